"""Saving and loading model weights by layer name, with metadata and clear mismatch errors.

Files written here are ordinary Keras 3 ``.weights.h5`` files (``model.load_weights`` reads
them) plus a JSON ``yolo3`` attribute on the root group recording what the weights are for:
``{"model_type": "yolov3", "num_classes": 80, "num_anchors": 3, ...}``. Loading matches
layers by their explicit names (``conv_12``, ``bn_12``) instead of by position, so a file
from any model built by :mod:`yolo3.model.network` loads into any other with the same layer names.

Original keras-yolo3 files (Keras 2 HDF5) are read by :mod:`yolo3.checkpoint.legacy`.
"""

import json
import os

import h5py
import numpy as np

from yolo3.fileio import atomic_write

METADATA_KEY = "yolo3"
# The float values a weights file may hold for its layers, declared sizes summed before any
# is read: 1 GiB of float32. YOLOv3 holds 62M, YOLOv3 for 2**15 classes 238M; an HDF5 file
# from elsewhere can declare terabytes in a few bytes (an unwritten dataset reads as its
# fill value).
MAX_VALUES = 2**28


def save_weights(model, path, metadata=None):
    """Writes ``model``'s weights to ``path`` (``*.weights.h5``) atomically, with metadata."""
    if not path.endswith(".weights.h5"):
        raise ValueError(f"weights path {path} must end with .weights.h5")
    with atomic_write(path) as temp:
        write_weights_file(model, temp, metadata or {})


def write_weights_file(model, path, metadata):
    """``model.save_weights(path)`` plus ``metadata`` (JSON-able) as the file's metadata.

    Not atomic: for the temporary path of :func:`yolo3.fileio.atomic_write`, which deletes
    it when this raises (a full disk).
    """
    _cache_keras_skipsets()
    try:
        model.save_weights(path)
        with h5py.File(path, "a") as f:
            f.attrs[METADATA_KEY] = json.dumps(metadata, sort_keys=True)
    except OSError:
        _abandon_open_file(path)
        raise


# The object types whose attribute skip-sets Keras's saving walk asks for (keras.src.saving.
# saving_lib.get_attr_skipset; the feature-space types left out: no model here holds one).
_SKIPSET_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss")


def _cache_keras_skipsets():
    """Stores Keras's attribute skip-sets under the key Keras looks them up by.

    Keras 3.15's ``get_attr_skipset`` caches each set as ``saving_attr_skipset_<type>`` but
    looks for ``saving_attr_skiplist_<type>``: every save builds its reference objects again,
    an ``Optimizer(1.0)`` among them for a model with an optimizer (a backup, the training
    state). That optimizer's name is new each time (``optimizer_12``), hence its two
    variables', and TensorFlow's eager kernel cache keeps a kernel for each variable of a
    new name (about 36 KB) until the process ends: 72 KB a file, 14 MB per 100 epochs of a
    run that writes a backup and a training state each epoch. Each set is built once per
    thread and session (Keras keeps them in its thread-local global state, which
    ``keras.backend.clear_session`` empties); harmless once Keras reads the key it writes.
    """
    from keras.src.backend.common import global_state  # noqa: PLC0415
    from keras.src.saving import saving_lib  # noqa: PLC0415

    build = getattr(saving_lib, "get_attr_skipset", None)
    for obj_type in _SKIPSET_TYPES if build else ():
        key = f"saving_attr_skiplist_{obj_type}"
        if global_state.get_global_attribute(key) is None:
            global_state.set_global_attribute(key, build(obj_type))


def _abandon_open_file(path):
    """Detaches the HDF5 file a failed write left open on ``path`` from the disk.

    Keras does not close its file when a write fails, and h5py closes it when the object is
    freed, which writes again to the same full disk: a second error printed from a
    destructor, and at exit a crash (SIGSEGV). Pointing the file's descriptor at an
    anonymous in-memory file lets that late close succeed, and frees the disk space of the
    deleted file at once instead of at the close.
    """
    name = os.fsencode(path)
    for file_id in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        if file_id.name != name:
            continue
        descriptor = file_id.get_vfd_handle()
        if hasattr(os, "memfd_create"):
            scratch = os.memfd_create("abandoned.h5")
            os.dup2(scratch, descriptor)
            os.close(scratch)
        else:  # no anonymous files: empty it, so that the close has room to write
            os.ftruncate(descriptor, 0)


def read_metadata(path):
    """The metadata dict written by :func:`save_weights`, or None if the file has none (a
    ``.keras`` archive records its own architecture instead)."""
    if os.fspath(path).endswith(".keras"):
        return None
    with _open_h5(path) as f:
        raw = f.attrs.get(METADATA_KEY)
    return json.loads(raw) if raw is not None else None


