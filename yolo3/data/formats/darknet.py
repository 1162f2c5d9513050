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
of names. ``valid`` becomes the validation split. Darknet reads no test list; a ``test =``
line, which Darknet ignores, is read as the test split. A split is read only when asked for.

The dataset's own folders are the ``.data`` file's, the one above it and each list file's:
a listed image elsewhere (``../../x.jpg``, ``/x.jpg``) is read with its own label file, and
its folder is not searched for label files without an image.
"""

import os

from yolo3.data import limits
from yolo3.data.formats import yolo_labels
from yolo3.data.limits import excerpt


def label_path(image_path):
    """Darknet's rule (see the module docstring)."""
    folder, name = os.path.split(os.fspath(image_path))
    parts = folder.split(os.sep)
    if "JPEGImages" in parts:
        index = len(parts) - 1 - parts[::-1].index("JPEGImages")
        parts[index] = "labels"
        return os.path.join(os.sep.join(parts), os.path.splitext(name)[0] + ".txt")
    return yolo_labels.label_path(image_path)


def _lines(path, what):
    """The lines of a file that describes the dataset, each a path at most: one too long
    is refused in one line naming it."""
    for number, raw, size in limits.read_lines(path, max_bytes=limits.MAX_PATH_BYTES):
        if raw is None:
            raise ValueError(
                f"{path}:{number}: a line of {size} bytes, longer than any path; is this {what}?"
            )
        yield number, raw


def read_settings(path):
    """``key = value`` lines of a ``.data`` file as a dict; ``#`` starts a comment."""
    settings = {}
    for number, raw in _lines(path, "a Darknet .data file"):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, equals, value = line.partition("=")
        if not equals:
            raise ValueError(f"{path}:{number}: {excerpt(repr(raw.strip()))} is not key = value")
        settings[key.strip()] = value.strip()
    return settings


def _locate(text, bases):
    """The first of ``bases``/``text`` that exists, else the first one."""
    if os.path.isabs(text):
        return text
    candidates = [os.path.normpath(os.path.join(base, text)) for base in bases]
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def read(path, splits=("train", "val")):
    """The layout of a ``.data`` file: ``(names, {split: [(image, source, line)]},
    label_folders, skip, rejects, named)`` for each of ``splits`` the file names; ``skip``
    are the list files themselves (not label files), ``rejects`` the list files' lines that
    were skipped, ``named`` every split the file names."""
    settings = read_settings(path)
    folder = os.path.dirname(os.path.abspath(path))
    bases = [os.getcwd(), folder, os.path.dirname(folder)]
    for key in ("train", "names"):
        if not settings.get(key):
            raise ValueError(f"{path}: no {key} = ... line; Darknet's .data files name both")
    names_path = _locate(settings["names"], bases)
    if not os.path.isfile(names_path):
        raise ValueError(
            f"{path}: names file {excerpt(settings['names'])} not found (looked for "
            f"{excerpt(names_path)})"
        )
    names = [line.strip() for _, line in _lines(names_path, "a names file") if line.strip()]
    if not names:
        raise ValueError(f"{names_path}: no class names; write one per line")
    if len(set(names)) != len(names):
        raise ValueError(f"{names_path}: a class name is repeated; names must be unique")
    declared = settings.get("classes")
    if declared is not None and declared != str(len(names)):
        raise ValueError(
            f"{path}: classes = {excerpt(declared)} but {names_path} names {len(names)} classes"
        )
    keys = {"train": "train", "val": "valid", "test": "test"}
    named = [split for split, key in keys.items() if settings.get(key)]
    listed_splits, label_folders, skip, rejects = {}, [], [], []
    for split in named:
        key = keys[split]
        list_path = _locate(settings[key], bases)
        if split not in splits:
            # Unread, but a list file, not a label file without an image.
            skip.append(list_path)
            continue
        if not os.path.isfile(list_path):
            raise ValueError(
                f"{path}: {key} list {excerpt(settings[key])} not found (looked for "
                f"{excerpt(list_path)})"
            )
        skip.append(list_path)
        list_folder = os.path.dirname(os.path.abspath(list_path))
        list_bases = [*bases, list_folder]
        listed, list_rejects = yolo_labels.list_file(
            list_path, lambda text, bases=list_bases: _locate(text, bases)
        )
        listed_splits[split] = listed
        rejects.extend(list_rejects)
        roots = [folder, os.path.dirname(folder), list_folder]
        images = [image for image, _, _ in listed]
        label_folders.extend(yolo_labels.label_folders(images, roots, label_path))
    return names, listed_splits, label_folders, skip, rejects, named
