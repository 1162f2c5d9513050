"""Offline preprocessing: annotation files -> a record set of letterboxed and augmented images.

Decoding, resizing and colour jitter cost tens of milliseconds of Python per image; done
every epoch they starve the GPUs. Here they are done once, in parallel worker processes:
each source image yields one clean letterboxed copy and ``copies`` augmented ones, encoded
and packed into TFRecord shards (format: :mod:`yolo3.data.records`).

Determinism: an image's augmentation is drawn from a generator seeded by ``(seed, split,
the image's position in its split, copy)``, and the assignment of images to shards and the
order of records inside a shard depend only on the seed. The output is therefore the same
byte for byte whatever the number of workers, and a run can be resumed shard by shard.

Mosaics (``mosaic`` > 0): each augmented training copy is a mosaic of the image and 3 others
of its split with probability ``mosaic`` (:mod:`yolo3.data.mosaic`). Which copies, and
which partners, is drawn in the main process when the shards are planned, from a generator
of each copy's own (the copy's seed and :data:`MOSAIC_STREAM`), so ``mosaic`` 0 leaves the
output as it was without the option; the mosaic itself is drawn from the copy's
augmentation generator. The task of an image carries its partners' paths and boxes, since a
worker sees one image at a time, and a shard's annotation digest covers them too. A
partner that cannot be read leaves its quarter gray (``mosaic_partners_unreadable``; it is
listed under its own line in ``rejects.txt``).

Resumption: shards are written under a temporary name and renamed when complete; the
shard's statistics follow in ``.progress/``, with a digest of the annotations it was rendered
from. A second run with the same settings skips the finished shards whose annotations did
not change, redoes the rest and writes ``manifest.json`` last. Other settings are refused
unless ``overwrite``, which deletes the record set's own files and nothing else.

This module imports TensorFlow only inside :func:`run` (to write TFRecords), so the worker
processes, which import it to find :func:`process_image`, start without it.
"""

import collections
import dataclasses
import hashlib
import io
import json
import math
import multiprocessing
import os
import time

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from yolo3 import fileio
from yolo3.data import annotations as annotations_io
from yolo3.data import hygiene
from yolo3.data import mosaic as mosaic_ops
from yolo3.data.augment import AugmentConfig, clip_boxes, letterbox, random_augment
from yolo3.data.image import PAD_VALUE, to_rgb
from yolo3.distributed.devices import available_cores
from yolo3.flags import argument_type, setting
from yolo3.model.resources import parse_size, read_classes
from yolo3.progress import counter

SPLIT_IDS = {"train": 0, "val": 1}
PROGRESS_DIR = ".progress"
# A floor on the number of training shards, so that up to this many input pipelines
# (workers of a multi-machine job) can each read whole files of their own.
MIN_TRAIN_SHARDS = 16
MIN_VAL_SHARDS = 2
# Rough bytes per pixel of a JPEG at quality ~90 and of a PNG of a photo, used only to size
# shards up front.
JPEG_BYTES_PER_PIXEL = 0.3
PNG_BYTES_PER_PIXEL = 1.5
IMAGE_FORMATS = ("jpeg", "raw")
VAL_FORMATS = ("lossless", "same")
# The last word of a copy's mosaic seed, (seed, split id, ordinal, copy, MOSAIC_STREAM): a
# stream apart from the copy's augmentation, (seed, split id, ordinal, copy). Not 0: NumPy's
# SeedSequence pads short seeds with zeros, so a zero here could repeat the shorter seed.
MOSAIC_STREAM = 0x6D6F73  # "mos"
# The share of the images held out for validation when the source names no validation split
# and neither --val-fraction nor --val-per-class is given: a run is never left without one
# unless asked (--val-fraction 0). A tenth, as MXNet's im2rec tools and most exports split.
DEFAULT_VAL_FRACTION = 0.1


def _annotation_files(args):
    return tuple(args.annotations or ())


def _class_names(args):
    """The names in ``--classes``' file; none without the flag."""
    return tuple(read_classes(args.classes)) if args.classes else ()


