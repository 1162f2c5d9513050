"""Shared builders for tests: small models, random boxes and NumPy reference implementations."""

import keras
import numpy as np
import tensorflow as tf

from yolo3.model.head import HeadSpec
from yolo3.model.layers import SyncBatchNormalization
from yolo3.model.network import tiny_yolo_body

# Anchors sized for 64-128 px test inputs, smallest first as in Darknet's files.
SMALL_ANCHORS = np.array([[6, 8], [10, 14], [16, 16], [24, 30], [40, 36], [56, 60]], np.float32)
SMALL_MASKS = ((3, 4, 5), (0, 1, 2))


def make_head(anchors=SMALL_ANCHORS, num_classes=2, **fields):
    """A :class:`HeadSpec` of ``anchors`` with ``num_classes`` classes named "0", "1", ...;
    ``fields`` (``scale_x_y``, ``anchor_masks``, ``input_hw``, ...) as HeadSpec takes them."""
    return HeadSpec(anchors=anchors, class_names=[str(i) for i in range(num_classes)], **fields)


def tiny_model(num_classes=2, size=64, **kwargs):
    kwargs.setdefault("weight_decay", 0.0)
    return tiny_yolo_body(None, 3, num_classes, input_shape=(size, size, 3), **kwargs)


def micro_model(num_classes=2, size=64, synchronized_bn=False):
    """A YOLO head of tiny's shape on three convolutions: two levels at strides 32 and 16,
    ``3 * (5 + num_classes)`` channels each, batch norm in every block (the network's
    synchronised kind with ``synchronized_bn``).

    For tests that compare runs of the trainer with each other (local steps, the dense
    warm-up, accumulation against one device): a trace of its step on four replicas takes
    about a third of tiny's, and every weight kind the exchange handles is there (kernels,
    biases, batch-norm scales and moving statistics).
    """
    layers = keras.layers
    norm = SyncBatchNormalization if synchronized_bn else layers.BatchNormalization
    inputs = keras.Input((size, size, 3))

    def block(x, filters, stride):
        x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        return layers.LeakyReLU(0.1)(norm()(x))

    stride16 = block(block(inputs, 8, 4), 16, 4)
    stride32 = block(stride16, 32, 2)
    heads = [layers.Conv2D(3 * (5 + num_classes), 1)(x) for x in (stride32, stride16)]
    return keras.Model(inputs, heads)


def random_boxes(rng, batch, max_boxes, size, num_classes, fill=0.6):
    """(batch, max_boxes, 5) float32 boxes inside a ``size`` x ``size`` input, some rows padding."""
    boxes = np.zeros((batch, max_boxes, 5), np.float32)
    for image in range(batch):
        for row in range(max_boxes):
            if rng.random() > fill:
                continue
            w, h = rng.uniform(4, size * 0.8, size=2)
            x0 = rng.uniform(0, size - w)
            y0 = rng.uniform(0, size - h)
            boxes[image, row] = [x0, y0, x0 + w, y0 + h, rng.integers(num_classes)]
    return boxes


