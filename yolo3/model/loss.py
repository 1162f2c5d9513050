"""The YOLOv3 loss as a pure function returning one value per image.

Why per image: under ``tf.distribute`` each replica sees a slice of the global batch and
the gradients of the replicas are summed. A per-image loss of shape (N, 1) lets the
training step divide by the *global* batch size (``tf.nn.compute_average_loss``), so the
summed gradient is the gradient of the global mean. A scalar mean over the local batch,
as the original computed, is silently multiplied by the number of replicas.

The terms are those of the original keras-yolo3 (and Darknet's yolo layer):
- xy: binary cross-entropy between the sigmoid cell offsets and the true offsets,
- wh: 0.5 * squared error in log space against ``log(true_wh / anchor)``,
  both weighted by ``2 - w * h`` (w, h as fractions of the input) and only where an
  object is assigned;
- objectness: cross-entropy, where predicted boxes with an IoU above ``ignore_thresh``
  with any true box of the same image are not penalised as background (all the image's
  boxes when they are given, as in Darknet; else those assigned in the targets);
- class: sigmoid cross-entropy per class where an object is assigned.
``objectness_iou`` (YOLOv5's ``gr``) moves the objectness target of an assigned prediction
from 1 towards the IoU of its box with the true box, ``1 - r + r * IoU`` (the IoU held
constant in the gradient), so that a detection's score also ranks how well it fits; 0 is
YOLOv3's target.
Each term is summed over cells, anchors and levels; the mean of the per-image totals over
a batch equals the original's ``sum / batch_size``.

``iou_loss`` replaces the xy and wh terms by one box term, ``1 - IoU`` or a variant of it
between the decoded prediction and the true box where an object is assigned (GIoU,
Rezatofighi et al. CVPR 2019; DIoU and CIoU, Zheng et al. AAAI 2020), as AlexeyAB's Darknet
does with the ``[yolo]`` keys of the same names. ``iou_normalizer``, ``obj_normalizer`` and
``cls_normalizer`` weigh the box (or xy and wh), objectness and class terms; at their
defaults (``mse``, 1, 1, 1) the loss is YOLOv3's. In AlexeyAB's Darknet the MSE box deltas
also carry ``iou_normalizer`` and the IoU ones do not carry the ``2 - w * h`` scale; both
hold here.
"""

import dataclasses
import math

import tensorflow as tf
from keras import ops

# Darknet's ignore_thresh in every [yolo] layer of yolov3.cfg and yolov3-tiny.cfg. The
# original keras-yolo3 used .5 for YOLOv3 (and .7 for tiny); training here follows Darknet,
# whose published figures are the ones results are compared with.
IGNORE_THRESH = 0.7
LOSS_TERMS = ("xy", "wh", "objectness", "class")
# Every term any box loss returns: the one list the logs, the non-finite check, the history
# and MLflow read (a new term is added here and returned by yolo_loss; nothing else names it).
ALL_LOSS_TERMS = ("xy", "wh", "box", "objectness", "class")
# The box terms of iou_loss: "mse" is YOLOv3's xy and wh terms, the others one box term.
IOU_LOSSES = ("mse", "iou", "giou", "diou", "ciou")
# Truth boxes per image for the ignore mask when only targets are given (Darknet's default).
MAX_TRUE_BOXES = 90
# exp() of a raw width/height logit above this overflows float32 box areas in the IoU.
_MAX_LOG_SCALE = 10.0


def _cell_grid(grid_h, grid_w):
    """(grid_h, grid_w, 1, 2) float32 holding each cell's (column, row)."""
    columns, rows = ops.meshgrid(ops.arange(grid_w), ops.arange(grid_h))
    grid = ops.stack([columns, rows], axis=-1)
    return ops.cast(ops.expand_dims(grid, 2), "float32")


def cell_offsets(xy_logits, xy_scale=1.0):
    """A box centre's offset in its cell, ``sigmoid(t) * s - (s - 1) / 2``, from the raw
    ``t_xy`` logits (any shape, float32) and one level's grid sensitivity ``s``
    (:attr:`yolo3.model.head.HeadLevel.xy_scale`, a Python float; 1 is YOLOv3's
    ``sigmoid(t)``)."""
    offsets = ops.sigmoid(xy_logits)
    if xy_scale == 1.0:
        return offsets
    return offsets * xy_scale - 0.5 * (xy_scale - 1.0)


