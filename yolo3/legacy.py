"""Weights saved by Keras 2, as the original keras-yolo3 wrote them (``yolo.h5``).

Keras 2 HDF5 layout: the root (``save_weights``) or its ``model_weights`` group (``save``) has
an attribute ``layer_names``; each layer's group has ``weight_names`` (``conv2d_12/kernel:0``)
and a dataset under each such name. Layers there are auto-named ``conv2d_N`` and
``batch_normalization_N``, numbered in creation order, which in keras-yolo3 is Darknet's order
(Keras 2 counts from 1; tf.keras from 0, the first being plain ``conv2d``). ``layer_names``
itself is depth-sorted, so for a branching network like YOLOv3 it is not creation order.

Convolutions and batch norms are therefore each sorted by their numeric suffix (file order only
when the names are not of that form) and paired, in that order, with our ``conv_k`` and
``bn_k`` in order of ``k``.
"""

import re

import h5py
import numpy as np

CONV_WEIGHTS = ("kernel", "bias")
BN_WEIGHTS = ("gamma", "beta", "moving_mean", "moving_variance")
_NUMBERED = re.compile(r"(?P<prefix>.*?)(?:_(?P<number>\d+))?")


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_keras2_layers(path):
    """``[(layer name, {weight kind: array})]`` for the file's layers with weights, file order.

    The owner of a weight is taken from its name (``conv2d_12/kernel:0`` -> ``conv2d_12``),
    which also unpacks a nested model stored as a single layer.
    """
    layers = {}
    with h5py.File(path, "r") as f:
        root = f["model_weights"] if "model_weights" in f else f
        if "layer_names" not in root.attrs:
            raise ValueError(f"{path} is not a Keras 2 weights file: no 'layer_names' attribute")
        for group_name in map(_text, root.attrs["layer_names"]):
            group = root[group_name]
            for weight_name in map(_text, group.attrs.get("weight_names", [])):
                owner, _, leaf = weight_name.rpartition("/")
                owner = owner.rsplit("/", 1)[-1] or group_name
                layers.setdefault(owner, {})[leaf.split(":")[0]] = np.asarray(group[weight_name])
    return list(layers.items())


def _split_kinds(layers, path):
    """Separates convolutions from batch norms; BN without scale/center gets gamma 1, beta 0."""
    convs, norms = [], []
    for name, weights in layers:
        kinds = set(weights)
        if "kernel" in kinds and kinds <= set(CONV_WEIGHTS):
            convs.append((name, [weights[k] for k in CONV_WEIGHTS if k in weights]))
        elif {"moving_mean", "moving_variance"} <= kinds <= set(BN_WEIGHTS):
            mean = weights["moving_mean"]
            # scale=False / center=False layers store no gamma / beta: identity values.
            gamma = weights.get("gamma", np.ones_like(mean))
            beta = weights.get("beta", np.zeros_like(mean))
            norms.append((name, [gamma, beta, mean, weights["moving_variance"]]))
        else:
            raise ValueError(
                f"{path}: layer {name} has weights {sorted(kinds)}; only Conv2D {CONV_WEIGHTS} "
                f"and BatchNormalization {BN_WEIGHTS} layers can be matched to YOLOv3"
            )
    return _creation_order(convs), _creation_order(norms)


def _creation_order(entries):
    """Sorts ``conv2d``, ``conv2d_1``, ... by number when all names share one prefix."""
    matches = [_NUMBERED.fullmatch(name) for name, _ in entries]
    if len({m["prefix"] for m in matches}) > 1:
        return entries
    numbers = [int(m["number"] or 0) for m in matches]
    order = sorted(range(len(entries)), key=lambda i: numbers[i])
    return [entries[i] for i in order]


def _numbered_layers(model, prefix):
    """Our layers ``{prefix}_k`` in order of ``k``."""
    found = []
    for layer in model.layers:
        match = re.fullmatch(rf"{prefix}_(\d+)", layer.name)
        if match and layer.weights:
            found.append((int(match.group(1)), layer))
    return [layer for _, layer in sorted(found, key=lambda item: item[0])]


def load_keras2_weights(model, path, *, skip_mismatch=False):
    """Loads a Keras 2 HDF5 file into ``model`` (layers ``conv_k`` / ``bn_k``).

    Returns:
        The report of :func:`yolo3.weights.assign_by_name`: ``loaded`` (our layer names),
        ``skipped`` (``(name, reason)``, only with ``skip_mismatch``) and ``missing``.

    Raises:
        ValueError when the file has a different number of convolutions or batch norms than
        ``model`` (another network), or, unless ``skip_mismatch``, when shapes disagree; the
        message names the file's layer, ours and both shapes.
    """
    file_convs, file_norms = _split_kinds(read_keras2_layers(path), path)
    our_convs, our_norms = _numbered_layers(model, "conv"), _numbered_layers(model, "bn")
    if (len(file_convs), len(file_norms)) != (len(our_convs), len(our_norms)):
        raise ValueError(
            f"{path} has {len(file_convs)} convolutions and {len(file_norms)} batch norms, "
            f"but {model.name} has {len(our_convs)} and {len(our_norms)}: the file is for "
            "another network (YOLOv3 has 75 and 72, tiny-YOLOv3 13 and 11)"
        )
    report = {"loaded": [], "skipped": [], "missing": []}
    paired = {id(layer) for layer in our_convs + our_norms}
    report["missing"] = [
        layer.name for layer in model.layers if layer.weights and id(layer) not in paired
    ]
    if report["missing"] and not skip_mismatch:
        raise ValueError(f"{path} has no weights for layers {report['missing']} of {model.name}")
    pending = []
    pairs = list(zip(file_convs, our_convs)) + list(zip(file_norms, our_norms))
    for (file_name, values), layer in pairs:
        expected = [tuple(w.shape) for w in layer.weights]
        found = [tuple(v.shape) for v in values]
        if expected != found:
            reason = (
                f"file layer {file_name} -> {layer.name}: file has shapes {found}, "
                f"model expects {expected}"
            )
            if not skip_mismatch:
                raise ValueError(f"{path}: {reason}")
            report["skipped"].append((layer.name, reason))
            continue
        pending.append((layer, values))
    # Nothing is assigned before every shape is checked, so a failed load changes nothing.
    for layer, values in pending:
        layer.set_weights(values)
        report["loaded"].append(layer.name)
    return report
