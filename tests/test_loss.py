"""The per-image YOLOv3 loss: NumPy oracle, hand-derived values and invariants."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, make_head, numpy_loss, numpy_targets, random_boxes

from yolo3.model.loss import LossOptions, iou_variant, loss_terms, yolo_loss
from yolo3.model.targets import build_targets

NUM_CLASSES = 2
MASKS = ((3, 4, 5), (0, 1, 2))
LN2 = np.log(2.0)


def _loss(boxes, outputs, anchors=SMALL_ANCHORS, ignore_thresh=0.5, size=64):
    targets = build_targets(boxes, input_hw=(size, size), head=make_head(anchors, NUM_CLASSES))
    total, terms = yolo_loss(
        targets, outputs, head=make_head(anchors, NUM_CLASSES), ignore_thresh=ignore_thresh
    )
    return targets, total.numpy(), {name: value.numpy()[:, 0] for name, value in terms.items()}


def _zeros(batch, size=64):
    channels = 3 * (5 + NUM_CLASSES)
    return [np.zeros((batch, size // s, size // s, channels), np.float32) for s in (32, 16)]


def test_matches_numpy_oracle():
    rng = np.random.default_rng(3)
    boxes = random_boxes(rng, 3, 6, 64, NUM_CLASSES)
    boxes[2] = 0  # one image without boxes
    outputs = [rng.normal(0, 1.5, o.shape).astype(np.float32) for o in _zeros(3)]
    targets, total, terms = _loss(boxes, outputs)
    expected_total, expected_terms = numpy_loss(
        numpy_targets(boxes, (64, 64), SMALL_ANCHORS, NUM_CLASSES, MASKS),
        outputs,
        SMALL_ANCHORS,
        NUM_CLASSES,
        MASKS,
        0.5,
    )
    assert total.shape == (3, 1)
    np.testing.assert_allclose(total[:, 0], expected_total, rtol=1e-5)
    for name, value in terms.items():
        np.testing.assert_allclose(value, expected_terms[name], rtol=1e-5, atol=1e-5)
    # The batch mean equals the original's sum over the whole batch divided by its size.
    original = sum(expected_terms[name].sum() for name in expected_terms) / 3
    np.testing.assert_allclose(total.mean(), original, rtol=1e-5)


def test_hand_derived_values():
    # 64x64 input, all raw outputs 0, ignore_thresh 1 (nothing ignored).
    # Box: 36x36 centred at (18, 18), class 1. Best anchor: 40x36 (index 4), IoU 1296/1440
    # = 0.9 against 24x30's 720/1296. Level 0 (stride 32, 2x2 grid), slot 1, cell (0, 0).
    # xy: offset 18/32 = 0.5625 per axis, scale 2 - (36/64)^2 = 1.68359375;
    #     bce(0.5625, 0) = ln 2 for any label, so xy = 2 * 1.68359375 * ln 2.
    # wh: log(36/40)^2 + log(36/36)^2, times 0.5 and the scale.
    # objectness: every one of the 60 cells/anchors costs bce(., 0) = ln 2.
    # class: two classes, bce(label, 0) = ln 2 each.
    boxes = np.array([[[0, 0, 36, 36, 1]]], np.float32)
    _, total, terms = _loss(boxes, _zeros(1), ignore_thresh=1.0)
    scale = 2 - (36 / 64) ** 2
    expected = {
        "xy": 2 * scale * LN2,
        "wh": scale * 0.5 * np.log(36 / 40) ** 2,
        "objectness": 60 * LN2,
        "class": 2 * LN2,
    }
    for name, value in expected.items():
        np.testing.assert_allclose(terms[name][0], value, rtol=1e-6)
    np.testing.assert_allclose(total[0, 0], sum(expected.values()), rtol=1e-6)


def test_no_boxes_only_objectness():
    _, total, terms = _loss(np.zeros((2, 3, 5), np.float32), _zeros(2))
    assert np.all(terms["objectness"] > 0)
    for name in ("xy", "wh", "class"):
        assert np.all(terms[name] == 0)
    np.testing.assert_allclose(total[:, 0], 60 * LN2, rtol=1e-6)


def test_one_box_all_terms_positive():
    boxes = np.array([[[5, 9, 30, 41, 0]]], np.float32)
    _, _, terms = _loss(boxes, _zeros(1))
    for name in terms:
        assert terms[name][0] > 0, name


def test_prediction_equal_to_target_has_no_box_loss():
    # Centre on a cell corner (32, 32) so the xy target offsets are exactly 0; size 24x30 is
    # anchor 3 (level 0, slot 0), so the wh targets are log(1) = 0.
    boxes = np.array([[[20, 17, 44, 47, 0]]], np.float32)
    outputs = _zeros(1)
    cell = outputs[0][0, 1, 1].reshape(3, 5 + NUM_CLASSES)
    cell[0, :2] = -30.0  # sigmoid -> 0
    cell[0, 2:4] = 0.0
    outputs[0][0, 1, 1] = cell.reshape(-1)
    _, _, terms = _loss(boxes, outputs)
    assert terms["xy"][0] < 1e-9
    assert terms["wh"][0] == 0
    # A wrong size is penalised: the check above is not vacuous.
    cell[0, 2:4] = 0.5
    outputs[0][0, 1, 1] = cell.reshape(-1)
    _, _, terms = _loss(boxes, outputs)
    assert terms["wh"][0] > 0.1


def test_grid_sensitivity_matches_numpy_oracle():
    # One scale per level (stride 32, 16): the xy term, and the ignore mask through the
    # decoded centres, against the reference cell by cell.
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, 2, 5, 64, NUM_CLASSES)
    outputs = [rng.normal(0, 1.5, o.shape).astype(np.float32) for o in _zeros(2)]
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    total, terms = yolo_loss(
        targets, outputs, head=make_head(SMALL_ANCHORS, 2, scale_x_y=(1.05, 1.2)),
        ignore_thresh=0.5,
    )  # fmt: skip
    expected_total, expected_terms = numpy_loss(
        numpy_targets(boxes, (64, 64), SMALL_ANCHORS, NUM_CLASSES, MASKS),
        outputs, SMALL_ANCHORS, NUM_CLASSES, MASKS, 0.5, scale_x_y=(1.05, 1.2),
    )  # fmt: skip
    np.testing.assert_allclose(total.numpy()[:, 0], expected_total, rtol=1e-5)
    for name, value in terms.items():
        np.testing.assert_allclose(value.numpy()[:, 0], expected_terms[name], rtol=1e-5, atol=1e-5)
    plain, _ = yolo_loss(targets, outputs, head=make_head(SMALL_ANCHORS, 2))
    assert np.abs(plain.numpy() - total.numpy()).max() > 1e-3  # the scale is not ignored


@pytest.mark.parametrize("iou_loss", ["mse", "ciou"])
def test_grid_sensitivity_reaches_the_cell_corner_at_a_finite_logit(iou_loss):
    # The box of test_prediction_equal_to_target_has_no_box_loss: centre on the corner
    # (32, 32) of stride-32 cell (1, 1), offset 0, size anchor 3's. With scale_x_y 2 the
    # offset 2 sigmoid(t) - 1/2 is 0 at sigmoid(t) = 1/4, t = -ln 3 (YOLOv3's sigmoid only
    # tends to 0). mse: the xy label is (0 + 1/2) / 2 = 1/4 = sigmoid(t), the cross-entropy's
    # minimum, the entropy H(1/4) per axis times the scale 2 - w h, with zero gradient.
    # ciou: the decoded box is the true box, 1 - CIoU = 0 (a cusp there: no gradient check).
    boxes = np.array([[[20, 17, 44, 47, 0]]], np.float32)
    outputs = _zeros(1)
    cell = outputs[0][0, 1, 1].reshape(3, 5 + NUM_CLASSES)
    cell[0, :2] = -np.log(3.0)
    outputs[0][0, 1, 1] = cell.reshape(-1)
    outputs = [tf.constant(o) for o in outputs]
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    with tf.GradientTape() as tape:
        tape.watch(outputs)
        _, terms = yolo_loss(
            targets, outputs, head=make_head(SMALL_ANCHORS, 2, scale_x_y=2.0),
            iou_loss=iou_loss,
        )  # fmt: skip
        box = terms["xy"] if iou_loss == "mse" else terms["box"]
    gradient = tape.gradient(box, outputs)[0].numpy()[0, 1, 1].reshape(3, -1)[0, :2]
    entropy = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    expected = 2 * (2 - 24 * 30 / 64**2) * entropy if iou_loss == "mse" else 0.0
    np.testing.assert_allclose(box.numpy()[0, 0], expected, atol=1e-5)
    if iou_loss == "mse":
        np.testing.assert_allclose(gradient, 0.0, atol=1e-5)


def test_ignore_mask_spares_good_background_predictions():
    # Box 36x36 centred at (46, 46): assigned to anchor 4 (40x36) in stride-32 cell (1, 1).
    # The same cell's slot 0 (anchor 3, 24x30) predicts a box centred at (48, 48) at raw 0,
    # which lies inside the true box: IoU 720 / 1296 = 0.56 > 0.5, so it is not background.
    boxes = np.array([[[28, 28, 64, 64, 0]]], np.float32)
    strict = _loss(boxes, _zeros(1), ignore_thresh=1.0)[2]["objectness"][0]
    lenient = _loss(boxes, _zeros(1), ignore_thresh=0.5)[2]["objectness"][0]
    ignored = (strict - lenient) / LN2
    assert round(ignored) >= 1
    np.testing.assert_allclose(ignored, round(ignored), atol=1e-4)


@pytest.mark.parametrize("batch", [1, 4])
def test_padded_batch_is_finite_with_finite_gradients(batch):
    outputs = [tf.Variable(o) for o in _zeros(batch)]
    boxes = np.zeros((batch, 5, 5), np.float32)
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    with tf.GradientTape() as tape:
        total, _ = yolo_loss(targets, outputs, head=make_head(SMALL_ANCHORS, 2))
        loss = tf.reduce_mean(total)
    grads = tape.gradient(loss, outputs)
    assert np.isfinite(loss.numpy())
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)


def test_mismatched_levels_are_an_error():
    targets = build_targets(
        np.zeros((1, 1, 5), np.float32), input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2)
    )
    with pytest.raises(ValueError, match="2 output levels expected"):
        yolo_loss(targets, _zeros(1)[:1], head=make_head(SMALL_ANCHORS, 2))


def _numpy_iou_variant(pred, true, kind):
    """An independent NumPy reading of the IoU variants' definitions, box by box."""
    out = []
    for (px, py, pw, ph), (tx, ty, tw, th) in zip(pred, true):
        p0, p1 = (px - pw / 2, py - ph / 2), (px + pw / 2, py + ph / 2)
        t0, t1 = (tx - tw / 2, ty - th / 2), (tx + tw / 2, ty + th / 2)
        iw = max(min(p1[0], t1[0]) - max(p0[0], t0[0]), 0)
        ih = max(min(p1[1], t1[1]) - max(p0[1], t0[1]), 0)
        union = pw * ph + tw * th - iw * ih
        iou = iw * ih / union
        cw = max(p1[0], t1[0]) - min(p0[0], t0[0])
        ch = max(p1[1], t1[1]) - min(p0[1], t0[1])
        value = {
            "iou": iou,
            "giou": iou - (cw * ch - union) / (cw * ch),
            "diou": iou - ((px - tx) ** 2 + (py - ty) ** 2) / (cw**2 + ch**2),
        }
        v = 4 / np.pi**2 * (np.arctan(tw / th) - np.arctan(pw / ph)) ** 2
        value["ciou"] = value["diou"] - v / (1 - iou + v) * v
        out.append(value[kind])
    return np.array(out)


