"""Darknet ``.cfg`` + ``.weights`` -> the matching Keras model of :mod:`yolo3.model`.

Three configs are recognised, by their layer counts: ``yolov3.cfg`` (75 convolutions, 3
[yolo] sections), ``yolov3-tiny.cfg`` (13 convolutions, 2 [yolo]) and the ImageNet classifier
``darknet53.cfg`` (53 convolutions, [avgpool], [softmax]). The Keras model is built by
:mod:`yolo3.model`, and every [convolutional] section ``k`` (in cfg order) is checked against
the layer ``conv_k`` before any weight is read, so a cfg that only looks like a known one fails
with the line to look at instead of loading shifted weights.

Weights file layout (``load_weights`` in Darknet's ``parser.c``): int32 major, minor, revision;
``seen`` images as int64 when ``major * 10 + minor >= 2``, else int32; then for each
[convolutional] in cfg order either ``beta, gamma, rolling_mean, rolling_variance`` (``n``
float32 each, batch-normalised) or ``bias`` (``n``), then the kernel, ``n * c * size * size``
float32 in (out, in, height, width) order.
"""

import os
import re
from dataclasses import dataclass

import numpy as np

from yolo3 import model as yolo_model
from yolo3 import weights as yolo_weights
from yolo3.fileio import atomic_write

SUPPORTED_SECTIONS = (
    "net", "convolutional", "shortcut", "route", "upsample", "yolo", "maxpool", "avgpool",
    "softmax", "cost",
)  # fmt: skip
# Darknet also accepts these short spellings (``string_to_layer_type`` in parser.c).
SECTION_ALIASES = {
    **{name: name for name in SUPPORTED_SECTIONS},
    "network": "net",
    "conv": "convolutional",
    "max": "maxpool",
    "avg": "avgpool",
    "soft": "softmax",
}
# (model type, [convolutional] count, [yolo] count, cfg it comes from)
KNOWN_CONFIGS = (
    ("yolov3", 75, 3, "yolov3.cfg"),
    ("tiny", 13, 2, "yolov3-tiny.cfg"),
    ("darknet53", 53, 0, "darknet53.cfg, with [avgpool] and [softmax]"),
)


@dataclass(frozen=True)
class Section:
    """One ``[kind]`` of a cfg: ``line`` is the 1-based line of its header."""

    kind: str
    line: int
    options: dict
    source: str = "cfg"

    def get(self, key, default=None, cast=int):
        """``options[key]`` as ``cast``; a missing key is an error when ``default`` is None."""
        where = f"{self.source}, line {self.line}: [{self.kind}]"
        if key not in self.options:
            if default is None:
                raise ValueError(f"{where} needs a '{key}=' line")
            return default
        try:
            return cast(self.options[key])
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(cast, cast.__name__)
            raise ValueError(f"{where} {key}={self.options[key]!r} is not {kind}") from None

    def get_list(self, key, cast=int):
        return [cast(v) for v in self.get(key, cast=str).split(",") if v.strip()]


@dataclass(frozen=True)
class ConvSpec:
    """A [convolutional] section: ``index`` k names ``conv_k``; ``layer`` is Darknet's index."""

    index: int
    layer: int
    line: int
    filters: int
    size: int
    stride: int
    padding: int
    batch_norm: bool
    activation: str
    in_channels: int

    @property
    def num_values(self):
        """float32 values this convolution takes from the weights file."""
        per_filter = 4 if self.batch_norm else 1
        return self.filters * (per_filter + self.in_channels * self.size * self.size)


