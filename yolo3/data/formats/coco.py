"""COCO instances datasets: a JSON file of images, annotations and categories, and the
folder of its images.

``--data`` names the JSON file, or a folder laid out as COCO (``annotations/instances_
train*.json`` and ``instances_val*.json``) or as Roboflow exports COCO (``train/``,
``valid/`` and ``test/``, each holding ``_annotations.coco.json`` beside its images), or one
such split folder. The splits are found from the one named (:func:`find_files`):

- a JSON in a folder named as a split (``train``, ``valid``/``val``/``validation``,
  ``test``; any case) is that split, and the JSON of the same name in each sibling folder
  named as a split is that one (``rf/train/_annotations.coco.json`` names the whole
  Roboflow export);
- any other JSON is the training split; where its name holds ``train``, the JSON of the same
  name with ``val`` beside it is the validation split, and with ``test`` the test split
  (``instances_train2017.json`` -> ``instances_val2017.json``).

Each split's images are found from its own JSON (below), and only the splits asked for are
read.

Images are looked for in ``--image-root`` when given, else in the first of these folders
that holds the first image the JSON lists: the JSON's own folder (Roboflow), its ``images``
folder, and, from the folder above, ``<split>``, ``images/<split>``, ``images`` and the folder
itself (``<split>`` is the name after ``instances_``: ``train2017``).

Class ids are contiguous in the order of the category ids (for COCO 2017: Darknet's 80-class
order), as ``yolo3 coco-annotation`` numbers them; a category that only names the others'
supercategory and has no annotations (Roboflow's first category) is left out. Boxes
``[x, y, width, height]`` become ``x_min, y_min, x_max, y_max`` in the same fractional
pixels. Crowd regions (``iscrowd``) are not objects to detect and are left out, counted as
``crowd_regions``; an image with no annotations is a background image. Rejected, naming the
annotation's id: an annotation that is not an object (``malformed_annotation``), of an image
or category the file does not list (``unknown_image``, ``unknown_category``), a ``bbox`` that
is not four numbers (``malformed_box``), not finite (``non_finite``) or beyond
:data:`~yolo3.data.limits.MAX_COORDINATE` (``coordinates_out_of_range``), and a box with no
width or height (``zero_area_box``); an image with more than
:data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE` boxes is skipped (``too_many_boxes``). A
category or image entry without its id and name (``file_name``) makes the file unreadable,
in one line naming the entry.
"""

import collections
import glob
import json
import math
import os
import re

import numpy as np

from yolo3 import fileio
from yolo3.data import limits
from yolo3.data.annotations import Entry, Reject, too_many_boxes
from yolo3.data.limits import excerpt

ROBOFLOW_FILE = "_annotations.coco.json"


# Folder names of a Roboflow-style export, by split, lower case.
SPLIT_FOLDERS = {
    "train": ("train", "training"),
    "val": ("valid", "val", "validation"),
    "test": ("test",),
}


def _split_of_folder(name):
    """The split a folder ``name`` names (any case), or None."""
    return next((split for split, names in SPLIT_FOLDERS.items() if name.lower() in names), None)


def _split_folders(parent):
    """``{split: folder}`` of the folders in ``parent`` named as splits (the first name of
    :data:`SPLIT_FOLDERS` found where several are)."""
    found = {}
    entries = {name.lower(): name for name in sorted(os.listdir(parent))}
    for split, names in SPLIT_FOLDERS.items():
        for name in names:
            if name in entries and os.path.isdir(os.path.join(parent, entries[name])):
                found[split] = os.path.join(parent, entries[name])
                break
    return found


def _siblings(path):
    """``{split: json}`` of a JSON in a folder named as a split and the JSONs of the same
    name in its sibling split folders; None when its folder names no split."""
    folder, name = os.path.split(os.path.abspath(path))
    if _split_of_folder(os.path.basename(folder)) is None:
        return None
    found = {}
    for split, split_folder in _split_folders(os.path.dirname(folder)).items():
        candidate = os.path.join(split_folder, name)
        if os.path.isfile(candidate):
            found[split] = candidate
    found[_split_of_folder(os.path.basename(folder))] = path  # as given, not resolved
    return found


def holds_coco(folder):
    """Whether ``folder`` is laid out as a COCO dataset :func:`find_files` reads."""
    return bool(
        os.path.isfile(os.path.join(folder, ROBOFLOW_FILE))
        or any(
            os.path.isfile(os.path.join(split_folder, ROBOFLOW_FILE))
            for split_folder in _split_folders(folder).values()
        )
        or glob.glob(os.path.join(glob.escape(folder), "annotations", "instances_*.json"))
    )