def _add_data_flags(group, *, help):
    """``--data`` and ``--data-format``, as every command that reads a dataset names them."""
    from yolo3.data import formats  # noqa: PLC0415

    formats.add_arguments(group, data_help=help)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    """Everything that determines the output; two runs with equal configs write equal bytes.

    ``workers`` is deliberately not part of it: it changes speed, never the output.

    A field that is a flag of ``yolo3 preprocess`` is a :func:`yolo3.flags.setting`, listed
    in the order of the flags, in one of these groups: ``"dataset"`` and ``"validation"``
    (the flags ``yolo3 train --data`` takes too), ``"per_class"``, ``"format"``,
    ``"augmentation"`` (with :class:`~yolo3.data.augment.AugmentConfig`'s) and ``"running"``.
    """

    output: str  # --output, the command's own: it checks the folder while parsing
    annotations: tuple[str, ...] = setting(
        (),
        group="dataset",
        nargs="+",
        cli_default=None,
        read=_annotation_files,
        help="annotation files (keras-yolo3 format)",
    )
    # a dataset in another layout (yolo3.data.formats), instead of annotation files
    data: str | None = setting(
        None,
        group="dataset",
        add=_add_data_flags,
        help="a dataset instead of annotation files: data.yaml (Ultralytics), .data "
        "(Darknet), a COCO JSON or a VOCdevkit folder",
    )
    # its format; None: told by what data is. Its flag, --data-format, comes with --data's.
    data_format: str | None = None
    # required with annotations; with data, VOC's classes to keep
    classes: tuple[str, ...] = setting(
        (),
        group="dataset",
        cli_default=None,
        read=_class_names,
        help="classes file, one name per line (with --data: only for voc, the classes to keep)",
    )
    input_size: tuple[int, int] = setting(  # (height, width), multiples of 32
        group="dataset",
        parse=argument_type(parse_size),
        cli_default=(416, 416),
        help="training size: 416 or HEIGHTxWIDTH, multiples of 32",
    )
    copies: int = setting(
        4, group="dataset", help="augmented copies per training image, besides the clean one"
    )
    image_root: str | None = setting(
        None,
        group="dataset",
        help="folder relative image paths start from (default: each annotation file's "
        "folder; with a COCO --data, the folder of the images)",
    )
    val_annotations: tuple[str, ...] = setting(
        (),
        group="validation",
        nargs="+",
        help="annotation files of a separate validation set",
    )
    # None: DEFAULT_VAL_FRACTION held out when the source names no validation split; 0: none.
    val_fraction: float | None = setting(
        None,
        group="validation",
        help="hold this share of the images out for validation when the dataset names no "
        f"validation split (default: {DEFAULT_VAL_FRACTION:g}, seeded by --seed; "
        "0: train without one)",
    )
    val_per_class: int | None = setting(
        None, group="per_class", help="carve N images per class out"
    )
    min_images_per_class: int = setting(
        0, group="per_class", help="drop classes that appear in fewer images than this"
    )
    image_format: str = setting("jpeg", group="format", flag="--format", choices=IMAGE_FORMATS)
    quality: int = setting(90, group="format", help="JPEG quality")
    # "lossless" (PNG in a JPEG set) so that the mAP measured on the validation split is the
    # mAP on the user's own images; "same" stores it as the training split.
    val_format: str = setting(
        "lossless",
        group="format",
        choices=VAL_FORMATS,
        help="the validation split's images: lossless (PNG in a JPEG set: mAP is measured on "
        "the images as they are) or the same as the training split's",
    )
    shard_mb: float = setting(100.0, group="format", help="target shard size in MB")
    num_shards: int | None = setting(
        None, group="format", help="training shards (overrides --shard-mb)"
    )
    augment: AugmentConfig = AugmentConfig()  # its flags: its own settings, here
    mosaic: float = setting(
        0.0,
        group="augmentation",
        metavar="P",
        help="probability that an augmented copy is a mosaic of 4 training images, each "
        "quarter augmented as above (needs 4 or more training images); default 0",
    )
    seed: int = setting(0, group="running")

    def __post_init__(self):
        height, width = self.input_size
        if height % 32 or width % 32 or height <= 0 or width <= 0:
            raise ValueError(f"--input-size {height}x{width}: both sides must be multiples of 32")
        if self.copies < 0:
            raise ValueError(f"--copies {self.copies} must be >= 0")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(f"--format {self.image_format!r}: use {' or '.join(IMAGE_FORMATS)}")
        if self.val_format not in VAL_FORMATS:
            raise ValueError(f"--val-format {self.val_format!r}: use {' or '.join(VAL_FORMATS)}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality {self.quality} must be in [1, 100]")
        if self.val_fraction is not None and self.val_per_class is not None:
            raise ValueError("give --val-fraction or --val-per-class, not both")
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(
                f"--val-fraction {self.val_fraction}: give a share in [0, 1) (0: no validation)"
            )
        if self.val_annotations and (self.val_fraction or self.val_per_class):
            raise ValueError("--val-annotations already gives a validation split; drop --val-*")
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"--num-shards {self.num_shards} must be >= 1")
        if bool(self.annotations) == bool(self.data):
            raise ValueError("give --annotations (with --classes) or --data, one of the two")
        if self.annotations and not self.classes:
            raise ValueError("--annotations needs --classes, the classes file")
        if self.data and self.val_annotations:
            raise ValueError("--val-annotations goes with --annotations; --data names its splits")
        if not 0.0 <= self.mosaic <= 1.0:  # written so, NaN is refused too
            raise ValueError(f"--mosaic {self.mosaic} is a probability: give a value in [0, 1]")

    def fingerprint(self):
        """A JSON-able description of the settings, stored to refuse resuming a different run."""
        data = dataclasses.asdict(self)
        data["augment"] = dataclasses.asdict(self.augment)
        del data["output"]  # the same folder may be spelled differently
        if not data["mosaic"]:
            del data["mosaic"]  # runs from before the option resume as they were
        return json.loads(json.dumps(data))


