"""Target assignment against a loop-per-box NumPy reference, eagerly and inside tf.data."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, SMALL_MASKS, make_head, numpy_targets, random_boxes

from yolo3.model.resources import default_anchor_masks, read_anchors
from yolo3.model.targets import build_targets

YOLO_ANCHORS = read_anchors("model_data/yolo_anchors.txt")


@pytest.mark.parametrize(
    "anchors, masks, input_hw, iou_thresh, neighbours",
    [
        (SMALL_ANCHORS, SMALL_MASKS, (64, 96), 1.0, False),
        (YOLO_ANCHORS, default_anchor_masks(9), (416, 320), 1.0, False),
        # AlexeyAB's several anchors per box, at yolov4.cfg's threshold.
        (YOLO_ANCHORS, default_anchor_masks(9), (416, 320), 0.213, False),
        # YOLOv5's neighbour cells, alone and with several anchors: boxes at the grid's edges
        # (30 of them in a 64 x 96 input) lose the neighbour outside it.
        (SMALL_ANCHORS, SMALL_MASKS, (64, 96), 1.0, True),
        (YOLO_ANCHORS, default_anchor_masks(9), (416, 320), 0.213, True),
    ],
)
def test_matches_reference(anchors, masks, input_hw, iou_thresh, neighbours):
    rng = np.random.default_rng(0)
    boxes = random_boxes(rng, 4, 30, min(input_hw), num_classes=3)
    expected = numpy_targets(boxes, input_hw, anchors, 3, masks, iou_thresh, neighbours)
    got = build_targets(
        boxes,
        input_hw=input_hw,
        head=make_head(anchors, 3),
        iou_thresh=iou_thresh,
        neighbour_cells=neighbours,
    )
    if neighbours:  # more cells learn each box than the centre's alone
        centre = numpy_targets(boxes, input_hw, anchors, 3, masks, iou_thresh)
        assert sum(t[..., 4].sum() for t in expected) > 2 * sum(t[..., 4].sum() for t in centre)
    if iou_thresh < 1.0:  # the rule assigns more: the reference is not the same as YOLOv3's
        single = numpy_targets(boxes, input_hw, anchors, 3, masks)
        assert sum(t[..., 4].sum() for t in expected) > sum(t[..., 4].sum() for t in single)
    assert len(got) == len(masks)
    for level_got, level_expected in zip(got, expected):
        assert level_got.shape == level_expected.shape
        np.testing.assert_allclose(level_got.numpy(), level_expected, atol=1e-6)


def test_inside_tf_data_matches_eager():
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, 6, 10, 64, num_classes=2)
    dataset = tf.data.Dataset.from_tensor_slices(boxes).batch(3)
    dataset = dataset.map(
        lambda b: build_targets(b, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    )
    batches = list(dataset)
    eager = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    for level in range(2):
        joined = np.concatenate([batch[level].numpy() for batch in batches])
        np.testing.assert_array_equal(joined, eager[level].numpy())


def test_no_cap_on_boxes_per_image():
    # 200 small boxes, each in its own stride-8 cell of a 416 input: all must be assigned.
    centres = [(8 * col + 4, 8 * row + 4) for row in range(20) for col in range(10)]
    boxes = np.array([[[x - 3, y - 4, x + 3, y + 4, 0] for x, y in centres]], np.float32)
    targets = build_targets(boxes, input_hw=(416, 416), head=make_head(YOLO_ANCHORS, 1))
    assert sum(float(tf.reduce_sum(level[..., 4])) for level in targets) == 200


def test_neighbour_cells_by_hand():
    # One 20 x 20 box centred at (20, 40) in a 64 x 64 input; one anchor per level, the box
    # best fits the stride-16 level's (4 x 4 grid). Its centre is at cell (x 1.25, y 2.5):
    # column 1, row 2; nearer its left edge (column 0) and, at a half exactly, the lower
    # neighbour (row 3).
    head = make_head(((4, 4), (20, 20), (64, 64), (70, 70), (80, 80), (90, 90)), 1)
    boxes = np.array([[[10, 30, 30, 50, 0]]], np.float32)
    stride_16 = build_targets(boxes, head=head, input_hw=(64, 64), neighbour_cells=True)[1]
    cells = {tuple(int(v) for v in cell[1:3]) for cell in np.argwhere(stride_16[..., 4] > 0)}
    assert cells == {(2, 1), (2, 0), (3, 1)}
    # Every entry holds the box itself: its centre and size as fractions of the input.
    for row, column in cells:
        np.testing.assert_allclose(
            stride_16[0, row, column, 1, :5], [20 / 64, 40 / 64, 20 / 64, 20 / 64, 1]
        )


def test_later_box_wins_a_shared_cell_and_anchor():
    boxes = np.array([[[10, 10, 30, 30, 0], [12, 12, 30, 30, 1]]], np.float32)
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    assigned = [level.numpy()[level.numpy()[..., 4] > 0] for level in targets]
    assigned = np.concatenate(assigned)
    assert len(assigned) == 1
    np.testing.assert_array_equal(assigned[0, 5:], [0, 1])


def test_box_fields_and_padding():
    # A 20x16 box centred at (40, 24) in a 64x64 input goes to anchor 2 (16x16): level 1,
    # slot 2, stride 16 cell (row 1, column 2).
    boxes = np.array([[[30, 16, 50, 32, 1], [0, 0, 0, 0, 0]]], np.float32)
    targets = build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
    assert float(tf.reduce_sum(targets[0])) == 0
    np.testing.assert_allclose(
        targets[1][0, 1, 2, 2].numpy(), [40 / 64, 24 / 64, 20 / 64, 16 / 64, 1, 0, 1]
    )
    assert float(tf.reduce_sum(targets[1][..., 4])) == 1


def test_empty_batch_gives_zero_targets():
    targets = build_targets(
        np.zeros((2, 4, 5), np.float32), input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2)
    )
    assert all(float(tf.reduce_sum(tf.abs(level))) == 0 for level in targets)


def test_class_id_out_of_range_is_an_error():
    boxes = np.array([[[0, 0, 10, 10, 5]]], np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="class id outside"):
        build_targets(boxes, input_hw=(64, 64), head=make_head(SMALL_ANCHORS, 2))
