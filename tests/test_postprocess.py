"""Decode, letterbox inverse and NMS against a NumPy oracle and hand-derived boxes."""

import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from yolo3.data.image import letterbox_geometry, letterbox_image
from yolo3.inference.postprocess import (
    batched_nms,
    decode_heads,
    letterbox_geometry_tf,
    postprocess,
    undo_letterbox,
)
from yolo3.model.head import HeadSpec

# Nine anchors (w, h) in input pixels. Index 6 (head 0, slot 0) and index 3 (head 1, slot 0)
# are chosen so the hand-made boxes below land on round numbers in the original images.
ANCHORS = np.array(
    [
        [10, 13],
        [16, 30],
        [33, 23],
        [83, 83.2],
        [62, 45],
        [59, 119],
        [130, 78],
        [156, 198],
        [373, 326],
    ],
    dtype=np.float32,
)
MASKS_9 = ((6, 7, 8), (3, 4, 5), (0, 1, 2))
MASKS_6 = ((3, 4, 5), (0, 1, 2))
NUM_CLASSES = 3
DEPTH = 5 + NUM_CLASSES
CONFIDENT, SILENT = 12.0, -12.0


def _head(num_anchors=9, num_classes=NUM_CLASSES, **fields):
    """The head of the first ``num_anchors`` of :data:`ANCHORS` (Darknet's masks)."""
    names = [f"class_{i}" for i in range(num_classes)]
    return HeadSpec(anchors=ANCHORS[:num_anchors], class_names=names, **fields)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def decode_oracle(outputs, anchors, masks, num_classes, input_hw, scale_x_y=None):
    """Per-element loops in float64, written from the YOLOv3 paper's equations; with
    ``scale_x_y`` (one per head), AlexeyAB Darknet's ``s sigmoid(t) - (s - 1) / 2`` centres."""
    input_h, input_w = input_hw
    depth = 5 + num_classes
    all_boxes, all_scores = [], []
    scales = scale_x_y or [1.0] * len(masks)
    for n in range(outputs[0].shape[0]):
        boxes, scores = [], []
        for output, mask, s in zip(outputs, masks, scales, strict=True):
            grid_h, grid_w = output.shape[1:3]
            for row in range(grid_h):
                for col in range(grid_w):
                    for slot, anchor_index in enumerate(mask):
                        raw = [
                            float(v) for v in output[n, row, col, slot * depth : (slot + 1) * depth]
                        ]
                        offset_x = s * _sigmoid(raw[0]) - (s - 1) / 2
                        offset_y = s * _sigmoid(raw[1]) - (s - 1) / 2
                        centre_x = (offset_x + col) / grid_w * input_w
                        centre_y = (offset_y + row) / grid_h * input_h
                        width = math.exp(raw[2]) * float(anchors[anchor_index][0])
                        height = math.exp(raw[3]) * float(anchors[anchor_index][1])
                        boxes.append(
                            [
                                centre_x - width / 2,
                                centre_y - height / 2,
                                centre_x + width / 2,
                                centre_y + height / 2,
                            ]
                        )
                        objectness = _sigmoid(raw[4])
                        scores.append([objectness * _sigmoid(v) for v in raw[5:]])
        all_boxes.append(boxes)
        all_scores.append(scores)
    return np.array(all_boxes), np.array(all_scores)


