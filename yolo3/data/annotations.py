"""The keras-yolo3 annotation line format: parsing, validating and writing it.

One image per line, a path followed by zero or more boxes::

    images/dog 1.jpg 48,240,195,371,11 8,12,352,498,14
    images/empty.jpg

Each box is ``x_min,y_min,x_max,y_max,class_id``: pixel coordinates in the original image
and an integer index into the classes file. A sixth field ``1`` marks the object difficult
(PASCAL VOC's flag: ``x_min,y_min,x_max,y_max,class_id,1``); ``0`` or no sixth field, not.
Difficult objects are left out of training, as Darknet's VOC labels leave them out, and
are neither required nor penalised when mAP is scored, as in the VOC devkit.

A line with only a path is a background image. Lines starting with ``#`` are comments;
blank lines are ignored.

Paths may contain spaces. The first whitespace-separated token always belongs to the path;
the boxes start at the first later token that looks like a box, meaning it contains a comma,
no ``/`` or ``\\``, and does not end in a file extension such as ``.jpg``. Everything from
there on is read as boxes, so a broken box is reported rather than glued onto the path.

Files come from elsewhere and are read within the bounds of :mod:`yolo3.data.limits`: a line
over :data:`~yolo3.data.limits.MAX_LINE_BYTES` or with more than
:data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE` boxes is skipped, and class ids and coordinates
have upper bounds even where no classes file gives one (``yolo3 kmeans``), each a counted
reject.

Relative image paths resolve against ``image_root`` when given, else against the directory
of the annotation file (the original keras-yolo3 used the current directory; the VOC and
COCO tools in ``tools/`` write paths relative to the annotation file). Image existence is
not checked here: that is the preprocessing worker's job, and it also clips boxes that
extend past the image, which is why negative coordinates are accepted.

Data set hygiene (the rare-class filter, the validation split) is in :mod:`yolo3.data.hygiene`.
This module does not import TensorFlow, so preprocessing worker processes start quickly.
"""

import collections
import dataclasses
import logging
import math
import os
import re

import numpy as np

from yolo3 import fileio
from yolo3.data import limits
from yolo3.data.limits import excerpt
from yolo3.fileio import atomic_write

logger = logging.getLogger(__name__)

