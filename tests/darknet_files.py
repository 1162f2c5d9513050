"""Test files in foreign formats: Darknet cfgs, random Darknet weights, Keras 2 HDF5 weights.

The cfgs have exactly the sections of Darknet's ``yolov3.cfg``, ``yolov3-tiny.cfg`` and
``darknet53.cfg`` (only ``width``, ``height`` and ``classes`` vary), so OpenCV's Darknet reader
can serve as an independent implementation to compare conversions against. This module parses
cfgs on its own rather than with :mod:`yolo3.checkpoint.darknet`, so a parser bug cannot hide
itself.
"""

import json
import re
from pathlib import Path

import h5py
import numpy as np

from yolo3.model.resources import read_anchors

ROOT = Path(__file__).resolve().parents[1]
NET_SECTION = """[net]
# Testing
batch=1
subdivisions=1
# Training
# batch=64
# subdivisions=16
width={size}
height={size}
channels=3
momentum=0.9
decay=0.0005
angle=0
saturation = 1.5
exposure = 1.5
hue=.1

learning_rate=0.001
burn_in=1000
max_batches = 500200
policy=steps
steps=400000,450000
scales=.1,.1
"""


def _conv(filters, size, stride=1):
    return (
        f"[convolutional]\nbatch_normalize=1\nfilters={filters}\nsize={size}\n"
        f"stride={stride}\npad=1\nactivation=leaky\n"
    )


def _linear_conv(filters):
    return f"[convolutional]\nsize=1\nstride=1\npad=1\nfilters={filters}\nactivation=linear\n"


def _yolo(mask, anchors, num_classes):
    pairs = ",  ".join(f"{w:g},{h:g}" for w, h in anchors)
    return (
        f"[yolo]\nmask = {mask}\nanchors = {pairs}\nclasses={num_classes}\nnum={len(anchors)}\n"
        "jitter=.3\nignore_thresh = .7\ntruth_thresh = 1\nrandom=1\n"
    )