def parse_cfg(path):
    """Reads a Darknet cfg into a list of :class:`Section`, ``[net]`` first."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"cfg file {path} does not exist")
    sections = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, start=1):
            line = re.split(r"[#;]", raw, maxsplit=1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                name = line.strip("[]").strip().lower()
                if not line.endswith("]") or name not in SECTION_ALIASES:
                    raise ValueError(
                        f"{path}, line {number}: unsupported section {line}; supported "
                        f"sections are {', '.join(f'[{s}]' for s in SUPPORTED_SECTIONS)}"
                    )
                sections.append(Section(SECTION_ALIASES[name], number, {}, str(path)))
            elif "=" in line and sections:
                key, value = (part.strip() for part in line.split("=", 1))
                sections[-1].options[key] = value
            else:
                where = "before the first section" if not sections else "expected key=value"
                raise ValueError(f"{path}, line {number}: cannot read {line!r} ({where})")
    if not sections or sections[0].kind != "net":
        raise ValueError(f"{path}: a Darknet cfg starts with a [net] section")
    return sections


def describe_cfg(sections, path="cfg"):
    """What the cfg describes: a dict with ``model_type``, ``num_classes``, ``anchors``
    (``(num_anchors, 2)`` pixels, or None), ``masks`` (per [yolo], cfg order = largest stride
    first), ``input_size`` ((height, width) of [net], None if unset), ``convs``
    (:class:`ConvSpec` list) and ``resamplers`` (the [maxpool] and [upsample] sections).
    """
    net, layers = sections[0], sections[1:]
    extra_net = next((s for s in layers if s.kind == "net"), None)
    if extra_net is not None:
        raise ValueError(f"{path}, line {extra_net.line}: a second [net] section")
    kinds = [s.kind for s in layers]
    num_convs, num_yolo = kinds.count("convolutional"), kinds.count("yolo")
    counts = {(convs, yolos): name for name, convs, yolos, _ in KNOWN_CONFIGS}
    model_type = counts.get((num_convs, num_yolo))
    if model_type == "darknet53" and not {"avgpool", "softmax"} <= set(kinds):
        model_type = None
    if model_type is None:
        known = "; ".join(f"{c} conv + {y} yolo ({cfg})" for _, c, y, cfg in KNOWN_CONFIGS)
        raise ValueError(
            f"{path} has {num_convs} [convolutional] and {num_yolo} [yolo] sections, which is "
            f"none of the supported networks: {known}"
        )
    convs = _trace_channels(layers, net.get("channels", 3), path)
    resamplers = [s for s in layers if s.kind in ("maxpool", "upsample")]
    info = {"model_type": model_type, "convs": convs, "resamplers": resamplers}
    size = (net.get("height", 0), net.get("width", 0))
    info["input_size"] = size if all(size) else None
    if model_type == "darknet53":
        info.update(num_classes=convs[-1].filters, anchors=None, masks=None)
    else:
        info.update(_read_yolo_sections(layers, convs, path))
    return info


def _trace_channels(layers, in_channels, path):
    """Output channels of every layer, following [route] and [shortcut] like Darknet does."""
    if in_channels != 3:
        raise ValueError(f"{path}: [net] channels={in_channels}; YOLOv3 takes 3 (RGB)")
    channels, convs = [], []
    for i, section in enumerate(layers):
        previous = channels[-1] if channels else in_channels
        if section.kind == "convolutional":
            if section.get("groups", 1) != 1:
                raise ValueError(f"{path}, line {section.line}: grouped convolutions unsupported")
            size = section.get("size", 1)
            pad = section.get("pad", 0)
            spec = ConvSpec(
                index=len(convs),
                layer=i,
                line=section.line,
                filters=section.get("filters", 1),
                size=size,
                stride=section.get("stride", 1),
                padding=size // 2 if pad else section.get("padding", 0),
                batch_norm=bool(section.get("batch_normalize", 0)),
                activation=section.get("activation", "logistic", cast=str),
                in_channels=previous,
            )
            convs.append(spec)
            channels.append(spec.filters)
        elif section.kind in ("route", "shortcut"):
            key = "layers" if section.kind == "route" else "from"
            sources = []
            for index in section.get_list(key):
                source = i + index if index < 0 else index
                if not 0 <= source < i:
                    raise ValueError(
                        f"{path}, line {section.line}: [{section.kind}] {key} {index} points "
                        f"to layer {source}; only layers 0..{i - 1} come before it"
                    )
                sources.append(channels[source])
            if section.kind == "route":
                channels.append(sum(sources))
            elif sources != [previous] or section.get("activation", "linear", str) != "linear":
                raise ValueError(
                    f"{path}, line {section.line}: [shortcut] must add a {previous}-channel "
                    f"layer with activation=linear; got {sources} channels"
                )
            else:
                channels.append(previous)
        else:
            channels.append(previous)
    return convs


def _read_yolo_sections(layers, convs, path):
    conv_at = {spec.layer: spec for spec in convs}
    yolo = [(i, s) for i, s in enumerate(layers) if s.kind == "yolo"]
    first = yolo[0][1]
    num_classes = first.get("classes")
    anchor_values = first.get_list("anchors", cast=float)
    num_pairs = len(anchor_values) // 2
    if len(anchor_values) % 2 or num_pairs != first.get("num", num_pairs):
        raise ValueError(
            f"{path}, line {first.line}: {len(anchor_values)} anchor numbers do not make "
            f"num={first.options.get('num')} w,h pairs"
        )
    anchors = np.asarray(anchor_values, np.float32).reshape(-1, 2)
    masks = []
    for i, section in yolo:
        same = section.get("classes") == num_classes
        if not same or section.get_list("anchors", float) != anchor_values:
            raise ValueError(
                f"{path}, line {section.line}: every [yolo] must have the same classes and "
                f"anchors as the one at line {first.line}"
            )
        mask = section.get_list("mask")
        valid = mask and all(0 <= m < len(anchors) for m in mask)
        if not valid or (masks and len(mask) != len(masks[0])):
            raise ValueError(
                f"{path}, line {section.line}: mask={section.options.get('mask')} must list "
                f"anchor indices 0..{len(anchors) - 1}, as many in every [yolo]"
            )
        head = conv_at.get(i - 1)
        expected = len(mask) * (5 + num_classes)
        if head is None or head.filters != expected:
            raise ValueError(
                f"{path}, line {section.line}: the [convolutional] before this [yolo] must have "
                f"filters={expected} ({len(mask)} anchors x (5 + {num_classes} classes))"
            )
        masks.append(mask)
    return {"num_classes": num_classes, "anchors": anchors, "masks": masks}


def build_keras_model(info, input_size=None):
    """The :mod:`yolo3.model` network for ``describe_cfg``'s ``info``.

    ``input_size``: None (any multiple of 32), an int, a ``(height, width)`` pair, or ``"cfg"``
    for the [net] width and height.
    """
    if input_size == "cfg":
        input_size = info["input_size"]
        if input_size is None:
            raise ValueError("the cfg's [net] has no width and height; give an input size")
    if isinstance(input_size, int):
        input_size = (input_size, input_size)
    height, width = input_size or (None, None)
    if info["model_type"] == "darknet53":
        return yolo_model.darknet53_classifier(
            num_classes=info["num_classes"], input_shape=(height, width, 3)
        )
    return yolo_model.build_model(
        info["model_type"],
        info["num_classes"],
        num_anchors=len(info["masks"][0]),
        input_size=input_size,
    )


def check_against_model(info, model, path="cfg"):
    """Raises unless each [convolutional] k has the shape and batch norm of ``conv_k``, and
    each [maxpool] / [upsample] the window and stride of our ``maxpool_j`` / ``upsample_j``.
    """
    layer_names = {layer.name for layer in model.layers}
    for spec in info["convs"]:
        name = f"conv_{spec.index}"
        if name not in layer_names:
            raise ValueError(f"{path}, line {spec.line}: {model.name} has no layer {name}")
        layer = model.get_layer(name)
        has_bn = f"bn_{spec.index}" in layer_names
        found = {
            "filters": spec.filters,
            "size": spec.size,
            "stride": spec.stride,
            "padding": spec.padding,
            "batch_normalize": spec.batch_norm,
            "activation": spec.activation,
            "input channels": spec.in_channels,
        }
        expected = {
            "filters": layer.filters,
            "size": layer.kernel_size[0],
            "stride": layer.strides[0],
            "padding": layer.kernel_size[0] // 2,
            "batch_normalize": has_bn,
            # Our batch-normalised convolutions are leaky; the heads are linear.
            "activation": "leaky" if has_bn else "linear",
            "input channels": layer.kernel.shape[2],
        }
        where = f"{path}, line {spec.line}: [convolutional] #{spec.index}"
        _raise_on_difference(found, expected, where, name)
    for kind in ("maxpool", "upsample"):
        sections = [s for s in info["resamplers"] if s.kind == kind]
        ours = sorted(
            (layer for layer in model.layers if re.fullmatch(rf"{kind}_\d+", layer.name)),
            key=lambda layer: int(layer.name.rpartition("_")[2]),
        )
        if len(sections) != len(ours):
            raise ValueError(
                f"{path} has {len(sections)} [{kind}] sections; {model.name} has {len(ours)}"
            )
        for section, layer in zip(sections, ours):
            where = f"{path}, line {section.line}: [{kind}]"
            if kind == "upsample":
                found, expected = {"stride": section.get("stride", 2)}, {"stride": layer.size[0]}
            else:
                # Darknet defaults: size = stride, padding = size - 1 (at the bottom right).
                stride = section.get("stride", 1)
                size = section.get("size", stride)
                found = {
                    "size": size,
                    "stride": stride,
                    "padding": section.get("padding", size - 1),
                }
                pool = layer.pool_size[0]
                expected = {"size": pool, "stride": layer.strides[0], "padding": pool - 1}
            _raise_on_difference(found, expected, where, layer.name)


def _raise_on_difference(found, expected, where, layer_name):
    wrong = [key for key in found if found[key] != expected[key]]
    if wrong:
        details = ", ".join(f"{key}={found[key]} (expected {expected[key]})" for key in wrong)
        raise ValueError(f"{where} does not match our layer {layer_name}: {details}")


def read_weights(path, convs):
    """Reads a Darknet weights file.

    Returns:
        ``(header, arrays)``: header ``{"major", "minor", "revision", "seen"}``, and per conv
        ``[kernel (size, size, in, filters)]`` plus ``[gamma, beta, mean, variance]`` (each
        ``(filters,)``) when batch-normalised, else ``[bias]``; all float32.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file {path} does not exist")
    file_size = os.path.getsize(path)
    if file_size < 16:
        raise ValueError(f"weights file {path} is {file_size} bytes, shorter than a header")
    major, minor, revision = (int(v) for v in np.fromfile(path, "<i4", count=3))
    # parser.c reads a 64-bit ``seen`` from format 0.2 on; very old files have 32 bits.
    # The < 1000 bounds are Darknet's own guard against a transposed legacy header.
    wide_seen = major * 10 + minor >= 2 and major < 1000 and minor < 1000
    header_size = 12 + (8 if wide_seen else 4)
    seen = int(np.fromfile(path, "<i8" if wide_seen else "<i4", count=1, offset=12)[0])
    header = {"major": major, "minor": minor, "revision": revision, "seen": seen}

    expected = sum(spec.num_values for spec in convs)
    payload = file_size - header_size
    if payload != 4 * expected:
        found = f"{payload // 4}" + (f" (+{payload % 4} stray bytes)" if payload % 4 else "")
        problem = "truncated" if payload < 4 * expected else "has bytes left over"
        raise ValueError(
            f"weights file {path} {problem}: the cfg's {len(convs)} convolutions need "
            f"{expected} float32 values after the {header_size}-byte header, found {found}; "
            "check that the cfg and weights belong together"
        )
    values = np.fromfile(path, "<f4", offset=header_size)
    arrays, offset = [], 0

    def take(count):
        nonlocal offset
        offset += count
        return values[offset - count : offset]

    for spec in convs:
        n = spec.filters
        if spec.batch_norm:
            beta, gamma, mean, variance = (take(n) for _ in range(4))
            tail = [gamma, beta, mean, variance]
        else:
            tail = [take(n)]
        kernel = take(n * spec.in_channels * spec.size**2)
        kernel = kernel.reshape(n, spec.in_channels, spec.size, spec.size).transpose(2, 3, 1, 0)
        arrays.append([np.ascontiguousarray(kernel), *tail])
    return header, arrays


