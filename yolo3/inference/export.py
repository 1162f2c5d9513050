"""Exporting a trained detector as a SavedModel, an ONNX file or a TFLite file.

An exported artifact is a whole detector: it takes a batch of letterboxed uint8 images at the
model's input size and each image's original ``(height, width)``, and returns boxes in the
original pixels. What it returns depends on what the format can hold (``outputs`` in its
metadata):

- ``detections`` (SavedModel, ONNX): decode, letterbox inverse and class-wise NMS inside;
  ``boxes (N, max_detections, 4)``, ``scores (N, max_detections)``, ``classes (N,
  max_detections) int32`` and ``num_detections (N,) int32``, as
  :func:`yolo3.inference.postprocess.postprocess`. SavedModels also have a ``detect_encoded``
  signature that takes encoded JPEG or PNG files of any size and letterboxes them inside.
- ``candidates`` (TFLite): TFLite's builtin operators have non-maximum suppression for one
  class of one image only, so the file ends before NMS with every candidate box in original
  pixels, ``boxes (N, B, 4)`` and per-class ``scores (N, B, C)``
  (:func:`yolo3.inference.postprocess.decode_to_image`); the runner applies the NMS.
- ``heads`` (``raw=True``, any format): the bare network, ``head_0 ... head_k`` of shape
  ``(N, H_l, W_l, anchors * (5 + C))`` float32, for users with their own post-processing;
  its only input is ``images``.

Every artifact records the :class:`yolo3.inference.detector_spec.DetectorSpec` it was exported with
(classes, anchors, masks, input size, resampling, thresholds, outputs, quantisation) as
JSON: a SavedModel's ``assets.extra/yolo3.json`` file (and its ``metadata()`` function, for
TensorFlow users), an ONNX file's ``yolo3`` metadata property, a TFLite file's ``yolo3``
metadata buffer. :func:`read_artifact` reads any of them as data, and checks it, before
anything of the artifact runs: a SavedModel is a program (loading one runs its graphs), so
one from an older export, whose settings only its ``metadata()`` function returns, is
refused rather than run to find out what it is.
"""

import json
import os
import shutil

import numpy as np
import tensorflow as tf

from yolo3 import fileio
from yolo3.checkpoint.darknet import MAX_INPUT_SIZE
from yolo3.data.image import PAD_VALUE
from yolo3.inference.detector_spec import DetectorSpec
from yolo3.inference.postprocess import batched_nms, decode_to_image, letterbox_geometry_tf

FORMATS = ("saved_model", "onnx", "tflite")
QUANTIZATIONS = ("float16", "int8")
OUTPUTS = ("detections", "candidates", "heads")
METADATA_KEY = "yolo3"
METADATA_VERSION = 1
# A SavedModel's metadata as a plain file: ``assets.extra`` is the SavedModel folder's place
# for files that higher-level libraries keep beside the model and TensorFlow never loads.
SAVED_MODEL_SPEC = os.path.join("assets.extra", f"{METADATA_KEY}.json")
# The metadata an artifact may carry, in bytes: 2**15 class names of 500 characters fit.
MAX_METADATA_BYTES = 2**24
# The detections an artifact may keep per image (the runner's NMS allocates room for them):
# COCO scores 100 an image, the densest detection sets hold a few thousand objects.
MAX_DETECTIONS = 2**16
ONNX_OPSET = 17
# The TFLite operators that decode boxes and map them back to the image: kept in float32 in
# an int8 file, because box corners in pixels and exp() of a size offset do not survive 8
# bits (a 416-pixel range in 256 steps). The convolutions, which hold the time, are int8.
FLOAT_DECODE_OPS = (
    "LOGISTIC",
    "EXP",
    "MUL",
    "ADD",
    "SUB",
    "DIV",
    "CONCATENATION",
    "RESHAPE",
    "MINIMUM",
    "MAXIMUM",
    "STRIDED_SLICE",
    "PACK",
    "TILE",
    "REVERSE_V2",
    "EXPAND_DIMS",
    "SELECT_V2",
    "GATHER",
    "RELU",
    "GREATER",
)


