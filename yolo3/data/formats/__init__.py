"""Datasets read where they lie, in the layouts other tools write: ``yolo3 preprocess
--data PATH``, ``yolo3 kmeans --data PATH`` and ``yolo3 evaluate --data PATH --split S``.

=========  ===================================================  ==========================
format     ``--data``                                           module
=========  ===================================================  ==========================
yolo       an Ultralytics ``data.yaml`` (Roboflow, CVAT), or    :mod:`.ultralytics`
           the folder holding it
darknet    a Darknet ``.data`` file                             :mod:`.darknet`
coco       a COCO instances JSON, or a folder of them           :mod:`.coco`
voc        a ``VOCdevkit`` or ``VOC<year>`` folder              :mod:`.voc`
=========  ===================================================  ==========================

:func:`read_dataset` gives every format the same shape: the class names the dataset names,
its splits (of :data:`SPLITS`: training, validation and test, those the dataset names and
the caller asks for) as :class:`~yolo3.data.annotations.Entry` lists (boxes in original image
pixels, as an annotation file's), and what was rejected, each naming its file and line.
Every reader keeps to the bounds of :mod:`yolo3.data.limits` (line lengths, boxes per image,
class ids, coordinates), so a hostile file ends as counted rejects or one error line. What
preprocessing does next (the class filter, the record shards, the manifest) does not depend
on the format.

The readers are written here rather than taken from a conversion library (globox,
supervision): those raise on the first bad line or skip it without a word, where a training
run needs every bad line named, counted and listed, ``--strict`` to refuse it, and the same
rules as the annotation files. The tests check the readers against globox and pycocotools.
"""

import collections
import dataclasses
import os

# The splits a dataset may name, in this order: training, validation, test.
SPLITS = ("train", "val", "test")
# What read_dataset reads unless told: the splits training uses (preprocess, kmeans). A test
# split is read only when asked for, so that its images cost nothing and its rejects do not
# count against a training set.
TRAINING_SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class SourceDataset:
    """A dataset as read: ``classes`` (names, in class id order), ``splits`` (``{split:
    [Entry, ...]}`` for each split asked for that the dataset names, keys of :data:`SPLITS`),
    ``named`` (every split the dataset names, read or not, in :data:`SPLITS` order),
    ``rejects`` (:class:`~yolo3.data.annotations.Reject` list) and ``counts`` (a Counter over
    the splits read: ``images``, ``boxes``, ``background_images``, ``rejected_boxes``,
    ``rejected_lines`` and the format's own)."""

    format: str
    path: str
    classes: list
    splits: dict
    rejects: list
    counts: collections.Counter
    named: tuple = ()


def add_arguments(parser, *, data_help, group=None):
    """``--data`` (with ``data_help``; in ``group`` when given, e.g. a mutually exclusive
    one with ``--annotations``) and ``--data-format`` on an argparse ``parser``."""
    (group or parser).add_argument("--data", help=data_help)
    parser.add_argument(
        "--data-format",
        choices=FORMATS,
        help="the format of --data (default: told by what it is)",
    )