def convert(cfg_path, weights_path, *, input_size=None):
    """Converts a Darknet cfg + weights pair.

    Args:
        input_size: see :func:`build_keras_model`; None builds a model for any input size.

    Returns:
        ``(model, info)``: the Keras model with the Darknet weights, and a dict with
        ``model_type``, ``num_classes``, ``anchors``, ``masks``, ``input_size`` (the cfg's
        (height, width)), ``header`` and ``source`` (file names).
    """
    info = describe_cfg(parse_cfg(cfg_path), cfg_path)
    model = build_keras_model(info, input_size)
    check_against_model(info, model, cfg_path)
    header, arrays = read_weights(weights_path, info["convs"])
    for spec, (kernel, *rest) in zip(info["convs"], arrays, strict=True):
        if spec.batch_norm:
            model.get_layer(f"conv_{spec.index}").set_weights([kernel])
            model.get_layer(f"bn_{spec.index}").set_weights(rest)
        else:
            model.get_layer(f"conv_{spec.index}").set_weights([kernel, *rest])
    info = {key: value for key, value in info.items() if key not in ("convs", "resamplers")}
    info["header"] = header
    info["source"] = f"darknet:{os.path.basename(cfg_path)},{os.path.basename(weights_path)}"
    return model, info


def conversion_metadata(info):
    """The JSON-able metadata stored with converted weights (see :mod:`yolo3.weights`)."""
    anchors = info["anchors"]
    masks = info["masks"]
    return {
        "model_type": info["model_type"],
        "num_classes": info["num_classes"],
        "num_anchors": len(masks[0]) if masks else None,
        "anchors": anchors.tolist() if anchors is not None else None,
        "anchor_masks": masks,
        "input_size": list(info["input_size"] or ()) or None,
        "source": info["source"],
        "darknet_header": info["header"],
    }