def serving_function(model, spec, outputs):
    """The exported computation as a ``tf.function`` with a fixed signature.

    Args:
        model: the Keras ``yolo_body`` / ``tiny_yolo_body`` with its weights.
        spec: a :class:`yolo3.inference.detector_spec.DetectorSpec`.
        outputs: one of :data:`OUTPUTS` (see the module docstring).

    Returns:
        A ``tf.function`` taking ``images`` ``(N, H, W, 3) uint8`` (and, unless ``outputs``
        is ``"heads"``, ``image_hw`` ``(N, 2) int32``, each image's original size; the input
        size for images that were not letterboxed) and returning a dict of tensors.
    """
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs {outputs!r}: use one of {OUTPUTS}")
    input_hw = spec.head.input_hw
    images_spec = tf.TensorSpec((None, *input_hw, 3), tf.uint8, name="images")
    hw_spec = tf.TensorSpec((None, 2), tf.int32, name="image_hw")

    def heads(images):
        inputs = tf.cast(images, tf.float32) / 255.0
        return [tf.cast(head, tf.float32) for head in model(inputs, training=False)]

    if outputs == "heads":

        @tf.function(input_signature=[images_spec])
        def run_heads(images):
            return {f"head_{level}": head for level, head in enumerate(heads(images))}

        return run_heads

    def candidates(images, image_hw):
        return decode_to_image(heads(images), spec.head, image_hw, input_hw)

    if outputs == "candidates":

        @tf.function(input_signature=[images_spec, hw_spec])
        def run_candidates(images, image_hw):
            boxes, scores = candidates(images, image_hw)
            return {"boxes": boxes, "scores": scores}

        return run_candidates

    @tf.function(input_signature=[images_spec, hw_spec])
    def run_detections(images, image_hw):
        # postprocess() is these two halves: the candidates, then class-wise NMS.
        boxes, scores, classes, counts = batched_nms(
            *candidates(images, image_hw), **spec.thresholds
        )
        return {"boxes": boxes, "scores": scores, "classes": classes, "num_detections": counts}

    return run_detections


def letterbox_encoded(encoded, input_hw):
    """Decodes one JPEG/PNG file and letterboxes it in TensorFlow ops.

    Args:
        encoded: scalar ``tf.string``, the file's bytes.
        input_hw: ``(height, width)`` of the network input.

    Returns:
        ``(image, image_hw)``: ``(H, W, 3) uint8`` letterboxed on the grey canvas, the same
        geometry as :func:`yolo3.data.image.letterbox_image`, and the original ``(2,) int32`` size.
        The resize is TensorFlow's antialiased bicubic, close to PIL's but not equal to it.
    """
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image_hw = tf.shape(image)[:2]
    scale_yx, offset_yx = letterbox_geometry_tf(image_hw[tf.newaxis], input_hw)
    new_hw = tf.cast(tf.round(tf.cast(image_hw, tf.float32) * scale_yx[0]), tf.int32)
    resized = tf.image.resize(image, new_hw, method="bicubic", antialias=True)
    resized = tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)
    offset = tf.cast(offset_yx[0], tf.int32)
    padding = [
        [offset[0], input_hw[0] - new_hw[0] - offset[0]],
        [offset[1], input_hw[1] - new_hw[1] - offset[1]],
        [0, 0],
    ]
    canvas = tf.pad(resized, padding, constant_values=PAD_VALUE)
    return tf.ensure_shape(canvas, (*input_hw, 3)), image_hw


def calibration_images(record_set, input_hw, count):
    """Up to ``count`` uint8 images of a record set's validation split, letterboxed to
    ``input_hw`` where the set was packed at another size: int8 calibration data."""
    import itertools  # noqa: PLC0415

    from yolo3.data import records  # noqa: PLC0415
    from yolo3.data.image import letterbox_image  # noqa: PLC0415
    from yolo3.data.records import iterate_records  # noqa: PLC0415

    record_set = records.open_record_set(record_set)
    if not record_set.has_split("val"):
        raise ValueError(f"record set {record_set} has no validation split to calibrate with")
    images = []
    for image, _ in itertools.islice(iterate_records(record_set, "val"), count):
        if image.shape[:2] != tuple(input_hw):
            image = letterbox_image(image, input_hw)
        images.append(np.asarray(image, np.uint8))
    return images