@dataclasses.dataclass(frozen=True)
class Task:
    """One source image to render; everything a worker process needs, picklable."""

    split: str
    ordinal: int
    path: str
    boxes: np.ndarray  # (M, 4) float64, source image pixels
    classes: np.ndarray  # (M,) int64
    difficult: np.ndarray  # (M,) bool
    source: str
    line: int
    copies: int
    input_size: tuple
    seed: int
    image_format: str
    quality: int
    augment: AugmentConfig
    # One item per augmented copy 1..copies: None for a plain copy, else the 3 partners
    # (annotations.Entry) of a mosaic, top-right, bottom-left, bottom-right. Empty: no mosaics.
    mosaic: tuple = ()


def _open_image(path):
    """Reads ``path`` as an upright RGB array, returning what had to be converted."""
    notes = []
    data = fileio.read_bytes(path)
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # decode now, so truncated files fail here
        mode = image.mode
        if mode.startswith("I;16") or mode in ("I", "F"):
            notes.append("converted_high_bit_depth")
        elif mode in ("L", "LA", "1"):
            notes.append("converted_grayscale")
        elif mode in ("P", "PA"):
            notes.append("converted_palette")
        elif mode == "CMYK":
            notes.append("converted_cmyk")
        elif mode in ("RGBA", "RGBa"):
            notes.append("converted_alpha")
        orientation = image.getexif().get(0x0112, 1)
        if orientation not in (0, 1):
            notes.append("exif_rotated")
        upright = ImageOps.exif_transpose(image)
        return np.asarray(to_rgb(upright), dtype=np.uint8), notes


def split_format(config, split):
    """How ``split``'s records store their images: the set's format, or PNG for a lossless
    validation split of a JPEG set (raw is lossless already)."""
    if split == "val" and config.val_format == "lossless" and config.image_format == "jpeg":
        return "png"
    return config.image_format


