"""The detector's head, one value passed whole: :class:`HeadSpec`.

What a network's outputs mean besides its weights: the model type, the class names, the
anchors, which anchors each output level predicts, each level's grid sensitivity and the
input size. The network builder, the targets, the loss, the decoder, the checkpoints'
metadata, the Darknet reader and writer and the tools all take one :class:`HeadSpec`; a new
key of the head is a field here, its check in :meth:`HeadSpec.__post_init__`, its metadata
key in :meth:`HeadSpec.to_metadata` / :meth:`HeadSpec.from_metadata`, and the consumers that
use it.
"""

import dataclasses
import math

import numpy as np

from yolo3.model.resources import (
    DEFAULT_ANCHOR_MASKS,
    MODEL_TYPES,
    SCALE_X_Y,
    SCALE_X_Y_RULE,
    default_anchor_masks,
    model_type_for_anchors,
    parse_anchor_masks,
    parse_scale_x_y,
    valid_scale_x_y,
)

# Output levels of each model type: as many as Darknet's masks for its anchor count.
NUM_LEVELS = {model_type_for_anchors(n): len(masks) for n, masks in DEFAULT_ANCHOR_MASKS.items()}

# The keys of a checkpoint's or artifact's metadata that describe the head.
METADATA_KEYS = (
    "model_type",
    "num_classes",
    "classes",
    "anchors",
    "anchor_masks",
    "scale_x_y",
    "input_size",
)


class HeadFieldError(ValueError):
    """A field of a head that cannot be: ``field`` (its HeadSpec name), the ``value`` as
    given and what is wrong with it. :meth:`named` says it with the flag or file key the
    value came from."""

    LABELS = {"scale_x_y": "grid sensitivity", "input_hw": "input size"}

    def __init__(self, field, value, detail):
        self.field, self.value, self.detail = field, value, detail
        super().__init__(f"{self.LABELS.get(field, field)} {value}: {detail}")

    def named(self, source):
        """The same error as ``ValueError("SOURCE VALUE: DETAIL")``."""
        return ValueError(f"{source} {self.value}: {self.detail}")


