"""From raw YOLO heads to boxes in original-image pixels: decode, undo letterbox, batched NMS.

Everything here is TensorFlow ops, so it runs eagerly, in a ``tf.function`` or after the
model inside a serving graph. Box format throughout: ``x_min, y_min, x_max, y_max``.

A raw head of one level has shape ``(N, H / stride, W / stride, num_anchors * (5 + C))``;
each anchor's channels are ``[tx, ty, tw, th, objectness, class logits...]`` with the anchor
as the slower axis, so it reshapes to ``(N, H / stride, W / stride, num_anchors, 5 + C)``.
Decoded boxes are flattened in ``(level, row, column, anchor)`` order.
"""

import tensorflow as tf

from yolo3.inference.detector_spec import (
    BOX_MERGE,
    BOX_MERGE_POWER,
    MAX_DETECTIONS,
    NMS_IOU_THRESHOLD,
    SCORE_THRESHOLD,
)
from yolo3.model.loss import box_iou, cell_offsets


def _as_hw(size):
    """``(height, width)`` from one int (square) or a pair; entries may be scalar tensors."""
    if isinstance(size, (tuple, list)) or len(getattr(size, "shape", ())) == 1:
        return size[0], size[1]
    return size, size


def decode_heads(outputs, head, input_hw):
    """Decodes raw heads into boxes and per-class scores.

    Args:
        outputs: list of raw heads, largest stride first, each
            ``(N, H_l, W_l, anchors_per_level * (5 + num_classes))`` float (cast to float32).
        head: the :class:`yolo3.model.head.HeadSpec` the network was built for: its levels'
            anchors (input pixels) and grid sensitivity, its class count.
        input_hw: ``(height, width)`` of the network input in pixels (or one int); Python
            ints or scalar tensors, so one trace serves any size.

    Returns:
        ``boxes`` ``(N, total_boxes, 4)`` float32, ``x_min, y_min, x_max, y_max`` in
        letterboxed input pixels, and ``scores`` ``(N, total_boxes, C)`` float32,
        ``sigmoid(objectness) * sigmoid(class logit)``, where
        ``total_boxes = sum_l H_l * W_l * anchors_per_level``. The box centre is
        ``(offset + cell) / grid_size * input_size``, the offset ``sigmoid(t_xy) * s - (s -
        1) / 2`` with ``s`` the level's ``xy_scale`` (:func:`yolo3.model.loss.cell_offsets`),
        and its size ``exp(t_wh) * anchor``.

    Raises:
        ValueError naming both counts when the outputs do not fit ``head``
        (:meth:`yolo3.model.head.HeadSpec.check_outputs`).
    """
    head.check_outputs([output.shape for output in outputs], "the network")
    num_classes = head.num_classes
    input_h, input_w = _as_hw(input_hw)
    input_wh = tf.cast(tf.stack([input_w, input_h]), tf.float32)
    all_boxes, all_scores = [], []
    for output, level in zip(outputs, head.levels(), strict=True):
        # Mixed-precision models emit float16; exp and sigmoid need float32 headroom.
        output = tf.cast(output, tf.float32)
        shape = tf.shape(output)
        batch, grid_h, grid_w = shape[0], shape[1], shape[2]
        output = tf.reshape(
            output, [batch, grid_h, grid_w, len(level.anchor_indices), 5 + num_classes]
        )

        # cell[row, col] = (col, row), broadcast over the anchor axis.
        cols, rows = tf.meshgrid(tf.range(grid_w), tf.range(grid_h))
        cell = tf.expand_dims(tf.cast(tf.stack([cols, rows], axis=-1), tf.float32), 2)
        grid_wh = tf.cast(tf.stack([grid_w, grid_h]), tf.float32)
        level_anchors = tf.constant(level.anchors, tf.float32)  # (anchors_per_level, 2)

        centre = (cell_offsets(output[..., 0:2], level.xy_scale) + cell) / grid_wh * input_wh
        size = tf.exp(output[..., 2:4]) * level_anchors
        boxes = tf.concat([centre - size / 2, centre + size / 2], axis=-1)
        scores = tf.sigmoid(output[..., 4:5]) * tf.sigmoid(output[..., 5:])
        all_boxes.append(tf.reshape(boxes, [batch, -1, 4]))
        all_scores.append(tf.reshape(scores, [batch, -1, num_classes]))
    return tf.concat(all_boxes, axis=1), tf.concat(all_scores, axis=1)