def _box_corners(xywh):
    return xywh[..., :2] - xywh[..., 2:4] / 2, xywh[..., :2] + xywh[..., 2:4] / 2


def box_iou(boxes_a, boxes_b):
    """IoU of every box in ``boxes_a`` (N, P, 4) with every box in ``boxes_b`` (N, T, 4).

    Boxes are centre x, y, width, height in any shared unit. Returns (N, P, T); a zero-size
    box has IoU 0 with everything.
    """
    a_min, a_max = _box_corners(boxes_a[:, :, None, :])
    b_min, b_max = _box_corners(boxes_b[:, None, :, :])
    overlap = ops.maximum(ops.minimum(a_max, b_max) - ops.maximum(a_min, b_min), 0.0)
    intersection = overlap[..., 0] * overlap[..., 1]
    area_a = boxes_a[:, :, None, 2] * boxes_a[:, :, None, 3]
    area_b = boxes_b[:, None, :, 2] * boxes_b[:, None, :, 3]
    return intersection / ops.maximum(area_a + area_b - intersection, 1e-12)


# The weight of the box term when none is given: YOLOv3's 1 for its xy and wh terms; 8 for
# 1 - CIoU (with the heads' priors and neighbour cells, COCO AP 0.710 against 0.683 on the
# demo's task and 0.728 against 0.681 at 256 px with 1,000 images; before them, with one
# cell a box, 1 was too weak against the objectness and class sums and 8 too strong:
# docs/benchmarks.md, "The training recipe"); 4 for the other IoU terms, not measured again.
DEFAULT_IOU_NORMALIZER = {"mse": 1.0, "iou": 4.0, "giou": 4.0, "diou": 4.0, "ciou": 8.0}
# The recipe's objectness target share (YOLOv5's gr, which is 1 too): with the neighbour
# cells and the heads' priors several predictions learn each box, and a score that ranks
# how well each fits keeps the tighter one through NMS: COCO AP 0.734 against 0.710 on the
# demo's task, 0.742 against 0.728 at 256 px with 1,000 images, AP75 most; it costs 0.043
# at 96 px with 1,000 images (63 steps an epoch), where the early boxes are poor and the
# target low (docs/benchmarks.md, "The recipe beyond the demo's task"). Before the
# neighbour cells it measured nothing.
OBJECTNESS_IOU = 1.0


@dataclasses.dataclass(frozen=True)
class LossOptions:
    """The box term and the weights of :func:`yolo_loss`'s terms (its keyword arguments of
    the same names), checked once wherever they come from.

    The defaults are the training recipe's from scratch (``yolo3 train``'s and
    :class:`yolo3.engine.trainer.YoloTrainer`'s): 1 - CIoU at weight 8 and the objectness
    target :data:`OBJECTNESS_IOU`, measured against YOLOv3's terms on the demo's task
    (docs/benchmarks.md); ``iou_loss="mse", objectness_iou=0`` is YOLOv3's loss, which is
    also :func:`yolo_loss`'s own default. ``iou_normalizer=None`` takes
    :data:`DEFAULT_IOU_NORMALIZER` of the box term.
    """

    iou_loss: str = "ciou"
    iou_normalizer: float | None = None
    obj_normalizer: float = 1.0
    cls_normalizer: float = 1.0
    label_smoothing: float = 0.0
    objectness_iou: float = OBJECTNESS_IOU

    def __post_init__(self):
        loss_terms(self.iou_loss)  # raises for an unknown kind
        if self.iou_normalizer is None:
            object.__setattr__(self, "iou_normalizer", DEFAULT_IOU_NORMALIZER[self.iou_loss])
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing {self.label_smoothing}: use a value in [0, 1)")
        if not 0.0 <= self.objectness_iou <= 1.0:
            raise ValueError(f"--objectness-iou {self.objectness_iou}: use a value in [0, 1]")
        for name in ("iou_normalizer", "obj_normalizer", "cls_normalizer"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} {value}: use a weight above 0")


def term_log_key(term):
    """The key a run logs term ``term`` under: ``"box"`` -> ``"box_loss"``."""
    return f"{term}_loss"


