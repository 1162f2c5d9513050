"""Pascal VOC datasets: a ``VOCdevkit`` folder (or one ``VOC<year>`` folder in it) with its
image sets, ``Annotations/<id>.xml`` and ``JPEGImages/<id>.jpg``.

The splits are the devkit's own: where a year has a ``test`` set (VOC2007), training reads
every year's ``trainval`` and validation the ``test`` sets, as Darknet's and Ultralytics'
VOC recipes do; otherwise training reads the ``train`` sets (``trainval`` where there is no
``train``) and validation the ``val`` sets. The ``test`` sets are also the test split, so
that ``--split test`` names VOC2007 test as it is published (the same images as
validation where they are validation). Only the splits asked for are read, each image set
file once.

Classes: ``--classes`` when given (objects of other classes are rejected,
``unknown_class``); else the 20 VOC classes in their usual order when every name found is
one of them; else the names found, sorted. Objects marked difficult are kept with the
difficult flag (left out of training, neither required nor penalised by VOC mAP), as
``yolo3 voc-annotation`` does by default. Box edges are rounded to whole pixels. Rejected,
naming the image set's file and line: a missing or unreadable XML file (the image; also one
over :data:`MAX_XML_BYTES`), an object with no or an empty box (``bad_box``) or one beyond
:data:`~yolo3.data.limits.MAX_COORDINATE` (``coordinates_out_of_range``), an image with more
than :data:`~yolo3.data.limits.MAX_BOXES_PER_IMAGE` objects (``too_many_boxes``) and a line
of an image set longer than any path (``line_too_long``). Entity expansion in the XML is
bounded by expat's own amplification limit (expat 2.4 and later), which refuses a "billion
laughs" as a parse error.
"""

import collections
import math
import os
import xml.etree.ElementTree as ET

import numpy as np

from yolo3.data import limits
from yolo3.data.annotations import (
    Entry,
    Reject,
    all_boxes_rejected,
    line_too_long,
    too_many_boxes,
)
from yolo3.data.limits import excerpt, read_small_file
from yolo3.model.resources import model_data_file, read_classes

# A VOC annotation is a kilobyte or two; this holds MAX_BOXES_PER_IMAGE objects of 400 bytes.
MAX_XML_BYTES = 2**22


def _pixel(value):
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return math.floor(value + 0.5)


def read_voc_objects(data, name):
    """Objects of one VOC XML file as ``[(class_name, difficult, (x0, y0, x1, y1) or None)]``.

    Coordinates are rounded to whole pixels; ``None`` stands for a missing or non-numeric
    ``bndbox``. Raises ValueError naming ``name`` when the XML does not parse.
    """
    try:
        root = ET.fromstring(data)
    except (ET.ParseError, LookupError) as err:  # LookupError: an encoding Python lacks
        raise ValueError(f"{name}: not valid XML ({err})") from err
    objects = []
    for obj in root.iter("object"):
        class_name = (obj.findtext("name") or "").strip()
        difficult = (obj.findtext("difficult") or "0").strip() == "1"
        box = obj.find("bndbox")
        try:
            edges = tuple(_pixel(box.findtext(tag)) for tag in ("xmin", "ymin", "xmax", "ymax"))
        except (AttributeError, TypeError, ValueError):
            edges = None
        objects.append((class_name, difficult, edges))
    return objects


def year_folders(path):
    """The ``VOC<year>`` folders of ``path`` (a devkit), or ``[path]`` when it is one."""
    if os.path.isdir(os.path.join(path, "Annotations")):
        return [path]
    found = sorted(
        os.path.join(path, name)
        for name in os.listdir(path)
        if name.startswith("VOC") and os.path.isdir(os.path.join(path, name, "Annotations"))
    )
    if not found:
        raise ValueError(f"{path}: no VOC<year>/Annotations folder; is this a VOCdevkit?")
    return found


def image_sets(folders):
    """``{split: [set_file, ...]}`` by the rule of the module docstring, ``"test"`` included
    where a year has a test set."""

    def set_file(folder, name):
        path = os.path.join(folder, "ImageSets", "Main", f"{name}.txt")
        return path if os.path.isfile(path) else None

    splits = collections.defaultdict(list)
    if any(set_file(folder, "test") for folder in folders):
        for folder in folders:
            if set_file(folder, "trainval"):
                splits["train"].append(set_file(folder, "trainval"))
            if set_file(folder, "test"):
                splits["val"].append(set_file(folder, "test"))
                splits["test"].append(set_file(folder, "test"))
    else:
        for folder in folders:
            train = set_file(folder, "train") or set_file(folder, "trainval")
            if train:
                splits["train"].append(train)
            if set_file(folder, "val") and train != set_file(folder, "trainval"):
                splits["val"].append(set_file(folder, "val"))
    if not splits["train"]:
        raise ValueError(
            f"{os.path.dirname(folders[0])}: no ImageSets/Main/train.txt or trainval.txt"
        )
    return dict(splits)


