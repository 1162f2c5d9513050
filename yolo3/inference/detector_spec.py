"""What turns a network's heads into detections, besides its weights: :class:`DetectorSpec`.

An exported artifact records one (:mod:`yolo3.inference.export`); :func:`spec_for_weights` reads one
from a ``.weights.h5`` file's metadata and the tools' flags.
"""

import dataclasses
import os

from yolo3.data.image import RESAMPLING
from yolo3.model.head import HeadSpec

# An artifact's JSON, key by key in the order artifacts have always held them: the head's
# keys (as :meth:`HeadSpec.to_metadata` names them) and the detector's own, each key added
# later at the end. An artifact from before a key reads as its old meaning
# (:meth:`HeadSpec.from_metadata`).
# The NMS IoU threshold of every detector and of the mAP passes unless one is given: a box is
# suppressed by a higher-scoring box of its class that overlaps it more (Darknet's nms=.45).
NMS_IOU_THRESHOLD = 0.45
# A detector's other thresholds unless one is given: detections scoring below SCORE_THRESHOLD
# are dropped before NMS, and at most MAX_DETECTIONS are kept per image after it.
SCORE_THRESHOLD = 0.3
MAX_DETECTIONS = 100
# Box merging: each box NMS keeps becomes the mean of the boxes of its class it overlaps by
# more than the NMS IoU threshold (itself among them), each weighted by its score times its
# IoU with the kept box to the power BOX_MERGE_POWER; the kept box's score stays. The boxes
# a kept box suppresses are other estimates of the same object, and their mean is a tighter
# box than the best-scored one alone: over the recipe matrix's 28 trained detectors (seven
# cells, two seeds, 6 epochs and equal time) COCO AP rose by 0.019 to 0.056 in every cell,
# 0.033 on average, and by 0.031 on the demo's run (docs/benchmarks.md, "Box merging"); the
# power of 6 was the best of 3 to 12 over the matrix (4 on the demo's run, by 0.001). On
# for every detector but those of weights converted from Darknet, which keep Darknet's
# plain NMS (their detections are Darknet's; spec_for_weights).
BOX_MERGE = True
BOX_MERGE_POWER = 6
# Merging weighs every kept detection against every candidate box, a few (detections x
# candidates) float arrays an image: at most this many pairs (64 MB an array), which holds
# 100 detections at any input size up to 1,632 px for YOLOv3 and 1,575 of them at 416 px.
# An artifact's metadata can ask for more (it is read before the artifact runs).
MAX_MERGE_PAIRS = 2**24

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
    "box_merge",
)


@dataclasses.dataclass(frozen=True)
class DetectorSpec:
    """Everything besides the weights that turns a network's heads into detections.

    Fields:
        head: the :class:`yolo3.model.head.HeadSpec` (classes, anchors, levels, grid
            sensitivity); its ``input_hw``, the network input ``(height, width)``, is required.
        resampling: how images are letterboxed, one of :data:`yolo3.data.image.RESAMPLING`.
        score_threshold, iou_threshold, max_detections, box_merge: see
            :func:`yolo3.inference.postprocess.batched_nms`.
    """

    head: HeadSpec
    resampling: str = "bicubic"
    score_threshold: float = SCORE_THRESHOLD
    iou_threshold: float = NMS_IOU_THRESHOLD
    max_detections: int = MAX_DETECTIONS
    box_merge: bool = BOX_MERGE

    def __post_init__(self):
        if self.head.input_hw is None:
            raise ValueError("a detector runs at one input size: give the head's input_hw")
        if self.resampling not in RESAMPLING:
            raise ValueError(f"resampling {self.resampling!r}: use one of {RESAMPLING}")
        if not 0.0 <= self.score_threshold <= 1.0 or not 0.0 <= self.iou_threshold <= 1.0:
            raise ValueError("score and IoU thresholds must lie in [0, 1]")
        if not isinstance(self.box_merge, bool):
            raise ValueError(f"box merging is on or off (True or False), not {self.box_merge!r}")
        if self.max_detections < 1:
            raise ValueError(f"max detections {self.max_detections} must be at least 1")
        pairs = self.max_detections * self.num_candidates
        if self.box_merge and pairs > MAX_MERGE_PAIRS:
            raise ValueError(
                f"box merging weighs each of {self.max_detections} detections against each of "
                f"{self.num_candidates} candidate boxes: {pairs:,} pairs an image, more than "
                f"{MAX_MERGE_PAIRS:,}; lower --max-detections or give --box-merge off"
            )

    @property
    def num_candidates(self):
        """The boxes the network proposes for one image: every anchor of every grid cell."""
        return sum(
            level.cells(self.head.input_hw) * len(level.anchor_indices)
            for level in self.head.levels()
        )

    @property
    def thresholds(self):
        """The keyword arguments of :func:`yolo3.inference.postprocess.batched_nms`."""
        return {
            "score_threshold": self.score_threshold,
            "iou_threshold": self.iou_threshold,
            "max_detections": self.max_detections,
            "box_merge": self.box_merge,
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
            # An artifact from before box merging holds plain NMS (or its runner applies it).
            box_merge=data.get("box_merge", False),
        )


