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

Batch norm epsilon: the original built ``BatchNormalization()`` with Keras 2's default
epsilon, 1e-3, where our layers use Darknet's 1e-6 (see :mod:`yolo3.model.network`). Batch norm
divides by ``sqrt(moving_variance + epsilon)``, so the difference is added to the moving
variance on loading, and the loaded model predicts what the original did. The epsilon is read
from the file's model configuration where a full-model save has one, else taken as 1e-3.

Anchor masks: the original's tiny-YOLOv3 gave its second head anchors 1, 2, 3 (Darknet's
``yolov3-tiny.cfg`` has 0, 1, 2); :data:`ORIGINAL_ANCHOR_MASKS` are the masks its files were
trained with.
"""

import json
import re

import h5py
import numpy as np

CONV_WEIGHTS = ("kernel", "bias")
# Keras 2's BatchNormalization default, which the original keras-yolo3 used throughout.
KERAS2_BN_EPSILON = 1e-3
# The original keras-yolo3's anchor masks, largest stride first.
ORIGINAL_ANCHOR_MASKS = {
    "yolov3": ((6, 7, 8), (3, 4, 5), (0, 1, 2)),
    "tiny": ((3, 4, 5), (1, 2, 3)),
}
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


def read_bn_epsilons(path):
    """``{layer name: epsilon}`` of the file's batch norms, from the model configuration that
    a full-model save stores; empty for a ``save_weights`` file, which stores none."""
    with h5py.File(path, "r") as f:
        raw = f.attrs.get("model_config")
    if raw is None:
        return {}
    try:
        config = json.loads(_text(raw))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: the model configuration is not valid JSON ({err})") from err
    found = {}

    def visit(node):
        if isinstance(node, dict):
            settings = node.get("config")
            if node.get("class_name") == "BatchNormalization" and isinstance(settings, dict):
                found[settings.get("name")] = float(settings.get("epsilon", KERAS2_BN_EPSILON))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(config)
    return found


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
        The report of :func:`yolo3.checkpoint.weights.assign_by_name`: ``loaded`` (our layer names),
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
    epsilons = read_bn_epsilons(path)
    file_norms = [
        (name, _fold_epsilon(values, epsilons.get(name, KERAS2_BN_EPSILON), layer.epsilon))
        for (name, values), layer in zip(file_norms, our_norms)
    ]
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


def _fold_epsilon(values, file_epsilon, our_epsilon):
    """Batch-norm weights for a layer with ``our_epsilon`` that normalise as the file's did.

    ``sqrt(variance + file_epsilon) = sqrt(variance' + our_epsilon)`` for
    ``variance' = variance + file_epsilon - our_epsilon``.
    """
    gamma, beta, mean, variance = values
    folded = np.asarray(variance, np.float64) + (file_epsilon - our_epsilon)
    return [gamma, beta, mean, np.maximum(folded, 0.0).astype(np.asarray(variance).dtype)]