def numpy_targets(
    boxes, input_hw, anchors, num_classes, anchor_masks, iou_thresh=1.0, neighbour_cells=False
):
    """Loop-per-box reference of the original ``preprocess_true_boxes`` assignment; with
    ``iou_thresh`` < 1, AlexeyAB Darknet's: also every anchor whose IoU is above it; with
    ``neighbour_cells``, YOLOv5's: also the cells beside the centre's nearest to the centre,
    written first (x, then y), so that a centre's entry overwrites them."""
    height, width = input_hw
    batch = boxes.shape[0]
    strides = [32 // 2**level for level in range(len(anchor_masks))]
    targets = [
        np.zeros((batch, height // s, width // s, len(m), 5 + num_classes), np.float32)
        for s, m in zip(strides, anchor_masks)
    ]
    for phase in ("x", "y", "centre") if neighbour_cells else ("centre",):
        for image in range(batch):
            for x0, y0, x1, y1, class_id in boxes[image]:
                w, h = x1 - x0, y1 - y0
                if w <= 0 or h <= 0:
                    continue
                ious = []
                for aw, ah in anchors:
                    inter = min(w, aw) * min(h, ah)
                    ious.append(inter / (w * h + aw * ah - inter))
                best = int(np.argmax(ious))
                chosen = [n for n in range(len(anchors)) if n == best or ious[n] > iou_thresh]
                for level, mask in enumerate(anchor_masks):
                    for anchor in chosen:
                        if anchor not in mask:
                            continue
                        grid_h, grid_w = targets[level].shape[1:3]
                        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
                        gx, gy = cx / width * grid_w, cy / height * grid_h
                        col = min(int(np.floor(gx)), grid_w - 1)
                        row = min(int(np.floor(gy)), grid_h - 1)
                        if phase == "x":
                            col += -1 if gx - col < 0.5 else 1
                        elif phase == "y":
                            row += -1 if gy - row < 0.5 else 1
                        if not (0 <= col < grid_w and 0 <= row < grid_h):
                            continue
                        slot = list(mask).index(anchor)
                        cell = targets[level][image, row, col, slot]
                        cell[:] = 0
                        cell[:4] = [cx / width, cy / height, w / width, h / height]
                        cell[4] = 1
                        cell[5 + int(class_id)] = 1
    return targets


def _bce(label, logit):
    return max(logit, 0) - logit * label + np.log1p(np.exp(-abs(logit)))


def _iou_xywh(a, b):
    ax0, ay0, ax1, ay1 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx0, by0, bx1, by1 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    iw, ih = max(min(ax1, bx1) - max(ax0, bx0), 0), max(min(ay1, by1) - max(ay0, by0), 0)
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def numpy_loss(
    targets,
    outputs,
    anchors,
    num_classes,
    anchor_masks,
    ignore_thresh,
    true_boxes=None,
    scale_x_y=None,
):
    """Cell-by-cell reference of the per-image loss; returns (N,) totals and a dict of terms.

    The ignore mask compares with ``true_boxes`` (N, max_boxes, >= 4 corner pixels; padding
    rows zero) when given, else with the cells assigned in ``targets``. ``scale_x_y`` (one
    per level) scales the sigmoid of the centre, ``s sigmoid(t) - (s - 1) / 2``, and the xy
    term is the cross-entropy of the sigmoid against the truth's offset carried back through
    that map, ``(offset + (s - 1) / 2) / s``.
    """
    batch = targets[0].shape[0]
    input_w = outputs[0].shape[2] * 32
    input_h = outputs[0].shape[1] * 32
    terms = {name: np.zeros(batch) for name in ("xy", "wh", "objectness", "class")}
    for image in range(batch):
        if true_boxes is None:
            truths = [
                level[image][index][:4]
                for level in targets
                for index in np.ndindex(level.shape[1:4])
                if level[image][index][4] > 0
            ]
        else:
            truths = [
                ((x0 + x1) / 2 / input_w, (y0 + y1) / 2 / input_h, (x1 - x0) / input_w,
                 (y1 - y0) / input_h)
                for x0, y0, x1, y1 in np.asarray(true_boxes[image], np.float64)[:, :4]
                if x1 > x0 and y1 > y0
            ]  # fmt: skip
        for level, mask in enumerate(anchor_masks):
            s = 1.0 if scale_x_y is None else scale_x_y[level]
            grid_h, grid_w = outputs[level].shape[1:3]
            raw = np.asarray(outputs[level][image], np.float64).reshape(
                grid_h, grid_w, len(mask), 5 + num_classes
            )
            for row, col, slot in np.ndindex(grid_h, grid_w, len(mask)):
                t = targets[level][image, row, col, slot]
                r = raw[row, col, slot]
                aw, ah = anchors[mask[slot]]
                sig = s / (1 + np.exp(-r[:2])) - (s - 1) / 2
                pred = [
                    (sig[0] + col) / grid_w,
                    (sig[1] + row) / grid_h,
                    np.exp(r[2]) * aw / input_w,
                    np.exp(r[3]) * ah / input_h,
                ]
                if t[4] > 0:
                    scale = 2 - t[2] * t[3]
                    tx, ty = t[0] * grid_w - col, t[1] * grid_h - row
                    tx, ty = (tx + (s - 1) / 2) / s, (ty + (s - 1) / 2) / s
                    tw, th = np.log(t[2] * input_w / aw), np.log(t[3] * input_h / ah)
                    terms["xy"][image] += scale * (_bce(tx, r[0]) + _bce(ty, r[1]))
                    terms["wh"][image] += scale * 0.5 * ((tw - r[2]) ** 2 + (th - r[3]) ** 2)
                    terms["objectness"][image] += _bce(1, r[4])
                    terms["class"][image] += sum(
                        _bce(t[5 + c], r[5 + c]) for c in range(num_classes)
                    )
                else:
                    best = max([_iou_xywh(pred, truth) for truth in truths], default=0.0)
                    if best < ignore_thresh:
                        terms["objectness"][image] += _bce(0, r[4])
    total = sum(terms.values())
    return total, terms


def write_voc_xml(path, boxes, class_names, *, image_size=None, difficult=None):
    """Writes a Pascal VOC annotation file at ``path`` (a ``pathlib.Path``): one ``<object>``
    per box.

    Args:
        boxes: ``[(x_min, y_min, x_max, y_max, class_id), ...]`` in image pixels; the class
            id indexes ``class_names``.
        image_size: ``(width, height)``: adds ``<filename>`` (the file's stem, ``.jpg``) and
            ``<size>``. None leaves both out; the VOC reader does not need them.
        difficult: indices of the boxes marked difficult; given, even empty, every object
            has a ``<difficult>`` of 0 or 1. None: no object has one (the reader takes 0).
    Returns:
        ``path``.
    """
    objects = "".join(
        f"<object><name>{class_names[class_id]}</name>"
        + ("" if difficult is None else f"<difficult>{int(index in difficult)}</difficult>")
        + f"<bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax>"
        "</bndbox></object>"
        for index, (x0, y0, x1, y1, class_id) in enumerate(boxes)
    )
    header = ""
    if image_size is not None:
        width, height = image_size
        header = (
            f"<filename>{path.stem}.jpg</filename><size><width>{width}</width>"
            f"<height>{height}</height><depth>3</depth></size>"
        )
    path.write_text(f"<annotation>{header}{objects}</annotation>")
    return path


def distribute_per_replica(strategy, values):
    """Distributed values of ``strategy`` whose replica r holds ``values[r]`` (an array, or a
    list or tuple of arrays) as tensors."""
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.nest.map_structure(tf.constant, values[context.replica_id_in_sync_group])
    )


def save_problem(path, initial, **arrays):
    """Writes the ``.npz`` file that a step script run in a process of its own reads:
    ``arrays`` under their names, and the model's ``initial`` weights as ``initial_0``,
    ``initial_1``, ... with their count, ``num_weights`` (:func:`initial_weights` reads them
    back). Returns ``path``."""
    numbered = {f"initial_{i}": w for i, w in enumerate(initial)}
    np.savez(path, **arrays, num_weights=len(initial), **numbered)
    return path


def initial_weights(problem):
    """The initial weights of a :func:`save_problem` file (as ``np.load`` opens it), in order."""
    return [problem[f"initial_{i}"] for i in range(int(problem["num_weights"]))]


def load_tool(name):
    """The module of a command (``yolo3/commands/<name>.py``) or, for the benchmark harness,
    of ``tools/<name>.py`` (the tools folder is not a package)."""
    import importlib
    import importlib.util
    from pathlib import Path

    if name != "benchmark":
        return importlib.import_module(f"yolo3.commands.{name}")
    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def float64_copy(model):
    """The same network and weights computing in float64, free of float32 rounding."""

    def clone(layer):
        config = layer.get_config()
        config["dtype"] = "float64"
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