@pytest.mark.parametrize("kind", ["iou", "giou", "diou", "ciou"])
def test_iou_variants_match_hand_values_and_numpy(kind):
    # Corners (0,0,2,2) and (1,1,3,3): overlap 1, union 7, enclosing 3x3 (area 9, diagonal^2
    # 18), centres 2^0.5 apart, same aspect: IoU 1/7, GIoU 1/7 - 2/9, DIoU = CIoU 1/7 - 2/18.
    # Corners (0,0,2,1) and (0,0,1,1): IoU 1/2, enclosing 2x1 = the union (GIoU 1/2),
    # centres 0.5 apart over diagonal^2 5 (DIoU 0.45); v = 4/pi^2 (atan 1 - atan 2)^2.
    v = 4 / np.pi**2 * (np.pi / 4 - np.arctan(2.0)) ** 2
    hand = {
        "iou": [1 / 7, 0.5],
        "giou": [1 / 7 - 2 / 9, 0.5],
        "diou": [1 / 7 - 2 / 18, 0.45],
        "ciou": [1 / 7 - 2 / 18, 0.45 - v / (0.5 + v) * v],
    }[kind]
    pred = np.array([[1, 1, 2, 2], [1, 0.5, 2, 1]], np.float32)
    true = np.array([[2, 2, 2, 2], [0.5, 0.5, 1, 1]], np.float32)
    got = iou_variant(pred, true, kind).numpy()[:, 0]
    np.testing.assert_allclose(got, hand, rtol=1e-6)
    rng = np.random.default_rng(7)
    pred = np.concatenate([rng.uniform(0, 60, (50, 2)), rng.uniform(1, 30, (50, 2))], axis=1)
    true = np.concatenate([rng.uniform(0, 60, (50, 2)), rng.uniform(1, 30, (50, 2))], axis=1)
    got = iou_variant(pred.astype(np.float32), true.astype(np.float32), kind).numpy()[:, 0]
    np.testing.assert_allclose(got, _numpy_iou_variant(pred, true, kind), rtol=1e-5, atol=1e-6)


