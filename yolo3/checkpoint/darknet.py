"""Darknet ``.cfg`` + ``.weights`` -> the matching Keras model of :mod:`yolo3.model.network`.

Three configs are recognised, by their layer counts: ``yolov3.cfg`` (75 convolutions, 3
[yolo] sections), ``yolov3-tiny.cfg`` (13 convolutions, 2 [yolo]) and the ImageNet classifier
``darknet53.cfg`` (53 convolutions, [avgpool], [softmax]). The Keras model is built by
:mod:`yolo3.model.network`, and every [convolutional] section ``k`` (in cfg order) is checked
against the layer ``conv_k`` before any weight is read, so a cfg that only looks like a known one
fails with the line to look at instead of loading shifted weights.

A cfg comes from elsewhere and is read as untrusted: every value that sizes a tensor is
checked against the bounds below, and the parameter count of the network it describes
against :data:`MAX_PARAMETERS`, before any model is built, so that a cfg asking for heads of
a billion filters ends with its file and line instead of a 2 TB allocation.

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

from yolo3.checkpoint import weights as yolo_weights
from yolo3.model import network as yolo_model
from yolo3.model.resources import SCALE_X_Y, valid_scale_x_y

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

# Bounds on a cfg's values, each wide enough for every real YOLOv3 / tiny-YOLOv3 / Darknet-53
# cfg (80 classes at 416-1280 px; YOLO9000's 9418 classes) and far below what allocates
# absurd tensors:
# - the cfg file: yolov3.cfg is 8 KB, the longest Darknet cfgs some 40 KB.
MAX_CFG_BYTES = 2**20
# - classes: YOLO9000's 9418 and ImageNet-21k's 21841 fit; a YOLOv3 head of 3 x (5 + 2**15)
#   filters on 1024 channels is 100M parameters, already more than the rest of the network.
MAX_CLASSES = 2**15
# - filters of one convolution: the heads at the class bound (3 anchors x (5 + 2**15) =
#   98,319) fit; the hidden layers of the three networks have at most 1024. The model this
#   module builds takes only the classes and anchors of a cfg (the hidden layers must then
#   match its own), so this bound also bounds the heads of that model: at most 2**17 filters
#   on 1792 channels in all, 235M parameters besides YOLOv3's 62M.
MAX_FILTERS = 2**17
# - a kernel or pooling window: Darknet's cfgs use 1, 2 and 3 (SPP's pools 13).
MAX_WINDOW = 32
# - [net] width and height: 416-608 px usually, 1280-1536 for the largest models; at
#   4096 x 4096 YOLOv3's first activation alone is 2 GB of float32 per image.
MAX_INPUT_SIZE = 4096
# - anchors of a [yolo] (``num``, the pairs of ``anchors``, a ``mask``'s indices): 9 in
#   YOLOv3, 6 in tiny, at most 15 in the cfgs in the wild.
MAX_ANCHORS = 64
# - the float32 values of all the cfg's convolutions, traced through [route] and [shortcut]
#   (a [route] can concatenate a layer with itself many times over): 1 GiB, as many as a
#   Keras weights file may hold. YOLOv3 holds 62M, YOLOv3 with 2**15 classes 238M.
MAX_PARAMETERS = yolo_weights.MAX_VALUES
# (section, key) -> (least, most) of its integer value; 0 leaves [net]'s size unset.
BOUNDS = {
    ("net", "width"): (0, MAX_INPUT_SIZE),
    ("net", "height"): (0, MAX_INPUT_SIZE),
    ("convolutional", "filters"): (1, MAX_FILTERS),
    ("convolutional", "size"): (1, MAX_WINDOW),
    ("maxpool", "size"): (1, MAX_WINDOW),
    ("yolo", "classes"): (1, MAX_CLASSES),
    ("yolo", "num"): (1, MAX_ANCHORS),
}

# A [yolo] section's grid sensitivity, as AlexeyAB Darknet (and OpenCV's reader) name it.
GRID_SENSITIVITY_KEY = "scale_x_y"


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
    size = os.path.getsize(path)
    if size > MAX_CFG_BYTES:
        raise ValueError(
            f"cfg file {path} is {size:,} bytes; Darknet cfgs are a few KB (this reader takes "
            f"up to {MAX_CFG_BYTES:,}): a Darknet .cfg comes first, then its .weights"
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(
            f"cfg file {path} is not text; a Darknet .cfg comes first, then its .weights"
        ) from None
    sections = []
    for number, raw in enumerate(text.splitlines(), start=1):
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
    check_bounds(sections)
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
    _check_parameter_count(convs, path)
    resamplers = [s for s in layers if s.kind in ("maxpool", "upsample")]
    info = {"model_type": model_type, "convs": convs, "resamplers": resamplers}
    size = (net.get("height", 0), net.get("width", 0))
    info["input_size"] = size if all(size) else None
    if model_type == "darknet53":
        info.update(num_classes=convs[-1].filters, anchors=None, masks=None, scale_x_y=None)
    else:
        info.update(_read_yolo_sections(layers, convs, path))
    return info


def check_bounds(sections):
    """ValueError naming the file and line of the first value outside :data:`BOUNDS`, or of
    a [yolo] listing more than :data:`MAX_ANCHORS` anchors or mask indices."""
    for section in sections:
        for (kind, key), (least, most) in BOUNDS.items():
            if section.kind != kind or key not in section.options:
                continue
            value = section.get(key)
            if not least <= value <= most:
                raise ValueError(
                    f"{section.source}, line {section.line}: [{kind}] {key}={value} is outside "
                    f"{least}..{most}, what this reader takes (real YOLOv3 cfgs lie well within)"
                )
        if section.kind == "yolo":
            for key, per_entry in (("anchors", 2), ("mask", 1)):
                count = section.options.get(key, "").count(",") + 1
                if count > MAX_ANCHORS * per_entry:
                    raise ValueError(
                        f"{section.source}, line {section.line}: [yolo] {key} lists {count} "
                        f"numbers; this reader takes up to {MAX_ANCHORS} anchors"
                    )


def _check_parameter_count(convs, path):
    """ValueError naming the largest convolution's line when the cfg's convolutions hold
    more than :data:`MAX_PARAMETERS` values: before a model is built or a weight read."""
    total = sum(spec.num_values for spec in convs)
    if total > MAX_PARAMETERS:
        largest = max(convs, key=lambda spec: spec.num_values)
        raise ValueError(
            f"{path}, line {largest.line}: the cfg's convolutions hold {total:,} parameters, "
            f"more than the {MAX_PARAMETERS:,} this reader takes (YOLOv3 has 62M); this one "
            f"alone, {largest.filters} filters of {largest.size}x{largest.size} on "
            f"{largest.in_channels} channels, holds {largest.num_values:,}"
        )


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
    if not np.all(np.isfinite(anchors)) or np.any(anchors <= 0):
        raise ValueError(
            f"{path}, line {first.line}: anchors must be positive and finite, in input pixels"
        )
    masks, scale_x_y = [], []
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
        scale_x_y.append(_grid_sensitivity(section))
    return {"num_classes": num_classes, "anchors": anchors, "masks": masks, "scale_x_y": scale_x_y}


def _grid_sensitivity(section):
    """A [yolo] section's ``scale_x_y`` (AlexeyAB Darknet's key, 1 where absent), which
    detection decodes with; raises naming the line for a decoding this library does not do."""
    where = f"{section.source}, line {section.line}: [yolo]"
    if section.get("new_coords", 0) != 0:
        raise ValueError(
            f"{where} new_coords={section.options['new_coords']} (Scaled-YOLOv4's box decoding) "
            "is not supported; only new_coords=0"
        )
    scale = section.get(GRID_SENSITIVITY_KEY, SCALE_X_Y, float)
    if not valid_scale_x_y((scale,)):
        raise ValueError(
            f"{where} {GRID_SENSITIVITY_KEY}={scale:g}: values below 1 are not supported"
        )
    return scale


def build_keras_model(info, input_size=None):
    """The :mod:`yolo3.model.network` network for ``describe_cfg``'s ``info``.

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
    """The JSON-able metadata stored with converted weights (see
    :mod:`yolo3.checkpoint.weights`)."""
    anchors = info["anchors"]
    masks = info["masks"]
    return {
        "model_type": info["model_type"],
        "num_classes": info["num_classes"],
        "num_anchors": len(masks[0]) if masks else None,
        "anchors": anchors.tolist() if anchors is not None else None,
        "anchor_masks": masks,
        "scale_x_y": info.get("scale_x_y"),
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
