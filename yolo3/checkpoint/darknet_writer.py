"""Keras -> Darknet: the inverse of :func:`yolo3.checkpoint.darknet.convert`.

:func:`write_darknet` writes a model of :mod:`yolo3.model.network` as a Darknet ``.cfg`` (the
sections of Darknet's own ``yolov3.cfg`` / ``yolov3-tiny.cfg``, :func:`cfg_text`) and ``.weights``
file, which Darknet and OpenCV's dnn module (``cv2.dnn.readNetFromDarknet``) run, and which
:func:`yolo3.checkpoint.darknet.convert` reads back to the same weights.
"""

import itertools

import numpy as np

from yolo3.checkpoint.darknet import Section, describe_cfg
from yolo3.fileio import atomic_write
from yolo3.model import network as yolo_model
from yolo3.model.resources import SCALE_X_Y, scale_x_y_per_head

# The [net] section of Darknet's own yolov3.cfg and yolov3-tiny.cfg, less width and height:
# batch=1 for inference; the rest only matters to Darknet when it trains (fine-tuning).
NET_OPTIONS = (
    ("batch", 1), ("subdivisions", 1), ("channels", 3), ("momentum", 0.9), ("decay", 0.0005),
    ("angle", 0), ("saturation", 1.5), ("exposure", 1.5), ("hue", 0.1),
    ("learning_rate", 0.001), ("burn_in", 1000), ("max_batches", 500200), ("policy", "steps"),
    ("steps", "400000,450000"), ("scales", ".1,.1"),
)  # fmt: skip
YOLO_OPTIONS = (("jitter", 0.3), ("ignore_thresh", 0.7), ("truth_thresh", 1), ("random", 1))


class _CfgBuilder:
    """Collects ``(kind, options)`` sections and knows each one's Darknet layer index."""

    def __init__(self, masks, yolo_options, scale_x_y):
        self.sections = []
        self.masks = iter(masks)
        self.scale_x_y = iter(scale_x_y)
        self.yolo_options = yolo_options

    @property
    def last(self):
        """Darknet index of the newest layer ([net] is not a layer)."""
        return len(self.sections) - 2

    def add(self, kind, **options):
        self.sections.append((kind, options))
        return self.last

    def conv(self, filters, size, stride=1):
        options = {"batch_normalize": 1, "filters": filters, "size": size, "stride": stride}
        return self.add("convolutional", **options, pad=1, activation="leaky")

    def head(self, filters):
        """The linear, biased 1x1 convolution of a head and its [yolo] section."""
        self.add("convolutional", size=1, stride=1, pad=1, filters=filters, activation="linear")
        mask = ",".join(str(index) for index in next(self.masks))
        scale = next(self.scale_x_y)
        # Written only where it differs from Darknet's default of 1, which keeps the cfg of
        # a YOLOv3-trained model section for section Darknet's own.
        text = np.format_float_positional(scale, trim="-")
        grid = {} if scale == SCALE_X_Y else {"scale_x_y": text}
        self.add("yolo", mask=mask, **self.yolo_options, **grid)


def _check_export_settings(model_type, num_classes, input_hw, anchors, anchor_masks):
    """``(height, width, anchors as float32, masks as lists)``; raises on a bad setting."""
    if model_type not in yolo_model.MODEL_TYPES:
        raise ValueError(
            f"unknown model type {model_type!r}; expected one of {yolo_model.MODEL_TYPES}"
        )
    if not isinstance(num_classes, int | np.integer) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    height, width = (input_hw, input_hw) if isinstance(input_hw, int) else input_hw
    for name, size in (("height", height), ("width", width)):
        if size < 32 or size % 32:
            raise ValueError(f"input {name} {size} is not a positive multiple of 32")
    anchors = np.asarray(anchors, np.float32)
    if anchors.ndim != 2 or anchors.shape[1] != 2 or not len(anchors) or np.any(anchors <= 0):
        raise ValueError(
            f"anchors must be (num_anchors, 2) positive w,h pairs in pixels, got {anchors.tolist()}"
        )
    masks = [[int(index) for index in mask] for mask in anchor_masks]
    num_heads = len(yolo_model.head_layer_names(model_type))
    if len(masks) != num_heads or len({len(mask) for mask in masks}) != 1 or not masks[0]:
        raise ValueError(
            f"anchor_masks {masks}: {model_type} needs {num_heads} heads (largest stride first) "
            "with the same number of anchors each"
        )
    if not all(0 <= index < len(anchors) for mask in masks for index in mask):
        raise ValueError(f"anchor_masks {masks} index past the {len(anchors)} anchors")
    return int(height), int(width), anchors, masks