def _read_set(set_path, counts):
    """``[(image_id, line, objects or None, reject or None)]`` of one image set file."""
    folder = os.path.dirname(os.path.dirname(os.path.dirname(set_path)))
    listed = []
    for number, raw, size in limits.read_lines(set_path, max_bytes=limits.MAX_PATH_BYTES):
        if raw is None:
            reject = line_too_long(set_path, number, size, limits.MAX_PATH_BYTES)
            listed.append((None, number, None, reject))
            counts["rejected_lines"] += 1
            continue
        if not raw.strip():
            continue
        image_id = raw.split()[0]
        xml_path = os.path.join(folder, "Annotations", f"{image_id}.xml")
        where = f"{set_path}:{number}"
        try:
            data = read_small_file(xml_path, MAX_XML_BYTES, "VOC annotation file")
            objects = read_voc_objects(data, xml_path)
        except FileNotFoundError:
            message = f"{where}: {xml_path} does not exist; the image is skipped"
            listed.append(
                (image_id, number, None, Reject(set_path, number, "missing_xml", message, "line"))
            )
            counts["rejected_lines"] += 1
            continue
        except (OSError, ValueError) as err:  # OSError: a folder, no permission...
            message = f"{where}: {excerpt(err, 400)}; the image is skipped"
            listed.append(
                (
                    image_id,
                    number,
                    None,
                    Reject(set_path, number, "unreadable_xml", message, "line"),
                )
            )
            counts["rejected_lines"] += 1
            continue
        listed.append((image_id, number, objects, None))
    return listed


def class_names(found):
    """The 20 VOC classes when ``found`` holds only those, else ``found`` sorted."""
    voc = read_classes(model_data_file("voc_classes.txt"))
    return voc if set(found) <= set(voc) else sorted(found)


def read(path, classes=None, splits=("train", "val")):
    """``(names, {split: entries}, rejects, counts, named)`` of a VOC dataset: the entries of
    each of ``splits`` it has, ``named`` every split it has. Without ``classes``, the class
    names are found in the splits read."""
    folders = year_folders(path)
    counts = collections.Counter()
    named = image_sets(folders)
    # set file -> its lines, read once: validation and test may be the same files.
    lines = {set_path: None for split in named if split in splits for set_path in named[split]}
    for set_path in lines:
        lines[set_path] = _read_set(set_path, counts)
    if classes is None:
        found = {
            name
            for listed in lines.values()
            for _, _, objects, _ in listed
            for name, _, _ in objects or ()
        }
        classes = class_names(found)
    class_ids = {name: index for index, name in enumerate(classes)}
    entries, rejects = {}, []  # set file -> its entries
    for set_path, listed in lines.items():
        folder = os.path.dirname(os.path.dirname(os.path.dirname(set_path)))
        kept = entries[set_path] = []
        for image_id, number, objects, reject in listed:
            if reject is not None:
                rejects.append(reject)
                continue
            entry, image_rejects = _entry(
                folder, image_id, objects, class_ids, set_path, number, counts
            )
            rejects.extend(image_rejects)
            if entry is not None:
                kept.append(entry)
    read_splits = {
        split: [entry for set_path in set_paths for entry in entries[set_path]]
        for split, set_paths in named.items()
        if split in splits
    }
    return list(classes), read_splits, rejects, counts, list(named)


def _entry(folder, image_id, objects, class_ids, set_path, number, counts):
    where = f"{set_path}:{number}"
    xml_path = os.path.join(folder, "Annotations", f"{image_id}.xml")
    if len(objects) > limits.MAX_BOXES_PER_IMAGE:
        counts["rejected_lines"] += 1
        return None, [too_many_boxes(set_path, number, xml_path, len(objects))]
    boxes, classes, difficult, rejects = [], [], [], []
    for class_name, is_difficult, edges in objects:
        if class_name not in class_ids:
            message = (
                f"{where}: {xml_path} has an object of class {excerpt(repr(class_name))}, not "
                "in the classes"
            )
            rejects.append(Reject(set_path, number, "unknown_class", message, "box"))
        elif edges is None or edges[2] <= edges[0] or edges[3] <= edges[1]:
            message = f"{where}: {xml_path} has an object without a box of positive size"
            rejects.append(Reject(set_path, number, "bad_box", message, "box"))
        elif max(abs(edge) for edge in edges) > limits.MAX_COORDINATE:
            message = (
                f"{where}: {xml_path} has an object with a box beyond "
                f"+-{limits.MAX_COORDINATE:.0f} pixels"
            )
            rejects.append(Reject(set_path, number, "coordinates_out_of_range", message, "box"))
        else:
            boxes.append(edges)
            classes.append(class_ids[class_name])
            difficult.append(is_difficult)
    counts["rejected_boxes"] += len(rejects)
    if rejects and not boxes:
        counts["rejected_lines"] += 1
        return None, [*rejects, all_boxes_rejected(set_path, number, xml_path)]
    counts["images"] += 1
    counts["boxes"] += len(boxes)
    counts["background_images"] += not boxes
    counts["difficult_boxes"] += sum(difficult)
    entry = Entry(
        path=os.path.join(folder, "JPEGImages", f"{image_id}.jpg"),
        boxes=np.asarray(boxes, np.float64).reshape(-1, 4),
        classes=np.asarray(classes, np.int64),
        source=set_path,
        line=number,
        difficult=np.asarray(difficult, bool),
    )
    return entry, rejects