def spec_for_weights(
    weights_path,
    *,
    classes_path=None,
    anchors_path=None,
    input_size=None,
    head_overrides=None,
    resampling=None,
    score_threshold=SCORE_THRESHOLD,
    iou_threshold=NMS_IOU_THRESHOLD,
    max_detections=MAX_DETECTIONS,
    box_merge=None,
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
    other head fields given (``model_type`` and those of
    :data:`yolo3.model.head.HEAD_FLAGS`, keyed as :class:`yolo3.model.head.HeadSpec` names
    them; None values are not given); what neither gives nor the file records is what the
    file implies (:func:`yolo3.checkpoint.weights.implied_head`), else the head's default.
    ``box_merge`` None is :data:`BOX_MERGE`, except for weights converted from Darknet
    (:func:`yolo3.checkpoint.weights.converted_from_darknet`), whose detections are
    Darknet's, with its plain NMS.
    ``fallbacks`` may hold ``classes_path``, ``anchors_path`` and ``input_size``: what a tool
    uses for a file that records none (Darknet conversions record no class names or input
    size), each use said through ``log`` so that no default is taken silently.
    """
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415 - h5py only where weights are read

    weights_path = os.fspath(weights_path)
    if not os.path.exists(weights_path):
        raise FileNotFoundError(f"weights file {weights_path} does not exist")
    stored = _StoredWeights(weights_path, weights_io.stored_metadata(weights_path), fallbacks, log)
    given = {key: value for key, value in (head_overrides or {}).items() if value is not None}
    fields = {
        **given,
        **stored.class_names(classes_path, class_names),
        **stored.anchors(anchors_path),
        "input_hw": stored.input_size(input_size),
    }
    if "model_type" in given:  # the file's own type named, before its anchors are judged
        weights_io.check_model_type(given["model_type"], weights_path, stored.metadata)
    head = HeadSpec.from_metadata(stored.metadata, source=f"weights {weights_path}", **fields)
    return DetectorSpec(
        weights_io.implied_head(head, weights_path, given, stored.metadata),
        resampling=resampling or weights_io.stored_resampling(weights_path, stored.metadata),
        score_threshold=score_threshold,
        iou_threshold=iou_threshold,
        max_detections=max_detections,
        box_merge=_stored_box_merge(stored.metadata) if box_merge is None else box_merge,
    )


def _stored_box_merge(metadata):
    from yolo3.checkpoint.weights import converted_from_darknet  # noqa: PLC0415 - h5py

    return BOX_MERGE and not converted_from_darknet(metadata)


@dataclasses.dataclass(frozen=True)
class _StoredWeights:
    """A weights file's metadata, read once, and what a tool gives where it records nothing:
    each method returns the head fields its flags give (``{}`` where the file's own hold)."""

    path: str
    metadata: dict
    fallbacks: dict | None
    log: object

    def fallback(self, key, what, flag):
        fallbacks = self.fallbacks or {}
        if fallbacks.get(key) is None:
            raise ValueError(f"weights {self.path} do not record {what}; give {flag}")
        if self.log is not None:
            self.log(f"weights {self.path} record no {what}: using {fallbacks[key]} ({flag})")
        return fallbacks[key]

    def class_names(self, classes_path, class_names):
        from yolo3.checkpoint.weights import check_num_classes  # noqa: PLC0415
        from yolo3.model.resources import read_classes  # noqa: PLC0415

        if classes_path is None and class_names is None and not self.metadata.get("classes"):
            classes_path = self.fallback("classes_path", "class names", "--classes FILE")
        if classes_path is not None:
            names, source = read_classes(classes_path), classes_path
        elif class_names is not None:
            names, source = list(class_names), "the given class names"
        else:
            return {}
        check_num_classes(self.path, len(names), source, self.metadata)
        return {"class_names": names}

    def anchors(self, anchors_path):
        from yolo3.model.resources import read_anchors  # noqa: PLC0415

        if anchors_path is None and not self.metadata.get("anchors"):
            anchors_path = self.fallback("anchors_path", "anchors", "--anchors FILE")
        return {"anchors": read_anchors(anchors_path)} if anchors_path is not None else {}

    def input_size(self, input_size):
        if input_size is None and not self.metadata.get("input_size"):
            return self.fallback("input_size", "input size", "--input-size")
        return input_size


def load_keras_model(weights_path, spec):
    """The Keras model of ``spec`` with the weights of ``weights_path`` loaded."""
    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415
    from yolo3.model.network import build_head_model  # noqa: PLC0415

    model = build_head_model(spec.head)
    weights_io.load_weights(model, os.fspath(weights_path))
    return model