def _weighted_loss(boxes, outputs, **options):
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    total, terms = yolo_loss(
        targets, outputs, head=make_head(SMALL_ANCHORS, 2), ignore_thresh=0.5, **options
    )
    return total.numpy()[:, 0], {name: value.numpy()[:, 0] for name, value in terms.items()}


@pytest.mark.parametrize("kind", ["iou", "giou", "diou", "ciou"])
def test_iou_losses_replace_xy_and_wh_by_one_box_term(kind):
    # The box of test_prediction_equal_to_target_has_no_box_loss, predicted exactly.
    boxes = np.array([[[20, 17, 44, 47, 0]], [[0, 0, 0, 0, 0]]], np.float32)
    outputs = _zeros(2)
    cell = outputs[0][0, 1, 1].reshape(3, 5 + NUM_CLASSES)
    cell[0, :2] = -30.0
    outputs[0][0, 1, 1] = cell.reshape(-1)
    total, terms = _weighted_loss(boxes, outputs, iou_loss=kind)
    assert sorted(terms) == ["box", "class", "objectness"]
    assert terms["box"][0] < 1e-6 and terms["box"][1] == 0  # exact; an image with no box
    np.testing.assert_allclose(total, terms["box"] + terms["objectness"] + terms["class"])
    # Off by a quarter of the width: 1 - IoU(24x30 against 30x30 at the same centre) = 0.2.
    cell[0, 2] = np.log(1.25)
    outputs[0][0, 1, 1] = cell.reshape(-1)
    _, off = _weighted_loss(boxes, outputs, iou_loss=kind, iou_normalizer=0.5)
    if kind in ("iou", "giou", "diou"):  # same centre, the union encloses both: all equal
        np.testing.assert_allclose(off["box"][0], 0.5 * 0.2, rtol=1e-5)
    else:  # CIoU also charges the aspect ratio: 30x30 against 24x30
        v = 4 / np.pi**2 * (np.arctan(24 / 30) - np.arctan(1.0)) ** 2
        np.testing.assert_allclose(off["box"][0], 0.5 * (0.2 + v / (0.2 + v) * v), rtol=1e-5)