def _darknet53_sections():
    sections = [_conv(32, 3)]
    for filters, num_blocks in ((64, 1), (128, 2), (256, 8), (512, 8), (1024, 4)):
        sections.append("# Downsample\n\n" + _conv(filters, 3, 2))
        for _ in range(num_blocks):
            sections += [_conv(filters // 2, 1), _conv(filters, 3)]
            sections.append("[shortcut]\nfrom=-3\nactivation=linear\n")
    return sections


def _yolov3_sections(num_classes):
    anchors = read_anchors(ROOT / "model_data" / "yolo_anchors.txt")
    out_filters = 3 * (5 + num_classes)
    sections = _darknet53_sections()
    for filters, mask, tap in ((512, "6,7,8", None), (256, "3,4,5", 61), (128, "0,1,2", 36)):
        if tap is not None:
            sections += ["[route]\nlayers = -4\n", _conv(filters, 1), "[upsample]\nstride=2\n"]
            sections.append(f"[route]\nlayers = -1, {tap}\n")
        sections.append("######################\n")
        for _ in range(3):
            sections += [_conv(filters, 1), _conv(filters * 2, 3)]
        sections += [_linear_conv(out_filters), _yolo(mask, anchors, num_classes)]
    return sections


def _tiny_sections(num_classes):
    anchors = read_anchors(ROOT / "model_data" / "tiny_yolo_anchors.txt")
    out_filters = 3 * (5 + num_classes)
    sections = []
    for filters in (16, 32, 64, 128, 256):
        sections += [_conv(filters, 3), "[maxpool]\nsize=2\nstride=2\n"]
    sections += [_conv(512, 3), "[maxpool]\nsize=2\nstride=1\n", _conv(1024, 3)]
    sections += ["###########\n", _conv(256, 1), _conv(512, 3), _linear_conv(out_filters)]
    sections += [_yolo("3,4,5", anchors, num_classes), "[route]\nlayers = -4\n"]
    sections += [_conv(128, 1), "[upsample]\nstride=2\n", "[route]\nlayers = -1, 8\n"]
    sections += [_conv(256, 3), _linear_conv(out_filters), _yolo("0,1,2", anchors, num_classes)]
    return sections


def write_cfg(path, model_type, num_classes, size):
    """Writes a ``yolov3`` / ``tiny`` / ``darknet53`` cfg for ``size`` x ``size`` inputs."""
    if model_type == "yolov3":
        sections = _yolov3_sections(num_classes)
    elif model_type == "tiny":
        sections = _tiny_sections(num_classes)
    elif model_type == "darknet53":
        sections = _darknet53_sections() + ["[avgpool]\n", _linear_conv(num_classes)]
        sections.append("[softmax]\ngroups=1\n")
    else:
        raise ValueError(f"unknown model type {model_type!r}")
    text = "\n".join([NET_SECTION.format(size=size), *sections])
    Path(path).write_text(text, encoding="utf-8")


def read_sections(path, with_net=False):
    """``[(kind, {key: value})]`` of a cfg; the [net] section only if ``with_net``."""
    sections = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            sections.append((line[1:-1], {}))
        elif "=" in line:
            key, value = line.split("=", 1)
            sections[-1][1][key.strip()] = value.strip()
    return sections if with_net else sections[1:]


def _conv2d(x, kernel, stride, padding):
    """``x`` (H, W, C), ``kernel`` (size, size, C, n), zero padding on all sides -> (H', W', n)."""
    size = kernel.shape[0]
    x = np.pad(x, ((padding, padding), (padding, padding), (0, 0)))
    out_h, out_w = ((dim - size) // stride + 1 for dim in x.shape[:2])
    patches = [
        x[i : i + stride * out_h : stride, j : j + stride * out_w : stride]
        for i in range(size)
        for j in range(size)
    ]
    return np.concatenate(patches, axis=-1) @ kernel.reshape(-1, kernel.shape[-1])


def _maxpool(x, size, stride):
    """Darknet's maxpool: ``size - 1`` rows and columns of -inf padding at the bottom right."""
    x = np.pad(x, ((0, size - 1), (0, size - 1), (0, 0)), constant_values=-np.inf)
    out_h, out_w = ((dim - size) // stride + 1 for dim in x.shape[:2])
    windows = [
        x[i : i + stride * out_h : stride, j : j + stride * out_w : stride]
        for i in range(size)
        for j in range(size)
    ]
    return np.max(windows, axis=0)


def _random_conv(rng, options, x):
    """Random parameters for one [convolutional] section, calibrated on its input ``x``.

    Kernels start as N(0, 1 / fan_in); each output channel is then rescaled so that its mean
    square on ``x`` equals the rolling variance written for it (a head: so that the whole
    output has mean square 1). Batch norm then maps every channel back to O(1) whatever the
    depth, which the 1 / fan_in scale alone does not: its small per-layer errors compound
    over 75 layers into outputs in the thousands.

    Returns ``(values in Darknet file order, output of the section on x)``.
    """
    filters, size = int(options["filters"]), int(options["size"])
    stride, padding = int(options.get("stride", 1)), size // 2
    in_channels = x.shape[-1]
    fan_in = in_channels * size * size
    kernel = rng.standard_normal((filters, in_channels, size, size), dtype=np.float32)
    kernel /= np.float32(np.sqrt(fan_in))
    y = _conv2d(x, kernel.transpose(2, 3, 1, 0), stride, padding)
    mean_square = np.maximum(np.mean(np.square(y), axis=(0, 1)), 1e-12)
    if options.get("batch_normalize") == "1":
        variance = rng.uniform(0.5, 1.5, filters).astype(np.float32)
        scale = np.sqrt(variance / mean_square).astype(np.float32)
        mean = rng.normal(0.0, 0.1, filters).astype(np.float32)
        gamma = rng.uniform(0.8, 1.2, filters).astype(np.float32)
        beta = rng.normal(0.0, 0.1, filters).astype(np.float32)
        z = gamma * (y * scale - mean) / np.sqrt(variance) + beta
        head, output = [beta, gamma, mean, variance], np.where(z > 0, z, 0.1 * z)
    else:
        scale = np.float32(1.0 / np.sqrt(np.mean(mean_square)))
        bias = rng.normal(0.0, 0.1, filters).astype(np.float32)
        head, output = [bias], y * scale + bias
    kernel *= np.reshape(scale, (-1, 1, 1, 1))
    return [*head, kernel], output


def write_random_weights(cfg, path, rng, major=0, minor=2):
    """Writes a Darknet weights file for ``cfg`` whose activations stay O(1) at every depth.

    The network is run once in NumPy on a random [0, 1] image of the cfg's size to calibrate
    each convolution (see :func:`_random_conv`): BN variance in [0.5, 1.5], gamma in
    [0.8, 1.2], means, betas and biases N(0, 0.1^2). The header is ``major, minor, revision``
    and a ``seen`` of 64 bits from format 0.2 on, else 32 bits, as Darknet writes it.
    """
    net = read_sections(cfg, with_net=True)[0][1]
    # Calibrating at another size does not carry over: at half the size YOLOv3's heads reach
    # ~100, as the border zeros weigh differently in every channel's statistics.
    x = rng.uniform(0.0, 1.0, (int(net["height"]), int(net["width"]), 3)).astype(np.float32)
    wide_seen = major * 10 + minor >= 2 and major < 1000 and minor < 1000
    outputs = []
    with open(path, "wb") as f:
        f.write(np.asarray([major, minor, 0], "<i4").tobytes())
        f.write(np.asarray([32013312], "<i8" if wide_seen else "<i4").tobytes())
        for i, (kind, options) in enumerate(read_sections(cfg)):
            if kind == "convolutional":
                values, x = _random_conv(rng, options, x)
                for array in values:
                    np.ascontiguousarray(array, "<f4").tofile(f)
            elif kind == "route":
                sources = [int(v) for v in options["layers"].split(",")]
                x = np.concatenate([outputs[i + s if s < 0 else s] for s in sources], axis=-1)
            elif kind == "shortcut":
                x = x + outputs[i + int(options["from"])]
            elif kind == "maxpool":
                x = _maxpool(x, int(options["size"]), int(options["stride"]))
            elif kind == "upsample":
                x = np.repeat(np.repeat(x, 2, axis=0), 2, axis=1)
            elif kind == "avgpool":
                x = np.mean(x, axis=(0, 1), keepdims=True)
            outputs.append(x)


def _snake_case(class_name):
    """Keras 2's layer-name prefix for a class: ``LeakyReLU`` -> ``leaky_re_lu``."""
    name = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", class_name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _depth_order(model):
    """Layers as Keras 2 lists them: longest distance to an output first, ties in model order."""
    config = model.get_config()
    consumers = {layer["name"]: [] for layer in config["layers"]}

    def parents(value):
        if isinstance(value, dict):
            if "keras_history" in value.get("config", {}):
                yield value["config"]["keras_history"][0]
            for item in value.values():
                yield from parents(item)
        elif isinstance(value, list):
            for item in value:
                yield from parents(item)

    for layer in config["layers"]:
        for parent in set(parents(layer["inbound_nodes"])):
            consumers[parent].append(layer["name"])
    depth = {}
    for layer in reversed(model.layers):  # consumers come after their inputs
        depth[layer.name] = 1 + max((depth[c] for c in consumers[layer.name]), default=-1)
    position = {layer.name: i for i, layer in enumerate(model.layers)}
    return sorted(model.layers, key=lambda layer: (-depth[layer.name], position[layer.name]))


def _keras2_names(model, zero_based):
    """Auto names in Darknet order: conv_k -> conv2d_(k+1) (Keras 2) or conv2d / conv2d_k."""

    def order(layer):
        match = re.fullmatch(r"[a-z]+_(\d+)", layer.name)
        return (int(match.group(1)) if match else -1, layer.name)

    names, counters = {}, {}
    for layer in sorted(model.layers, key=order):
        prefix = _snake_case(type(layer).__name__)
        count = counters.get(prefix, 0 if zero_based else 1)
        counters[prefix] = count + 1
        names[layer.name] = f"{prefix}_{count}" if count else prefix
    return names


def write_keras2_h5(
    model, path, rng, *, full_model=False, zero_based=False, bn_epsilon=None, variance=(0.5, 1.5)
):
    """Writes random weights for ``model`` in the HDF5 layout of Keras 2's ``save_weights``.

    Layers get Keras 2 auto names numbered in Darknet order (``conv2d_1`` is ``conv_0``; with
    ``zero_based`` tf.keras's ``conv2d``, ``conv2d_1``, ...) and are listed depth-sorted, as
    Keras 2 lists them, so file order differs from creation order. ``full_model`` nests them in
    ``model_weights`` as ``model.save`` did, with a model configuration that gives every batch
    norm ``bn_epsilon`` when that is set. Moving variances are drawn from ``variance``.

    Returns:
        ``{our layer name: [arrays in our variable order]}``.
    """
    names = _keras2_names(model, zero_based)
    written = {}
    with h5py.File(path, "w") as f:
        if full_model:
            layers = []
            if bn_epsilon is not None:
                layers = [
                    {
                        "class_name": "BatchNormalization",
                        "name": names[layer.name],
                        "config": {"name": names[layer.name], "epsilon": bn_epsilon},
                    }
                    for layer in model.layers
                    if layer.name.startswith("bn_")
                ]
            config = {"class_name": "Model", "config": {"layers": layers}}
            f.attrs["model_config"] = json.dumps(config)
            f.attrs["training_config"] = json.dumps({"loss": "yolo_loss"})
            root = f.create_group("model_weights")
        else:
            root = f
        ordered = _depth_order(model)
        # Keras 2 stores name lists as fixed-length byte strings (np.asarray of bytes).
        layer_names = [names[layer.name].encode() for layer in ordered]
        root.attrs["layer_names"] = np.asarray(layer_names, dtype="S")
        root.attrs["backend"] = b"tensorflow"
        root.attrs["keras_version"] = b"2.1.5"
        for layer in ordered:
            name = names[layer.name]
            group = root.create_group(name)
            weight_names = []
            values = []
            for variable in layer.weights:
                shape = tuple(variable.shape)
                if variable.name == "moving_variance":
                    value = rng.uniform(*variance, shape)
                else:
                    value = rng.normal(0.0, 0.1, shape)
                weight_name = f"{name}/{variable.name}:0"
                group.create_dataset(weight_name, data=value.astype(np.float32))
                weight_names.append(weight_name.encode())
                values.append(value.astype(np.float32))
            group.attrs["weight_names"] = np.asarray(weight_names, dtype="S")
            if values:
                written[layer.name] = values
    return written
