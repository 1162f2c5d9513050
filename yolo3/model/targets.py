"""Ground-truth boxes -> per-level YOLOv3 targets, in TensorFlow ops.

Runs inside ``tf.data`` (after batching) and inside a replica under a strategy: no Python
loop per image or per box, no NumPy.

Assignment rule (the original keras-yolo3 and Darknet): each box goes to the anchor, among
all anchors of all levels, whose centred box has the highest IoU with it; it lands at that
anchor's level, in the cell containing its centre. A box whose best anchor is in no level's
mask is not assigned. When two boxes of one image land on the same cell and anchor, the
later box wins, as in the original's loop.

With ``iou_thresh`` below 1 (AlexeyAB Darknet's ``[yolo]`` key of that name), a box also
goes to every other anchor whose centred box has an IoU above it with the box, at that
anchor's level and in the cell of its centre: several predictions learn each box.

With ``neighbour_cells`` (YOLOv5's rule), a box also goes, with the same anchors, to the two
cells beside its centre's that lie nearest to the centre: the one left or right of it and
the one above or below it, where they are in the grid. Their predictions reach the centre
only with a grid sensitivity of at least 2 (offsets from -0.5 to 1.5 cells). Where entries
meet at one cell and anchor, a centre's entry wins over a neighbour's, and among equals the
later box wins.
"""

import tensorflow as tf

# The training recipe's iou_thresh (yolo3 train's and YoloTrainer's default): AlexeyAB
# Darknet's yolov4.cfg value. On the demo's task it raised COCO AP from 0.49 to 0.57, and to
# 0.64 with the CIoU box term (docs/benchmarks.md, "The training recipe"). build_targets'
# own default, 1, is YOLOv3's rule.
IOU_THRESH = 0.213


def anchor_ious(box_wh, anchors):
    """IoU of each box with each anchor, both centred at one point.

    Args:
        box_wh: (..., 2) box widths and heights, any units shared with ``anchors``.
        anchors: (num_anchors, 2).
    Returns:
        (..., num_anchors) float32.
    """
    box_wh = tf.expand_dims(box_wh, -2)
    intersection = tf.reduce_prod(tf.minimum(box_wh, anchors), axis=-1)
    union = tf.reduce_prod(box_wh, axis=-1) + tf.reduce_prod(anchors, axis=-1) - intersection
    return intersection / tf.maximum(union, 1e-12)


def best_anchor_indices(box_wh, anchors):
    """Index of the anchor with the highest centred-box IoU (:func:`anchor_ious`).

    Returns:
        (...) int32 indices into ``anchors``.
    """
    return tf.argmax(anchor_ious(box_wh, anchors), axis=-1, output_type=tf.int32)


# The grid sensitivity at which a prediction of a neighbour cell reaches a centre anywhere in
# its own cell (offsets in (-0.5, 1.5)): what neighbour_cells needs.
NEIGHBOUR_SCALE_X_Y = 2.0


