"""Darknet ``.cfg`` + ``.weights`` -> the matching Keras model of :mod:`yolo3.model.network`.

Three configs are recognised, by their layer counts: ``yolov3.cfg`` (75 convolutions, 3
[yolo] sections), ``yolov3-tiny.cfg`` (13 convolutions, 2 [yolo]) and the ImageNet classifier
``darknet53.cfg`` (53 convolutions, [avgpool], [softmax]). The Keras model is built by
:mod:`yolo3.model.network`, and every [convolutional] section ``k`` (in cfg order) is checked
against the layer ``conv_k`` before any weight is read, so a cfg that only looks like a known one
fails with the line to look at instead of loading shifted weights.

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
from yolo3.model.resources import SCALE_X_Y

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
        info.update(num_classes=convs[-1].filters, anchors=None, masks=None, scale_x_y=None)
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
    scale = section.get("scale_x_y", SCALE_X_Y, float)
    if not scale >= 1.0:
        raise ValueError(f"{where} scale_x_y={scale:g}: values below 1 are not supported")
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