def test_normalizers_weigh_their_terms_and_iou_gradients_stay_finite():
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, 3, 4, 64, NUM_CLASSES)
    boxes[1] = 0  # padding only
    outputs = [rng.normal(0, 1.5, o.shape).astype(np.float32) for o in _zeros(3)]
    _, plain = _weighted_loss(boxes, outputs)
    _, weighted = _weighted_loss(
        boxes, outputs, iou_normalizer=0.07, obj_normalizer=2.0, cls_normalizer=0.5
    )
    np.testing.assert_allclose(weighted["xy"], 0.07 * plain["xy"], rtol=1e-5)
    np.testing.assert_allclose(weighted["wh"], 0.07 * plain["wh"], rtol=1e-5)
    np.testing.assert_allclose(weighted["objectness"], 2.0 * plain["objectness"], rtol=1e-5)
    np.testing.assert_allclose(weighted["class"], 0.5 * plain["class"], rtol=1e-5)
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    variables = [tf.constant(o) for o in outputs]
    with tf.GradientTape() as tape:
        tape.watch(variables)
        total, _ = yolo_loss(targets, variables, head=make_head(SMALL_ANCHORS, 2), iou_loss="ciou")
        summed = tf.reduce_sum(total)
    for gradient in tape.gradient(summed, variables):
        assert np.all(np.isfinite(gradient.numpy()))
        assert np.any(gradient.numpy() != 0)
    with pytest.raises(ValueError, match="iou_loss 'ciuo': use one of mse, iou, giou"):
        loss_terms("ciuo")