def _cfg_sections(model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y=None):
    """The ``(kind, options)`` sections of the cfg for our network (see :func:`cfg_text`)."""
    height, width, anchors, masks = _check_export_settings(
        model_type, num_classes, input_hw, anchors, anchor_masks
    )
    scale_x_y = scale_x_y_per_head(scale_x_y, len(masks), "scale_x_y")
    # Shortest text that reads back as the same float32 (what convert stores).
    pairs = (",".join(np.format_float_positional(v, trim="-") for v in pair) for pair in anchors)
    yolo_options = {"anchors": ",  ".join(pairs), "classes": int(num_classes), "num": len(anchors)}
    cfg = _CfgBuilder(masks, {**yolo_options, **dict(YOLO_OPTIONS)}, scale_x_y)
    cfg.add("net", width=width, height=height, **dict(NET_OPTIONS))
    out_filters = len(masks[0]) * (5 + num_classes)
    if model_type == "tiny":
        for filters in (16, 32, 64, 128, 256):
            stride_16 = cfg.conv(filters, 3)
            cfg.add("maxpool", size=2, stride=2)
        cfg.conv(512, 3)
        cfg.add("maxpool", size=2, stride=1)
        cfg.conv(1024, 3)
        cfg.conv(256, 1)
        cfg.conv(512, 3)
        cfg.head(out_filters)
        cfg.add("route", layers=-4)
        cfg.conv(128, 1)
        cfg.add("upsample", stride=2)
        cfg.add("route", layers=f"-1, {stride_16}")
        cfg.conv(256, 3)
        cfg.head(out_filters)
        return cfg.sections
    cfg.conv(32, 3)
    taps = []
    for filters, num_blocks in ((64, 1), (128, 2), (256, 8), (512, 8), (1024, 4)):
        cfg.conv(filters, 3, stride=2)
        for _ in range(num_blocks):
            cfg.conv(filters // 2, 1)
            cfg.conv(filters, 3)
            cfg.add("shortcut", **{"from": -3, "activation": "linear"})
        taps.append(cfg.last)
    # Heads at strides 32, 16, 8; the last two concatenate Darknet-53's stride-16 / 8 output.
    for filters, tap in ((512, None), (256, taps[3]), (128, taps[2])):
        if tap is not None:
            cfg.add("route", layers=-4)
            cfg.conv(filters, 1)
            cfg.add("upsample", stride=2)
            cfg.add("route", layers=f"-1, {tap}")
        for _ in range(3):
            cfg.conv(filters, 1)
            cfg.conv(filters * 2, 3)
        cfg.head(out_filters)
    return cfg.sections


def _render_cfg(
    model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y=None, source="cfg"
):
    """``(text, [Section])``: the cfg text and what :func:`parse_cfg` reads from it."""
    sections = _cfg_sections(model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y)
    lines = [f"# {model_type} with {num_classes} classes, written by yolo3.checkpoint.darknet"]
    parsed = []
    for kind, options in sections:
        lines += ["", f"[{kind}]"]
        parsed.append(Section(kind, len(lines), {k: str(v) for k, v in options.items()}, source))
        lines += [f"{key}={value}" for key, value in options.items()]
    return "\n".join(lines) + "\n", parsed


def cfg_text(model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y=None):
    """The Darknet cfg of our ``model_type`` network: section for section Darknet's own
    ``yolov3.cfg`` / ``yolov3-tiny.cfg``, with these classes, anchors and input size.

    Args:
        model_type: ``"yolov3"`` or ``"tiny"``.
        num_classes: object classes.
        input_hw: ``(height, width)`` of [net] (an int for square), multiples of 32.
        anchors: ``(num_anchors, 2)`` w, h in input pixels, smallest first (9 or 6 pairs).
        anchor_masks: anchor indices per head, largest stride first, as this library stores
            them; Darknet lists its [yolo] sections in that order too, so each becomes the
            ``mask=`` of the [yolo] at the same position.
        scale_x_y: grid sensitivity, one number or one per head (None: 1), written as each
            [yolo]'s ``scale_x_y=`` (AlexeyAB Darknet's and OpenCV's key) where it is not 1.

    :func:`convert` reads the text back to the same anchors (float32), masks, classes and size.
    """
    return _render_cfg(model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y)[0]


def _named_weights(layer):
    return {w.name: value for w, value in zip(layer.weights, layer.get_weights(), strict=True)}


def _darknet_values(model, spec, model_type):
    """The arrays of [convolutional] ``spec`` from ``model``, in weights-file order."""
    name, bn_name = f"conv_{spec.index}", f"bn_{spec.index}"
    names = {layer.name for layer in model.layers}
    where = f"model {model.name}"
    if name not in names:
        raise ValueError(
            f"{where} has no layer {name}, which [convolutional] #{spec.index} of the "
            f"{model_type} cfg needs; is it a {model_type} model built by yolo3.model.network?"
        )
    conv = _named_weights(model.get_layer(name))
    expected = (spec.size, spec.size, spec.in_channels, spec.filters)
    found = tuple(conv["kernel"].shape) if "kernel" in conv else None
    if found != expected:
        raise ValueError(
            f"{where} layer {name}: kernel shape {found}, but the {model_type} cfg needs "
            f"{expected} (size, size, input channels, filters); check model_type, num_classes "
            "and the anchors per head"
        )
    kernel = conv["kernel"].transpose(3, 2, 0, 1)  # (h, w, in, out) -> Darknet's (out, in, h, w)
    if not spec.batch_norm:
        if "bias" not in conv or bn_name in names:
            raise ValueError(f"{where} layer {name}: a head must be biased, with no {bn_name}")
        return [conv["bias"], kernel]
    if "bias" in conv or bn_name not in names:
        raise ValueError(f"{where} layer {name}: needs {bn_name} after it and no bias")
    bn_layer = model.get_layer(bn_name)
    bn = _named_weights(bn_layer)
    ones = np.ones(spec.filters, np.float32)
    beta, gamma = bn.get("beta", 0 * ones), bn.get("gamma", ones)
    mean, variance = bn["moving_mean"], bn["moving_variance"]
    for key, array in (("beta", beta), ("gamma", gamma), ("mean", mean), ("variance", variance)):
        if array.shape != (spec.filters,):
            raise ValueError(
                f"{where} layer {bn_name}: {key} shape {array.shape}, expected ({spec.filters},)"
            )
    # convert() loads the variance into a layer with BN_EPSILON; folding the difference in
    # keeps sqrt(variance + epsilon), so a layer of another epsilon still computes the same.
    if bn_layer.epsilon != yolo_model.BN_EPSILON:
        variance = variance.astype(np.float64) + (bn_layer.epsilon - yolo_model.BN_EPSILON)
    return [beta, gamma, mean, variance, kernel]


def write_darknet(
    model,
    cfg_path,
    weights_path,
    *,
    model_type,
    num_classes,
    input_hw,
    anchors,
    anchor_masks,
    scale_x_y=None,
):
    """Writes ``model`` as a Darknet ``cfg_path`` (:func:`cfg_text`) and ``weights_path``.

    The weights file has Darknet's header for format 0.2 (int32 major 0, minor 2, revision 0,
    int64 ``seen`` 0), then per [convolutional] in cfg order ``beta, gamma, mean, variance``
    or the ``bias``, then the kernel as (out, in, height, width), all little-endian float32.
    Both files are written atomically, and only after every layer has been checked.

    Args:
        model: a ``model_type`` network of :mod:`yolo3.model.network` (layers ``conv_k`` /
            ``bn_k``).
        model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y: see
            :func:`cfg_text`.

    Raises:
        ValueError naming the layer when ``model`` lacks one the cfg needs or its shapes
        differ (another model type, class count or number of anchors per head).
    """
    settings = (model_type, num_classes, input_hw, anchors, anchor_masks, scale_x_y)
    text, sections = _render_cfg(*settings, source=str(cfg_path))
    convs = describe_cfg(sections, cfg_path)["convs"]
    values = [_darknet_values(model, spec, model_type) for spec in convs]
    with atomic_write(cfg_path) as cfg_temp, atomic_write(weights_path) as weights_temp:
        with open(cfg_temp, "w", encoding="utf-8") as f:
            f.write(text)
        with open(weights_temp, "wb") as f:
            f.write(np.asarray([0, 2, 0], "<i4").tobytes())
            f.write(np.asarray([0], "<i8").tobytes())  # seen: 64 bits from format 0.2 on
            for array in itertools.chain.from_iterable(values):
                f.write(np.ascontiguousarray(array, "<f4").tobytes())