def _encode(image, image_format, quality):
    if image_format == "raw":
        return image.tobytes()
    buffer = io.BytesIO()
    if image_format == "png":
        Image.fromarray(image).save(buffer, "PNG")
    else:
        Image.fromarray(image).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def process_image(task):
    """Renders one source image into its clean and augmented records (runs in a worker).

    Returns:
        ``(records, rejects, counts)``: a list of record dicts for
        :func:`yolo3.data.records.serialize_example` (clean copy first; a mosaic's with
        ``mosaic`` 1 and the boxes of all 4 tiles), a list of ``(reason, message)`` for the
        image or its boxes, and a Counter of conversions, dropped boxes and mosaics.
    """
    counts = collections.Counter()
    where = f"{task.source}:{task.line}" if task.line else task.source
    if not fileio.exists(task.path):
        return [], [("missing_image", f"{where}: image {task.path} does not exist")], counts
    try:
        image, notes = _open_image(task.path)
    except Exception as err:  # noqa: BLE001 - one bad file must not stop the run; it is listed
        # Pillow reports corrupt data as OSError, SyntaxError, ValueError, struct.error,
        # DecompressionBombError...; its message for an unknown format names a memory
        # address, so that one is replaced to keep the rejects file stable.
        if isinstance(err, UnidentifiedImageError):
            detail = "not an image format Pillow reads"
        else:
            detail = f"{type(err).__name__}: {err}"
        message = f"{where}: cannot decode image {task.path} ({detail}); the image is skipped"
        return [], [("unreadable_image", message)], counts
    counts.update(notes)
    rejects = []
    boxes, classes, difficult, was_clipped, inside = _boxes_inside(task, image)
    for box in task.boxes.reshape(-1, 4)[~inside]:
        coords = ",".join(f"{v:g}" for v in box)
        message = (
            f"{where}: box {coords} lies outside the {image.shape[1]}x{image.shape[0]} image "
            f"{task.path}; the box is skipped"
        )
        rejects.append(("box_outside_image", message))
    counts["boxes_clipped"] += int(np.sum(was_clipped & inside))

    records, partner_images = [], {}
    for copy in range(task.copies + 1):
        partners = task.mosaic[copy - 1] if copy and task.mosaic else None
        out_classes, out_difficult = classes, difficult
        # The copy's augmentation generator, which draws a mosaic's pixels too.
        rng = np.random.default_rng((task.seed, SPLIT_IDS[task.split], task.ordinal, copy))
        if copy == 0:
            out_image, out_boxes, keep = letterbox(image, boxes, task.input_size)
            counts["boxes_dropped_clean"] += int(np.sum(~keep))
        elif partners is None:
            out_image, out_boxes, keep = random_augment(
                image, boxes, task.input_size, rng, task.augment
            )
            counts["boxes_dropped_augmented"] += int(np.sum(~keep))
        else:
            tiles = [(image, boxes, classes, difficult)]
            tiles += [_partner_tile(p, partner_images, counts) for p in partners]
            sample = mosaic_ops.random_mosaic(
                [tile[:2] for tile in tiles], task.input_size, rng, task.augment
            )
            out_image, out_boxes, keep = sample.pixels, sample.boxes, sample.keep
            out_classes = np.concatenate([tile[2] for tile in tiles])
            out_difficult = np.concatenate([tile[3] for tile in tiles])
            counts["boxes_dropped_mosaic"] += int(np.sum(~keep))
            counts["mosaic_records"] += 1
        record = {
            "image": _encode(out_image, task.image_format, task.quality),
            "format": task.image_format,
            "height": task.input_size[0],
            "width": task.input_size[1],
            "boxes": np.asarray(out_boxes, np.float32)[keep],
            "classes": out_classes[keep],
            "difficult": out_difficult[keep],
            "source": task.path,
            "line": task.line,
            "copy": copy,
        }
        if partners is not None:
            record["mosaic"] = 1
        records.append(record)
    return records, rejects, counts


def _boxes_inside(entry, image):
    """``entry``'s boxes clipped to ``image``, those left inside it and their classes and
    flags: ``(boxes, classes, difficult, was_clipped, inside)``, the last two ``(M,)`` bool
    masks over the entry's boxes."""
    boxes, classes = entry.boxes.reshape(-1, 4), entry.classes.reshape(-1)
    difficult = entry.difficult.reshape(-1)
    clipped, was_clipped = clip_boxes(boxes, image.shape[:2])
    inside = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
    return clipped[inside], classes[inside], difficult[inside], was_clipped, inside


def _partner_tile(entry, cache, counts):
    """``(image, boxes, classes, difficult)`` of a mosaic partner, decoded once per task.

    Its conversions, clipped boxes and rejects are counted by its own task, not here; an
    image that cannot be read is a one-pixel gray stand-in without boxes (its quarter stays
    gray), counted as ``mosaic_partners_unreadable``.
    """
    if entry.path not in cache:
        try:
            cache[entry.path], _ = _open_image(entry.path)
        except Exception:  # noqa: BLE001 - its own task lists why; here it is one gray quarter
            cache[entry.path] = None
    image = cache[entry.path]
    if image is None:
        counts["mosaic_partners_unreadable"] += 1
        gray = np.full((1, 1, 3), PAD_VALUE, np.uint8)
        return gray, np.zeros((0, 4)), np.zeros(0, np.int64), np.zeros(0, bool)
    boxes, classes, difficult, _, _ = _boxes_inside(entry, image)
    return image, boxes, classes, difficult


def plan_shards(num_items, num_records_per_item, config, split):
    """How many shards a split gets: by target size, at least a floor, at most one per image."""
    if num_items == 0:
        return 0
    height, width = config.input_size
    per_pixel = {"raw": 3, "jpeg": JPEG_BYTES_PER_PIXEL, "png": PNG_BYTES_PER_PIXEL}
    bytes_per_record = height * width * per_pixel[split_format(config, split)]
    if split == "train" and config.num_shards is not None:
        wanted = config.num_shards
    else:
        total = num_items * num_records_per_item * bytes_per_record
        floor = MIN_TRAIN_SHARDS if split == "train" else MIN_VAL_SHARDS
        wanted = max(floor, math.ceil(total / (config.shard_mb * 2**20)))
    return max(1, min(wanted, num_items))