def find_files(path):
    """``{split: json_path}`` for ``--data``, in :data:`SPLIT_FOLDERS` order (see the
    module docstring)."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, ROBOFLOW_FILE)):
            path = os.path.join(path, ROBOFLOW_FILE)  # one split folder of an export
        else:
            exported = {
                split: os.path.join(folder, ROBOFLOW_FILE)
                for split, folder in _split_folders(path).items()
                if os.path.isfile(os.path.join(folder, ROBOFLOW_FILE))
            }
            if exported:
                return exported
            trains = sorted(
                glob.glob(os.path.join(glob.escape(path), "annotations", "instances_train*.json"))
            )
            if not trains:
                raise ValueError(
                    f"{path}: no annotations/instances_train*.json nor train/{ROBOFLOW_FILE}; "
                    "give --data the COCO JSON file itself"
                )
            path = trains[0]
    siblings = _siblings(path)
    if siblings is not None:
        return {split: siblings[split] for split in SPLIT_FOLDERS if split in siblings}
    found = {"train": path}
    folder, name = os.path.split(path)
    if "train" in name:
        for split in ("val", "test"):
            candidate = os.path.join(folder, name.replace("train", split, 1))
            if os.path.isfile(candidate):
                found[split] = candidate
    return found


def load(path):
    """The JSON file as a dict, checked for the three lists and the fields of its images and
    categories; ValueError naming the file."""
    try:
        data = json.loads(fileio.read_bytes(path))
    except (ValueError, RecursionError) as err:
        # ValueError: bad JSON, bad UTF-8, or a number of thousands of digits;
        # RecursionError: arrays nested thousands deep.
        raise ValueError(f"{path}: not a JSON file ({excerpt(err)})") from err
    for key in ("images", "annotations", "categories"):
        if not isinstance(data, dict) or not isinstance(data.get(key), list):
            raise ValueError(f"{path}: no {key!r} list; is this a COCO instances file?")
    for index, category in enumerate(data["categories"]):
        if not (
            isinstance(category, dict)
            and isinstance(_key(category.get("id")), int)
            and _key(category.get("name")) is not None
            and isinstance(category.get("supercategory"), (str, type(None)))
        ):
            raise ValueError(
                f"{path}: categories[{index}] is not an object with an integer id and a name"
            )
    for index, image in enumerate(data["images"]):
        if not (
            isinstance(image, dict)
            and _key(image.get("id")) is not None
            and isinstance(image.get("file_name"), str)
        ):
            raise ValueError(f"{path}: images[{index}] is not an object with an id and a file_name")
    return data


def _key(value):
    """``value`` when it can be an id (an int or a str), else None."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def categories(datasets):
    """``(category_ids, names)`` kept as classes, over every split's data (same list)."""
    lists = [sorted(data["categories"], key=lambda c: c["id"]) for _, data in datasets]
    first_path, first = datasets[0][0], lists[0]
    for (path, _), other in zip(datasets[1:], lists[1:]):
        if [(c["id"], c["name"]) for c in other] != [(c["id"], c["name"]) for c in first]:
            raise ValueError(f"{path}: its categories differ from those of {first_path}")
    used = _used_categories(datasets)
    parents = {c.get("supercategory") for c in first}
    kept = [c for c in first if c["id"] in used or c["name"] not in parents]
    return [c["id"] for c in kept], [str(c["name"]) for c in kept]


def _used_categories(datasets):
    return {
        _key(a.get("category_id"))
        for _, data in datasets
        for a in data["annotations"]
        if isinstance(a, dict)
    }


def _undecided(datasets):
    """Whether :func:`categories` over ``datasets`` alone could leave out a category that
    another split uses: one named as a supercategory and unused in these."""
    used = _used_categories(datasets)
    for _, data in datasets:
        parents = {c.get("supercategory") for c in data["categories"]}
        if any(c["name"] in parents and c["id"] not in used for c in data["categories"]):
            return True
    return False


def image_folder(data, path, image_root):
    """Where the images of ``data`` lie (see the module docstring)."""
    if image_root is not None:
        return image_root
    if not data["images"]:
        return os.path.dirname(path)
    first = data["images"][0]["file_name"]
    folder = os.path.dirname(os.path.abspath(path))
    parent = os.path.dirname(folder)
    split = re.sub(r"^instances_", "", os.path.splitext(os.path.basename(path))[0])
    candidates = [
        folder,
        os.path.join(folder, "images"),
        os.path.join(parent, split),
        os.path.join(parent, "images", split),
        os.path.join(parent, "images"),
        parent,
    ]
    for candidate in candidates:
        if os.path.exists(os.path.join(candidate, first)):
            return candidate
    raise ValueError(
        f"{path}: its first image {first} is in none of {', '.join(candidates)}; "
        "name the image folder with --image-root"
    )