def test_label_smoothing_moves_the_class_targets_off_0_and_1():
    # The box of test_hand_derived_values, all raw outputs 0: bce(t, 0) = ln 2 for any t, so
    # the class term stays 2 ln 2; with raw class logits +-2 it is bce(0.95, 2) + bce(0.05,
    # -2) for eps 0.1: targets 1 - 0.05 and 0.05 (class 1 true, class 0 not).
    boxes = np.array([[[0, 0, 36, 36, 1]]], np.float32)
    outputs = _zeros(1)
    cell = outputs[0][0, 0, 0].reshape(3, 5 + NUM_CLASSES)
    cell[1, 5:] = [-2.0, 2.0]
    outputs[0][0, 0, 0] = cell.reshape(-1)

    def bce(label, logit):
        return np.log1p(np.exp(-abs(logit))) + max(logit, 0) - logit * label

    _, smooth = _weighted_loss(boxes, outputs, label_smoothing=0.1)
    _, plain = _weighted_loss(boxes, outputs)
    np.testing.assert_allclose(smooth["class"][0], bce(0.05, -2.0) + bce(0.95, 2.0), rtol=1e-6)
    np.testing.assert_allclose(plain["class"][0], bce(0.0, -2.0) + bce(1.0, 2.0), rtol=1e-6)
    with pytest.raises(ValueError, match="--label-smoothing 1.0: use a value in"):
        LossOptions(label_smoothing=1.0)


def test_objectness_iou_moves_the_assigned_target_to_the_box_fit():
    # The box of test_iou_losses_replace_xy_and_wh_by_one_box_term, its width a quarter too
    # wide (IoU 0.8) and its objectness logit z = 1. Only that prediction's target moves,
    # from 1 to 1 - r + 0.8 r, and bce(t, z) - bce(1, z) = z (1 - t): 0.2 r.
    boxes = np.array([[[20, 17, 44, 47, 0]]], np.float32)
    outputs = _zeros(1)
    cell = outputs[0][0, 1, 1].reshape(3, 5 + NUM_CLASSES)
    cell[0, :5] = [-30.0, -30.0, np.log(1.25), 0.0, 1.0]
    outputs[0][0, 1, 1] = cell.reshape(-1)
    _, plain = _weighted_loss(boxes, outputs, iou_loss="ciou")
    for share in (0.5, 1.0):
        total, soft = _weighted_loss(boxes, outputs, iou_loss="ciou", objectness_iou=share)
        np.testing.assert_allclose(soft["objectness"] - plain["objectness"], 0.2 * share, rtol=1e-4)
        np.testing.assert_allclose(soft["box"], plain["box"])
    # The IoU is a target, not a path: the objectness term moves no box logit.
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    variables = [tf.constant(o) for o in outputs]
    with tf.GradientTape() as tape:
        tape.watch(variables)
        _, terms = yolo_loss(
            targets, variables, head=make_head(SMALL_ANCHORS, 2), objectness_iou=1.0
        )
    gradient = tape.gradient(terms["objectness"], variables)[0].numpy()[0, 1, 1]
    gradient = gradient.reshape(3, 5 + NUM_CLASSES)
    assert np.all(gradient[:, :4] == 0) and gradient[0, 4] != 0
    with pytest.raises(ValueError, match="--objectness-iou 1.5: use a value in"):
        LossOptions(objectness_iou=1.5)