class RejectError(ValueError):
    """Raised in ``--strict`` mode when any line, box or image is rejected."""


@dataclasses.dataclass
class Dataset:
    """Parsed and split annotations, before rendering."""

    classes: list
    splits: dict  # split -> list of annotations.Entry
    rejects: list  # (source, line, reason, message) found while parsing and splitting
    counts: collections.Counter
    hygiene: dict
    validation: dict  # where the validation split came from (_validation_split)


def read_sources(config):
    """``(classes, train, val, rejects, counts)`` of the annotation files or ``--data``:
    entry lists, :class:`~yolo3.data.annotations.Reject` list and Counter."""
    if config.data:
        from yolo3.data import formats  # noqa: PLC0415

        source = formats.read_dataset(
            config.data,
            data_format=config.data_format,
            classes=list(config.classes) or None,
            image_root=config.image_root,
        )
        train, val = source.splits.get("train", []), source.splits.get("val", [])
        return source.classes, train, val, source.rejects, source.counts
    counts, rejects, num_classes = collections.Counter(), [], len(config.classes)

    def parse(paths):
        entries, file_rejects, file_counts = annotations_io.parse_annotation_files(
            paths, num_classes=num_classes, image_root=config.image_root
        )
        counts.update(file_counts)
        rejects.extend(file_rejects)
        return entries

    train = parse(config.annotations)
    val = parse(config.val_annotations) if config.val_annotations else []
    return list(config.classes), train, val, rejects, counts


def load_dataset(config):
    """Reads the annotations and applies the class filter and validation split."""
    classes, train, val, source_rejects, counts = read_sources(config)
    rejects = [(r.source, r.line, r.reason, r.message) for r in source_rejects]
    carve = config.val_per_class is not None or bool(config.val_fraction)
    if val and carve:
        raise ValueError(
            f"{config.data} names a validation split already; drop --val-fraction/--val-per-class"
        )
    hygiene_report = {}
    if config.min_images_per_class > 0:
        kept, classes, report = hygiene.drop_rare_classes(
            train + val, classes, config.min_images_per_class
        )
        train, val = kept[: len(train)], kept[len(train) :]
        hygiene_report["min_images_per_class"] = report
    train, val, validation = _validation_split(config, train, val)
    splits = {"train": train}
    if val:
        splits["val"] = val
    return Dataset(classes, splits, rejects, counts, hygiene_report, validation)


def _validation_split(config, train, val):
    """``(train, val, validation)``: the split as the source names it, carved out as the
    flags say, or :data:`DEFAULT_VAL_FRACTION` held out when the source names none;
    ``validation`` says where the validation images came from (``source``: ``named``,
    ``held_out`` or ``none``, and ``text``, the line a run prints), for the manifest."""
    if val:
        named = list(config.val_annotations) or [config.data]
        text = f"the validation split of {', '.join(map(str, named))}"
        return train, val, {"source": "named", "text": text}
    if config.val_fraction == 0:
        return train, val, {"source": "none", "text": "none (--val-fraction 0)"}
    fraction, per_class = config.val_fraction, config.val_per_class
    if fraction is None and per_class is None:
        fraction = DEFAULT_VAL_FRACTION
        how = (
            f"{fraction:.0%} of the images, seed {config.seed}; --val-fraction F holds out "
            "another share"
        )
    elif per_class is not None:
        how = f"{per_class} images per class (--val-per-class), seed {config.seed}"
    else:
        how = f"{fraction:g} of the images (--val-fraction), seed {config.seed}"
    distinct = len({entry.path for entry in train})
    if distinct < 2:
        text = (
            f"none: {distinct} distinct training image cannot be split; add a validation split "
            "or more images (--val-fraction 0 says no validation outright)"
        )
        return train, val, {"source": "none", "text": text}
    train, val = hygiene.split_validation(
        train, fraction=fraction, per_class=per_class, seed=config.seed
    )
    text = f"held out of the training images: {how}"
    return train, val, {"source": "held_out", "text": text, "fraction": fraction}