def detect_format(path):
    """The format of ``path`` from what it is (see the table above); ValueError if none."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"--data {path} does not exist")
    for entry in REGISTRY:
        if entry.recognises(path):
            return entry.name
    if os.path.isdir(path):
        raise ValueError(
            f"--data {path}: a folder of none of the formats; looked for a data.yaml (yolo), "
            f"annotations/instances_*.json or train/, valid/, test/ holding "
            f"_annotations.coco.json (coco), Annotations/ or VOC<year>/ (voc); give --data "
            "the dataset's file itself"
        )
    raise ValueError(
        f"--data {path}: cannot tell its format from the name; give --data-format "
        f"({', '.join(FORMATS)})"
    )


def read_dataset(path, *, data_format=None, classes=None, image_root=None, splits=TRAINING_SPLITS):
    """Reads a dataset in any of :data:`FORMATS`.

    Args:
        path: what ``--data`` names (see the table above).
        data_format: one of :data:`FORMATS`, or None to detect it from ``path``.
        classes: class names to keep, for the formats that take them (VOC, whose files
            name classes but not their order); the others number their classes themselves.
        image_root: COCO's image folder, when it is not where the JSON's layout puts it.
        splits: which of :data:`SPLITS` to read (default: :data:`TRAINING_SPLITS`); one the
            dataset does not name is left out of the result's ``splits`` (its ``named``
            tells which it has).

    Raises:
        ValueError: one line naming the file when the dataset cannot be read at all.
    """
    path = os.fspath(path)
    unknown = [split for split in splits if split not in SPLITS]
    if unknown:
        raise ValueError(f"split {unknown[0]!r}: a dataset's splits are {', '.join(SPLITS)}")
    data_format = data_format or detect_format(path)
    entry = registered(data_format)
    if classes is not None and not entry.takes_classes:
        raise ValueError(
            f"--classes: a {data_format} dataset names its classes itself; drop --classes"
        )
    if not os.path.exists(path):
        raise ValueError(f"--data {path} does not exist")
    names, read, rejects, counts, named = entry.read(
        path, classes=classes, image_root=image_root, splits=tuple(splits)
    )
    named = tuple(split for split in SPLITS if split in named)
    return SourceDataset(data_format, path, list(names), read, rejects, counts, named)


def read_split(path, split, **options):
    """The dataset at ``path`` with only its ``split`` read (:func:`read_dataset`'s
    ``options``): ``.splits[split]`` holds at least one entry.

    Raises:
        ValueError: one line naming the dataset, for a split it does not name (with those it
            does) or one that holds no image, besides :func:`read_dataset`'s.
    """
    if split not in SPLITS:
        raise ValueError(f"--split {split}: a dataset's splits are {', '.join(SPLITS)}")
    dataset = read_dataset(path, splits=(split,), **options)
    if split not in dataset.splits:
        raise ValueError(
            f"--data {dataset.path} has no {split} split (it has: {', '.join(dataset.named)}); "
            f"give --split {' or '.join(dataset.named)}"
        )
    if not dataset.splits[split]:
        raise ValueError(f"--data {dataset.path}: its {split} split holds no image")
    return dataset


def registered(data_format):
    """The :class:`DatasetFormat` of :data:`REGISTRY` named ``data_format``; ValueError
    naming ``--data-format`` when none is."""
    entry = next((entry for entry in REGISTRY if entry.name == data_format), None)
    if entry is None:
        raise ValueError(f"--data-format {data_format!r}: use one of {', '.join(FORMATS)}")
    return entry


def _read_yolo_layout(path, data_format, splits):
    from yolo3.data.formats import darknet, ultralytics, yolo_labels  # noqa: PLC0415

    if data_format == "yolo":
        names, listed, label_folders, rejects, named = ultralytics.read(path, splits)
        label_of, skip = yolo_labels.label_path, []
    else:
        names, listed, label_folders, skip, rejects, named = darknet.read(path, splits)
        label_of = darknet.label_path
    counts, splits = collections.Counter(), {}
    counts["rejected_lines"] += len(rejects)  # list files' lines too long to be a path
    claimed = list(skip)
    for split, images in listed.items():
        entries = splits.setdefault(split, [])
        for image, source, line in images:
            labels = label_of(image)
            claimed.append(labels)
            entry, image_rejects = yolo_labels.read_image(
                image, labels, len(names), source=source, line=line, counts=counts
            )
            rejects.extend(image_rejects)
            if entry is not None:
                entries.append(entry)
    orphans = yolo_labels.orphan_labels(label_folders, claimed)
    rejects.extend(orphans)
    counts["rejected_lines"] += len(orphans)
    return names, splits, rejects, counts, named


def _has_suffix(*suffixes):
    def recognises(path):
        return os.path.isfile(path) and os.path.splitext(path)[1].lower() in suffixes

    return recognises


def _is_voc(path):
    """A ``VOCdevkit`` or ``VOC<year>`` folder: one with ``Annotations`` or a ``VOC*`` entry."""
    return os.path.isdir(path) and (
        os.path.isdir(os.path.join(path, "Annotations"))
        or any(name.startswith("VOC") for name in os.listdir(path))
    )


def _is_yolo(path):
    """A ``.yaml``/``.yml`` file, or a folder holding a dataset's one (a Roboflow YOLO
    export)."""
    from yolo3.data.formats import ultralytics  # noqa: PLC0415

    return _has_suffix(".yaml", ".yml")(path) or (
        os.path.isdir(path) and ultralytics.find_yaml(path) is not None
    )


def _read_yolo(path, *, splits, **_):
    from yolo3.data.formats import ultralytics  # noqa: PLC0415

    if os.path.isdir(path):
        found = ultralytics.find_yaml(path)
        if found is None:
            raise ValueError(f"--data {path}: no data.yaml in this folder; give the yaml file")
        path = found
    return _read_yolo_layout(path, "yolo", splits)


def _is_coco(path):
    """A COCO JSON, or a folder of them (``annotations/instances_*.json``, a Roboflow
    export) that is not a VOC folder."""
    from yolo3.data.formats import coco  # noqa: PLC0415

    return _has_suffix(".json")(path) or (
        os.path.isdir(path) and not _is_voc(path) and coco.holds_coco(path)
    )


def _read_coco(path, *, classes, image_root, splits):
    from yolo3.data.formats import coco  # noqa: PLC0415

    return coco.read(path, image_root, splits)


def _read_voc(path, *, classes, image_root, splits):
    from yolo3.data.formats import voc  # noqa: PLC0415

    return voc.read(path, classes, splits)


@dataclasses.dataclass(frozen=True)
class DatasetFormat:
    """One format of :data:`REGISTRY`: its ``name`` (``--data-format``), ``recognises(path)``
    (whether a ``--data`` path is one), ``read(path, classes=, image_root=, splits=)`` giving
    ``(names, splits, rejects, counts, named)`` as :class:`SourceDataset` holds them (only
    the ``splits`` asked for are read; ``named`` is every split the dataset names), and
    whether it ``takes_classes`` (``--classes``)."""

    name: str
    recognises: object
    read: object
    takes_classes: bool = False


# Every format --data reads; a new one is a reader module and one entry here.
REGISTRY = (
    DatasetFormat("yolo", _is_yolo, _read_yolo),
    DatasetFormat(
        "darknet",
        _has_suffix(".data"),
        lambda path, *, splits, **_: _read_yolo_layout(path, "darknet", splits),
    ),
    DatasetFormat("coco", _is_coco, _read_coco),
    DatasetFormat("voc", _is_voc, _read_voc, takes_classes=True),
)
FORMATS = tuple(entry.name for entry in REGISTRY)


__all__ = [
    "DatasetFormat",
    "FORMATS",
    "REGISTRY",
    "SPLITS",
    "TRAINING_SPLITS",
    "SourceDataset",
    "add_arguments",
    "detect_format",
    "read_dataset",
    "read_split",
    "registered",
]
