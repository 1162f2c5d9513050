"""One ``detect(images)`` for every form a trained detector takes.

:func:`load_detector` opens a ``.weights.h5`` file (a :class:`yolo3.inference.detect.Detector` on
the Keras model), or an artifact written by :func:`yolo3.inference.export.export_detector`: a
SavedModel folder (TensorFlow), an ``.onnx`` file (onnxruntime) or a ``.tflite`` file (LiteRT). Each
returns the same per-image dicts as :meth:`yolo3.inference.detect.Detector.detect`::

    detector = load_detector("model.tflite")
    [result] = detector.detect([load_rgb("dog.jpg")])

Images are letterboxed here as the artifact records (``resampling``) and handed over as
uint8; what the artifact leaves out (NMS for TFLite, everything after the heads for a raw
export) runs here with :mod:`yolo3.inference.postprocess`, so every engine gives the same
detections.
"""

import numpy as np
import tensorflow as tf

from yolo3.data.image import letterbox_darknet, letterbox_image
from yolo3.inference.detect import Detector, letterbox_batch, split_detections
from yolo3.inference.detector_spec import load_keras_model, spec_for_weights
from yolo3.inference.export import artifact_engine, read_artifact
from yolo3.inference.postprocess import batched_nms, postprocess

# What the artifact fixed at export time; load_detector refuses other values for them.
EXPORT_TIME_SETTINGS = ("score_threshold", "iou_threshold", "max_detections", "box_merge")


def _shown(value):
    """A setting as its flag takes it: on or off for a switch."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def load_detector(path, *, num_threads=None, **settings):
    """A detector for ``path``, whatever its format.

    Args:
        path: a ``.weights.h5`` file, a SavedModel folder, an ``.onnx`` or a ``.tflite`` file.
        num_threads: CPU threads for onnxruntime and LiteRT (None: their default).
        **settings: for weights files, :func:`yolo3.inference.detector_spec.spec_for_weights`'s
            keywords (``classes_path``, ``anchors_path``, ``input_size``, ``head_overrides``,
            thresholds, ...); for an artifact only thresholds equal to those it was exported
            with (ValueError otherwise: they are part of the artifact).
    """
    engine = artifact_engine(path)
    if engine == "keras":
        spec = spec_for_weights(path, **settings)
        return Detector.from_model(
            load_keras_model(path, spec),
            spec.head,
            resampling=spec.resampling,
            **spec.thresholds,
        )
    return ArtifactDetector(path, engine=engine, num_threads=num_threads, **settings)


class ArtifactDetector:
    """Runs an exported artifact; see :func:`load_detector`.

    Attributes:
        engine: ``"saved_model"``, ``"onnx"`` or ``"tflite"``.
        metadata: the dict the artifact carries; ``spec`` the
            :class:`yolo3.inference.detector_spec.DetectorSpec` in it.
    """

    def __init__(self, path, *, engine=None, num_threads=None, **settings):
        self.path = str(path)
        self.engine = engine or artifact_engine(path)
        # Read as data and checked before anything of the artifact runs (loading a
        # SavedModel runs its graphs).
        self.metadata, self.spec = read_artifact(self.path, self.engine)
        for name, value in settings.items():
            if name not in EXPORT_TIME_SETTINGS:
                raise ValueError(
                    f"{self.path} is an exported {self.engine} model: {name} is "
                    f"part of it (use the weights file to change it)"
                )
            if value is not None and value != getattr(self.spec, name):
                raise ValueError(
                    f"{self.path} was exported with {name} {_shown(getattr(self.spec, name))}; "
                    f"export again with the new value to use {_shown(value)}"
                )
        self.class_names = list(self.spec.head.class_names)
        self.input_hw = self.spec.head.input_hw
        self.outputs = self.metadata["outputs"]
        if self.engine == "saved_model":
            self._run = _saved_model_runner(self.path)
        elif self.engine == "onnx":
            self._run = _onnx_runner(self.path, num_threads)
        else:
            self._run = _tflite_runner(self.path, num_threads)
        self._finish = _host_postprocess(self.spec, self.outputs)

    def letterbox(self, image):
        """The uint8 input for one RGB image, resampled as the artifact records."""
        if self.spec.resampling == "darknet":
            scaled = letterbox_darknet(image, self.input_hw) * np.float32(255)
            return np.clip(np.round(scaled), 0, 255).astype(np.uint8)
        return letterbox_image(image, self.input_hw)

    def run_batch(self, inputs, sizes):
        """Padded ``(boxes, scores, classes, counts)`` for letterboxed uint8 ``inputs``
        ``(N, H, W, 3)`` of images whose original sizes are ``sizes`` ``(N, 2)`` int32."""
        feed = {"images": np.ascontiguousarray(inputs, np.uint8)}
        if self.outputs != "heads":
            feed["image_hw"] = np.asarray(sizes, np.int32)
        return self._finish(self._run(feed), np.asarray(sizes, np.int32))

    def detect(self, images):
        """As :meth:`yolo3.inference.detect.Detector.detect`."""
        if (
            isinstance(images, np.ndarray)
            and images.ndim < 4
            or not isinstance(images, (list, tuple, np.ndarray))
        ):
            images = [images]
        if len(images) == 0:
            return []
        inputs, sizes = letterbox_batch(images, self.letterbox)
        return split_detections(*self.run_batch(inputs, sizes), self.class_names)


def _saved_model_runner(path):
    try:
        loaded = tf.saved_model.load(path)
        function = loaded.signatures["serving_default"]
    except Exception as err:  # noqa: BLE001 - a damaged SavedModel fails in many ways
        detail = " ".join(str(err).split())[:200]
        raise ValueError(
            f"{path} does not load as a SavedModel with a serving_default signature "
            f"({type(err).__name__}: {detail}); export it again with yolo3 export"
        ) from None

    def run(feed):
        found = function(**{name: tf.constant(value) for name, value in feed.items()})
        return {name: tensor.numpy() for name, tensor in found.items()}

    return run


def _onnx_runner(path, num_threads):
    try:
        import onnxruntime  # noqa: PLC0415 - optional, the export extra
    except ImportError as err:
        raise ValueError(
            f"running {path} needs onnxruntime: pip install 'keras-yolo3[export]'"
        ) from err
    options = onnxruntime.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        path, sess_options=options, providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]

    def run(feed):
        return dict(zip(names, session.run(names, feed), strict=True))

    return run


def tflite_interpreter(path, num_threads=None):
    """A LiteRT interpreter for ``path``: ``ai_edge_litert`` where installed (TensorFlow's own
    ``tf.lite.Interpreter`` is deprecated in its favour), else TensorFlow's."""
    try:
        from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415
    except ImportError:
        Interpreter = tf.lite.Interpreter  # noqa: N806 - the class, chosen at run time
    return Interpreter(model_path=str(path), num_threads=num_threads)