def _shard_plan(dataset, config):
    """``[(split, shard_index, num_shards, [(ordinal, entry, partners), ...]), ...]``, from
    the seed only; ``partners`` as :attr:`Task.mosaic` holds them (:func:`_mosaic_partners`)."""
    plan = []
    for split, entries in dataset.splits.items():
        items = [
            (ordinal, entry, _mosaic_partners(config, split, ordinal, entries))
            for ordinal, entry in enumerate(entries)
        ]
        copies = config.copies if split == "train" else 0
        if split == "train":
            order = np.random.default_rng((config.seed, SPLIT_IDS[split])).permutation(len(items))
            items = [items[i] for i in order]
        count = plan_shards(len(items), copies + 1, config, split)
        for index, chunk in enumerate(np.array_split(np.arange(len(items)), count)):
            plan.append((split, index, count, [items[i] for i in chunk]))
    return plan


def _mosaic_partners(config, split, ordinal, entries):
    """The mosaic partners of each augmented copy of ``entries[ordinal]``: a tuple with one
    item per copy 1..copies, None for a plain copy or a tuple of 3 other entries of the
    split; empty when the split has no mosaics (validation, ``mosaic`` 0)."""
    if split != "train" or not config.mosaic:
        return ()
    partners = []
    for copy in range(1, config.copies + 1):
        seed = (config.seed, SPLIT_IDS[split], ordinal, copy, MOSAIC_STREAM)
        rng = np.random.default_rng(seed)
        chosen = mosaic_ops.choose_partners(rng, ordinal, len(entries), config.mosaic)
        partners.append(None if chosen is None else tuple(entries[i] for i in chosen))
    return tuple(partners)


def _tasks(plan, config):
    for split, _, _, items in plan:
        copies = config.copies if split == "train" else 0  # validation stays clean
        for ordinal, entry, partners in items:
            yield Task(
                split=split,
                ordinal=ordinal,
                path=entry.path,
                boxes=entry.boxes,
                classes=entry.classes,
                difficult=entry.difficult,
                source=entry.source,
                line=entry.line,
                copies=copies,
                input_size=tuple(config.input_size),
                seed=config.seed,
                image_format=split_format(config, split),
                quality=config.quality,
                augment=config.augment,
                mosaic=partners,
            )


def _progress_path(config, *parts):
    return fileio.join(config.output, PROGRESS_DIR, *parts)


# The files of a record set, as globs in its folder: --overwrite deletes these and nothing
# else, so pointing --output at a folder that holds other files does not lose them.
_OUTPUT_FILES = ("train-*-of-*.tfrecord*", "val-*-of-*.tfrecord*", "manifest.json", "rejects.txt*")
# What a killed run can leave behind: a shard being written (``.incomplete``) and files being
# replaced (``.tmp-*.json`` locally, ``*.tmp`` on remote filesystems).
_LEFTOVERS = ("*.tfrecord.incomplete", "*.json.tmp", "rejects.txt.tmp", ".tmp-*.json")


def _remove(directory, patterns, keep=()):
    for pattern in patterns:
        for path in fileio.glob(fileio.join(directory, pattern)):
            if os.path.basename(path) not in keep:
                fileio.remove(path)


def _prepare_output(config, overwrite):
    """Creates the output folder, refusing to mix runs with different settings."""
    plan_file = _progress_path(config, "config.json")
    fingerprint = config.fingerprint()
    if overwrite and fileio.exists(_progress_path(config)):
        fileio.rmtree(_progress_path(config))
    if overwrite and fileio.exists(config.output):
        _remove(config.output, _OUTPUT_FILES)
    fileio.makedirs(_progress_path(config))
    if fileio.exists(plan_file):
        with fileio.open_file(plan_file, "r") as f:
            previous = json.load(f)
        if previous != fingerprint:
            keys = set(fingerprint) | set(previous)
            changed = sorted(k for k in keys if previous.get(k) != fingerprint.get(k))
            raise ValueError(
                f"{config.output} holds a preprocessing run with other settings (different "
                f"{', '.join(changed)}); use a new --output folder or pass --overwrite"
            )
    else:
        fileio.write_json(plan_file, fingerprint)
    _remove(config.output, _LEFTOVERS)
    _remove(_progress_path(config), _LEFTOVERS)


