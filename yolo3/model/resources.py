"""Readers for the anchors and classes files, and the anchor-to-level assignment.

Anchors file: comma-separated ``w,h`` pairs in input pixels (whitespace ignored), 9 pairs
for YOLOv3 or 6 for tiny-YOLOv3, smallest first as Darknet lists them.
Classes file: one class name per line; blank lines are ignored.
"""

from pathlib import Path

import numpy as np

# The anchors and class-name files the project ships: model_data/ at the top of a checkout,
# installed inside the package as yolo3/model_data (setup.py), so that the tools' defaults
# resolve wherever they run from.
_PACKAGE = Path(__file__).resolve().parents[1]  # yolo3/
MODEL_DATA_FOLDERS = (_PACKAGE / "model_data", _PACKAGE.parent / "model_data")


def model_data_file(name):
    """The path of a shipped anchors or classes file, e.g. ``"yolo_anchors.txt"``."""
    for folder in MODEL_DATA_FOLDERS:
        if (folder / name).is_file():
            return str(folder / name)
    raise FileNotFoundError(f"{name} is not in {' or '.join(map(str, MODEL_DATA_FOLDERS))}")


# Darknet's COCO anchors of each model type, shipped in model_data/.
SHIPPED_ANCHORS = {"yolov3": "yolo_anchors.txt", "tiny": "tiny_yolo_anchors.txt"}


def shipped_anchors(model_type):
    """The path of Darknet's COCO anchors for ``"yolov3"`` or ``"tiny"``."""
    return model_data_file(SHIPPED_ANCHORS[model_type])


# The detectors this library builds (yolo3.model.network), each known by its anchor count
# (model_type_for_anchors) and its levels (DEFAULT_ANCHOR_MASKS).
MODEL_TYPES = ("yolov3", "tiny")

# The input size of Darknet's COCO weights and of the original keras-yolo3: what the tools use
# for a weights file that records none (a Darknet conversion without a fixed size).
DARKNET_INPUT_SIZE = 416

# Darknet's ``mask`` of each [yolo] section, largest stride first. The tiny mask is the one
# in the current yolov3-tiny.cfg (0,1,2); the original keras-yolo3 used 1,2,3, which leaves
# anchor 0 unused, so boxes whose best anchor is 0 were never trained. Pass
# ``anchor_masks`` explicitly to reproduce it.
DEFAULT_ANCHOR_MASKS = {
    9: ((6, 7, 8), (3, 4, 5), (0, 1, 2)),
    6: ((3, 4, 5), (0, 1, 2)),
}


def model_type_for_anchors(num_anchors):
    """``"yolov3"`` for 9 anchors, ``"tiny"`` for 6."""
    if num_anchors not in DEFAULT_ANCHOR_MASKS:
        raise ValueError(f"{num_anchors} anchors given; expected 6 (tiny) or 9 (yolov3)")
    return "yolov3" if num_anchors == 9 else "tiny"


def anchors_of_model(model_type):
    """How many anchors ``model_type`` takes: 9 for ``"yolov3"``, 6 for ``"tiny"``."""
    (count,) = [n for n in DEFAULT_ANCHOR_MASKS if model_type_for_anchors(n) == model_type]
    return count


def default_anchor_masks(num_anchors):
    model_type_for_anchors(num_anchors)
    return DEFAULT_ANCHOR_MASKS[num_anchors]


def parse_anchor_masks(text, source="--anchor-masks"):
    """Parses ``"6,7,8 3,4,5 0,1,2"`` (one comma-separated group per head, largest stride
    first) into a tuple of int tuples."""
    try:
        masks = tuple(tuple(int(i) for i in group.split(",")) for group in text.split())
    except ValueError:
        raise ValueError(
            f"{source} {text!r}: expected comma-separated anchor indices per head, heads "
            "separated by spaces, e.g. '3,4,5 1,2,3'"
        ) from None
    if not masks or len({len(mask) for mask in masks}) != 1:
        raise ValueError(f"{source} {text!r}: every head needs the same number of anchors")
    return masks


# Grid sensitivity (AlexeyAB Darknet's ``scale_x_y`` of each [yolo] section): a box centre's
# offset in its cell is ``sigmoid(t) * s - (s - 1) / 2``, which reaches the cell's edges (0
# and 1) at finite logits when s > 1. 1 is YOLOv3's ``sigmoid(t)``.
SCALE_X_Y = 1.0


# The rule of grid sensitivity, wherever a value comes from (a flag, a head, a cfg): a
# centre's offset sigmoid(t) S - (S - 1) / 2 stays inside a band around its cell only for
# S >= 1.
SCALE_X_Y_RULE = "every value must be at least 1 (1 is YOLOv3's)"


def valid_scale_x_y(values):
    """Whether ``values`` (grid sensitivities) keep :data:`SCALE_X_Y_RULE`."""
    values = tuple(values)
    return bool(values) and all(np.isfinite(values)) and min(values) >= 1.0


def parse_scale_x_y(text, source="--scale-x-y"):
    """Parses ``"1.05"`` (every head) or ``"1.05,1.1"`` (one per head, largest stride first)
    into a tuple of floats, each at least 1."""
    try:
        values = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(
            f"{source} {text!r}: expected a number, or one per head separated by commas, "
            "e.g. 1.05 or 1.05,1.1"
        ) from None
    if not valid_scale_x_y(values):
        raise ValueError(f"{source} {text!r}: {SCALE_X_Y_RULE}")
    return values


def parse_anchors(text, source="anchors"):
    """Parses ``w,h, w,h, ...`` text into a float32 array of shape (num_anchors, 2)."""
    fields = [field.strip() for field in text.replace("\n", ",").split(",") if field.strip()]
    try:
        values = [float(field) for field in fields]
    except ValueError:
        bad = next(f for f in fields if not _is_number(f))
        raise ValueError(f"{source}: {bad!r} is not a number; expected 'w,h, w,h, ...'") from None
    if len(values) % 2:
        raise ValueError(f"{source}: {len(values)} numbers is not a whole number of w,h pairs")
    num_pairs = len(values) // 2
    if num_pairs not in DEFAULT_ANCHOR_MASKS:
        raise ValueError(f"{source} has {num_pairs} pairs; expected 6 (tiny) or 9 (yolov3)")
    anchors = np.asarray(values, dtype=np.float32).reshape(num_pairs, 2)
    if np.any(anchors <= 0):
        raise ValueError(f"{source}: anchor sizes must be positive, got {anchors.tolist()}")
    return anchors


def read_anchors(path):
    with open(path, encoding="utf-8") as f:
        return parse_anchors(f.read(), source=f"anchors file {path}")


def read_classes(path):
    """Class names in file order; an empty file is an error."""
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if not names:
        raise ValueError(f"classes file {path} is empty; write one class name per line")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"classes file {path} repeats {duplicates}; names must be unique")
    return names


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_size(text, example=416):
    """``"416"`` -> ``(416, 416)``, ``"320x480"`` -> ``(320, 480)`` (height x width).

    Raises:
        ValueError naming the text when it is neither form (the hint shows ``example``).
    """
    try:
        sizes = [int(part) for part in str(text).lower().split("x")]
    except ValueError:
        sizes = []
    if len(sizes) == 1:
        sizes *= 2
    if len(sizes) != 2:
        raise ValueError(f"{text!r}: use {example} or HEIGHTxWIDTH")
    return tuple(sizes)