def read_split(path, data, category_ids, image_root, counts):
    """``(entries, rejects)`` of one JSON file (see the module docstring)."""
    class_of = {category_id: index for index, category_id in enumerate(category_ids)}
    known = {c["id"] for c in data["categories"]}
    folder = image_folder(data, path, image_root)
    images = {image["id"]: image["file_name"] for image in data["images"]}
    objects, rejects = collections.defaultdict(list), []
    for index, annotation in enumerate(data["annotations"]):
        if not isinstance(annotation, dict):
            message = f"{path}: annotations[{index}] is not an object; it is skipped"
            rejects.append(Reject(path, 0, "malformed_annotation", message, "box"))
            continue
        where = f"{path}: annotation id {excerpt(annotation.get('id'))}"
        image_id, category_id = annotation.get("image_id"), annotation.get("category_id")
        if _key(image_id) not in images:
            message = f"{where} is of image id {excerpt(image_id)}, which is not listed"
            rejects.append(Reject(path, 0, "unknown_image", message, "box"))
            continue
        if _key(category_id) not in known:
            message = f"{where} has category id {excerpt(category_id)}, not listed"
            rejects.append(Reject(path, 0, "unknown_category", message, "box"))
            continue
        if annotation.get("iscrowd", 0):
            counts["crowd_regions"] += 1
            continue
        try:
            x, y, width, height = _box(annotation.get("bbox"))
        except _BadBox as bad:
            message = f"{where} has the bbox {excerpt(annotation.get('bbox'))}: {bad}"
            rejects.append(Reject(path, 0, bad.reason, f"{message}; the box is skipped", "box"))
            continue
        if not width > 0 or not height > 0:
            message = f"{where} has a box of zero width or height; the box is skipped"
            rejects.append(Reject(path, 0, "zero_area_box", message, "box"))
            continue
        objects[image_id].append(((x, y, x + width, y + height), class_of[category_id]))
    counts["rejected_boxes"] += len(rejects)
    entries = []
    # Ids in order, numbers before names (COCO's are numbers; some tools write names).
    for image_id in sorted(images, key=lambda i: (isinstance(i, str), i)):
        found = objects.get(image_id, [])
        if len(found) > limits.MAX_BOXES_PER_IMAGE:
            rejects.append(too_many_boxes(path, 0, images[image_id], len(found)))
            counts["rejected_lines"] += 1
            continue
        entries.append(
            Entry(
                path=os.path.normpath(os.path.join(folder, images[image_id])),
                boxes=np.asarray([box for box, _ in found], np.float64).reshape(-1, 4),
                classes=np.asarray([c for _, c in found], np.int64),
                source=path,
                line=0,
            )
        )
        counts["images"] += 1
        counts["boxes"] += len(found)
        counts["background_images"] += not found
    return entries, rejects


class _BadBox(ValueError):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def _box(bbox):
    """``(x, y, width, height)`` floats of a ``bbox``; _BadBox why not."""
    if not isinstance(bbox, list) or len(bbox) != 4:
        raise _BadBox("malformed_box", "expected [x, y, width, height]")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
        raise _BadBox("malformed_box", "expected four numbers")
    beyond = f"beyond +-{limits.MAX_COORDINATE:.0f} pixels"
    try:
        values = [float(v) for v in bbox]
    except OverflowError:  # an integer of hundreds of digits
        raise _BadBox("coordinates_out_of_range", beyond) from None
    if not all(math.isfinite(v) for v in values):
        raise _BadBox("non_finite", "a number is not finite")
    if max(abs(v) for v in values) > limits.MAX_COORDINATE:
        raise _BadBox("coordinates_out_of_range", beyond)
    return values


def read(path, image_root=None, splits=("train", "val")):
    """``(names, {split: entries}, rejects, counts, named)`` of a COCO dataset: the entries of
    each of ``splits`` it has, ``named`` every split it has.

    The classes are decided over the splits read, and over the others too where those could
    change them (a category named as a supercategory that the splits read do not use): class
    ids stay the same whichever splits are asked for.
    """
    files = find_files(path)
    wanted = [split for split in files if split in splits]
    loaded = {split: (files[split], load(files[split])) for split in wanted}
    others = [split for split in files if split not in loaded]
    deciding = list(loaded.values())
    if others and (not deciding or _undecided(deciding)):
        deciding += [(files[split], load(files[split])) for split in others]
    category_ids, names = categories(deciding)
    if not names:
        raise ValueError(f"{deciding[0][0]}: no categories; a COCO file lists them")
    read_splits, rejects, counts = {}, [], collections.Counter()
    for split, (file, data) in loaded.items():
        read_splits[split], split_rejects = read_split(file, data, category_ids, image_root, counts)
        rejects.extend(split_rejects)
    return names, read_splits, rejects, counts, list(files)