def read_named_arrays(path):
    """``{layer_name: [arrays in variable order]}`` from a Keras 3 ``.weights.h5`` file.

    None when the file has no ``layers`` group; ValueError when it is not HDF5, or declares
    more than :data:`MAX_VALUES` values (checked before they are read).
    """
    arrays = {}
    total = 0
    with _open_h5(path) as f:
        if "layers" not in f:
            return None

        def visit(name, obj):
            nonlocal total
            if isinstance(obj, h5py.Group) and name.endswith("/vars") and "name" in obj.attrs:
                datasets = [obj[k] for k in sorted(obj.keys(), key=int)]
                total += sum(int(dataset.size) for dataset in datasets)
                if total > MAX_VALUES:
                    raise ValueError(
                        f"{path} declares more than {MAX_VALUES:,} weight values (at "
                        f"layers/{name}); no model of this library has that many: give the "
                        "weights file of a YOLOv3 or tiny-YOLOv3"
                    )
                arrays[str(obj.attrs["name"])] = [np.asarray(dataset) for dataset in datasets]

        f["layers"].visititems(visit)
    return arrays


def is_keras2_file(path):
    with _open_h5(path) as f:
        return "layer_names" in f.attrs or "model_weights" in f


def _open_h5(path):
    try:
        return h5py.File(path, "r")
    except OSError:
        raise ValueError(
            f"{path} is not a Keras weights file (HDF5); convert Darknet .weights files with "
            "yolo3 convert first"
        ) from None


def check_num_classes(path, num_classes, source=None, metadata=None):
    """Raises if ``path`` records a class count other than ``num_classes``; ``metadata``:
    the file's, where the caller has read it (:func:`stored_metadata`)."""
    if metadata is None:
        metadata = stored_metadata(path)
    found = metadata.get("num_classes")
    if found is not None and num_classes is not None and found != num_classes:
        where = f" ({source})" if source else ""
        raise ValueError(
            f"weights {path} were trained for {found} classes, but the model has "
            f"{num_classes} classes{where}; use the classes file the weights were trained with"
        )


def implied_head(head, path, given=(), metadata=None):
    """``head`` as the weights in ``path`` mean it where their file says more than its
    metadata: a Keras 2 file of the original keras-yolo3 (which records none) implies that
    project's anchor masks (its tiny-YOLOv3's differ from Darknet's, see
    :mod:`yolo3.checkpoint.legacy`), unless ``given`` (the head fields a flag set) names them.
    ``metadata``: the file's, where the caller has read it (:func:`stored_metadata`).
    """
    if "anchor_masks" in given or not path.endswith(".h5") or not os.path.exists(path):
        return head
    if metadata is None:
        metadata = stored_metadata(path)
    if metadata or not is_keras2_file(path):
        return head
    from yolo3.checkpoint.legacy import ORIGINAL_ANCHOR_MASKS  # noqa: PLC0415

    return head.replace(anchor_masks=ORIGINAL_ANCHOR_MASKS[head.model_type])


def stored_metadata(path):
    """The metadata of the weights in ``path`` as a dict: what :func:`save_weights` wrote
    (this library's checkpoints, conversions of a cfg); ``{}`` for a file that records none,
    a ``.keras`` archive (it records its own architecture) or a missing file (which fails
    where it is loaded)."""
    if not path.endswith(".h5") or not os.path.exists(path):
        return {}
    return read_metadata(path) or {}


def stored_resampling(path, metadata=None):
    """``"darknet"`` for weights converted from Darknet (they reproduce Darknet's detections
    with its own letterbox resize), else ``"bicubic"``, what training here resamples with;
    ``metadata``: the file's, where the caller has read it (:func:`stored_metadata`)."""
    if metadata is None:
        metadata = stored_metadata(path)
    return "darknet" if converted_from_darknet(metadata) else "bicubic"


def converted_from_darknet(metadata):
    """Whether weights with ``metadata`` (:func:`stored_metadata`) are a conversion of
    Darknet's (``yolo3 convert``): they decode as Darknet does."""
    return str(metadata.get("source") or "").startswith("darknet:")