def loss_terms(iou_loss="mse"):
    """The names of the terms :func:`yolo_loss` returns for ``iou_loss``."""
    if iou_loss not in IOU_LOSSES:
        raise ValueError(f"iou_loss {iou_loss!r}: use one of {', '.join(IOU_LOSSES)}")
    return LOSS_TERMS if iou_loss == "mse" else ("box", "objectness", "class")


def iou_variant(pred, true, kind):
    """IoU, GIoU, DIoU or CIoU of aligned boxes: ``pred`` and ``true`` (..., 4) centre x,
    y, width, height in one unit (pixels: CIoU's aspect ratios need equal units on both
    axes); returns (..., 1). Finite for a zero-size ``true`` (padding), whose IoU is 0.

    GIoU subtracts the part of the enclosing box neither box covers; DIoU the squared
    centre distance over the enclosing box's squared diagonal; CIoU also ``alpha * v``, with
    ``v`` the squared difference of the boxes' aspect angles times 4 / pi^2 and ``alpha =
    v / (1 - IoU + v)`` held constant in the gradient, as in the paper.
    """
    pred_min, pred_max = _box_corners(pred)
    true_min, true_max = _box_corners(true)
    overlap = ops.maximum(ops.minimum(pred_max, true_max) - ops.maximum(pred_min, true_min), 0.0)
    intersection = overlap[..., 0:1] * overlap[..., 1:2]
    union = pred[..., 2:3] * pred[..., 3:4] + true[..., 2:3] * true[..., 3:4] - intersection
    iou = intersection / ops.maximum(union, 1e-9)
    if kind == "iou":
        return iou
    enclose = ops.maximum(pred_max, true_max) - ops.minimum(pred_min, true_min)
    if kind == "giou":
        area = enclose[..., 0:1] * enclose[..., 1:2]
        return iou - (area - union) / ops.maximum(area, 1e-9)
    diagonal = ops.sum(ops.square(enclose), axis=-1, keepdims=True)
    distance = ops.sum(ops.square(pred[..., 0:2] - true[..., 0:2]), axis=-1, keepdims=True)
    diou = iou - distance / ops.maximum(diagonal, 1e-9)
    if kind == "diou":
        return diou
    if kind != "ciou":
        raise ValueError(f"iou kind {kind!r}: use iou, giou, diou or ciou")

    def angle(box):
        return ops.arctan(box[..., 2:3] / ops.maximum(box[..., 3:4], 1e-9))

    v = (4.0 / 3.141592653589793**2) * ops.square(angle(true) - angle(pred))
    alpha = ops.stop_gradient(v / ops.maximum(1.0 - iou + v, 1e-9))
    return diou - alpha * v


def _boxes_from_targets(y_true, max_true_boxes):
    """Boxes assigned in the targets, gathered from every level; static shapes (XLA-safe).

    Returns (N, T, 4) centre x, y, width, height as input fractions, zero-padded, with
    T = min(max_true_boxes, cells x anchors over all levels): the first T assigned cells of
    each image in level order (Darknet's ``[yolo]`` layer holds at most 90 truths too).
    """
    flat = [ops.reshape(level[..., :5], (ops.shape(level)[0], -1, 5)) for level in y_true]
    flat = ops.concatenate(flat, axis=1)
    num_cells = sum(
        int(level.shape[1]) * int(level.shape[2]) * int(level.shape[3]) for level in y_true
    )
    count = min(int(max_true_boxes), num_cells)
    # top_k over 0/1 objectness picks assigned cells, ties in index order: level order.
    _, indices = tf.math.top_k(flat[..., 4], k=count, sorted=True)
    gathered = tf.gather(flat, indices, batch_dims=1)
    return gathered[..., :4] * gathered[..., 4:5]


def boxes_to_xywh(boxes, input_wh):
    """Padded corner boxes (N, T, >= 4) in input pixels -> (N, T, 4) centre x, y, width,
    height as input fractions; padding rows (zero width or height) stay zero-size."""
    boxes = ops.cast(boxes[..., :4], "float32")
    corner_min, corner_max = boxes[..., 0:2], boxes[..., 2:4]
    size = ops.maximum(corner_max - corner_min, 0.0)
    centre = (corner_min + corner_max) / 2
    return ops.concatenate([centre / input_wh, size / input_wh], axis=-1)


