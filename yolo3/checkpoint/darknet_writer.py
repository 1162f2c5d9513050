"""Keras -> Darknet: the inverse of :func:`yolo3.checkpoint.darknet.convert`.

:func:`write_darknet` writes a model of :mod:`yolo3.model.network` as a Darknet ``.cfg`` (the
sections of Darknet's own ``yolov3.cfg`` / ``yolov3-tiny.cfg``, :func:`cfg_text`) and ``.weights``
file, which Darknet and OpenCV's dnn module (``cv2.dnn.readNetFromDarknet``) run, and which
:func:`yolo3.checkpoint.darknet.convert` reads back to the same weights.
"""

import itertools

import numpy as np

from yolo3.checkpoint.darknet import GRID_SENSITIVITY_KEY, Section, describe_cfg
from yolo3.fileio import atomic_write
from yolo3.model import network as yolo_model

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

    def __init__(self, head, yolo_options):
        self.sections = []
        self.levels = iter(head.levels())
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
        level = next(self.levels)
        mask = ",".join(str(index) for index in level.anchor_indices)
        # Written only where it differs from Darknet's default of 1, which keeps the cfg of
        # a YOLOv3-trained model section for section Darknet's own.
        text = np.format_float_positional(level.xy_scale, trim="-")
        grid = {} if level.xy_scale == 1.0 else {GRID_SENSITIVITY_KEY: text}
        self.add("yolo", mask=mask, **self.yolo_options, **grid)


def _cfg_sections(head):
    """The ``(kind, options)`` sections of the cfg for ``head``'s network (see
    :func:`cfg_text`)."""
    if head.input_hw is None:
        raise ValueError("the Darknet cfg needs an input size: the head records none")
    (height, width), anchors = head.input_hw, head.anchor_array
    num_classes = head.num_classes
    # Shortest text that reads back as the same float32 (what convert stores).
    pairs = (",".join(np.format_float_positional(v, trim="-") for v in pair) for pair in anchors)
    yolo_options = {"anchors": ",  ".join(pairs), "classes": int(num_classes), "num": len(anchors)}
    cfg = _CfgBuilder(head, {**yolo_options, **dict(YOLO_OPTIONS)})
    cfg.add("net", width=width, height=height, **dict(NET_OPTIONS))
    out_filters = head.channels
    if head.model_type == "tiny":
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


def _render_cfg(head, source="cfg"):
    """``(text, [Section])``: the cfg text and what :func:`parse_cfg` reads from it."""
    sections = _cfg_sections(head)
    lines = [
        f"# {head.model_type} with {head.num_classes} classes, written by yolo3.checkpoint.darknet"
    ]
    parsed = []
    for kind, options in sections:
        lines += ["", f"[{kind}]"]
        parsed.append(Section(kind, len(lines), {k: str(v) for k, v in options.items()}, source))
        lines += [f"{key}={value}" for key, value in options.items()]
    return "\n".join(lines) + "\n", parsed


def cfg_text(head):
    """The Darknet cfg of ``head``'s network (a :class:`yolo3.model.head.HeadSpec`): section
    for section Darknet's own ``yolov3.cfg`` / ``yolov3-tiny.cfg``, with its classes, anchors
    and input size (the head's, required) in [net].

    Each level's anchor indices (largest stride first, as this library stores them; Darknet
    lists its [yolo] sections in that order too) become the ``mask=`` of the [yolo] at the
    same position, and its grid sensitivity that [yolo]'s :data:`GRID_SENSITIVITY_KEY`
    (AlexeyAB Darknet's and OpenCV's key) where it is not 1. :func:`convert` reads the text
    back to the same head: anchors (float32), masks, grid sensitivity, classes and size.
    """
    return _render_cfg(head)[0]


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
    head,
):
    """Writes ``model`` as a Darknet ``cfg_path`` (:func:`cfg_text`) and ``weights_path``.

    The weights file has Darknet's header for format 0.2 (int32 major 0, minor 2, revision 0,
    int64 ``seen`` 0), then per [convolutional] in cfg order ``beta, gamma, mean, variance``
    or the ``bias``, then the kernel as (out, in, height, width), all little-endian float32.
    Both files are written atomically, and only after every layer has been checked.

    Args:
        model: a network of :mod:`yolo3.model.network` (layers ``conv_k`` / ``bn_k``).
        head: its :class:`yolo3.model.head.HeadSpec`, with the input size the cfg gets
            (:func:`cfg_text`).

    Raises:
        ValueError naming the layer when ``model`` lacks one the cfg needs or its shapes
        differ (another model type, class count or number of anchors per head).
    """
    text, sections = _render_cfg(head, source=str(cfg_path))
    convs = describe_cfg(sections, cfg_path)["convs"]
    values = [_darknet_values(model, spec, head.model_type) for spec in convs]
    with atomic_write(cfg_path) as cfg_temp, atomic_write(weights_path) as weights_temp:
        with open(cfg_temp, "w", encoding="utf-8") as f:
            f.write(text)
        with open(weights_temp, "wb") as f:
            f.write(np.asarray([0, 2, 0], "<i4").tobytes())
            f.write(np.asarray([0], "<i8").tobytes())  # seen: 64 bits from format 0.2 on
            for array in itertools.chain.from_iterable(values):
                f.write(np.ascontiguousarray(array, "<f4").tobytes())