def _metadata(spec, engine, outputs, quantize):
    return {
        "format": "yolo3-detector",
        "version": METADATA_VERSION,
        "engine": engine,
        "outputs": outputs,
        "quantize": quantize,
        **spec.to_json(),
    }


def export_detector(
    model, spec, output, *, engine, raw=False, quantize=None, calibration_images=None
):
    """Writes ``model`` as a whole-detector artifact and returns its metadata.

    Args:
        model: the Keras model, weights loaded.
        spec: a :class:`yolo3.inference.detector_spec.DetectorSpec`.
        output: a folder for ``saved_model``, a ``.onnx`` or ``.tflite`` file otherwise.
            Written atomically: a failed export leaves no half artifact.
        engine: one of :data:`FORMATS`.
        raw: export the bare heads (``outputs = "heads"``).
        quantize: TFLite only: ``"float16"`` weights, or ``"int8"`` (full-integer
            convolutions calibrated on ``calibration_images``, float input and output).
        calibration_images: for int8, an iterable of ``(H, W, 3) uint8`` images already
            letterboxed to the input size.
    """
    if engine not in FORMATS:
        raise ValueError(f"format {engine!r}: use one of {FORMATS}")
    if quantize is not None and engine != "tflite":
        raise ValueError(f"quantisation ({quantize}) is for the tflite format, not {engine}")
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize {quantize!r}: use one of {QUANTIZATIONS}")
    if quantize == "int8" and calibration_images is None:
        raise ValueError("int8 quantisation needs calibration images (--calibration RECORDS)")
    if raw:
        outputs = "heads"
    else:
        outputs = "candidates" if engine == "tflite" else "detections"
    metadata = _metadata(spec, engine, outputs, quantize)
    function = serving_function(model, spec, outputs)
    if engine == "saved_model":
        _write_saved_model(model, spec, function, metadata, output)
    elif engine == "onnx":
        _write_onnx(function, metadata, output)
    else:
        _write_tflite(function, metadata, output, quantize, calibration_images, outputs)
    return metadata


def _write_saved_model(model, spec, function, metadata, output):
    module = tf.Module()
    module.model = model
    module.serve = function
    text = json.dumps(metadata, sort_keys=True)
    module.metadata = tf.function(lambda: tf.constant(text), input_signature=[])
    signatures = {"serving_default": function.get_concrete_function()}
    if metadata["outputs"] == "detections":

        @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="encoded")])
        def detect_encoded(encoded):
            images, image_hw = tf.map_fn(
                lambda data: letterbox_encoded(data, spec.head.input_hw),
                encoded,
                fn_output_signature=(
                    tf.TensorSpec((*spec.head.input_hw, 3), tf.uint8),
                    tf.TensorSpec((2,), tf.int32),
                ),
            )
            return function(images, image_hw)

        module.detect_encoded = detect_encoded
        signatures["detect_encoded"] = detect_encoded.get_concrete_function()
    output = os.fspath(output)
    temp = fileio.atomic_path(output.rstrip("/"))
    try:
        tf.saved_model.save(module, temp, signatures=signatures)
        os.makedirs(os.path.join(temp, os.path.dirname(SAVED_MODEL_SPEC)), exist_ok=True)
        with open(os.path.join(temp, SAVED_MODEL_SPEC), "w", encoding="utf-8") as f:
            f.write(text)
        if os.path.isdir(output):
            shutil.rmtree(output)
        os.replace(temp, output)
    finally:
        if os.path.exists(temp):
            shutil.rmtree(temp)


def _require(module, purpose):
    try:
        return __import__(module)
    except ImportError as err:
        raise ValueError(
            f"{purpose} needs the {module} package: pip install 'keras-yolo3[export]'"
        ) from err


