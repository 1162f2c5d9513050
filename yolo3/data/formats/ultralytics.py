"""Ultralytics ``data.yaml`` datasets (also as Roboflow and CVAT export them).

::

    path: datasets/parts        # the dataset root; relative to the yaml file's folder
    train: images/train         # a folder, a list file, or a list of either
    val: images/val
    names: [bolt, nut]          # or a mapping {0: bolt, 1: nut}

``path`` defaults to the yaml file's folder (Ultralytics resolves a relative ``path``
against its own datasets folder setting, which this project does not have: the yaml's
folder is the one place both agree on for an exported dataset). ``train``, ``val`` and
``test`` resolve against ``path``; a relative entry starting with ``../`` that does not
exist is tried without it, as Ultralytics does for Roboflow's exports (``train:
../train/images`` beside a ``train/`` folder).

A folder contributes every image below it (sorted paths); a ``.txt`` list file one image
per line, relative lines from the list file's folder. Each image's labels are found by
:func:`~yolo3.data.formats.yolo_labels.label_path`. ``val`` becomes the validation split
(``test`` is not read). ``nc``, when given, must equal the number of names.
"""

import os

from yolo3 import fileio
from yolo3.data.formats import yolo_labels


def read_yaml(path):
    """The yaml file as a dict; ValueError naming the file on bad syntax or shape."""
    import yaml  # noqa: PLC0415 - only this reader needs it

    try:
        data = yaml.safe_load(fileio.read_bytes(path).decode("utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a YAML file ({err})".replace("\n", " ")) from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with train, val and names")
    return data


def class_names(data, path):
    """``names`` as a list: a list as is, a mapping ``{id: name}`` with ids 0..n-1."""
    names = data.get("names")
    if isinstance(names, dict):
        try:
            ids = sorted(int(key) for key in names)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: names' keys must be class ids 0, 1, ...") from None
        if ids != list(range(len(ids))):
            raise ValueError(f"{path}: names' ids are {ids}; expected 0..{len(ids) - 1}")
        names = [names[key] for key in sorted(names, key=int)]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path}: no names list; add names: [class0, class1, ...]")
    names = [str(name) for name in names]
    if "nc" in data and data["nc"] != len(names):
        raise ValueError(f"{path}: nc is {data['nc']} but names lists {len(names)} classes")
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: names repeats a class name; names must be unique")
    return names


def _resolve(root, entry):
    candidate = os.path.normpath(os.path.join(root, entry))
    if not os.path.exists(candidate) and entry.startswith("../"):
        fallback = os.path.normpath(os.path.join(root, entry[3:]))
        if os.path.exists(fallback):
            return fallback
    return candidate


def list_images(entries, root, yaml_path, key):
    """``[(image, source, line), ...]`` of a split and the folders its labels lie in."""
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{yaml_path}: {key} must be a folder, a list file or a list of them")
    images, label_folders = [], []
    for entry in entries:
        location = _resolve(root, entry)
        if os.path.isdir(location):
            found = [p for p in fileio.files_under(location) if yolo_labels.is_image(p)]
            images.extend((p, p, 0) for p in found)
            label_folders.append(
                os.path.dirname(yolo_labels.label_path(os.path.join(location, "x")))
            )
        elif os.path.isfile(location):
            listed = list_file(location)
            images.extend(listed)
            label_folders.extend({os.path.dirname(yolo_labels.label_path(p)) for p, _, _ in listed})
        else:
            raise ValueError(
                f"{yaml_path}: {key} entry {entry!r} is neither a folder nor a list file "
                f"(looked for {location})"
            )
    return images, label_folders


def list_file(path):
    """``[(image, path, line), ...]`` of a list file, relative lines from its folder."""
    folder = os.path.dirname(os.path.abspath(path))
    listed = []
    for number, raw in enumerate(fileio.read_bytes(path).decode("utf-8-sig").splitlines(), 1):
        text = raw.strip()
        if text and not text.startswith("#"):
            image = text if os.path.isabs(text) else os.path.normpath(os.path.join(folder, text))
            listed.append((image, path, number))
    return listed


def read(path):
    """The layout of a ``data.yaml``: ``(names, {split: [(image, source, line)]},
    label_folders)``; the labels follow :func:`~yolo3.data.formats.yolo_labels.label_path`."""
    data = read_yaml(path)
    names = class_names(data, path)
    root = os.path.dirname(os.path.abspath(path))
    if data.get("path"):
        root = os.path.normpath(os.path.join(root, str(data["path"])))
    if not data.get("train"):
        raise ValueError(f"{path}: no train entry; add train: images/train (a folder or list)")
    splits, folders = {}, []
    for split in ("train", "val"):
        if data.get(split):
            splits[split], split_folders = list_images(data[split], root, path, split)
            folders.extend(split_folders)
    return names, splits, folders