def write_weights(model, info, path):
    """Writes ``path`` (``*.weights.h5``) atomically, with :func:`conversion_metadata`."""
    yolo_weights.save_weights(model, path, metadata=conversion_metadata(info))


def write_keras(model, path):
    """Writes the full model to ``path`` (``*.keras``) atomically: a crash leaves no half file."""
    if not path.endswith(".keras"):
        raise ValueError(f"model path {path} must end with .keras")
    with yolo_weights.atomic_write(path) as temp:
        model.save(temp)


# Keras -> Darknet: the inverse of :func:`convert`.

# The [net] section of Darknet's own yolov3.cfg and yolov3-tiny.cfg, less width and height:
# batch=1 for inference; the rest only matters to Darknet when it trains (fine-tuning).
NET_OPTIONS = (
    ("batch", 1), ("subdivisions", 1), ("channels", 3), ("momentum", 0.9), ("decay", 0.0005),
    ("angle", 0), ("saturation", 1.5), ("exposure", 1.5), ("hue", 0.1),
    ("learning_rate", 0.001), ("burn_in", 1000), ("max_batches", 500200), ("policy", "steps"),
    ("steps", "400000,450000"), ("scales", ".1,.1"),
)  # fmt: skip
NUM_HEADS = {"yolov3": 3, "tiny": 2}