def _write_onnx(function, metadata, output):
    _require("tf2onnx", "ONNX export")
    onnx = _require("onnx", "ONNX export")
    import tf2onnx  # noqa: PLC0415 - an optional dependency, checked above

    proto, _ = tf2onnx.convert.from_function(
        function, input_signature=function.input_signature, opset=ONNX_OPSET
    )
    onnx.helper.set_model_props(proto, {METADATA_KEY: json.dumps(metadata, sort_keys=True)})
    with fileio.atomic_write(output) as temp:
        onnx.save(proto, temp)


def _frozen(function):
    """``function`` with its variables folded in as constants, keeping its output names.

    TFLite converts resource variables into variable operators that its interpreter reads
    uninitialised from a concrete function; constants also let it fold batch norm.
    """
    from tensorflow.python.framework.convert_to_constants import (  # noqa: PLC0415
        convert_variables_to_constants_v2,
    )

    concrete = function.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)

    @tf.function(input_signature=function.input_signature)
    def run(*args):
        names = [spec.name for spec in function.input_signature]
        flat = frozen(**dict(zip(names, args, strict=True)))
        return tf.nest.pack_sequence_as(concrete.structured_outputs, tf.nest.flatten(flat))

    holder = tf.Module()
    holder.run = run
    return run.get_concrete_function(), holder


def _write_tflite(function, metadata, output, quantize, calibration_images, outputs):
    concrete, holder = _frozen(function)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    if quantize == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
        content = converter.convert()
    elif quantize == "int8":
        samples = list(calibration_images)
        if not samples:
            raise ValueError("int8 quantisation: the calibration set has no images")
        input_hw = tuple(metadata["input_size"])

        def representative():
            for image in samples:
                feed = {"images": np.asarray(image, np.uint8)[np.newaxis]}
                if outputs != "heads":
                    feed["image_hw"] = np.asarray([input_hw], np.int32)
                yield feed

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        if outputs == "heads":
            content = converter.convert()
        else:
            # The quantisation debugger is TFLite's way to keep chosen operators in float.
            debugger = tf.lite.experimental.QuantizationDebugger(
                converter=converter,
                debug_dataset=lambda: iter(()),
                debug_options=tf.lite.experimental.QuantizationDebugOptions(
                    denylisted_ops=list(FLOAT_DECODE_OPS)
                ),
            )
            content = debugger.get_nondebug_quantized_model()
    else:
        content = converter.convert()
    content = _with_tflite_metadata(content, metadata)
    with fileio.atomic_write(output) as temp, open(temp, "wb") as f:
        f.write(content)