_EXTENSION = re.compile(r"\.[A-Za-z]\w*$")
_TOKEN = re.compile(r"\S+")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One image and its boxes.

    Attributes:
        path: image path, resolved as described in the module docstring.
        boxes: ``(M, 4)`` float64 ``x_min, y_min, x_max, y_max`` in original image pixels.
        classes: ``(M,)`` int64 class ids; ``M == 0`` for a background image.
        source: the annotation file the line came from.
        line: 1-based line number in ``source``.
        difficult: ``(M,)`` bool, the boxes marked difficult (default: none).
    """

    path: str
    boxes: np.ndarray
    classes: np.ndarray
    source: str
    line: int
    difficult: np.ndarray = None

    def __post_init__(self):
        flags = self.difficult
        flags = np.zeros(len(self.classes), bool) if flags is None else np.asarray(flags, bool)
        if flags.shape != (len(self.classes),):
            raise ValueError(
                f"{self.source}:{self.line}: {flags.size} difficult flags for "
                f"{len(self.classes)} boxes"
            )
        object.__setattr__(self, "difficult", flags)


@dataclasses.dataclass(frozen=True)
class Reject:
    """A box (``scope="box"``) or a whole line (``scope="line"``) that was skipped.

    ``reason`` is a short key for counting (``"inverted_box"``); ``message`` names
    ``file:line`` and the offending text, for people.
    """

    source: str
    line: int
    reason: str
    message: str
    scope: str


def all_boxes_rejected(source, line, image):
    """The :class:`Reject` of an image whose every box was rejected: it is skipped as a
    whole, since kept as a background image it would teach the model that its objects are
    background. ``line`` 0 names ``source`` alone."""
    where = f"{source}:{line}" if line else source
    message = (
        f"{where}: every box of {image} was rejected; the image is skipped rather than used "
        "as a background image"
    )
    return Reject(source, line, "all_boxes_rejected", message, "line")


def line_too_long(source, line, size, limit, scope="line"):
    """The :class:`Reject` of a line of ``size`` bytes, over ``limit``: skipped unread."""
    message = f"{source}:{line}: the line is {size} bytes, over the limit of {limit}; it is skipped"
    return Reject(source, line, "line_too_long", message, scope)


def too_many_boxes(source, line, image, count):
    """The :class:`Reject` of an image with ``count`` boxes, over the bound: it is skipped as
    a whole, since trained with only some of its objects marked it would teach the model that
    the others are background. ``count`` may be a string (``"more than 10000"``)."""
    where = f"{source}:{line}" if line else source
    message = (
        f"{where}: {count} boxes on {excerpt(image)}; an image may have at most "
        f"{limits.MAX_BOXES_PER_IMAGE}, so it is skipped"
    )
    return Reject(source, line, "too_many_boxes", message, "line")


class _BadBox(ValueError):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def _is_box_token(token):
    return "," in token and "/" not in token and "\\" not in token and not _EXTENSION.search(token)


def _parse_box(token, num_classes, classes_hint):
    fields = token.split(",")
    if len(fields) not in (5, 6):
        raise _BadBox(
            "malformed_box",
            f"has {len(fields)} field{'s' * (len(fields) != 1)}; "
            "expected 5: x_min,y_min,x_max,y_max,class_id (and 1 for a difficult object)",
        )
    if len(fields) == 6 and fields[5] not in ("0", "1"):
        flag = excerpt(repr(fields[5]))
        raise _BadBox("bad_difficult_flag", f"has difficult flag {flag}; expected 0 or 1")
    coordinates = []
    for field in fields[:4]:
        try:
            value = float(field)
        except ValueError:
            text = excerpt(repr(field))
            raise _BadBox("malformed_number", f"has {text}, which is not a number") from None
        if not math.isfinite(value):
            raise _BadBox("non_finite", f"has the non-finite coordinate {excerpt(repr(field))}")
        if abs(value) > limits.MAX_COORDINATE:
            raise _BadBox(
                "coordinates_out_of_range",
                f"has the coordinate {excerpt(field)}, beyond +-{limits.MAX_COORDINATE:.0f} pixels",
            )
        coordinates.append(value)
    try:
        class_id = int(fields[4])
    except ValueError:
        text = excerpt(repr(fields[4]))
        raise _BadBox("bad_class_id", f"has class id {text}; expected an integer") from None
    upper = limits.MAX_CLASSES if num_classes is None else num_classes
    if class_id < 0 or class_id >= upper:
        raise _BadBox(
            "class_out_of_range",
            f"has class id {excerpt(class_id)}, but {classes_hint}",
        )
    x_min, y_min, x_max, y_max = coordinates
    if x_max < x_min or y_max < y_min:
        axis = "x_max < x_min" if x_max < x_min else "y_max < y_min"
        raise _BadBox("inverted_box", f"has {axis}")
    if x_max == x_min or y_max == y_min:
        raise _BadBox("zero_area_box", "has zero width or height")
    return coordinates, class_id, len(fields) == 6 and fields[5] == "1"


def _split_line(line):
    """``(image_path, box_tokens, count)`` of a stripped line: ``image_path`` is None when
    the line starts with a box (and then nothing else is read); ``count`` boxes, whose tokens
    are left out (an empty list) when there are more than
    :data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE`, so that a hostile line is never held as a
    million tokens."""
    tokens = _TOKEN.finditer(line)
    if _is_box_token(next(tokens).group()):
        return None, [], 0  # the line is skipped: its boxes are not needed
    start = next((t.start() for t in tokens if _is_box_token(t.group())), None)
    if start is None:
        return line, [], 0
    image_path = line[:start].strip()
    # n tokens take 2n - 1 characters at least: only a longer rest can hold too many.
    if len(line) - start > 2 * limits.MAX_BOXES_PER_IMAGE:
        count = sum(1 for _ in _TOKEN.finditer(line, start))
        if count > limits.MAX_BOXES_PER_IMAGE:
            return image_path, [], count
    box_tokens = _TOKEN.findall(line, start)
    return image_path, box_tokens, len(box_tokens)


def _line_reject(path, number, line, image_path, count):
    """The :class:`Reject` of a line that is skipped before its boxes are read, else None."""
    where = f"{path}:{number}"
    if image_path is None:
        first = excerpt(line.split(maxsplit=1)[0])
        message = (
            f"{where}: line starts with the box {first}, not an image path; the line is skipped"
        )
        return Reject(path, number, "missing_path", message, "line")
    size = len(image_path.encode())
    if size > limits.MAX_PATH_BYTES:
        message = (
            f"{where}: the image path {excerpt(image_path)} is {size} bytes, longer than a "
            f"filesystem opens ({limits.MAX_PATH_BYTES}); the line is skipped"
        )
        return Reject(path, number, "path_too_long", message, "line")
    if count > limits.MAX_BOXES_PER_IMAGE:
        return too_many_boxes(path, number, image_path, count)
    return None


def resolve_image_path(image_path, annotation_path, image_root=None):
    """``image_path`` as is when absolute or ``scheme://``, else joined to its base directory.

    The base is ``image_root`` when given, else the directory holding ``annotation_path``.
    """
    if fileio.is_remote(image_path) or os.path.isabs(image_path):
        return image_path
    base = image_root if image_root is not None else os.path.dirname(os.fspath(annotation_path))
    if not base:
        return os.path.normpath(image_path)
    joined = fileio.join(base, image_path)
    return joined if fileio.is_remote(joined) else os.path.normpath(joined)


def relative_image_path(image_path, annotation_path):
    """How to write ``image_path`` in ``annotation_path`` so that it resolves back to it.

    Local paths become relative to the annotation file's directory; a ``scheme://`` path on
    either side is written as is.
    """
    image_path, annotation_path = os.fspath(image_path), os.fspath(annotation_path)
    if fileio.is_remote(image_path) or fileio.is_remote(annotation_path):
        return image_path
    folder = os.path.dirname(os.path.abspath(annotation_path))
    return os.path.relpath(os.path.abspath(image_path), folder)


def parse_annotations(path, *, num_classes, image_root=None):
    """Reads one annotation file, keeping what is valid and explaining what is not.

    Over 80 lines: one pass over the lines, every check in the order a line is read, so one
    line's fate reads top to bottom.

    Args:
        path: the annotation file, local or any ``tf.io.gfile`` path; UTF-8.
        num_classes: the number of lines in the classes file; class ids must lie in
            ``[0, num_classes)``. ``None`` checks only that they are non-negative.
        image_root: directory that relative image paths resolve against; default the
            annotation file's directory.

    Returns:
        ``(entries, rejects, counts)``: a list of :class:`Entry` in file order, a list of
        :class:`Reject`, and a ``collections.Counter`` with ``lines`` (physical lines),
        ``blank_lines``, ``comment_lines``, ``images``, ``boxes`` (kept),
        ``background_images``, ``rejected_boxes`` and ``rejected_lines``.

        A rejected box is dropped and the rest of its line kept. A line whose boxes were
        all rejected is dropped as a whole (reason ``"all_boxes_rejected"``): kept as a
        background image it would teach the model that its objects are background. So is a
        line over the bounds of :mod:`yolo3.data.limits` (``line_too_long``,
        ``path_too_long``, ``too_many_boxes``).

    Raises:
        ValueError naming ``path:line`` when a line is not UTF-8 text.
    """
    path = os.fspath(path)
    if num_classes is not None and num_classes < 1:
        raise ValueError(f"num_classes is {num_classes}; expected a positive count")
    if num_classes is None:
        classes_hint = f"class ids lie in 0..{limits.MAX_CLASSES - 1}"
    else:
        classes_hint = f"the classes file has {num_classes} classes (ids 0..{num_classes - 1})"
    entries, rejects, counts = [], [], collections.Counter()
    for number, raw, size in limits.read_lines(path, universal=False):
        counts["lines"] += 1
        if raw is None:
            rejects.append(line_too_long(path, number, size, limits.MAX_LINE_BYTES))
            counts["rejected_lines"] += 1
            continue
        line = raw.strip()
        if not line:
            counts["blank_lines"] += 1
            continue
        if line.startswith("#"):
            counts["comment_lines"] += 1
            continue
        where = f"{path}:{number}"
        image_path, box_tokens, count = _split_line(line)
        reject = _line_reject(path, number, line, image_path, count)
        if reject is not None:
            rejects.append(reject)
            counts["rejected_lines"] += 1
            continue
        boxes, classes, difficult, line_rejects = [], [], [], []
        for token in box_tokens:
            try:
                box, class_id, is_difficult = _parse_box(token, num_classes, classes_hint)
            except _BadBox as bad:
                line_rejects.append(
                    Reject(
                        path,
                        number,
                        bad.reason,
                        f"{where}: box {excerpt(token)} {bad}; the box is skipped",
                        "box",
                    )
                )
                continue
            boxes.append(box)
            classes.append(class_id)
            difficult.append(is_difficult)
        rejects.extend(line_rejects)
        counts["rejected_boxes"] += len(line_rejects)
        if line_rejects and not boxes:
            rejects.append(all_boxes_rejected(path, number, image_path))
            counts["rejected_lines"] += 1
            continue
        entries.append(
            Entry(
                path=resolve_image_path(image_path, path, image_root),
                boxes=np.asarray(boxes, dtype=np.float64).reshape(-1, 4),
                classes=np.asarray(classes, dtype=np.int64),
                source=path,
                line=number,
                difficult=np.asarray(difficult, dtype=bool),
            )
        )
        counts["images"] += 1
        counts["boxes"] += len(boxes)
        counts["background_images"] += not boxes
    return entries, rejects, +counts  # unary +: no keys that only ever got zeros


def parse_annotation_files(paths, *, num_classes, image_root=None):
    """:func:`parse_annotations` over several files, concatenated in the order given.

    Returns ``(entries, rejects, counts)`` with the counts summed over the files.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    entries, rejects, counts = [], [], collections.Counter()
    for path in paths:
        file_entries, file_rejects, file_counts = parse_annotations(
            path, num_classes=num_classes, image_root=image_root
        )
        entries.extend(file_entries)
        rejects.extend(file_rejects)
        counts.update(file_counts)
    return entries, rejects, counts


def _format_number(value):
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def format_line(path, boxes, classes, difficult=None):
    """One annotation line (no newline) that :func:`parse_annotations` reads back exactly.

    Args:
        path: image path as it should appear in the file.
        boxes: ``(M, 4)`` ``x_min, y_min, x_max, y_max`` in pixels; whole numbers are
            written without a decimal point.
        classes: ``(M,)`` integer class ids.
        difficult: ``(M,)`` bool, or None for none; difficult boxes get a sixth field ``1``.

    Raises:
        ValueError when the path would not read back as a path (empty, a newline, a
        leading ``#``, or a space-separated part that looks like a box), or shapes disagree.
    """
    path = os.fspath(path)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    classes = np.asarray(classes).reshape(-1)
    if len(boxes) != len(classes):
        raise ValueError(f"{len(boxes)} boxes but {len(classes)} class ids for {path}")
    difficult = np.zeros(len(classes), bool) if difficult is None else np.asarray(difficult)
    if difficult.shape != (len(classes),):
        raise ValueError(f"{difficult.size} difficult flags for {len(classes)} boxes of {path}")
    tokens = path.split()
    if not tokens or "\n" in path or "\r" in path or tokens[0].startswith("#"):
        raise ValueError(f"image path {path!r} cannot be written on an annotation line")
    if _is_box_token(tokens[0]):
        raise ValueError(f"image path {path!r} cannot be written on an annotation line")
    if any(_is_box_token(token) for token in tokens[1:]):
        raise ValueError(
            f"image path {path!r} has a space-separated part that reads as a box; rename it"
        )
    fields = [path.strip()]
    for box, class_id, is_difficult in zip(boxes, classes, difficult):
        values = [_format_number(v) for v in box] + [str(int(class_id))]
        fields.append(",".join(values + ["1"] * bool(is_difficult)))
    return " ".join(fields)


def write_annotations(path, lines):
    """Writes ``lines`` (strings without newlines), one per line; returns how many.

    A local file is written to a temporary name and renamed, so readers never see half a
    file; a ``scheme://`` file is written directly (object stores publish it on close).
    """
    path = os.fspath(path)
    text = "".join(f"{line}\n" for line in lines)
    if fileio.is_remote(path):
        with fileio.open_file(path, "w") as f:
            f.write(text)
    else:
        with atomic_write(path) as temp, open(temp, "w", encoding="utf-8") as f:
            f.write(text)
    return text.count("\n")
