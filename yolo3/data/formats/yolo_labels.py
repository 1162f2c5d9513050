"""YOLO label files, the per-image text files of Ultralytics, Roboflow, CVAT and Darknet.

One file per image, one object per line::

    class_id x_centre y_centre width height

with the four numbers normalised to the image's width and height (0 to 1). A line of an
odd number of 7 or more fields is a segmentation polygon ``class_id x1 y1 x2 y2 ...``; it
is read as the box around its points, as Ultralytics reads it for detection. Blank lines
are ignored. An empty file, or no file at all, is a background image.

What is rejected, each naming ``label_file:line`` (the rest of the file is kept):

- a line that is not 5 numbers or a polygon (``malformed_label``), a number that does not
  parse or is not finite (``malformed_number``, ``non_finite``);
- a class id that is not a whole number (``bad_class_id``) or lies past the class names
  (``class_out_of_range``);
- a coordinate outside [0, 1] (``coordinates_out_of_range``): such a file was written for
  another image size or in pixels, and guessing which would train on wrong boxes. Values
  within 1e-6 of the range are taken as rounding and clipped;
- a box with no width or height (``zero_area_box``);
- a line over :data:`~yolo3.data.limits.MAX_LINE_BYTES` (``line_too_long``), skipped unread.

As in annotation files, an image whose every box was rejected is skipped as a whole
(``all_boxes_rejected``) rather than kept as a background image, and so is one whose label
file has more than :data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE` lines (``too_many_boxes``;
the file is read no further).

Where the label file of an image lies is a rule of each layout: :func:`label_path` is
Ultralytics' and Darknet's ``images`` -> ``labels`` rule, which puts the file beside the
image when its path has no ``images`` folder. The label folders are searched for label files
without an image (:func:`orphan_labels`) only inside the dataset's own folders
(:func:`label_folders`): an image listed from elsewhere is read with its own label file and
nothing else of its folder.
"""

import math
import os

import numpy as np

from yolo3 import fileio
from yolo3.data import limits
from yolo3.data.annotations import (
    Entry,
    Reject,
    all_boxes_rejected,
    line_too_long,
    too_many_boxes,
)
from yolo3.data.image import IMAGE_SUFFIXES
from yolo3.data.kmeans import image_hw
from yolo3.data.limits import excerpt

# Normalised coordinates this far outside [0, 1] are rounding, not a wrong unit.
TOLERANCE = 1e-6


def is_image(path):
    return os.path.splitext(os.fspath(path))[1].lower() in IMAGE_SUFFIXES


def label_path(image_path):
    """The label file of ``image_path``: the last ``images`` folder of the path becomes
    ``labels`` and the suffix ``.txt`` (``data/images/train/a.jpg`` ->
    ``data/labels/train/a.txt``); with no ``images`` folder, the file beside the image."""
    folder, name = os.path.split(os.fspath(image_path))
    parts = folder.split(os.sep)
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return os.path.join(os.sep.join(parts), os.path.splitext(name)[0] + ".txt")