def _with_tflite_metadata(content, metadata):
    from tensorflow.lite.python import schema_py_generated as schema  # noqa: PLC0415
    from tensorflow.lite.tools import flatbuffer_utils  # noqa: PLC0415

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(content))
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(json.dumps(metadata, sort_keys=True).encode(), np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = METADATA_KEY
    entry.buffer = len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def artifact_engine(path):
    """The format of the artifact at ``path``, from what is there; ValueError otherwise."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            return "saved_model"
        raise ValueError(f"{path} is a folder without saved_model.pb, not a SavedModel")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:8] == b"TFL3":
        return "tflite"
    if path.endswith(".onnx"):
        return "onnx"
    if head.startswith(b"\x89HDF") or (path.endswith(".keras") and head.startswith(b"PK")):
        return "keras"
    raise ValueError(
        f"{path} is not a detector this library reads: give a .weights.h5 file, a "
        f"SavedModel folder, an .onnx file or a .tflite file"
    )


def read_artifact_metadata(path, engine=None):
    """The metadata dict an exported artifact carries, read as data and checked (see
    :func:`read_artifact`); ValueError naming the file if it carries none or a broken one."""
    return read_artifact(path, engine)[0]


def read_artifact(path, engine=None):
    """``(metadata, spec)``: the metadata dict an exported artifact carries and the
    :class:`DetectorSpec` in it, read as data without running anything of the artifact.

    ValueError naming the file when it carries none (a SavedModel without
    :data:`SAVED_MODEL_SPEC`: an older export, or none of ours), or JSON that is not what
    :func:`export_detector` writes.
    """
    path = os.fspath(path)
    engine = engine or artifact_engine(path)
    text = None
    if engine == "saved_model":
        text = _saved_model_metadata(path)
    elif engine == "onnx":
        onnx = _require("onnx", "Reading ONNX files")
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as err:  # protobuf's DecodeError and kin: not an ONNX file
            raise ValueError(f"{path} is not an ONNX model: {err}") from None
        text = {prop.key: prop.value for prop in model.metadata_props}.get(METADATA_KEY)
    elif engine == "tflite":
        text = _tflite_metadata(path)
    if text is None:
        raise ValueError(
            f"{path} has no {METADATA_KEY} metadata: it was not written by yolo3 export"
        )
    return _checked_metadata(text, path, engine)


def _saved_model_metadata(path):
    """The text of a SavedModel's :data:`SAVED_MODEL_SPEC`; ValueError when it has none."""
    spec_path = os.path.join(path, SAVED_MODEL_SPEC)
    if not os.path.isfile(spec_path):
        raise ValueError(
            f"{path} has no {SAVED_MODEL_SPEC}: a SavedModel is a program, and this one's "
            "settings can only be had by running it (an export of an older yolo3, or none of "
            "ours); export it again with yolo3 export, from weights you trust"
        )
    with open(spec_path, "rb") as f:
        data = f.read(MAX_METADATA_BYTES + 1)
    if len(data) > MAX_METADATA_BYTES:
        raise ValueError(f"{spec_path} is over {MAX_METADATA_BYTES:,} bytes: not yolo3 metadata")
    return data


def _checked_metadata(text, path, engine):
    """``(metadata, spec)`` from an artifact's JSON ``text``; ValueError naming ``path``
    unless it is what :func:`_metadata` wrote for ``engine``, within bounds."""

    def refuse(problem):
        return ValueError(
            f"{path}: its {METADATA_KEY} metadata {problem}; export the detector again with "
            "yolo3 export"
        )

    try:
        metadata = json.loads(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise refuse(f"is not JSON ({type(err).__name__})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != "yolo3-detector":
        raise refuse("is not a yolo3 detector's")
    if metadata.get("engine") != engine or metadata.get("outputs") not in OUTPUTS:
        raise refuse(f"does not describe a {engine} detector with one of the outputs {OUTPUTS}")

    def described(data):
        try:
            return DetectorSpec.from_json(data, source="it")
        except Exception as err:  # noqa: BLE001 - JSON from elsewhere is wrong in many ways
            detail = " ".join(str(err).split())[:200]
            if not isinstance(err, ValueError):  # a missing key, a list where a number goes
                detail = f"{type(err).__name__}: {detail}"
            raise refuse(f"does not describe a detector ({detail})") from None

    # Its sizes first (read with plain NMS), then what they ask of box merging (the spec's
    # own bound), so that an absurd size is named as one.
    sizes = described({**metadata, "box_merge": False})
    if max(sizes.head.input_hw) > MAX_INPUT_SIZE or sizes.max_detections > MAX_DETECTIONS:
        raise refuse(
            f"asks for input size {sizes.head.input_hw} and {sizes.max_detections} detections "
            f"an image; this library runs up to {MAX_INPUT_SIZE} px and {MAX_DETECTIONS}"
        )
    return metadata, described(metadata)


def _tflite_metadata(path):
    from tensorflow.lite.python import schema_py_generated as schema  # noqa: PLC0415

    with open(path, "rb") as f:
        content = f.read()
    try:
        model = schema.Model.GetRootAs(content, 0)
        for index in range(model.MetadataLength()):
            entry = model.Metadata(index)
            if entry.Name() == METADATA_KEY.encode():
                return model.Buffers(entry.Buffer()).DataAsNumpy().tobytes()
    except Exception as err:  # noqa: BLE001 - a damaged flatbuffer fails in many ways
        raise ValueError(f"{path} is not a TFLite model ({type(err).__name__})") from None
    return None