def letterbox_geometry_tf(image_hw, input_hw):
    """:func:`yolo3.data.image.letterbox_geometry` for a batch in TensorFlow ops (tf.function-safe).

    Args:
        image_hw: ``(N, 2)`` integer tensor of original ``(height, width)`` in pixels.
        input_hw: ``(height, width)`` of the network input, Python ints or scalar tensors.

    Returns:
        ``scale_yx`` ``(N, 2)`` float32 (``new_h / image_h``, ``new_w / image_w``) and
        ``offset_yx`` ``(N, 2)`` float32 (``offset_y``, ``offset_x``) in input pixels.
    """
    # Integer arithmetic, as the Python twin. int32 holds the products (input size x image
    # size) for images up to about 5 million pixels on a side at 416, and it is the integer
    # width that every exporter (TFLite's builtin floor division included) supports.
    image_hw = tf.cast(image_hw, tf.int32)
    image_h, image_w = image_hw[:, 0], image_hw[:, 1]
    input_h = tf.cast(input_hw[0], tf.int32)
    input_w = tf.cast(input_hw[1], tf.int32)
    width_limited = input_w * image_h <= input_h * image_w
    new_w = tf.where(width_limited, input_w, image_w * input_h // image_h)
    new_h = tf.where(width_limited, image_h * input_w // image_w, input_h)
    new_w, new_h = tf.maximum(new_w, 1), tf.maximum(new_h, 1)
    offset_yx = tf.stack([(input_h - new_h) // 2, (input_w - new_w) // 2], axis=-1)
    # float32 division of exact integers is the correctly rounded ratio.
    scale_yx = tf.cast(tf.stack([new_h, new_w], axis=-1), tf.float32) / tf.cast(
        image_hw, tf.float32
    )
    return scale_yx, tf.cast(offset_yx, tf.float32)


def undo_letterbox(boxes, image_hw, input_hw):
    """Maps boxes from letterboxed input pixels back to original-image pixels.

    Args:
        boxes: ``(N, num_boxes, 4)`` float, ``x_min, y_min, x_max, y_max`` in input pixels.
        image_hw: ``(N, 2)`` integer original ``(height, width)`` of each image.
        input_hw: ``(height, width)`` of the network input (or one int).

    Returns:
        ``(N, num_boxes, 4)`` float32 in original pixels, clipped to ``[0, width]`` x
        ``[0, height]``. The geometry is :func:`yolo3.data.image.letterbox_geometry`'s.
    """
    boxes = tf.cast(boxes, tf.float32)
    scale_yx, offset_yx = letterbox_geometry_tf(image_hw, _as_hw(input_hw))
    # (N, 2) in y, x order -> (N, 1, 4) in x_min, y_min, x_max, y_max order.
    scale = tf.expand_dims(tf.tile(tf.reverse(scale_yx, axis=[-1]), [1, 2]), 1)
    offset = tf.expand_dims(tf.tile(tf.reverse(offset_yx, axis=[-1]), [1, 2]), 1)
    image_wh = tf.reverse(tf.cast(image_hw, tf.float32), axis=[-1])
    upper = tf.expand_dims(tf.tile(image_wh, [1, 2]), 1)
    return tf.clip_by_value((boxes - offset) / scale, 0.0, upper)


def batched_nms(
    boxes,
    scores,
    *,
    score_threshold=SCORE_THRESHOLD,
    iou_threshold=NMS_IOU_THRESHOLD,
    max_detections=MAX_DETECTIONS,
    box_merge=BOX_MERGE,
):
    """Class-wise non-maximum suppression for a batch, with padded outputs.

    Args:
        boxes: ``(N, num_boxes, 4)`` float32 ``x_min, y_min, x_max, y_max`` (any units).
        scores: ``(N, num_boxes, C)`` float32 per-class scores in [0, 1].
        score_threshold: (box, class) pairs scoring at or below it are dropped first.
        iou_threshold: a box is suppressed by a higher-scoring box of the same class
            overlapping it with IoU above this.
        max_detections: detections kept per image (and per class), highest scores first.
        box_merge: each kept box becomes the weighted mean of the boxes it suppresses and
            itself (:func:`merge_boxes`); its score stays.

    Returns:
        ``boxes`` ``(N, max_detections, 4)`` float32, ``scores`` ``(N, max_detections)``
        float32, ``classes`` ``(N, max_detections)`` int32 and ``num_detections`` ``(N,)``
        int32. Rows past ``num_detections[i]`` are zero padding.
    """
    # One box shared by all classes (q = 1). IoU is the same whichever axis comes first, so
    # x-first boxes go in unchanged; clip_boxes=False because these are pixels, not [0, 1].
    nmsed_boxes, nmsed_scores, nmsed_classes, num_detections = (
        tf.image.combined_non_max_suppression(
            tf.expand_dims(tf.cast(boxes, tf.float32), 2),
            tf.cast(scores, tf.float32),
            max_output_size_per_class=max_detections,
            max_total_size=max_detections,
            iou_threshold=iou_threshold,
            score_threshold=score_threshold,
            clip_boxes=False,
        )
    )
    nmsed_classes = tf.cast(nmsed_classes, tf.int32)
    if box_merge:
        nmsed_boxes = merge_boxes(
            nmsed_boxes,
            nmsed_classes,
            boxes,
            scores,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
        )
    return nmsed_boxes, nmsed_scores, nmsed_classes, tf.cast(num_detections, tf.int32)


def _centre_size(corners):
    """``x_min, y_min, x_max, y_max`` -> centre x, y, width, height."""
    return tf.concat(
        [(corners[..., :2] + corners[..., 2:]) / 2, corners[..., 2:] - corners[..., :2]], -1
    )


def merge_boxes(kept, kept_classes, boxes, scores, *, score_threshold, iou_threshold):
    """Each box NMS kept, as the mean of the candidates of its class that overlap it by more
    than ``iou_threshold`` (itself among them), weighted by ``score * IoU ** p``
    (:data:`yolo3.inference.detector_spec.BOX_MERGE_POWER`); a candidate scoring at or below
    ``score_threshold`` for that class takes no part.

    Args:
        kept: ``(N, K, 4)`` boxes NMS kept (zero rows: padding, returned as they are).
        kept_classes: ``(N, K)`` int32, their classes.
        boxes, scores: the candidates NMS chose from, ``(N, B, 4)`` and ``(N, B, C)``.

    Returns:
        ``(N, K, 4)`` float32. Memory: ``N * K * B`` floats a few times over (100 detections
        of the 10,647 candidates of YOLOv3 at 416 px: 4 MB an image).
    """
    boxes, scores = tf.cast(boxes, tf.float32), tf.cast(scores, tf.float32)
    # Each candidate's score for each kept box's class, (N, K, B): a product with one-hot
    # rows, which every exporter holds (no gather with batch axes).
    chosen = tf.one_hot(kept_classes, tf.shape(scores)[-1], dtype=tf.float32)
    class_scores = tf.matmul(chosen, scores, transpose_b=True)
    overlap = box_iou(_centre_size(kept), _centre_size(boxes))  # the loss's IoU
    taking_part = (overlap > iou_threshold) & (class_scores > score_threshold)
    weights = tf.where(taking_part, class_scores * overlap**BOX_MERGE_POWER, 0.0)
    total = tf.reduce_sum(weights, axis=-1, keepdims=True)
    merged = tf.matmul(weights, boxes) / tf.where(total > 0.0, total, 1.0)
    return tf.where(total > 0.0, merged, kept)


def postprocess(
    outputs,
    head,
    image_hw,
    input_hw,
    *,
    score_threshold=SCORE_THRESHOLD,
    iou_threshold=NMS_IOU_THRESHOLD,
    max_detections=MAX_DETECTIONS,
    box_merge=BOX_MERGE,
):
    """Raw heads of a letterboxed batch -> detections in each image's original pixels.

    Args:
        outputs: raw heads, largest stride first (see :func:`decode_heads`).
        head: the :class:`yolo3.model.head.HeadSpec` the network was built for.
        image_hw: ``(N, 2)`` integer original ``(height, width)`` of each image; images in
            a batch may differ in size.
        input_hw: ``(height, width)`` of the network input (or one int).
        score_threshold, iou_threshold, max_detections, box_merge: see :func:`batched_nms`.

    Returns:
        ``boxes`` ``(N, max_detections, 4)`` float32 ``x_min, y_min, x_max, y_max`` in
        original pixels, ``scores`` ``(N, max_detections)`` float32, ``classes``
        ``(N, max_detections)`` int32 and ``num_detections`` ``(N,)`` int32; rows past
        ``num_detections[i]`` are zero padding.
    """
    boxes, scores = decode_to_image(outputs, head, image_hw, input_hw)
    return batched_nms(
        boxes,
        scores,
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
        max_detections=max_detections,
        box_merge=box_merge,
    )


def decode_to_image(outputs, head, image_hw, input_hw):
    """Raw heads of a letterboxed batch -> every candidate box in original pixels, before NMS.

    The first half of :func:`postprocess` (whose arguments these are), for engines that run
    the network and decoding but cannot hold class-wise NMS (TFLite's builtin operators).

    Returns:
        ``boxes`` ``(N, total_boxes, 4)`` float32 in original pixels, clipped to the image,
        and ``scores`` ``(N, total_boxes, C)`` float32, zero for boxes with no area left
        after clipping; :func:`batched_nms` on them gives :func:`postprocess`'s result.
    """
    boxes, scores = decode_heads(outputs, head, input_hw)
    boxes = undo_letterbox(boxes, image_hw, input_hw)
    # A box lying wholly in the letterbox padding clips to zero width or height; it covers
    # no pixel of the image, so it must not survive as a detection.
    has_area = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
    return boxes, scores * tf.expand_dims(tf.cast(has_area, scores.dtype), -1)