class _BadLabel(ValueError):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def _parse_label_line(fields, num_classes):
    """``(class_id, (cx, cy, w, h))`` normalised, from one line's fields."""
    if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
        raise _BadLabel(
            "malformed_label",
            f"has {len(fields)} fields; expected 5 (class x_centre y_centre width height) "
            "or a polygon (class x1 y1 x2 y2 x3 y3 ...)",
        )
    try:
        values = [float(field) for field in fields]
    except ValueError:
        bad = excerpt(repr(next(f for f in fields if not _is_float(f))))
        raise _BadLabel("malformed_number", f"has {bad}, which is not a number") from None
    if not all(math.isfinite(v) for v in values):
        raise _BadLabel("non_finite", "has a non-finite number")
    if not values[0].is_integer():
        text = excerpt(repr(fields[0]))
        raise _BadLabel("bad_class_id", f"has class id {text}; expected a whole number")
    class_id = int(values[0])
    if class_id < 0 or class_id >= num_classes:
        raise _BadLabel(
            "class_out_of_range",
            f"has class id {excerpt(class_id)}, but the dataset names {num_classes} classes "
            f"(ids 0..{num_classes - 1})",
        )
    coordinates = np.asarray(values[1:])
    if coordinates.min() < -TOLERANCE or coordinates.max() > 1 + TOLERANCE:
        raise _BadLabel(
            "coordinates_out_of_range",
            "has a coordinate outside [0, 1]; YOLO labels are fractions of the image's "
            "width and height",
        )
    coordinates = np.clip(coordinates, 0.0, 1.0)
    if len(fields) == 5:
        cx, cy, width, height = coordinates
    else:  # a polygon: the box around its points
        xs, ys = coordinates[0::2], coordinates[1::2]
        cx, cy = (xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2
        width, height = xs.max() - xs.min(), ys.max() - ys.min()
    if width <= 0 or height <= 0:
        raise _BadLabel("zero_area_box", "has zero width or height")
    return class_id, (cx, cy, width, height)


def _is_float(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_labels(path, num_classes):
    """The objects of one label file, read line by line within :mod:`yolo3.data.limits`.

    Returns:
        ``(objects, rejects, crowded)``: ``[(line, class_id, (cx, cy, w, h)), ...]``
        normalised, in file order; a list of :class:`~yolo3.data.annotations.Reject` (scope
        ``box``); and whether the file has more than
        :data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE` lines of objects, where reading
        stopped.

    Raises:
        ValueError naming ``path:line`` when a line is not UTF-8 text.
    """
    path = os.fspath(path)
    objects, rejects, lines = [], [], 0
    for number, raw, size in limits.read_lines(path):
        if raw is not None and not raw.strip():
            continue
        lines += 1
        if lines > limits.MAX_BOXES_PER_IMAGE:
            return objects, rejects, True
        if raw is None:
            rejects.append(line_too_long(path, number, size, limits.MAX_LINE_BYTES, "box"))
            continue
        try:
            class_id, box = _parse_label_line(raw.split(), num_classes)
        except _BadLabel as bad:
            label = excerpt(repr(raw.strip()))
            message = f"{path}:{number}: label {label} {bad}; the box is skipped"
            rejects.append(Reject(path, number, bad.reason, message, "box"))
            continue
        objects.append((number, class_id, box))
    return objects, rejects, False


def read_image(image_path, labels, num_classes, *, source, line, counts):
    """The :class:`~yolo3.data.annotations.Entry` of one image and its label file.

    Args:
        image_path: the image.
        labels: its label file (:func:`label_path` or a layout's own rule); a missing file
            makes a background image, counted as ``images_without_labels``.
        num_classes: class ids must lie in ``[0, num_classes)``.
        source, line: where the image was listed (a list file and its 1-based line; the
            image itself and 0 for an image found in a folder), for messages.
        counts: a Counter updated with ``images``, ``boxes``, ``background_images``,
            ``images_without_labels``, ``rejected_boxes`` and ``rejected_lines``.

    Returns:
        ``(entry or None, rejects)``: None when the image is skipped (missing or unreadable
        while its labels need its size, or every box rejected).
    """
    where = f"{source}:{line}" if line else source
    if not fileio.exists(labels):
        counts["images_without_labels"] += 1
        return _entry(image_path, [], [], source, line, counts), []
    objects, rejects, crowded = read_labels(labels, num_classes)
    counts["rejected_boxes"] += len(rejects)
    if crowded:
        counts["rejected_lines"] += 1
        count = f"more than {limits.MAX_BOXES_PER_IMAGE}"
        return None, [*rejects, too_many_boxes(labels, 0, image_path, count)]
    if rejects and not objects:
        counts["rejected_lines"] += 1
        return None, [*rejects, all_boxes_rejected(labels, 0, image_path)]
    if not objects:
        return _entry(image_path, [], [], labels, 0, counts), rejects
    try:
        height, width = image_hw(image_path)
    except FileNotFoundError:
        reason, detail = "missing_image", f"image {image_path} does not exist"
    except ValueError as err:
        reason, detail = "unreadable_image", str(err)
    else:
        boxes = [
            (
                (cx - w / 2) * width,
                (cy - h / 2) * height,
                (cx + w / 2) * width,
                (cy + h / 2) * height,
            )
            for _, _, (cx, cy, w, h) in objects
        ]
        classes = [class_id for _, class_id, _ in objects]
        return _entry(image_path, boxes, classes, labels, 0, counts), rejects
    message = f"{where}: {detail}; its labels {labels} need its size, the image is skipped"
    counts["rejected_lines"] += 1
    return None, [*rejects, Reject(source, line, reason, message, "line")]


def _entry(image_path, boxes, classes, source, line, counts):
    counts["images"] += 1
    counts["boxes"] += len(classes)
    counts["background_images"] += not classes
    return Entry(
        path=os.fspath(image_path),
        boxes=np.asarray(boxes, np.float64).reshape(-1, 4),
        classes=np.asarray(classes, np.int64),
        source=os.fspath(source),
        line=line,
    )


def label_folders(images, roots, label_of=label_path):
    """The folders of the label files of ``images`` (paths) that lie inside ``roots``, the
    dataset's own folders: those :func:`orphan_labels` may search."""
    folders = {os.path.dirname(label_of(image)) for image in images}
    return sorted(folder for folder in folders if limits.is_inside(folder, roots))


def list_file(path, locate):
    """``(listed, rejects)`` of a list file, one image path a line (``#`` starts a comment).

    ``listed`` is ``[(image, path, line), ...]``, each line resolved by ``locate(text)``; a
    line longer than any path (:data:`~yolo3.data.limits.MAX_PATH_BYTES`) is a
    ``line_too_long`` reject.
    """
    listed, rejects = [], []
    for number, raw, size in limits.read_lines(path, max_bytes=limits.MAX_PATH_BYTES):
        if raw is None:
            rejects.append(line_too_long(path, number, size, limits.MAX_PATH_BYTES))
            continue
        text = raw.strip()
        if text and not text.startswith("#"):
            listed.append((locate(text), path, number))
    return listed, rejects


def orphan_labels(label_folders, claimed):
    """Label files in ``label_folders`` that are not in ``claimed`` (the label files of
    the listed images, and list files to pass over) and have no image of their own on
    disk, as ``label_without_image`` rejects.

    A label file has an image of its own when a file of the same name with an image suffix
    lies beside it, or where a ``labels`` folder read back as ``images`` or ``JPEGImages``
    puts it.
    """
    claimed = {os.path.normpath(p) for p in claimed}
    rejects = []
    for folder in sorted(set(label_folders)):
        for path in fileio.files_under(folder):
            path = os.path.normpath(path)
            if not path.endswith(".txt") or path in claimed or _has_image(path):
                continue
            message = (
                f"{path}: a label file without an image (no {os.path.basename(path)[:-4]}.jpg, "
                ".png, ... beside it or in the images folder); it is not used"
            )
            rejects.append(Reject(path, 0, "label_without_image", message, "line"))
    return rejects


def _has_image(label):
    stem = os.path.splitext(label)[0]
    parts = stem.split(os.sep)
    candidates = [stem]
    if "labels" in parts:
        index = len(parts) - 1 - parts[::-1].index("labels")
        for images in ("images", "JPEGImages"):
            candidates.append(os.sep.join([*parts[:index], images, *parts[index + 1 :]]))
    return any(fileio.exists(c + s) for c in candidates for s in IMAGE_SUFFIXES)
