"""The per-image YOLOv3 loss: NumPy oracle, hand-derived values and invariants."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, numpy_loss, numpy_targets, random_boxes

from yolo3.model.loss import yolo_loss
from yolo3.model.targets import build_targets

NUM_CLASSES = 2
MASKS = ((3, 4, 5), (0, 1, 2))
LN2 = np.log(2.0)


def _loss(boxes, outputs, anchors=SMALL_ANCHORS, ignore_thresh=0.5, size=64):
    targets = build_targets(boxes, input_hw=(size, size), anchors=anchors, num_classes=NUM_CLASSES)
    total, terms = yolo_loss(
        targets, outputs, anchors=anchors, num_classes=NUM_CLASSES, ignore_thresh=ignore_thresh
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
    targets = build_targets(boxes, input_hw=(64, 64), anchors=SMALL_ANCHORS, num_classes=2)
    with tf.GradientTape() as tape:
        total, _ = yolo_loss(targets, outputs, anchors=SMALL_ANCHORS, num_classes=2)
        loss = tf.reduce_mean(total)
    grads = tape.gradient(loss, outputs)
    assert np.isfinite(loss.numpy())
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)


def test_mismatched_levels_are_an_error():
    targets = build_targets(
        np.zeros((1, 1, 5), np.float32), input_hw=(64, 64), anchors=SMALL_ANCHORS, num_classes=2
    )
    with pytest.raises(ValueError, match="2 output levels expected"):
        yolo_loss(targets, _zeros(1)[:1], anchors=SMALL_ANCHORS, num_classes=2)