def silent_heads(batch, input_size=416, strides=(32, 16, 8)):
    """Raw heads in which no anchor is confident of anything."""
    return [
        np.full((batch, input_size // s, input_size // s, 3 * DEPTH), SILENT, np.float32)
        for s in strides
    ]


def fire(head, image, row, col, slot, class_id, txy=(0.0, 0.0), twh=(0.0, 0.0)):
    """Makes one anchor of one cell confident of ``class_id`` with the given raw box."""
    channels = head[image, row, col, slot * DEPTH : (slot + 1) * DEPTH]
    channels[0:2] = txy
    channels[2:4] = twh
    channels[4] = CONFIDENT
    channels[5 + class_id] = CONFIDENT


@pytest.mark.parametrize(
    "masks, scale_x_y",
    [
        (MASKS_9, None),
        (MASKS_6, None),
        (MASKS_9, (1.05, 1.1, 1.2)),
        (MASKS_6, (2.0, 1.0)),
        (((4, 3, 5), (0, 2, 1)), None),  # masks of the head's own, in any order
    ],
    ids=["yolov3", "tiny", "yolov3-scale_x_y", "tiny-scale_x_y", "tiny-own-masks"],
)
def test_decode_matches_numpy_oracle(masks, scale_x_y):
    rng = np.random.default_rng(0)
    input_hw = (64, 96)  # not square, so a swapped x/y anywhere shows up
    strides = (32, 16, 8)[: len(masks)]
    outputs = [
        rng.normal(0, 1.5, (2, input_hw[0] // s, input_hw[1] // s, 3 * DEPTH)).astype(np.float32)
        for s in strides
    ]
    anchors = ANCHORS[: 3 * len(masks)]
    head = _head(len(anchors), anchor_masks=masks, scale_x_y=scale_x_y)
    boxes, scores = decode_heads(outputs, head, input_hw)
    expected_boxes, expected_scores = decode_oracle(
        outputs, anchors, masks, NUM_CLASSES, input_hw, scale_x_y
    )
    assert boxes.shape == expected_boxes.shape == (2, sum(3 * 64 * 96 // s**2 for s in strides), 4)
    np.testing.assert_allclose(boxes.numpy(), expected_boxes, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(scores.numpy(), expected_scores, rtol=1e-5, atol=1e-6)


def test_decode_rejects_head_of_wrong_width():
    outputs = silent_heads(1, 64)
    with pytest.raises(ValueError, match=r"24 channels; 3 anchors x \(5 \+ 4 classes\) = 27"):
        decode_heads(outputs, _head(num_classes=4), 64)


def test_letterbox_geometry_golden_values():
    # 640x480 -> 416: scale = min(416/640, 416/480) = 0.65; 480 * 0.65 = 312 rows, pasted at
    # (416 - 312) // 2 = 52.
    assert letterbox_geometry((480, 640), (416, 416)) == (0.65, 0.65, 52, 0, 312, 416)
    # 300x500 portrait: scale = 416/500 = 0.832; int(300 * 0.832) = int(249.6) = 249 columns
    # at (416 - 249) // 2 = 83; exact x scale 249/300 = 0.83.
    assert letterbox_geometry((500, 300), (416, 416)) == pytest.approx(
        (0.832, 0.83, 0, 83, 416, 249)
    )


def test_letterbox_geometry_tf_matches_python():
    rng = np.random.default_rng(1)
    sizes = np.concatenate(
        [rng.integers(1, 4000, (300, 2)), [[480, 640], [500, 300], [1, 5000], [5000, 1]]]
    )
    for input_hw in [(416, 416), (320, 608)]:
        scale_yx, offset_yx = letterbox_geometry_tf(tf.constant(sizes), input_hw)
        for (height, width), scale, offset in zip(
            sizes, scale_yx.numpy(), offset_yx.numpy(), strict=True
        ):
            sy, sx, oy, ox, _, _ = letterbox_geometry((height, width), input_hw)
            assert tuple(offset) == (oy, ox), (height, width)
            np.testing.assert_allclose(scale, (sy, sx), rtol=1e-6)


def test_letterbox_image_pastes_on_gray_at_the_offset():
    red = Image.new("RGB", (640, 480), (255, 0, 0))
    boxed = letterbox_image(red, (416, 416))
    assert boxed.shape == (416, 416, 3) and boxed.dtype == np.uint8
    # Rows 52..363 hold the image (see the golden values above); the rest is padding.
    assert np.all(boxed[:52] == 128) and np.all(boxed[364:] == 128)
    assert np.all(boxed[52:364] == (255, 0, 0))


def test_one_confident_cell_gives_the_expected_box_in_original_pixels():
    outputs = silent_heads(2)
    # Image 0, 640x480 (offset_y 52, scale 0.65). Head 0 (stride 32), cell (row 6, col 6),
    # anchor 6 = 130x78, t = 0: centre (6 + 0.5) * 32 = 208, so x 143..273 and y 169..247 in
    # the input; x / 0.65 -> 220..420, (y - 52) / 0.65 -> 180..300.
    fire(outputs[0], image=0, row=6, col=6, slot=0, class_id=2)
    # Image 1, 300x500 (offset_x 83, scale_x 0.83, scale_y 0.832). Head 1 (stride 16),
    # cell (row 9, col 12), anchor 3 = 83x83.2, sigmoid(ln 31) = 31/32, sigmoid(ln 3) = 3/4:
    # centre x (12 + 31/32) * 16 = 207.5, so x 166..249 -> (x - 83) / 0.83 = 100..200;
    # centre y (9 + 3/4) * 16 = 156, so y 114.4..197.6 -> y / 0.832 = 137.5..237.5.
    fire(outputs[1], image=1, row=9, col=12, slot=0, class_id=0, txy=(math.log(31), math.log(3)))
    image_hw = np.array([[480, 640], [500, 300]], np.int32)

    boxes, scores, classes, counts = postprocess(outputs, _head(), image_hw, 416)

    assert counts.numpy().tolist() == [1, 1]
    assert boxes.shape == (2, 100, 4) and scores.shape == (2, 100) and classes.dtype == tf.int32
    np.testing.assert_allclose(boxes[0, 0], [220, 180, 420, 300], atol=1e-3)
    np.testing.assert_allclose(boxes[1, 0], [100, 137.5, 200, 237.5], atol=1e-3)
    assert classes.numpy()[:, 0].tolist() == [2, 0]
    np.testing.assert_allclose(scores[:, 0], _sigmoid(CONFIDENT) ** 2, rtol=1e-6)
    assert np.all(boxes.numpy()[:, 1:] == 0) and np.all(scores.numpy()[:, 1:] == 0)


def test_grid_sensitivity_stretches_the_offset_about_the_cell_centre():
    # Input 416x416, head 1 (stride 16), cell (row 9, col 12), tiny's anchor 0 = 10x13, with
    # scale_x_y 2 on that head: offset 2 sigmoid(t) - 1/2. t = 0 keeps the centre, 1/2 for
    # any s: (12.5, 9.5) * 16 = (200, 152). sigmoid(ln 3) = 3/4 gives offset 1 (the cell's
    # edge, which YOLOv3's sigmoid never reaches) and sigmoid(-ln 3) = 1/4 offset 0:
    # centre (13, 9) * 16 = (208, 144). Head 0's scale (1.5) must not touch head 1.
    image_hw = np.array([[416, 416]], np.int32)
    expected = {(0.0, 0.0): (200, 152), (math.log(3), -math.log(3)): (208, 144)}
    for txy, (centre_x, centre_y) in expected.items():
        outputs = silent_heads(1, strides=(32, 16))
        fire(outputs[1], image=0, row=9, col=12, slot=0, class_id=1, txy=txy)
        boxes, _, _, counts = postprocess(outputs, _head(6, scale_x_y=(1.5, 2.0)), image_hw, 416)
        assert counts.numpy().tolist() == [1]
        np.testing.assert_allclose(
            boxes[0, 0], [centre_x - 5, centre_y - 6.5, centre_x + 5, centre_y + 6.5],
            atol=1e-3,
        )  # fmt: skip


def test_box_wholly_in_the_padding_is_dropped():
    outputs = silent_heads(1)
    # Head 2 (stride 8), row 0: anchor 0 = 10x13 spans y -2.5..10.5, all inside the 52 rows of
    # padding above a 640x480 image, so it clips to zero height.
    fire(outputs[2], image=0, row=0, col=20, slot=0, class_id=1)
    *_, counts = postprocess(outputs, _head(), np.array([[480, 640]]), 416)
    assert counts.numpy().tolist() == [0]


@pytest.mark.parametrize("image_hw", [(480, 640), (500, 300), (37, 1000), (416, 416)])
def test_letterbox_then_undo_is_identity(image_hw):
    height, width = image_hw
    rng = np.random.default_rng(2)
    corners = rng.uniform(0, 1, (20, 2, 2)) * [width, height]
    boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=-1)  # x1 y1 x2 y2
    scale_y, scale_x, offset_y, offset_x, _, _ = letterbox_geometry(image_hw, (320, 416))
    forward = boxes * [scale_x, scale_y, scale_x, scale_y] + [offset_x, offset_y] * 2
    restored = undo_letterbox(forward[np.newaxis], np.array([image_hw]), (320, 416))
    np.testing.assert_allclose(restored.numpy()[0], boxes, rtol=1e-5, atol=1e-3)


def test_undo_letterbox_clips_to_the_image():
    boxes = np.array([[[-50.0, -50.0, 500.0, 500.0]]], np.float32)
    restored = undo_letterbox(boxes, np.array([[480, 640]]), 416)
    np.testing.assert_allclose(restored[0, 0], [0, 0, 640, 480])


def _boxes_and_scores(rows):
    """rows: (box, class_id, score) -> (1, B, 4) boxes and (1, B, 2) scores."""
    boxes = np.array([[box for box, _, _ in rows]], np.float32)
    scores = np.zeros((1, len(rows), 2), np.float32)
    for index, (_, class_id, score) in enumerate(rows):
        scores[0, index, class_id] = score
    return boxes, scores


def test_nms_keeps_the_higher_scoring_of_two_overlapping_boxes_of_one_class():
    # IoU = 90 * 100 / (110 * 100) = 0.82 > 0.45.
    boxes, scores = _boxes_and_scores([([10, 0, 110, 100], 0, 0.8), ([0, 0, 100, 100], 0, 0.9)])
    out_boxes, out_scores, out_classes, counts = batched_nms(boxes, scores, box_merge=False)
    assert counts.numpy().tolist() == [1]
    np.testing.assert_allclose(out_boxes[0, 0], [0, 0, 100, 100])
    np.testing.assert_allclose(out_scores[0, 0], 0.9)


def test_box_merging_averages_a_kept_box_with_what_it_suppresses_by_score_and_iou():
    rows = [
        ([0, 0, 100, 100], 0, 0.9),  # kept
        ([10, 0, 110, 100], 0, 0.8),  # IoU 90 / 110 = 9 / 11 with it: suppressed, merged
        ([0, 20, 100, 120], 1, 0.85),  # another class: kept apart, merges with nothing
        ([0, 0, 95, 100], 0, 0.25),  # IoU 0.95 but at or below the score threshold
        ([60, 0, 160, 100], 0, 0.7),  # IoU 40 / 160 = 0.25 with the first: kept, alone
    ]
    boxes, scores = _boxes_and_scores(rows)
    out_boxes, out_scores, out_classes, counts = batched_nms(
        boxes, scores, score_threshold=0.3, max_detections=4
    )
    assert counts.numpy().tolist() == [3]
    # Hand-derived: weights 0.9 * 1**6 and 0.8 * (9 / 11)**6; x moves by 10 times the
    # second's share, y stays. The 0.7 box overlaps the second by 50 / 150 < 0.45.
    second = 0.8 * (9 / 11) ** 6
    shift = 10 * second / (0.9 + second)
    np.testing.assert_allclose(out_boxes[0, 0], [shift, 0, 100 + shift, 100], rtol=1e-5)
    np.testing.assert_allclose(out_boxes[0, 1], [0, 20, 100, 120])
    np.testing.assert_allclose(out_boxes[0, 2], [60, 0, 160, 100])
    np.testing.assert_allclose(out_boxes[0, 3], [0, 0, 0, 0])  # padding stays padding
    np.testing.assert_allclose(out_scores[0, :3], [0.9, 0.85, 0.7])  # scores stay
    assert out_classes.numpy()[0, :3].tolist() == [0, 1, 0]


def test_box_merging_matches_a_numpy_oracle_on_random_candidates():
    rng = np.random.default_rng(3)
    corner = rng.uniform(0, 300, (2, 300, 2)).astype(np.float32)
    size = rng.uniform(20, 120, (2, 300, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + size], -1)
    scores = (rng.uniform(0, 1, (2, 300, 3)) ** 4).astype(np.float32)
    kept, _, classes, counts = (t.numpy() for t in batched_nms(boxes, scores, box_merge=False))
    merged, *_ = (t.numpy() for t in batched_nms(boxes, scores))
    assert counts.min() > 5
    for image in range(2):
        for row in range(counts[image]):
            box, class_id = kept[image, row], classes[image, row]
            lo, hi = (
                np.maximum(box[:2], boxes[image, :, :2]),
                np.minimum(box[2:], boxes[image, :, 2:]),
            )
            inter = np.prod(np.clip(hi - lo, 0, None), -1)
            area = np.prod(boxes[image, :, 2:] - boxes[image, :, :2], -1)
            iou = inter / (np.prod(box[2:] - box[:2]) + area - inter)
            score = scores[image, :, class_id]
            weight = np.where((iou > 0.45) & (score > 0.3), score * iou.astype(np.float64) ** 6, 0)
            expected = (weight[:, None] * boxes[image]).sum(0) / weight.sum()
            np.testing.assert_allclose(merged[image, row], expected, rtol=1e-4, atol=1e-3)


def test_nms_keeps_overlapping_boxes_of_different_classes():
    boxes, scores = _boxes_and_scores([([0, 0, 100, 100], 0, 0.9), ([10, 0, 110, 100], 1, 0.8)])
    _, out_scores, out_classes, counts = batched_nms(boxes, scores)
    assert counts.numpy().tolist() == [2]
    assert out_classes.numpy()[0, :2].tolist() == [0, 1]
    np.testing.assert_allclose(out_scores[0, :2], [0.9, 0.8])


def test_nms_respects_score_threshold_and_max_detections():
    # Five disjoint boxes scoring 0.9, 0.7, 0.5, 0.35, 0.2.
    rows = [
        ([100 * i, 0, 100 * i + 50, 50], 0, s) for i, s in enumerate([0.9, 0.7, 0.5, 0.35, 0.2])
    ]
    boxes, scores = _boxes_and_scores(rows)
    *_, counts = batched_nms(boxes, scores, score_threshold=0.3)
    assert counts.numpy().tolist() == [4]
    *_, counts = batched_nms(boxes, scores, score_threshold=0.6)
    assert counts.numpy().tolist() == [2]
    out_boxes, out_scores, _, counts = batched_nms(
        boxes, scores, score_threshold=0.3, max_detections=3
    )
    assert out_boxes.shape == (1, 3, 4) and counts.numpy().tolist() == [3]
    np.testing.assert_allclose(out_scores[0], [0.9, 0.7, 0.5])


def test_nms_iou_threshold_is_a_parameter():
    boxes, scores = _boxes_and_scores([([0, 0, 100, 100], 0, 0.9), ([10, 0, 110, 100], 0, 0.8)])
    *_, counts = batched_nms(boxes, scores, iou_threshold=0.9)  # IoU 0.82 < 0.9: both kept
    assert counts.numpy().tolist() == [2]


def test_postprocess_in_graph_mode_matches_eager():
    outputs = silent_heads(2)
    fire(outputs[0], image=0, row=6, col=6, slot=0, class_id=2)
    fire(outputs[1], image=1, row=9, col=12, slot=0, class_id=0, txy=(math.log(31), math.log(3)))
    image_hw = np.array([[480, 640], [500, 300]], np.int32)

    @tf.function(
        input_signature=[
            [tf.TensorSpec((None, None, None, 3 * DEPTH), tf.float32)] * 3,
            tf.TensorSpec((None, 2), tf.int32),
        ]
    )
    def graph(heads, sizes):
        return postprocess(heads, _head(), sizes, (416, 416), max_detections=10)

    for got, expected in zip(
        graph(outputs, image_hw),
        postprocess(outputs, _head(), image_hw, (416, 416), max_detections=10),
        strict=True,
    ):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
    assert graph(outputs, image_hw)[3].numpy().tolist() == [1, 1]
