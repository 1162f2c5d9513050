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
:func:`~yolo3.data.formats.yolo_labels.label_path`. ``val`` becomes the validation split and
``test`` the test split; a split is read only when asked for, so a ``test:`` naming a folder
that does not exist is no error until the test split is asked for. ``nc``, when given, must
equal the number of names.

``--data`` may also name the folder of the yaml file (a Roboflow YOLO export unzipped):
:func:`find_yaml` takes its ``data.yaml`` (or ``data.yml``), else its one ``.yaml`` file
that holds ``names`` and ``train``.

The yaml file names the dataset's folders, and those are read as it names them. A line of a
list file that leads out of them (``../../x.png``, ``/x.png``) names that one image: its own
label file is read, its folder is not searched for others.

The file is read with PyYAML's safe loader, refusing aliases (``*name``: each repeats what it
names, so nested ones multiply level by level, the "billion laughs"), nesting deeper than
:data:`MAX_YAML_DEPTH` and files over :data:`MAX_YAML_BYTES`, each in one line at once.
"""

import functools
import os

from yolo3 import fileio
from yolo3.data.formats import yolo_labels
from yolo3.data.limits import excerpt, read_small_file

# A data.yaml is a few kilobytes, a thousand class names some 30 KB; PyYAML's pure-Python
# loader reads 1 MiB in about 4 s.
MAX_YAML_BYTES = 2**20
# data.yaml nests 2 or 3 levels; the loader recurses once a level.
MAX_YAML_DEPTH = 16


class _Refused(ValueError):
    """What the loader refuses, with the line it is on."""

    def __init__(self, mark, what):
        super().__init__(what)
        self.line = mark.line + 1


@functools.cache
def _loader():
    """PyYAML's SafeLoader that refuses aliases and deep nesting (built on first use: only
    this reader imports yaml)."""
    import yaml  # noqa: PLC0415

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _Refused(
                    event.start_mark,
                    f"the alias *{excerpt(event.anchor)}; aliases are refused in a dataset "
                    "file (nested ones expand exponentially): write the value out",
                )
            if self.depth >= MAX_YAML_DEPTH:
                raise _Refused(
                    self.peek_event().start_mark,
                    f"nested deeper than {MAX_YAML_DEPTH} levels; no data.yaml needs that",
                )
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Loader


def read_yaml(path):
    """The yaml file as a dict; ValueError naming the file on bad syntax or shape, and on
    what the loader refuses (see the module docstring)."""
    import yaml  # noqa: PLC0415 - only this reader needs it

    text = read_small_file(path, MAX_YAML_BYTES, "data.yaml")
    try:
        data = yaml.load(text.decode("utf-8-sig"), Loader=_loader())
    except _Refused as err:
        raise ValueError(f"{path}:{err.line}: {err}") from err
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, OverflowError) as err:
        # ValueError, OverflowError: a date or number that does not exist (2021-02-30).
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
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{path}: names' keys must be class ids 0, 1, ...") from None
        if ids != list(range(len(ids))):
            shown = excerpt(ids)
            raise ValueError(f"{path}: names' ids are {shown}; expected 0..{len(ids) - 1}")
        names = [names[key] for key in sorted(names, key=int)]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path}: no names list; add names: [class0, class1, ...]")
    names = [str(name) for name in names]
    if "nc" in data and data["nc"] != len(names):
        nc = excerpt(data["nc"])
        raise ValueError(f"{path}: nc is {nc} but names lists {len(names)} classes")
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
    """``([(image, source, line), ...], label_folders, rejects)`` of a split: its images,
    the folders its labels lie in that may be searched, and the lines of its list files that
    were skipped."""
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{yaml_path}: {key} must be a folder, a list file or a list of them")
    images, label_folders, rejects = [], [], []
    for entry in entries:
        location = _resolve(root, entry)
        if os.path.isdir(location):
            found = [p for p in fileio.files_under(location) if yolo_labels.is_image(p)]
            images.extend((p, p, 0) for p in found)
            label_folders.append(
                os.path.dirname(yolo_labels.label_path(os.path.join(location, "x")))
            )
        elif os.path.isfile(location):
            listed, list_rejects = list_file(location)
            images.extend(listed)
            rejects.extend(list_rejects)
            roots = [root, os.path.dirname(os.path.abspath(location))]
            label_folders.extend(yolo_labels.label_folders([p for p, _, _ in listed], roots))
        else:
            raise ValueError(
                f"{yaml_path}: {key} entry {excerpt(repr(entry))} is neither a folder nor a "
                f"list file (looked for {excerpt(location)})"
            )
    return images, label_folders, rejects


def list_file(path):
    """``([(image, path, line), ...], rejects)`` of a list file, relative lines from its
    folder (:func:`~yolo3.data.formats.yolo_labels.list_file`)."""
    folder = os.path.dirname(os.path.abspath(path))

    def locate(text):
        return text if os.path.isabs(text) else os.path.normpath(os.path.join(folder, text))

    return yolo_labels.list_file(path, locate)


def find_yaml(folder):
    """The dataset file of ``folder``: its ``data.yaml`` or ``data.yml``, else its one
    ``*.yaml``/``*.yml`` file holding ``names`` and ``train``; None when it has none.
    ValueError naming the files when more than one is a candidate."""
    names = sorted(os.listdir(folder))
    found = [name for name in names if name in ("data.yaml", "data.yml")]
    if not found:
        found = [
            name
            for name in names
            if os.path.splitext(name)[1].lower() in (".yaml", ".yml")
            and _names_a_dataset(os.path.join(folder, name))
        ]
    if len(found) > 1:
        raise ValueError(
            f"--data {folder}: holds {' and '.join(found)}; give --data the one to read"
        )
    return os.path.join(folder, found[0]) if found else None


def _names_a_dataset(path):
    """Whether ``path`` is a readable yaml mapping with ``names`` and ``train``."""
    if not os.path.isfile(path):
        return False
    try:
        data = read_yaml(path)
    except (OSError, ValueError):  # not a dataset file: some other yaml in the folder
        return False
    return "names" in data and "train" in data


def read(path, splits=("train", "val")):
    """The layout of a ``data.yaml``: ``(names, {split: [(image, source, line)]},
    label_folders, rejects, named)`` for each of ``splits`` the file names; the labels follow
    :func:`~yolo3.data.formats.yolo_labels.label_path`, ``rejects`` are list files' lines,
    ``named`` every split the file names (``train``, ``val``, ``test``)."""
    data = read_yaml(path)
    names = class_names(data, path)
    root = os.path.dirname(os.path.abspath(path))
    if data.get("path"):
        root = os.path.normpath(os.path.join(root, str(data["path"])))
    if not data.get("train"):
        raise ValueError(f"{path}: no train entry; add train: images/train (a folder or list)")
    named = [split for split in ("train", "val", "test") if data.get(split)]
    listed, folders, rejects = {}, [], []
    for split in named:
        if split in splits:
            listed[split], split_folders, split_rejects = list_images(
                data[split], root, path, split
            )
            folders.extend(split_folders)
            rejects.extend(split_rejects)
    return names, listed, folders, rejects, named
