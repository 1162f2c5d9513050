"""Pascal VOC datasets: a ``VOCdevkit`` folder (or one ``VOC<year>`` folder in it) with its
image sets, ``Annotations/<id>.xml`` and ``JPEGImages/<id>.jpg``.

The splits are the devkit's own: where a year has a ``test`` set (VOC2007), training reads
every year's ``trainval`` and validation the ``test`` sets, as Darknet's and Ultralytics'
VOC recipes do; otherwise training reads the ``train`` sets (``trainval`` where there is no
``train``) and validation the ``val`` sets.

Classes: ``--classes`` when given (objects of other classes are rejected,
``unknown_class``); else the 20 VOC classes in their usual order when every name found is
one of them; else the names found, sorted. Objects marked difficult are kept with the
difficult flag (left out of training, neither required nor penalised by VOC mAP), as
``yolo3 voc-annotation`` does by default. Box edges are rounded to whole pixels. Rejected,
naming the image set's file and line: a missing or unreadable XML file (the image), an
object with no or an empty box (``bad_box``).
"""

import collections
import math
import os
import xml.etree.ElementTree as ET

import numpy as np

from yolo3 import fileio
from yolo3.data.annotations import Entry, Reject, all_boxes_rejected
from yolo3.model.resources import model_data_file, read_classes


def _pixel(value):
    return math.floor(float(value) + 0.5)


def read_voc_objects(data, name):
    """Objects of one VOC XML file as ``[(class_name, difficult, (x0, y0, x1, y1) or None)]``.

    Coordinates are rounded to whole pixels; ``None`` stands for a missing or non-numeric
    ``bndbox``. Raises ValueError naming ``name`` when the XML does not parse.
    """
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
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
    """``{split: [set_file, ...]}`` by the rule of the module docstring."""

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
    text = fileio.read_bytes(set_path).decode("utf-8-sig")
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        image_id = raw.split()[0]
        xml_path = os.path.join(folder, "Annotations", f"{image_id}.xml")
        where = f"{set_path}:{number}"
        try:
            objects = read_voc_objects(fileio.read_bytes(xml_path), xml_path)
        except FileNotFoundError:
            message = f"{where}: {xml_path} does not exist; the image is skipped"
            listed.append(
                (image_id, number, None, Reject(set_path, number, "missing_xml", message, "line"))
            )
            counts["rejected_lines"] += 1
            continue
        except ValueError as err:
            message = f"{where}: {err}; the image is skipped"
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


def read(path, classes=None):
    """``(names, {split: entries}, rejects, counts)`` of a VOC dataset."""
    folders = year_folders(path)
    counts = collections.Counter()
    read_sets = {
        split: [(set_path, _read_set(set_path, counts)) for set_path in set_paths]
        for split, set_paths in image_sets(folders).items()
    }
    if classes is None:
        found = {
            name
            for sets in read_sets.values()
            for _, listed in sets
            for _, _, objects, _ in listed
            for name, _, _ in objects or ()
        }
        classes = class_names(found)
    class_ids = {name: index for index, name in enumerate(classes)}
    splits, rejects = {}, []
    for split, sets in read_sets.items():
        entries = splits.setdefault(split, [])
        for set_path, listed in sets:
            folder = os.path.dirname(os.path.dirname(os.path.dirname(set_path)))
            for image_id, number, objects, reject in listed:
                if reject is not None:
                    rejects.append(reject)
                    continue
                entry, image_rejects = _entry(
                    folder, image_id, objects, class_ids, set_path, number, counts
                )
                rejects.extend(image_rejects)
                if entry is not None:
                    entries.append(entry)
    return list(classes), splits, rejects, counts


def _entry(folder, image_id, objects, class_ids, set_path, number, counts):
    where = f"{set_path}:{number}"
    xml_path = os.path.join(folder, "Annotations", f"{image_id}.xml")
    boxes, classes, difficult, rejects = [], [], [], []
    for class_name, is_difficult, edges in objects:
        if class_name not in class_ids:
            message = (
                f"{where}: {xml_path} has an object of class {class_name!r}, not in the classes"
            )
            rejects.append(Reject(set_path, number, "unknown_class", message, "box"))
        elif edges is None or edges[2] <= edges[0] or edges[3] <= edges[1]:
            message = f"{where}: {xml_path} has an object without a box of positive size"
            rejects.append(Reject(set_path, number, "bad_box", message, "box"))
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
