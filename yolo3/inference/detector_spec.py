"""What turns a network's heads into detections, besides its weights: :class:`DetectorSpec`.

An exported artifact records one (:mod:`yolo3.inference.export`); :func:`spec_for_weights` reads one
from a ``.weights.h5`` file's metadata and the tools' flags.
"""

import dataclasses
import os

from yolo3.data.image import RESAMPLING
from yolo3.model.head import HeadSpec

# An artifact's JSON, key by key in the order artifacts have always held them: the head's
# keys (as :meth:`HeadSpec.to_metadata` names them) and the detector's own. Artifacts from
# before the grid sensitivity have no ``scale_x_y`` and read as YOLOv3's 1.
JSON_KEYS = (
    "model_type",
    "classes",
    "anchors",
    "anchor_masks",
    "input_size",
    "resampling",
    "score_threshold",
    "iou_threshold",
    "max_detections",
    "scale_x_y",
)


@dataclasses.dataclass(frozen=True)
class DetectorSpec:
    """Everything besides the weights that turns a network's heads into detections.

    Fields:
        head: the :class:`yolo3.model.head.HeadSpec` (classes, anchors, levels, grid
            sensitivity); its ``input_hw``, the network input ``(height, width)``, is required.
        resampling: how images are letterboxed, one of :data:`yolo3.data.image.RESAMPLING`.
        score_threshold, iou_threshold, max_detections: see
            :func:`yolo3.inference.postprocess.batched_nms`.
    """

    head: HeadSpec
    resampling: str = "bicubic"
    score_threshold: float = 0.3
    iou_threshold: float = 0.45
    max_detections: int = 100

    def __post_init__(self):
        if self.head.input_hw is None:
            raise ValueError("a detector runs at one input size: give the head's input_hw")
        if self.resampling not in RESAMPLING:
            raise ValueError(f"resampling {self.resampling!r}: use one of {RESAMPLING}")
        if not 0.0 <= self.score_threshold <= 1.0 or not 0.0 <= self.iou_threshold <= 1.0:
            raise ValueError("score and IoU thresholds must lie in [0, 1]")
        if self.max_detections < 1:
            raise ValueError(f"max detections {self.max_detections} must be at least 1")

    @property
    def thresholds(self):
        """The keyword arguments of :func:`yolo3.inference.postprocess.batched_nms`."""
        return {
            "score_threshold": self.score_threshold,
            "iou_threshold": self.iou_threshold,
            "max_detections": self.max_detections,
        }

    def to_json(self):
        """The flat JSON an artifact records (:data:`JSON_KEYS`)."""
        values = {**self.head.to_metadata(), "resampling": self.resampling, **self.thresholds}
        return {key: values[key] for key in JSON_KEYS}

    @classmethod
    def from_json(cls, data, source="detector metadata"):
        """The spec :meth:`to_json` wrote, also one written before a key existed."""
        return cls(
            HeadSpec.from_metadata(data, source=source),
            resampling=data.get("resampling", "bicubic"),
            score_threshold=float(data["score_threshold"]),
            iou_threshold=float(data["iou_threshold"]),
            max_detections=int(data["max_detections"]),
        )


def spec_for_weights(
    weights_path,
    *,
    classes_path=None,
    anchors_path=None,
    input_size=None,
    head_overrides=None,
    resampling=None,
    score_threshold=0.3,
    iou_threshold=0.45,
    max_detections=100,
    class_names=None,
    fallbacks=None,
    log=None,
):
    """The :class:`DetectorSpec` of a ``.weights.h5`` file: each value from its argument
    when given, else from the file's metadata, else from ``fallbacks``; ValueError naming the
    flag when none has it.

    ``input_size`` is an int or ``(height, width)``; the paths are the classes and anchors
    files (``--classes``, ``--anchors``). ``class_names`` stands in for a classes file (a
    record set's own names); ``classes_path`` wins over it. ``head_overrides`` holds the
    other head fields given (``model_type``, ``anchor_masks``, ``scale_x_y``, keyed as
    :class:`yolo3.model.head.HeadSpec` names them; None values are not given). Masks
    neither given nor recorded are the ones a Keras 2 file of the original keras-yolo3
    implies (:func:`yolo3.checkpoint.weights.stored_anchor_masks`), else Darknet's.
    ``fallbacks`` may hold ``classes_path``, ``anchors_path`` and ``input_size``: what a tool
    uses for a file that records none (Darknet conversions record no class names or input
    size), each use said through ``log`` so that no default is taken silently.
    """
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415 - h5py only where weights are read
    from yolo3.model.resources import read_anchors, read_classes  # noqa: PLC0415

    weights_path = os.fspath(weights_path)
    if not os.path.exists(weights_path):
        raise FileNotFoundError(f"weights file {weights_path} does not exist")
    metadata = weights_io.read_metadata(weights_path) or {}
    overrides = {key: value for key, value in (head_overrides or {}).items() if value is not None}
    fallbacks = fallbacks or {}

    def fallback(key, what, flag):
        if fallbacks.get(key) is None:
            raise ValueError(f"weights {weights_path} do not record {what}; give {flag}")
        if log is not None:
            log(f"weights {weights_path} record no {what}: using {fallbacks[key]} ({flag})")
        return fallbacks[key]

    if classes_path is None and class_names is None and not metadata.get("classes"):
        classes_path = fallback("classes_path", "class names", "--classes FILE")
    if classes_path is not None:
        overrides["class_names"] = read_classes(classes_path)
        weights_io.check_num_classes(weights_path, len(overrides["class_names"]), classes_path)
    elif class_names is not None:
        overrides["class_names"] = list(class_names)
        weights_io.check_num_classes(weights_path, len(class_names), "the given class names")
    if anchors_path is None and not metadata.get("anchors"):
        anchors_path = fallback("anchors_path", "anchors", "--anchors FILE")
    if anchors_path is not None:
        overrides["anchors"] = read_anchors(anchors_path)
    if input_size is None and not metadata.get("input_size"):
        input_size = fallback("input_size", "input size", "--input-size")
    overrides["input_hw"] = input_size
    if "model_type" in overrides:  # the file's own type named, before its anchors are judged
        weights_io.check_model_type(overrides["model_type"], weights_path)
    source = f"weights {weights_path}"
    head = HeadSpec.from_metadata(metadata, source=source, **overrides)
    if not (overrides.get("anchor_masks") or metadata.get("anchor_masks")):
        # A Keras 2 file of the original keras-yolo3 implies that project's masks.
        masks = weights_io.stored_anchor_masks(weights_path, head.model_type)
        if masks:
            head = head.replace(anchor_masks=masks)
    return DetectorSpec(
        head,
        resampling=resampling or weights_io.stored_resampling(weights_path),
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
        max_detections=max_detections,
    )


def load_keras_model(weights_path, spec):
    """The Keras model of ``spec`` with the weights of ``weights_path`` loaded."""
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415
    from yolo3.model.network import build_head_model  # noqa: PLC0415

    model = build_head_model(spec.head)
    weights_io.load_weights(model, os.fspath(weights_path))
    return model