@dataclasses.dataclass(frozen=True)
class HeadLevel:
    """One output level of a head, largest stride first.

    ``anchor_indices`` index into the head's anchors; ``anchors`` is their ``(k, 2)``
    float32 widths and heights in input pixels; ``xy_scale`` the level's grid sensitivity
    (a box centre's offset in its cell is ``sigmoid(t) * s - (s - 1) / 2``; 1 is YOLOv3's).
    """

    index: int
    stride: int
    anchor_indices: tuple
    anchors: np.ndarray
    xy_scale: float

    def cells(self, input_hw):
        """The grid cells of this level at an input of ``input_hw`` ``(height, width)``."""
        height, width = input_hw
        return math.ceil(height / self.stride) * math.ceil(width / self.stride)


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    """The detector's head: everything besides the weights that gives its outputs a meaning.

    Fields (normalised on construction, so every holder sees the same form):
        model_type: ``"yolov3"`` (9 anchors, 3 levels) or ``"tiny"`` (6 anchors, 2 levels);
            None: the one the anchor count implies.
        class_names: tuple of str, one per class.
        anchors: ``((w, h), ...)`` in input pixels, smallest first as Darknet lists them;
            any ``(num_anchors, 2)`` array-like is accepted.
        anchor_masks: the anchor indices of each level, largest stride first; None:
            Darknet's for the anchor count.
        scale_x_y: the grid sensitivity of each level, largest stride first (AlexeyAB
            Darknet's key); one number for every level, or None for YOLOv3's 1.
        input_hw: the network input ``(height, width)``, multiples of 32; an int for a square;
            None where the input size is free (multi-scale training, a conversion of a cfg
            that fixes none).

    Raises:
        ValueError naming the field when a value is out of range or the fields disagree.
    """

    anchors: tuple
    class_names: tuple
    model_type: str | None = None
    anchor_masks: tuple | None = None
    scale_x_y: tuple | float | None = None
    input_hw: tuple | int | None = None

    def __post_init__(self):
        anchors = np.asarray(self.anchors, dtype=np.float64)
        if anchors.ndim != 2 or anchors.shape[1] != 2:
            raise ValueError(f"anchors: expected (num_anchors, 2) pairs, got {anchors.shape}")
        if not np.all(np.isfinite(anchors)) or np.any(anchors <= 0):
            raise ValueError(f"anchors: sizes must be positive and finite, got {anchors.tolist()}")
        implied = model_type_for_anchors(len(anchors))
        model_type = self.model_type or implied
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model type {model_type!r}: use one of {MODEL_TYPES}")
        if model_type != implied:
            needed = 9 if model_type == "yolov3" else 6
            raise ValueError(
                f"model type {model_type} needs {needed} anchors; {len(anchors)} given"
            )
        class_names = tuple(str(name) for name in self.class_names)
        if not class_names:
            raise ValueError("class names: at least one class is needed")
        masks = self.anchor_masks or default_anchor_masks(len(anchors))
        masks = tuple(tuple(int(i) for i in mask) for mask in masks)
        if len(masks) != NUM_LEVELS[model_type]:
            raise ValueError(
                f"anchor masks {masks}: {model_type} needs {NUM_LEVELS[model_type]} heads "
                "(largest stride first)"
            )
        if len({len(mask) for mask in masks}) != 1 or not masks[0]:
            raise ValueError(f"anchor masks {masks}: every level needs the same number of anchors")
        if any(not 0 <= i < len(anchors) for mask in masks for i in mask):
            raise ValueError(f"anchor masks {masks} index past the {len(anchors)} anchors")
        object.__setattr__(self, "anchors", tuple(tuple(map(float, pair)) for pair in anchors))
        object.__setattr__(self, "class_names", class_names)
        object.__setattr__(self, "model_type", model_type)
        object.__setattr__(self, "anchor_masks", masks)
        object.__setattr__(self, "scale_x_y", _per_level(self.scale_x_y, len(masks)))
        object.__setattr__(self, "input_hw", _input_hw(self.input_hw))

    # -- views -------------------------------------------------------------------------

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def num_levels(self):
        """Output levels: 3 for YOLOv3, 2 for tiny."""
        return len(self.anchor_masks)

    @property
    def anchors_per_level(self):
        return len(self.anchor_masks[0])

    @property
    def channels(self):
        """Channels of each output level: anchors per level x (5 + classes)."""
        return self.anchors_per_level * (5 + self.num_classes)

    @property
    def anchor_array(self):
        """``(num_anchors, 2)`` float32 widths and heights in input pixels."""
        return np.asarray(self.anchors, dtype=np.float32)

    @property
    def strides(self):
        """Output strides, largest first: (32, 16, 8) for YOLOv3, (32, 16) for tiny."""
        return tuple(32 // 2**level for level in range(self.num_levels))

    def levels(self):
        """The :class:`HeadLevel` of each output, largest stride first."""
        anchors = self.anchor_array
        return tuple(
            HeadLevel(index, stride, mask, anchors[list(mask)], scale)
            for index, (mask, stride, scale) in enumerate(
                zip(self.anchor_masks, self.strides, self.scale_x_y, strict=True)
            )
        )

    def replace(self, **changes):
        """A copy with ``changes`` (field names), checked again."""
        return dataclasses.replace(self, **changes)

    def check_outputs(self, output_shapes, what="model"):
        """ValueError naming both counts when ``output_shapes`` (one shape per output, the
        channels last) do not fit this head's levels, anchors and classes."""
        if len(output_shapes) != self.num_levels:
            raise ValueError(
                f"{what} has {len(output_shapes)} output heads but the anchor masks "
                f"{self.anchor_masks} describe {self.num_levels}; YOLOv3 has 3 heads "
                "(9 anchors), tiny-YOLOv3 2 (6 anchors)"
            )
        for level, shape in enumerate(output_shapes):
            channels = shape[-1]
            if channels is not None and int(channels) != self.channels:
                raise ValueError(
                    f"{what}'s head {level} has {channels} channels; {self.anchors_per_level} "
                    f"anchors x (5 + {self.num_classes} classes) = {self.channels} expected "
                    "(another class count or anchors per head?)"
                )

    # -- metadata ------------------------------------------------------------------------

    def to_metadata(self):
        """The head as JSON-ready metadata (what checkpoints and artifacts record)."""
        return {
            "model_type": self.model_type,
            "num_classes": self.num_classes,
            "classes": list(self.class_names),
            "anchors": [list(pair) for pair in self.anchors],
            "anchor_masks": [list(mask) for mask in self.anchor_masks],
            "scale_x_y": list(self.scale_x_y),
            "input_size": list(self.input_hw) if self.input_hw else None,
        }

    @classmethod
    def from_metadata(cls, metadata, *, source="metadata", **overrides):
        """The head that ``metadata`` (:meth:`to_metadata`'s keys) records, each field of
        ``overrides`` (``anchors=``, ``class_names=``, ...) winning where it is not None.

        Metadata written before a key existed reads as that key's old meaning: no
        ``scale_x_y`` is YOLOv3's 1, no ``anchor_masks`` Darknet's for the anchor count.

        Raises:
            ValueError naming ``source`` and the missing key when neither has it.
        """
        values = {
            "anchors": metadata.get("anchors"),
            "class_names": metadata.get("classes"),
            "model_type": metadata.get("model_type"),
            "anchor_masks": metadata.get("anchor_masks"),
            "scale_x_y": metadata.get("scale_x_y"),
            "input_hw": metadata.get("input_size"),
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        for key, what in (("anchors", "anchors"), ("class_names", "class names")):
            if values[key] is None or len(values[key]) == 0:
                raise ValueError(f"{source} records no {what}")
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


@dataclasses.dataclass(frozen=True)
class HeadFlag:
    """A field of the head that a user may set by flag, alike in every tool that takes it
    (``yolo3 detect``, ``evaluate``, ``convert --to-darknet``, and ``yolo3 train`` where its
    config has the field).

    ``field`` is the :class:`HeadSpec` field and its metadata key; ``parse`` turns the flag's
    text into the field's value (ValueError naming the flag); ``unrecorded`` says what holds
    where neither the flag nor the weights file gives a value.
    """

    field: str
    flag: str
    parse: object
    help: str
    unrecorded: str
    metavar: str | None = None

    def value(self, given):
        """``given`` (the flag's text, or a value parsed already, or None) as the field's."""
        return self.parse(given) if isinstance(given, str) else given


# The head's fields a user sets by flag. A new key of the head that users may set is one
# entry here: the tools' flags, the fine-tuning rule (a run's flag, else the weights' own
# value), the resume check and the export's arguments follow from it.
HEAD_FLAGS = (
    HeadFlag(
        "anchor_masks",
        "--anchor-masks",
        parse_anchor_masks,
        "anchors per head, largest stride first, e.g. '3,4,5 0,1,2'",
        "the original keras-yolo3's for its Keras 2 .h5 files, else Darknet's",
        metavar="MASKS",
    ),
    HeadFlag(
        "scale_x_y",
        "--scale-x-y",
        parse_scale_x_y,
        "grid sensitivity the weights were trained with, one value or one per head, largest "
        "stride first",
        "1, YOLOv3's",
        metavar="S",
    ),
)
HEAD_FLAG_FIELDS = tuple(flag.field for flag in HEAD_FLAGS)


def flags_given(values, fields=HEAD_FLAG_FIELDS):
    """``{field: value}`` of the :data:`HEAD_FLAGS` among ``fields`` that ``values`` (parsed
    arguments, a config: anything holding them as attributes) gives, each parsed."""
    return {
        flag.field: flag.value(getattr(values, flag.field))
        for flag in HEAD_FLAGS
        if flag.field in fields and getattr(values, flag.field, None) is not None
    }


def head_from_flags(given, **fields):
    """``HeadSpec(**fields)`` with ``given`` (:func:`flags_given`) over them; a given value
    that cannot be is a ValueError naming its flag."""
    try:
        return HeadSpec(**{**fields, **given})
    except HeadFieldError as error:
        if error.field in given:
            flag = next(flag.flag for flag in HEAD_FLAGS if flag.field == error.field)
            raise error.named(flag) from None
        raise


def _per_level(scale_x_y, num_levels):
    """``scale_x_y`` (None, a number, or one number per level) as ``num_levels`` floats."""
    if scale_x_y is None:
        return (SCALE_X_Y,) * num_levels
    values = (float(scale_x_y),) if np.isscalar(scale_x_y) else tuple(map(float, scale_x_y))
    text = ",".join(f"{v:g}" for v in values)
    if not valid_scale_x_y(values):
        raise HeadFieldError("scale_x_y", text, SCALE_X_Y_RULE)
    if len(values) == 1:
        values *= num_levels
    if len(values) != num_levels:
        raise HeadFieldError(
            "scale_x_y",
            text,
            f"give one value, or one per head ({num_levels} here, largest stride first)",
        )
    return values


def _input_hw(input_hw):
    if input_hw is None:
        return None
    if np.isscalar(input_hw):
        input_hw = (input_hw, input_hw)
    input_hw = tuple(int(v) for v in input_hw)
    if len(input_hw) != 2 or any(v % 32 or v < 32 for v in input_hw):
        raise ValueError(f"input size {input_hw} is not a positive multiple of 32")
    return input_hw


def prior_biases(head, input_hw, boxes_per_image):
    """The biases of each output convolution of ``head`` (largest stride first, each
    ``(anchors_per_level * (5 + classes),)`` float32) at which a new network's first scores
    are the data's priors instead of sigmoid(0) = 0.5 (Lin et al., "Focal Loss for Dense
    Object Detection", ICCV 2017, section 4.1; YOLOv5's initial biases).

    Objectness: the share of a level's predictions that hold a box, ``boxes_per_image`` (1
    where it is None: not known) over its cells (at ``input_hw``) times its anchors per
    cell, at least 1e-3 of a box and at most 0.5; each class
    ``1 / classes``, at most 0.5; the box channels 0. At 0.5 each of a 256-px input's 960 tiny
    predictions starts at ln 2 of objectness loss, which the first steps spend pushing down,
    the more the finer the grid.
    """
    count = max(1.0 if boxes_per_image is None else float(boxes_per_image), 1e-3)
    class_logit = _logit(min(1.0 / head.num_classes, 0.5))
    biases = []
    for level in head.levels():
        cells = level.cells(input_hw)
        per_cell = len(level.anchor_indices)
        bias = np.zeros((per_cell, 5 + head.num_classes), np.float32)
        bias[:, 4] = _logit(min(count / (cells * per_cell), 0.5))
        bias[:, 5:] = class_logit
        biases.append(bias.reshape(-1))
    return biases


def _logit(p):
    return math.log(p / (1.0 - p))