def load_weights(model, path, *, skip_mismatch=False):
    """Loads weights into ``model`` by layer name.

    Accepts our ``.weights.h5`` files, Keras 2 HDF5 files from the original keras-yolo3
    (read in creation order, see :mod:`yolo3.checkpoint.legacy`) and ``.keras`` archives.

    Returns:
        A report dict: ``loaded`` (layer names), ``skipped`` (``(name, reason)`` pairs, only
        when ``skip_mismatch``) and ``missing`` (model layers with weights the file lacks).

    Raises:
        FileNotFoundError, or ValueError naming the layer and both shapes on a mismatch.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.endswith(".keras"):
        source = load_keras_archive(path)
        arrays = {layer.name: layer.get_weights() for layer in source.layers if layer.weights}
    elif is_keras2_file(path):
        from yolo3.checkpoint import legacy

        return legacy.load_keras2_weights(model, path, skip_mismatch=skip_mismatch)
    else:
        arrays = read_named_arrays(path)
        if arrays is None:
            raise ValueError(f"{path} is not a Keras weights file (no 'layers' group)")
        from yolo3.model.network import model_type_of  # noqa: PLC0415

        check_model_type(model_type_of(model), path)
    return assign_by_name(model, arrays, path, skip_mismatch=skip_mismatch)


def load_keras_archive(path):
    """The model in the ``.keras`` archive ``path``, deserialised in Keras's safe mode.

    An archive from elsewhere is untrusted: safe mode refuses the layers that would run its
    code (``Lambda``), and Keras refuses classes it does not know (a config naming
    ``os.system``) before anything runs. Every way such a file fails to load (unknown
    classes, refused lambdas, a damaged zip, a config that builds no model, a layer too big
    to allocate) is the file's problem, not a bug here: one ValueError naming the file and
    what to give instead.
    """
    import keras  # noqa: PLC0415 - TensorFlow only where an archive is read

    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as err:  # noqa: BLE001 - a file from elsewhere fails in many ways
        raise ValueError(
            f"{path} does not load as a Keras model ({_one_line(err)}); give a .weights.h5 "
            "file, or a .keras archive saved by Keras 3 from a model of this library"
        ) from None


# What a message quotes of a library's error about a file: enough to tell what failed.
_QUOTE_CHARS = 200


def _one_line(err):
    """``err``'s message on one line: the first sentence of its innermost cause, at most
    :data:`_QUOTE_CHARS` characters. Keras wraps the error of a nested layer in its
    model's ("Exception encountered: ...") and quotes the whole config of what it could
    not load, which a hostile file makes as long as it likes."""
    text = " ".join(str(err).split()).rpartition("Exception encountered: ")[2]
    text = text.split(". ", 1)[0] or type(err).__name__
    if len(text) > _QUOTE_CHARS:
        text = text[: _QUOTE_CHARS - 3] + "..."
    return f"{type(err).__name__}: {text}"


def check_model_type(model_type, path, metadata=None):
    """ValueError naming both when ``path`` records weights of the detector type other than
    ``model_type``; ``metadata``: the file's, where the caller has read it
    (:func:`stored_metadata`).

    A darknet53 backbone loads into YOLOv3 (its first 52 layers); YOLOv3 and tiny share
    layer names but not their meaning, so a partial load of one into the other is refused.
    """
    from yolo3.model.network import MODEL_TYPES  # noqa: PLC0415

    if metadata is None:
        metadata = stored_metadata(path)
    recorded = metadata.get("model_type")
    if recorded in MODEL_TYPES and model_type in MODEL_TYPES and recorded != model_type:
        raise ValueError(
            f"weights {path} are for a {recorded} model, not {model_type}: use model type "
            f"{recorded}, or weights of a {model_type} model"
        )


def assign_by_name(model, arrays, source, *, skip_mismatch=False):
    """Sets each layer of ``model`` from ``arrays[layer.name]`` after checking shapes."""
    report = {"loaded": [], "skipped": [], "missing": []}
    pending = []
    for layer in model.layers:
        if not layer.weights:
            continue
        values = arrays.get(layer.name)
        if values is None:
            report["missing"].append(layer.name)
            continue
        expected = [tuple(w.shape) for w in layer.weights]
        found = [tuple(v.shape) for v in values]
        if expected != found:
            reason = f"layer {layer.name}: file has shapes {found}, model expects {expected}"
            if not skip_mismatch:
                raise ValueError(f"{source}: {reason}")
            report["skipped"].append((layer.name, reason))
            continue
        pending.append((layer, values))
    if not pending:
        raise ValueError(f"{source}: no layer of the file matches a layer of {model.name}")
    if report["missing"] and not skip_mismatch:
        raise ValueError(
            f"{source}: the file has no weights for {len(report['missing'])} layers of "
            f"{model.name} (first: {report['missing'][:3]})"
        )
    for layer, values in pending:
        layer.set_weights(values)
        report["loaded"].append(layer.name)
    return report