def _inputs_digest(items):
    """A digest of the annotations a shard is rendered from.

    Stored with the shard's statistics so that a resumed run whose annotation files were
    edited renders the affected shards again instead of reusing stale ones.
    """
    digest = hashlib.sha256()
    for ordinal, entry, partners in items:
        fields = [ordinal, entry.path, entry.boxes.tolist(), entry.classes.tolist()]
        if entry.difficult.any():  # digests of sets without the flag stay as they were
            fields.append(entry.difficult.tolist())
        digest.update(json.dumps([*fields, entry.source, entry.line]).encode())
        # A mosaic shows its partners: editing one's boxes makes the shard stale too.
        for copy_partners in partners:
            for partner in copy_partners or ():
                boxes, classes = partner.boxes.tolist(), partner.classes.tolist()
                flags = partner.difficult.tolist()
                digest.update(json.dumps([partner.path, boxes, classes, flags]).encode())
    return digest.hexdigest()


def _finished_shard(config, name, items):
    """The statistics of a complete shard rendered from ``items``, else None."""
    stats_path = _progress_path(config, name + ".json")
    if not (fileio.exists(stats_path) and fileio.exists(fileio.join(config.output, name))):
        return None
    with fileio.open_file(stats_path, "r") as f:
        stats = json.load(f)
    return stats if stats.get("inputs") == _inputs_digest(items) else None


