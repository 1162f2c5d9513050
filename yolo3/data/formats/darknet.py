"""Darknet ``.data`` datasets, as Darknet's ``detector train`` reads them.

::

    classes = 2
    train = data/train.txt
    valid = data/valid.txt
    names = data/obj.names
    backup = backup/

``train`` and ``valid`` are list files, one image path per line; ``names`` holds one class
name per line. Darknet opens these paths from the folder it runs in, usually Darknet's own
root; here a relative path is looked for from the current folder first, then from the
``.data`` file's folder and the folder above it (where Darknet's root is when the file is
``data/obj.data``), and the first that exists is taken. Lines of the list files likewise,
and also from the list file's own folder.

Each image's labels are the YOLO label file Darknet itself looks for: a ``JPEGImages``
folder in the path becomes ``labels`` (VOC as Darknet's ``voc_label.py`` writes it), else an
``images`` folder does, else the file lies beside the image (``data/obj/a.jpg`` ->
``data/obj/a.txt``, the custom-data layout). ``classes``, when given, must equal the number
of names. ``valid`` becomes the validation split.
"""

import os

from yolo3 import fileio
from yolo3.data.formats import yolo_labels


def label_path(image_path):
    """Darknet's rule (see the module docstring)."""
    folder, name = os.path.split(os.fspath(image_path))
    parts = folder.split(os.sep)
    if "JPEGImages" in parts:
        index = len(parts) - 1 - parts[::-1].index("JPEGImages")
        parts[index] = "labels"
        return os.path.join(os.sep.join(parts), os.path.splitext(name)[0] + ".txt")
    return yolo_labels.label_path(image_path)


def read_settings(path):
    """``key = value`` lines of a ``.data`` file as a dict; ``#`` starts a comment."""
    settings = {}
    text = fileio.read_bytes(path).decode("utf-8-sig")
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise ValueError(f"{path}:{number}: {raw.strip()!r} is not key = value")
        settings[key.strip()] = value.strip()
    return settings


def _locate(text, bases):
    """The first of ``bases``/``text`` that exists, else the first one."""
    if os.path.isabs(text):
        return text
    candidates = [os.path.normpath(os.path.join(base, text)) for base in bases]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def read(path):
    """The layout of a ``.data`` file: ``(names, {split: [(image, source, line)]},
    label_folders, skip)``; ``skip`` are the list files themselves (not label files)."""
    settings = read_settings(path)
    folder = os.path.dirname(os.path.abspath(path))
    bases = [os.getcwd(), folder, os.path.dirname(folder)]
    for key in ("train", "names"):
        if not settings.get(key):
            raise ValueError(f"{path}: no {key} = ... line; Darknet's .data files name both")
    names_path = _locate(settings["names"], bases)
    if not os.path.isfile(names_path):
        raise ValueError(
            f"{path}: names file {settings['names']} not found (looked for {names_path})"
        )
    names = [
        line.strip()
        for line in fileio.read_bytes(names_path).decode("utf-8-sig").splitlines()
        if line.strip()
    ]
    if not names:
        raise ValueError(f"{names_path}: no class names; write one per line")
    if len(set(names)) != len(names):
        raise ValueError(f"{names_path}: a class name is repeated; names must be unique")
    declared = settings.get("classes")
    if declared is not None and declared != str(len(names)):
        raise ValueError(
            f"{path}: classes = {declared} but {names_path} names {len(names)} classes"
        )
    splits, label_folders, skip = {}, [], []
    for split, key in (("train", "train"), ("val", "valid")):
        if not settings.get(key):
            continue
        list_path = _locate(settings[key], bases)
        if not os.path.isfile(list_path):
            raise ValueError(
                f"{path}: {key} list {settings[key]} not found (looked for {list_path})"
            )
        skip.append(list_path)
        text = fileio.read_bytes(list_path).decode("utf-8-sig")
        list_bases = [*bases, os.path.dirname(os.path.abspath(list_path))]
        listed = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if line and not line.startswith("#"):
                listed.append((_locate(line, list_bases), list_path, number))
        splits[split] = listed
        label_folders.extend({os.path.dirname(label_path(image)) for image, _, _ in listed})
    return names, splits, label_folders, skip