class _CfgBuilder:
    """Collects ``(kind, options)`` sections and knows each one's Darknet layer index."""

    def __init__(self, yolo_options):
        self.sections = []
        self.yolo_options = yolo_options
        self.masks = iter(yolo_options.pop("masks"))

    @property
    def last(self):
        """Darknet index of the newest layer ([net] is not a layer)."""
        return len(self.sections) - 2

    def add(self, kind, **options):
        self.sections.append((kind, options))
        return self.last

    def conv(self, filters, size, stride=1):
        return self.add(
            "convolutional", batch_normalize=1, filters=filters, size=size, stride=stride, pad=1,
            activation="leaky",
        )  # fmt: skip

    def head(self, filters):
        """The linear, biased 1x1 convolution of a head and its [yolo] section."""
        self.add("convolutional", size=1, stride=1, pad=1, filters=filters, activation="linear")
        mask = ",".join(str(index) for index in next(self.masks))
        self.add("yolo", mask=mask, **self.yolo_options)


def _cfg_sections(model_type, num_classes, input_hw, anchors, anchor_masks):
    """The ``(kind, options)`` sections of the cfg for our network (see :func:`cfg_text`)."""
    if model_type not in NUM_HEADS:
        raise ValueError(f"unknown model type {model_type!r}; expected one of {tuple(NUM_HEADS)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
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
    num_heads = NUM_HEADS[model_type]
    if len(masks) != num_heads or len({len(mask) for mask in masks}) != 1 or not masks[0]:
        raise ValueError(
            f"anchor_masks {masks}: {model_type} needs {num_heads} heads (largest stride first) "
            "with the same number of anchors each"
        )
    if not all(0 <= index < len(anchors) for mask in masks for index in mask):
        raise ValueError(f"anchor_masks {masks} index past the {len(anchors)} anchors")
    # Shortest text that reads back as the same float32 (what convert stores).
    pairs = (",".join(np.format_float_positional(v, trim="-") for v in pair) for pair in anchors)
    yolo_options = {
        "masks": masks,
        "anchors": ",  ".join(pairs),
        "classes": num_classes,
        "num": len(anchors),
        "jitter": 0.3, "ignore_thresh": 0.7, "truth_thresh": 1, "random": 1,
    }  # fmt: skip
    cfg = _CfgBuilder(yolo_options)
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


def _render_cfg(sections, header, source):
    """``(text, [Section])``: the cfg text and what :func:`parse_cfg` would read from it."""
    lines = [f"# {line}" for line in header]
    parsed = []
    for kind, options in sections:
        lines += ["", f"[{kind}]"]
        parsed.append(Section(kind, len(lines), {k: str(v) for k, v in options.items()}, source))
        lines += [f"{key}={value}" for key, value in options.items()]
    return "\n".join(lines) + "\n", parsed


def cfg_text(model_type, num_classes, input_hw, anchors, anchor_masks):
    """The Darknet cfg of our ``model_type`` network, section for section Darknet's own
    ``yolov3.cfg`` / ``yolov3-tiny.cfg`` with these classes, anchors and input size.

    Args:
        model_type: ``"yolov3"`` or ``"tiny"``.
        num_classes: classes per anchor.
        input_hw: ``(height, width)`` of [net] (an int for square), multiples of 32.
        anchors: ``(num_anchors, 2)`` w, h in input pixels, smallest first (9 or 6 pairs).
        anchor_masks: anchor indices per head, largest stride first, as this library stores
            them; that is also Darknet's [yolo] order, so ``mask`` lines are written as given.

    :func:`convert` reads the text back to the same anchors (float32), masks, classes and size.
    """
    sections = _cfg_sections(model_type, num_classes, input_hw, anchors, anchor_masks)
    header = [f"{model_type} with {num_classes} classes, written by yolo3.darknet.cfg_text"]
    return _render_cfg(sections, header, "cfg")[0]


def _named_weights(layer):
    return {w.name: value for w, value in zip(layer.weights, layer.get_weights(), strict=True)}


def _darknet_values(model, spec, model_type):
    """The float32 arrays of [convolutional] ``spec`` from ``model``, in weights-file order."""
    name, bn_name = f"conv_{spec.index}", f"bn_{spec.index}"
    names = {layer.name for layer in model.layers}
    where = f"model {model.name}"
    if name not in names:
        raise ValueError(
            f"{where} has no layer {name}, which [convolutional] #{spec.index} of the "
            f"{model_type} cfg needs; is it a {model_type} model built by yolo3.model?"
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
    kernel = conv["kernel"].astype(np.float32).transpose(3, 2, 0, 1)  # -> (out, in, h, w)
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
    model, cfg_path, weights_path, *, model_type, num_classes, input_hw, anchors, anchor_masks
):
    """Writes ``model`` as a Darknet ``cfg_path`` (:func:`cfg_text`) and ``weights_path``.

    The weights file has Darknet's header for format 0.2 (int32 major 0, minor 2, revision 0,
    int64 ``seen`` 0), then per [convolutional] in cfg order ``beta, gamma, mean, variance``
    or the ``bias``, and the kernel as (out, in, height, width), all little-endian float32.
    Both files are written atomically, and only once every layer has been checked.

    Args:
        model: a ``model_type`` network of :mod:`yolo3.model` (layers ``conv_k`` / ``bn_k``).
        model_type, num_classes, input_hw, anchors, anchor_masks: see :func:`cfg_text`.

    Raises:
        ValueError naming the layer when ``model`` lacks one the cfg needs or its shapes
        differ (another model type, class count or number of anchors per head).
    """
    sections = _cfg_sections(model_type, num_classes, input_hw, anchors, anchor_masks)
    header = [
        f"{model_type} with {num_classes} classes, written by yolo3.darknet.write_darknet",
        f"from the Keras model {model.name}; weights: {os.path.basename(weights_path)}",
    ]
    text, parsed = _render_cfg(sections, header, str(cfg_path))
    convs = describe_cfg(parsed, cfg_path)["convs"]
    values = [_darknet_values(model, spec, model_type) for spec in convs]
    with atomic_write(cfg_path) as cfg_temp, atomic_write(weights_path) as weights_temp:
        with open(cfg_temp, "w", encoding="utf-8") as f:
            f.write(text)
        with open(weights_temp, "wb") as f:
            f.write(np.asarray([0, 2, 0], "<i4").tobytes())
            f.write(np.asarray([0], "<i8").tobytes())  # seen: 64 bits from format 0.2 on
            for arrays in values:
                for array in arrays:
                    f.write(np.ascontiguousarray(array, "<f4").tobytes())