def _tflite_runner(path, num_threads):
    runner = tflite_interpreter(path, num_threads).get_signature_runner()

    def run(feed):
        return runner(**feed)

    return run


def _host_postprocess(spec, outputs):
    """What runs here after the artifact: nothing, NMS, or decode and NMS."""
    thresholds = spec.thresholds
    if outputs == "detections":

        def finish(found, sizes):
            del sizes  # already in the artifact's output
            return (
                found["boxes"],
                found["scores"],
                found["classes"],
                found["num_detections"],
            )

        return finish
    if outputs == "candidates":
        nms = tf.function(
            lambda boxes, scores: batched_nms(boxes, scores, **thresholds),
            autograph=False,  # TensorFlow ops only (yolo3/engine/step.py)
            input_signature=[
                tf.TensorSpec((None, None, 4), tf.float32),
                tf.TensorSpec((None, None, spec.head.num_classes), tf.float32),
            ],
        )

        def finish(found, sizes):
            del sizes
            return tuple(t.numpy() for t in nms(found["boxes"], found["scores"]))

        return finish
    num_levels = spec.head.num_levels
    decode = tf.function(
        lambda heads, image_hw: postprocess(
            heads, spec.head, image_hw, spec.head.input_hw, **thresholds
        ),
        autograph=False,  # TensorFlow ops only (yolo3/engine/step.py)
        input_signature=[
            [tf.TensorSpec((None, None, None, None), tf.float32)] * num_levels,
            tf.TensorSpec((None, 2), tf.int32),
        ],
    )

    def finish(found, sizes):
        heads = [found[f"head_{level}"] for level in range(num_levels)]
        return tuple(t.numpy() for t in decode(heads, sizes))

    return finish