def _sigmoid_bce(labels, logits):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def yolo_loss(
    y_true,
    y_pred,
    *,
    head,
    ignore_thresh=IGNORE_THRESH,
    true_boxes=None,
    max_true_boxes=MAX_TRUE_BOXES,
    iou_loss="mse",
    iou_normalizer=1.0,
    obj_normalizer=1.0,
    cls_normalizer=1.0,
    label_smoothing=0.0,
    objectness_iou=0.0,
):
    """Per-image YOLOv3 loss.

    Over 80 lines: the four terms of the loss written out in one place, level by level.

    Args:
        y_true: per-level targets from :func:`yolo3.model.targets.build_targets`, largest stride
            first, each (N, H_l, W_l, anchors_in_level, 5 + num_classes).
        y_pred: raw model outputs, same order, each (N, H_l, W_l, anchors_in_level *
            (5 + num_classes)); any float dtype (cast to float32 here).
        head: the :class:`yolo3.model.head.HeadSpec` the model was built for: its classes,
            the anchors of each level (sizes in input pixels) and each level's grid
            sensitivity (``HeadLevel.xy_scale``; 1 is YOLOv3's): the predicted centre's
            offset in its cell is :func:`cell_offsets`. With ``mse`` the xy term's
            targets move into the sigmoid's range to match, ``(offset + (s - 1) / 2) / s``.
        ignore_thresh: IoU above which a predicted box is not penalised as background.
        true_boxes: the boxes the targets were built from, (N, max_boxes, >= 4) float32
            x_min, y_min, x_max, y_max in input pixels (padding rows zero), as
            :func:`yolo3.model.targets.build_targets` takes them. The ignore mask compares each
            prediction with all of them, as Darknet's ``[yolo]`` layer does. Without them it
            compares with the boxes assigned in ``y_true`` (at most ``max_true_boxes`` per
            image, the first in level order), which leaves out a box that lost its cell and
            anchor to another.
        max_true_boxes: the cap of that fallback; shapes stay static, so the loss compiles
            with XLA either way.
        iou_loss: one of :data:`IOU_LOSSES`: ``mse`` (YOLOv3's xy and wh terms) or the
            box term ``1 - IoU``, ``1 - GIoU``, ``1 - DIoU``, ``1 - CIoU``.
        iou_normalizer, obj_normalizer, cls_normalizer: weights of the box (or xy and wh),
            objectness and class terms (AlexeyAB Darknet's ``[yolo]`` keys).
        label_smoothing: class targets ``y (1 - eps) + eps / 2`` (AlexeyAB Darknet's
            ``label_smooth_eps``): 1 becomes ``1 - eps / 2``, 0 becomes ``eps / 2``.
        objectness_iou: the share ``r`` of an assigned prediction's objectness target taken
            from its box's IoU with the true box, ``1 - r + r * IoU``; 0 is YOLOv3's 1.

    Returns:
        ``(total, terms)``: total (N, 1) float32 per-image loss, and a dict mapping each name
        of :func:`loss_terms` ``(iou_loss)`` to its (N, 1) per-image value, weighted.
    """
    names = loss_terms(iou_loss)
    num_classes = head.num_classes
    if len(y_true) != head.num_levels or len(y_pred) != head.num_levels:
        raise ValueError(
            f"{head.num_levels} output levels expected from the anchor masks; got "
            f"{len(y_true)} targets and {len(y_pred)} predictions"
        )
    y_true = [ops.cast(level, "float32") for level in y_true]
    # The largest stride is 32, so the input size is the first grid times 32.
    grid_0 = ops.shape(y_pred[0])
    input_wh = ops.cast(ops.stack([grid_0[2] * 32, grid_0[1] * 32]), "float32")
    if true_boxes is None:
        true_boxes = _boxes_from_targets(y_true, max_true_boxes)
    else:
        true_boxes = boxes_to_xywh(true_boxes, input_wh)
        if true_boxes.shape[1] in (0, None):  # keeps the max over true boxes defined
            true_boxes = ops.pad(true_boxes, [[0, 0], [0, 1], [0, 0]])
    true_boxes = ops.stop_gradient(true_boxes)

    terms = {name: 0.0 for name in names}
    for level in head.levels():
        target = y_true[level.index]
        shape = ops.shape(y_pred[level.index])
        batch, grid_h, grid_w = shape[0], shape[1], shape[2]
        per_cell = len(level.anchor_indices)
        raw = ops.reshape(
            ops.cast(y_pred[level.index], "float32"),
            (batch, grid_h, grid_w, per_cell, 5 + num_classes),
        )
        level_anchors = ops.convert_to_tensor(level.anchors, "float32")
        grid = _cell_grid(grid_h, grid_w)
        grid_wh = ops.cast(ops.stack([grid_w, grid_h]), "float32")

        object_mask = target[..., 4:5]
        true_xy = target[..., 0:2] * grid_wh - grid
        # log(0) guard: width/height targets exist only where an object is assigned.
        wh_ratio = target[..., 2:4] * input_wh / level_anchors
        true_wh = ops.where(object_mask > 0, ops.log(ops.maximum(wh_ratio, 1e-9)), 0.0)
        box_scale = 2.0 - target[..., 2:3] * target[..., 3:4]

        scale = level.xy_scale
        pred_xy = (cell_offsets(raw[..., 0:2], scale) + grid) / grid_wh
        pred_wh = ops.exp(ops.minimum(raw[..., 2:4], _MAX_LOG_SCALE)) * level_anchors / input_wh
        pred_boxes = ops.reshape(ops.concatenate([pred_xy, pred_wh], axis=-1), (batch, -1, 4))
        best_iou = ops.max(box_iou(ops.stop_gradient(pred_boxes), true_boxes), axis=-1)
        ignore_mask = ops.cast(
            ops.reshape(best_iou < ignore_thresh, (batch, grid_h, grid_w, per_cell, 1)),
            "float32",
        )

        class_target = target[..., 5:] * (1.0 - label_smoothing) + 0.5 * label_smoothing
        pixels = ops.concatenate([input_wh, input_wh], axis=0)
        decoded = ops.concatenate([pred_xy, pred_wh], axis=-1) * pixels
        objectness_target = object_mask
        if objectness_iou:
            fit = ops.stop_gradient(iou_variant(decoded, target[..., 0:4] * pixels, "iou"))
            objectness_target = object_mask * (1.0 - objectness_iou + objectness_iou * fit)
        objectness_bce = _sigmoid_bce(objectness_target, raw[..., 4:5])
        objectness = (
            object_mask * objectness_bce + (1.0 - object_mask) * objectness_bce * ignore_mask
        )
        level_terms = {
            "objectness": obj_normalizer * objectness,
            "class": cls_normalizer * object_mask * _sigmoid_bce(class_target, raw[..., 5:]),
        }
        if iou_loss == "mse":
            box_weight = iou_normalizer * object_mask * box_scale
            # The sigmoid that cell_offsets scales reaches the true offset at this value.
            xy_target = (true_xy + 0.5 * (scale - 1.0)) / scale
            level_terms["xy"] = box_weight * _sigmoid_bce(xy_target, raw[..., 0:2])
            level_terms["wh"] = box_weight * 0.5 * ops.square(true_wh - raw[..., 2:4])
        else:
            variant = iou_variant(decoded, target[..., 0:4] * pixels, iou_loss)
            level_terms["box"] = iou_normalizer * object_mask * (1.0 - variant)
        for name, value in level_terms.items():
            terms[name] = terms[name] + ops.sum(value, axis=(1, 2, 3, 4))

    terms = {name: ops.expand_dims(value, -1) for name, value in terms.items()}
    total = sum(terms[name] for name in names)
    return total, terms


def replica_loss(per_image_loss, global_batch_size, regularization_losses=()):
    """The scalar one replica differentiates so that summed gradients equal the global mean.

    ``sum(per_image_loss) / global_batch_size`` plus the model's regularisation losses
    divided by the number of replicas (each replica adds them once).
    """
    loss = tf.nn.compute_average_loss(
        ops.reshape(per_image_loss, (-1,)), global_batch_size=global_batch_size
    )
    if regularization_losses:
        loss = loss + tf.nn.scale_regularization_loss(ops.sum(ops.stack(regularization_losses)))
    return loss
