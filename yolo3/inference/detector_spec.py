"""What turns a network's heads into detections, besides its weights: :class:`DetectorSpec`.

An exported artifact records one (:mod:`yolo3.inference.export`); :func:`spec_for_weights` reads one
from a ``.weights.h5`` file's metadata and the tools' flags.
"""

import dataclasses
import os

import numpy as np

from yolo3.data.image import RESAMPLING
from yolo3.model.resources import scale_x_y_per_head


@dataclasses.dataclass(frozen=True)
class DetectorSpec:
    """Everything besides the weights that turns a network's heads into detections.

    ``anchors`` is ``(num_anchors, 2)`` in input pixels, ``anchor_masks`` the anchors of each
    head (largest stride first), ``input_hw`` the network input ``(height, width)``,
    ``scale_x_y`` the grid sensitivity of each head (None: 1 for every head, YOLOv3's).
    """

    model_type: str
    class_names: tuple
    anchors: tuple
    anchor_masks: tuple
    input_hw: tuple
    resampling: str = "bicubic"
    score_threshold: float = 0.3
    iou_threshold: float = 0.45
    max_detections: int = 100
    scale_x_y: tuple | None = None

    def __post_init__(self):
        scales = scale_x_y_per_head(self.scale_x_y, len(self.anchor_masks), "scale_x_y")
        object.__setattr__(self, "scale_x_y", scales)
        if self.resampling not in RESAMPLING:
            raise ValueError(f"resampling {self.resampling!r}: use one of {RESAMPLING}")
        if any(int(v) % 32 or int(v) < 32 for v in self.input_hw):
            raise ValueError(f"input size {self.input_hw} is not a positive multiple of 32")
        if not 0.0 <= self.score_threshold <= 1.0 or not 0.0 <= self.iou_threshold <= 1.0:
            raise ValueError("score and IoU thresholds must lie in [0, 1]")
        if self.max_detections < 1:
            raise ValueError(f"max detections {self.max_detections} must be at least 1")

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def anchor_array(self):
        return np.asarray(self.anchors, dtype=np.float32)

    def to_json(self):
        return {
            "model_type": self.model_type,
            "classes": list(self.class_names),
            "anchors": [list(pair) for pair in self.anchors],
            "anchor_masks": [list(mask) for mask in self.anchor_masks],
            "input_size": list(self.input_hw),
            "resampling": self.resampling,
            "score_threshold": self.score_threshold,
            "iou_threshold": self.iou_threshold,
            "max_detections": self.max_detections,
            "scale_x_y": list(self.scale_x_y),
        }

    @classmethod
    def from_json(cls, data):
        return cls(
            model_type=data["model_type"],
            class_names=tuple(data["classes"]),
            anchors=tuple(tuple(float(v) for v in pair) for pair in data["anchors"]),
            anchor_masks=tuple(tuple(int(i) for i in mask) for mask in data["anchor_masks"]),
            input_hw=tuple(int(v) for v in data["input_size"]),
            resampling=data.get("resampling", "bicubic"),
            score_threshold=float(data["score_threshold"]),
            iou_threshold=float(data["iou_threshold"]),
            max_detections=int(data["max_detections"]),
            scale_x_y=data.get("scale_x_y"),  # artifacts from before it: YOLOv3's 1
        )


def spec_for_weights(
    weights_path,
    *,
    classes_path=None,
    anchors_path=None,
    model_type=None,
    input_size=None,
    anchor_masks=None,
    resampling=None,
    scale_x_y=None,
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

    Over 80 lines: one short block per value, each resolved the same way, side by side.

    ``input_size`` is an int or ``(height, width)``; the paths are the classes and anchors
    files (``--classes``, ``--anchors``). ``class_names`` stands in for a classes file (a
    record set's own names); ``classes_path`` wins over it. ``fallbacks`` may hold
    ``classes_path``, ``anchors_path`` and ``input_size``: what a tool uses for a file that
    records none (Darknet conversions record no class names or input size), each use said
    through ``log`` so that no default is taken silently.
    """
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415 - h5py only where weights are read
    from yolo3.model.resources import (  # noqa: PLC0415
        default_anchor_masks,
        model_type_for_anchors,
        read_anchors,
        read_classes,
    )

    weights_path = os.fspath(weights_path)
    if not os.path.exists(weights_path):
        raise FileNotFoundError(f"weights file {weights_path} does not exist")
    metadata = weights_io.read_metadata(weights_path) or {}
    fallbacks = fallbacks or {}

    def missing(what, flag):
        return ValueError(f"weights {weights_path} do not record {what}; give {flag}")

    def fallback(key, what, flag):
        if fallbacks.get(key) is None:
            raise missing(what, flag)
        if log is not None:
            log(f"weights {weights_path} record no {what}: using {fallbacks[key]} ({flag})")
        return fallbacks[key]

    if classes_path is None and class_names is None and not metadata.get("classes"):
        classes_path = fallback("classes_path", "class names", "--classes FILE")
    if classes_path is not None:
        class_names = read_classes(classes_path)
        weights_io.check_num_classes(weights_path, len(class_names), classes_path)
    elif class_names is not None:
        class_names = list(class_names)
        weights_io.check_num_classes(weights_path, len(class_names), "the given class names")
    else:
        class_names = list(metadata["classes"])
    if anchors_path is None and not metadata.get("anchors"):
        anchors_path = fallback("anchors_path", "anchors", "--anchors FILE")
    if anchors_path is not None:
        anchors = read_anchors(anchors_path)
    else:
        anchors = np.asarray(metadata["anchors"], np.float32)
    model_type = model_type or metadata.get("model_type") or model_type_for_anchors(len(anchors))
    if anchor_masks is None:
        anchor_masks = weights_io.stored_anchor_masks(weights_path, model_type)
    anchor_masks = anchor_masks or default_anchor_masks(len(anchors))
    if input_size is None:
        input_size = metadata.get("input_size") or fallback(
            "input_size", "input size", "--input-size"
        )
    if isinstance(input_size, int):
        input_size = (input_size, input_size)
    return DetectorSpec(
        model_type=model_type,
        class_names=tuple(class_names),
        anchors=tuple(tuple(float(v) for v in pair) for pair in np.asarray(anchors)),
        anchor_masks=tuple(tuple(int(i) for i in mask) for mask in anchor_masks),
        input_hw=tuple(int(v) for v in input_size),
        resampling=resampling or weights_io.stored_resampling(weights_path),
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
        max_detections=max_detections,
        scale_x_y=scale_x_y if scale_x_y is not None else metadata.get("scale_x_y"),
    )


def load_keras_model(weights_path, spec):
    """The Keras model of ``spec`` with the weights of ``weights_path`` loaded."""
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415
    from yolo3.model.network import build_model  # noqa: PLC0415

    model = build_model(
        spec.model_type,
        spec.num_classes,
        num_anchors=len(spec.anchor_masks[0]),
        input_size=spec.input_hw,
    )
    weights_io.load_weights(model, os.fspath(weights_path))
    return model