def build_targets(boxes, *, head, input_hw=None, iou_thresh=1.0, neighbour_cells=False):
    """Builds the training targets of every output level.

    Over 80 lines: the assignment of every box to its anchor and cell as one traced
    computation, read top to bottom.

    Args:
        boxes: (N, max_boxes, 5) float32: x_min, y_min, x_max, y_max in input pixels and a
            class id. Rows with zero width or height are padding and ignored.
        head: the :class:`yolo3.model.head.HeadSpec` of the model: its anchors (widths and
            heights in input pixels), the anchors of each level and the classes; class ids
            must lie in [0, num_classes).
        input_hw: (height, width) of the network input in pixels, multiples of 32; default:
            the head's (multi-scale training passes each step's own).
        iou_thresh: a box also goes to every anchor whose centred IoU with it is above this
            (1: its best anchor only, YOLOv3's rule).
        neighbour_cells: a box also goes to the two cells beside its centre's nearest to
            the centre (see the module docstring).

    Returns:
        A tuple with one float32 tensor per level, largest stride first, of shape
        (N, height / stride, width / stride, anchors_in_level, 5 + num_classes):
        box centre x, y and width, height as fractions of the input size, objectness
        (1 where a box is assigned) and a one-hot class vector.
    """
    anchors = tf.constant(head.anchor_array)
    num_classes = head.num_classes
    input_hw = input_hw or head.input_hw
    height, width = int(input_hw[0]), int(input_hw[1])
    input_size = tf.constant([width, height], tf.float32)

    boxes = tf.convert_to_tensor(boxes, tf.float32)
    batch_size = tf.shape(boxes)[0]
    max_boxes = tf.shape(boxes)[1]
    centre = (boxes[..., 0:2] + boxes[..., 2:4]) / 2.0
    size = boxes[..., 2:4] - boxes[..., 0:2]
    valid = tf.logical_and(size[..., 0] > 0, size[..., 1] > 0)
    class_ids = tf.cast(boxes[..., 4], tf.int32)
    bad_class = tf.logical_and(valid, tf.logical_or(class_ids < 0, class_ids >= num_classes))
    tf.debugging.assert_equal(
        tf.reduce_any(bad_class),
        False,
        message=f"build_targets: a box has a class id outside [0, {num_classes})",
    )
    ious = anchor_ious(size, anchors)
    best_anchor = tf.argmax(ious, axis=-1, output_type=tf.int32)

    values = tf.concat(
        [
            centre / input_size,
            size / input_size,
            tf.ones_like(size[..., :1]),
            tf.one_hot(class_ids, num_classes, dtype=tf.float32),
        ],
        axis=-1,
    )
    # Each box is one entry, or three with neighbour_cells (its neighbours' first, then the
    # centres': box j's k-th entry at k * max_boxes + j, so a centre wins a shared cell).
    # later[i, j] is True when entry j comes after entry i in the same image.
    index = tf.range(3 * max_boxes if neighbour_cells else max_boxes)
    later = index[None, :] > index[:, None]
    entry_values = tf.tile(values, [1, 3, 1]) if neighbour_cells else values

    targets = []
    for level in head.levels():
        mask, stride = level.anchor_indices, level.stride
        grid_h, grid_w = height // stride, width // stride
        column = tf.clip_by_value(
            tf.cast(tf.floor(centre[..., 0] / width * grid_w), tf.int32), 0, grid_w - 1
        )
        row = tf.clip_by_value(
            tf.cast(tf.floor(centre[..., 1] / height * grid_h), tf.int32), 0, grid_h - 1
        )
        entries = valid
        if neighbour_cells:
            row, column, entries = _with_neighbours(
                centre, row, column, valid, grid_hw=(grid_h, grid_w), input_hw=(height, width)
            )
        cell = row * grid_w + column
        indices, updates = [], []
        for slot, anchor in enumerate(mask):
            chosen = tf.equal(best_anchor, anchor)
            if iou_thresh < 1.0:
                chosen = tf.logical_or(chosen, ious[..., anchor] > iou_thresh)
            if neighbour_cells:
                chosen = tf.tile(chosen, [1, 3])
            assigned = tf.logical_and(entries, chosen)
            # Keep only the last entry per cell so scatter_nd sees unique indices.
            collides = tf.logical_and(tf.equal(cell[..., :, None], cell[..., None, :]), later)
            collides = tf.logical_and(collides, assigned[..., None, :])
            keep = tf.logical_and(assigned, tf.logical_not(tf.reduce_any(collides, axis=-1)))
            kept = tf.where(keep)
            image_index = tf.cast(kept[:, 0], tf.int32)
            indices.append(
                tf.stack(
                    [
                        image_index,
                        tf.gather_nd(row, kept),
                        tf.gather_nd(column, kept),
                        tf.fill(tf.shape(image_index), slot),
                    ],
                    axis=-1,
                )
            )
            updates.append(tf.gather_nd(entry_values, kept))
        shape = tf.stack([batch_size, grid_h, grid_w, len(mask), 5 + num_classes])
        targets.append(tf.scatter_nd(tf.concat(indices, 0), tf.concat(updates, 0), shape))
    return tuple(targets)


def _with_neighbours(centre, row, column, valid, *, grid_hw, input_hw):
    """Each box's entries on one level's grid with its two neighbour cells: ``(rows,
    columns, entries)``, each (N, 3 * max_boxes): the cell beside the centre's in x, then in
    y, then the centre's own (``row``, ``column``); ``entries`` is False for padding and for
    a neighbour outside the grid."""
    grid_h, grid_w = grid_hw
    x = centre[..., 0] / input_hw[1] * grid_w
    y = centre[..., 1] / input_hw[0] * grid_h
    # The nearer side of the centre's cell: left (-1) when its offset is below a half.
    beside_x = column + tf.where(x - tf.cast(column, tf.float32) < 0.5, -1, 1)
    beside_y = row + tf.where(y - tf.cast(row, tf.float32) < 0.5, -1, 1)
    in_x = tf.logical_and(valid, tf.logical_and(beside_x >= 0, beside_x < grid_w))
    in_y = tf.logical_and(valid, tf.logical_and(beside_y >= 0, beside_y < grid_h))
    rows = tf.concat([row, beside_y, row], axis=1)
    columns = tf.concat([beside_x, column, column], axis=1)
    return rows, columns, tf.concat([in_x, in_y, valid], axis=1)