class _Renderer:
    """Renders tasks in order, in ``workers`` spawned processes (inline for one worker)."""

    def __init__(self, workers):
        # spawn, not fork: the parent has TensorFlow's threads running.
        context = multiprocessing.get_context("spawn")
        self.pool = context.Pool(workers) if workers > 1 else None

    def imap(self, tasks):
        if self.pool is None:
            return map(process_image, tasks)
        return self.pool.imap(process_image, tasks, chunksize=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def run(
    config, *, workers=None, overwrite=False, strict=False, progress="auto", log=print, dataset=None
):
    """Preprocesses ``config.annotations`` into a record set at ``config.output``.

    Over 80 lines: the run's steps in the order they happen, from the plan and the resume
    check to the workers and the manifest.

    ``progress``: one of :data:`yolo3.progress.PROGRESS_CHOICES` (auto: a bar on a
    terminal, else a line every 30 s through ``log``).
    ``dataset``: :func:`load_dataset`'s of ``config``, when the caller has read it already.

    Returns:
        The manifest dict (also written to ``manifest.json``).

    Raises:
        RejectError in ``strict`` mode on the first rejected line, box or image.
    """
    from yolo3.data import records  # noqa: PLC0415 - TensorFlow: parent only

    workers = workers or available_cores()
    dataset = dataset or load_dataset(config)
    if strict and dataset.rejects:
        raise RejectError(_describe_rejects(STRICT_HEADER, dataset.rejects))
    if not dataset.splits["train"]:
        where = f"no usable images in {', '.join(_sources(config))}"
        if not dataset.rejects:
            raise ValueError(where)
        raise ValueError(_describe_rejects(f"{where}; the reasons:", dataset.rejects, limit=3))
    if config.mosaic and config.copies and len(dataset.splits["train"]) < mosaic_ops.NUM_TILES:
        raise ValueError(
            f"--mosaic {config.mosaic:g}: a mosaic takes {mosaic_ops.NUM_TILES} images and the "
            f"training split has {len(dataset.splits['train'])}; drop --mosaic or add images"
        )
    _prepare_output(config, overwrite)
    plan = _shard_plan(dataset, config)
    # Shards of an earlier run over other annotations (another count) are not part of this set.
    names = {records.shard_name(split, index, count) for split, index, count, _ in plan}
    _remove(config.output, _OUTPUT_FILES[:2], keep=names)
    _remove(_progress_path(config), ("*-of-*.tfrecord.json",), keep={n + ".json" for n in names})
    pending = []
    for split, index, count, items in plan:
        if _finished_shard(config, records.shard_name(split, index, count), items) is None:
            pending.append((split, index, count, items))
    manifest_path = fileio.join(config.output, records.MANIFEST)
    if pending and fileio.exists(manifest_path):
        fileio.remove(manifest_path)  # shards are about to change: the set is not complete
    total_images = sum(len(items) for *_, items in plan)
    todo = sum(len(items) for *_, items in pending)
    log(
        f"{total_images} images -> {len(plan)} shards in {config.output} "
        f"({todo} images in {len(pending)} shards to do, {workers} workers)"
    )
    started = time.perf_counter()
    with (
        _Renderer(workers) as renderer,
        counter(todo, what="preprocess", unit="images", progress=progress, log=log) as bar,
    ):
        results = renderer.imap(_tasks(pending, config))
        for split, index, count, items in pending:
            shard_records, shard_rejects, shard_counts = [], [], collections.Counter()
            for _, entry, _ in items:
                image_records, image_rejects, image_counts = next(results)
                shard_records.extend(image_records)
                shard_counts.update(image_counts)
                shard_counts["images_written" if image_records else "images_rejected"] += 1
                for reason, message in image_rejects:
                    shard_rejects.append((entry.source, entry.line, reason, message))
                if strict and image_rejects:
                    raise RejectError(_describe_rejects(STRICT_HEADER, shard_rejects))
                bar.update(1)
            order = np.random.default_rng((config.seed, SPLIT_IDS[split], index, 1))
            shard_records = [shard_records[i] for i in order.permutation(len(shard_records))]
            name = records.shard_name(split, index, count)
            entry = records.write_shard(
                fileio.join(config.output, name),
                (records.serialize_example(r) for r in shard_records),
            )
            entry["images"] = shard_counts["images_written"]
            entry["boxes"] = int(sum(len(r["classes"]) for r in shard_records))
            entry["max_boxes"] = max((len(r["classes"]) for r in shard_records), default=0)
            stats = {
                "entry": entry,
                "counts": dict(shard_counts),
                "rejects": shard_rejects,
                "inputs": _inputs_digest(items),
            }
            fileio.write_json(_progress_path(config, name + ".json"), stats)
    elapsed = time.perf_counter() - started
    if todo:
        log(f"rendered {todo} images in {elapsed:.1f} s ({todo / elapsed:.1f} images/s)")
    return _write_manifest(config, dataset, plan, records)


STRICT_HEADER = "rejected input (--strict):"


def _sources(config):
    return [config.data] if config.data else list(config.annotations)


def _describe_rejects(header, rejects, limit=10):
    lines = [message for *_, message in rejects[:limit]]
    more = f"\n... and {len(rejects) - limit} more" if len(rejects) > limit else ""
    return header + "\n" + "\n".join(lines) + more


def _source_format(config):
    if not config.data:
        return "annotations"
    from yolo3.data import formats  # noqa: PLC0415

    return config.data_format or formats.detect_format(config.data)


def _write_manifest(config, dataset, plan, records):
    splits, counts = {}, collections.Counter(dataset.counts)
    rejects, mosaic_records = list(dataset.rejects), collections.Counter()
    for split, index, count, items in plan:
        stats = _finished_shard(config, records.shard_name(split, index, count), items)
        splits.setdefault(split, []).append(stats["entry"])
        counts.update(stats["counts"])
        mosaic_records[split] += stats["counts"].get("mosaic_records", 0)
        rejects.extend(tuple(r) for r in stats["rejects"])
    reject_counts = collections.Counter(reason for _, _, reason, _ in rejects)
    rejects_path = fileio.join(config.output, records.REJECTS)
    text = "".join(
        f"{source}{f':{line}' if line else ''}\t{reason}\t{message}\n"
        for source, line, reason, message in rejects
    )
    with fileio.open_file(rejects_path + ".tmp", "w") as f:
        f.write(text)  # even when empty: tf.io.gfile creates a file only on its first write
    fileio.rename(rejects_path + ".tmp", rejects_path)
    manifest = records.make_manifest(
        classes=dataset.classes,
        input_size=config.input_size,
        image_format=config.image_format,
        splits=splits,
        copies=config.copies,
        seed=config.seed,
        jpeg_quality=config.quality if config.image_format == "jpeg" else None,
        augmentation=dataclasses.asdict(config.augment),
        **({"mosaic": config.mosaic} if config.mosaic else {}),
        source_annotations=_sources(config),
        source_format=_source_format(config),
        source_images={split: len(entries) for split, entries in dataset.splits.items()},
        counts=dict(sorted(counts.items())),
        rejects=dict(sorted(reject_counts.items())),
        validation={
            "annotations": list(config.val_annotations),
            "fraction": config.val_fraction,
            "per_class": config.val_per_class,
            **dataset.validation,
        },
        min_images_per_class=config.min_images_per_class,
        hygiene=dataset.hygiene,
        max_boxes_per_image=max(
            (shard["max_boxes"] for shards in splits.values() for shard in shards), default=0
        ),
    )
    for split, info in manifest["splits"].items():
        info["images"] = sum(shard["images"] for shard in info["shards"])
        info["boxes"] = sum(shard["boxes"] for shard in info["shards"])
        if split_format(config, split) != config.image_format:
            info["image_format"] = split_format(config, split)
        if config.mosaic and split == "train":  # manifests without mosaics stay as they were
            info["mosaic_records"] = mosaic_records[split]
    fileio.write_json(fileio.join(config.output, records.MANIFEST), manifest)
    return manifest
