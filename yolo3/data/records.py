"""The packed record format written by ``yolo3 preprocess`` and read by :mod:`yolo3.data.pipeline`.

A record set is a folder::

    manifest.json                         written last: its presence means the set is complete
    train-00000-of-00016.tfrecord ...     TFRecord shards of ``tf.train.Example``
    val-00000-of-00002.tfrecord ...
    rejects.txt                           one line per skipped line, box or image

Every record is one training image, already letterboxed (clean copy), augmented or made a
mosaic of four images (augmented copies) to the training size. Features:

==================  ==========  ==========================================================
``image``           bytes       JPEG, PNG, or raw ``(height, width, 3)`` uint8 RGB (``format``)
``format``          bytes       ``b"jpeg"``, ``b"png"`` or ``b"raw"``
``height/width``    int64       the stored image's size in pixels (the training size)
``boxes``           float list  ``4 * M`` values: x_min, y_min, x_max, y_max in stored-image
                                pixels, each inside the image, width and height >= 1
``classes``         int64 list  ``M`` class ids
``source``          bytes       the source image path
``line``            int64       the 1-based line of the source in its annotation file
``copy``            int64       0 for the clean copy, 1..K for augmented copies
``difficult``       int64 list  ``M`` flags, 1 for an object marked difficult; absent when
                                none is (then all 0)
``mosaic``          int64       1 for a mosaic of four images (``source``, ``line``: the
                                top-left one's), else 0; absent when 0, so sets written
                                before the feature read as they are
==================  ==========  ==========================================================

The manifest's ``splits.train.mosaic_records`` counts the mosaic records (absent: none,
:meth:`RecordSet.num_mosaic_records`).
"""

import dataclasses
import hashlib
import json
import re

import numpy as np
import tensorflow as tf

from yolo3 import fileio
from yolo3.data import autotune, shard_check
from yolo3.data.shard_check import BadRecord

MANIFEST = "manifest.json"
REJECTS = "rejects.txt"
FORMAT_NAME = "yolo3-records"
FORMAT_VERSION = 1
IMAGE_FORMATS = ("jpeg", "raw")
# What a split's images may be stored as: the set's format, or PNG (lossless) for a
# validation split of a JPEG set (the manifest's ``splits.<split>.image_format``).
SPLIT_IMAGE_FORMATS = ("jpeg", "raw", "png")
SPLITS = ("train", "val")

_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "format": tf.io.FixedLenFeature([], tf.string),
    "height": tf.io.FixedLenFeature([], tf.int64),
    "width": tf.io.FixedLenFeature([], tf.int64),
    "boxes": tf.io.VarLenFeature(tf.float32),
    "classes": tf.io.VarLenFeature(tf.int64),
    "source": tf.io.FixedLenFeature([], tf.string, default_value=b""),
    "line": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "copy": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "difficult": tf.io.VarLenFeature(tf.int64),
    "mosaic": tf.io.FixedLenFeature([], tf.int64, default_value=0),
}


def shard_name(split, index, count):
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def _bytes(value):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def serialize_example(record):
    """One record as a serialized ``tf.train.Example``.

    Args:
        record: a mapping with ``image`` (bytes), ``format`` (``"jpeg"`` or ``"raw"``),
            ``height``, ``width``, ``boxes`` ((M, 4) float, stored-image pixels),
            ``classes`` ((M,) int), ``source`` (str), ``line`` and ``copy`` (ints), and
            optionally ``difficult`` ((M,) bool; written only when a box is difficult) and
            ``mosaic`` (int, 0 when absent; written only when 1, so records without
            mosaics keep their bytes).
    """
    boxes = np.asarray(record["boxes"], np.float32).reshape(-1)
    feature = {
        "image": _bytes(record["image"]),
        "format": _bytes(record["format"].encode()),
        "height": _ints([record["height"]]),
        "width": _ints([record["width"]]),
        "boxes": tf.train.Feature(float_list=tf.train.FloatList(value=boxes.tolist())),
        "classes": _ints(np.asarray(record["classes"]).reshape(-1)),
        "source": _bytes(str(record["source"]).encode()),
        "line": _ints([record["line"]]),
        "copy": _ints([record["copy"]]),
    }
    difficult = np.asarray(record.get("difficult", ()), bool).reshape(-1)
    if difficult.any():
        feature["difficult"] = _ints(difficult)
    if record.get("mosaic", 0):
        feature["mosaic"] = _ints([record["mosaic"]])
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Protobuf writes map entries (the features) in an order that may change from one
    # process to the next; sorted keys keep shards byte-identical across runs and resumes.
    return example.SerializeToString(deterministic=True)


def read_shard(path):
    """The serialized records of one shard file, in order, read by an iterator that is
    deleted at once when its reader stops (no autotuning thread: :mod:`yolo3.data.autotune`).

    The shard's framing is checked first (:func:`yolo3.data.shard_check.check_shard`,
    :class:`BadRecord` naming the first record that is not soundly framed), so TensorFlow
    never reads a length it cannot allocate; a record whose data checksum does not match
    still raises ``tf.errors.DataLossError`` as it is read (:func:`read_records` names it).
    """
    shard_check.check_shard(path)
    return _tfrecords(path)


def _tfrecords(path, count=None):
    dataset = tf.data.TFRecordDataset(path)
    if count is not None:
        dataset = dataset.take(count)
    return dataset.with_options(autotune.untuned_options())


def read_records(path):
    """Yields ``(index, serialized)`` for each record of the shard at ``path``: its index in
    the shard and its bytes. :class:`BadRecord` names the first record that cannot be read
    (framing or data checksum), after the sound ones before it."""
    index = 0
    try:
        for serialized in read_shard(path):
            yield index, serialized.numpy()
            index += 1
    except tf.errors.DataLossError as err:
        raise BadRecord(path, index, _read_problem(err.message)) from None


def decode_records(path):
    """Yields each record of the shard at ``path`` decoded, as :func:`parse_example_numpy`
    returns it; :class:`BadRecord` names the first record that cannot be read or decoded."""
    for index, serialized in read_records(path):
        try:
            record = parse_example_numpy(serialized)
        except Exception as err:  # noqa: BLE001 - hostile bytes fail in many ways; each is named
            raise BadRecord(path, index, f"cannot be decoded ({_one_line(err)})") from None
        yield record


def _one_line(err):
    """An error's message on one line, without TensorFlow's op decorations."""
    message = getattr(err, "message", None) or str(err)
    message = re.sub(r"\{\{.*?\}\}\s*", "", message).split(" [Op:")[0]
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def parse_example(serialized, image_format):
    """Parses one serialized record in TensorFlow ops (for ``tf.data.Dataset.map``).

    Args:
        serialized: scalar string tensor.
        image_format: ``"jpeg"``, ``"png"`` or ``"raw"``, the split's
            (:meth:`RecordSet.split_format`).

    Returns:
        A dict: ``image`` ``(H, W, 3)`` uint8, ``boxes`` ``(M, 4)`` float32 in image pixels,
        ``classes`` ``(M,)`` int32, ``difficult`` ``(M,)`` bool, ``source`` string, ``copy``
        int64, ``mosaic`` int64 (1 for a mosaic, 0 otherwise and in sets written before it).
    """
    features = tf.io.parse_single_example(serialized, _FEATURES)
    height, width = features["height"], features["width"]
    if image_format == "jpeg":
        image = tf.io.decode_jpeg(features["image"], channels=3)
    elif image_format == "png":
        image = tf.io.decode_png(features["image"], channels=3)
    elif image_format == "raw":
        image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), [height, width, 3])
    else:
        raise ValueError(
            f"unknown image format {image_format!r}; expected one of {SPLIT_IMAGE_FORMATS}"
        )
    classes = tf.cast(tf.sparse.to_dense(features["classes"]), tf.int32)
    difficult = tf.sparse.to_dense(features["difficult"])
    # Absent (no difficult box): padded to one 0 per box.
    difficult = tf.pad(difficult, [[0, tf.size(classes) - tf.size(difficult)]]) > 0
    return {
        "image": image,
        "boxes": tf.reshape(tf.sparse.to_dense(features["boxes"]), [-1, 4]),
        "classes": classes,
        "difficult": difficult,
        "source": features["source"],
        "copy": features["copy"],
        "mosaic": features["mosaic"],
    }


def is_mosaic(serialized):
    """Whether a serialized record is a mosaic, in TensorFlow ops (a ``tf.data`` filter).

    Parses only the ``mosaic`` feature, not the image, so filtering costs little.

    Args:
        serialized: scalar string tensor.

    Returns:
        Scalar bool tensor; False for records written before the feature.
    """
    features = tf.io.parse_single_example(serialized, {"mosaic": _FEATURES["mosaic"]})
    return features["mosaic"] > 0


def parse_example_numpy(serialized):
    """Parses one serialized record eagerly into NumPy (for checks and tools): the keys of
    :func:`parse_example` (``mosaic`` an int, 0 when absent) and ``format``, ``height``,
    ``width`` and ``line``.

    Raises:
        ValueError (or protobuf's DecodeError, TensorFlow's InvalidArgumentError) for bytes
        that are no such record: a feature missing, an image that does not decode, a box
        array that is not 4 values a box, a class id or flag count that is not the box count.
    """
    feature = tf.train.Example.FromString(serialized).features.feature
    image_format = _scalar(feature, "format", "bytes_list").decode()
    height = _scalar(feature, "height", "int64_list")
    width = _scalar(feature, "width", "int64_list")
    data = _scalar(feature, "image", "bytes_list")
    if image_format == "jpeg":
        image = tf.io.decode_jpeg(data, channels=3).numpy()
    elif image_format == "png":
        image = tf.io.decode_png(data, channels=3).numpy()
    elif image_format == "raw":
        if len(data) != height * width * 3:
            raise ValueError(
                f"its raw image has {len(data)} bytes, not {height}x{width}x3 = "
                f"{height * width * 3}"
            )
        image = np.frombuffer(data, np.uint8).reshape(height, width, 3)
    else:
        raise ValueError(f"unknown image format {image_format!r}")
    boxes = np.asarray(feature["boxes"].float_list.value, np.float32)
    classes = np.asarray(feature["classes"].int64_list.value, np.int64)
    if len(boxes) != 4 * len(classes):
        raise ValueError(f"it has {len(boxes)} box values for {len(classes)} class ids")
    return {
        "image": image,
        "format": image_format,
        "height": height,
        "width": width,
        "boxes": boxes.reshape(-1, 4),
        "classes": classes,
        "difficult": _difficult_flags(feature, len(classes)),
        "source": _scalar(feature, "source", "bytes_list", b"").decode(),
        "line": _scalar(feature, "line", "int64_list", 0),
        "copy": _scalar(feature, "copy", "int64_list", 0),
        "mosaic": _scalar(feature, "mosaic", "int64_list", 0),
    }


def _scalar(feature, name, kind, default=None):
    """The one value of feature ``name`` (``kind``: ``"bytes_list"`` or ``"int64_list"``),
    or ``default`` where it is absent (None: a required feature), as
    ``tf.io.parse_single_example`` reads a ``FixedLenFeature([])``."""
    values = getattr(feature[name], kind).value if name in feature else ()
    if len(values) == 1:
        return values[0]
    if not values and default is not None:
        return default
    raise ValueError(f"its {name!r} feature holds {len(values)} values, not one")


def _difficult_flags(feature, count):
    if "difficult" not in feature:
        return np.zeros(count, bool)
    flags = np.asarray(feature["difficult"].int64_list.value, np.int64) > 0
    if len(flags) != count:
        raise ValueError(f"a record has {len(flags)} difficult flags for {count} boxes")
    return flags


def file_sha256(path):
    digest = hashlib.sha256()
    with fileio.open_file(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_shard(path, serialized_records):
    """Writes serialized records as one TFRecord shard, atomically.

    The shard is written under a temporary name and renamed when complete, so a killed
    run never leaves a file under the final name that looks finished.

    Returns:
        The shard's manifest entry: ``{"file", "records", "bytes", "sha256"}``.
    """
    temp = f"{path}.incomplete"
    count = 0
    with tf.io.TFRecordWriter(temp) as writer:
        for serialized in serialized_records:
            writer.write(serialized)
            count += 1
    entry = {
        "file": path.replace("\\", "/").rsplit("/", 1)[-1],
        "records": count,
        "bytes": tf.io.gfile.stat(temp).length,
        "sha256": file_sha256(temp),
    }
    fileio.rename(temp, path)
    return entry


def make_manifest(*, classes, input_size, image_format, splits, **extra):
    """A manifest dict; ``splits`` maps a split name to its list of shard entries."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format {image_format!r} is not one of {IMAGE_FORMATS}")
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "image_format": image_format,
        "input_size": [int(v) for v in input_size],
        "classes": list(classes),
        "splits": {},
    }
    for split, shards in splits.items():
        manifest["splits"][split] = {
            "records": sum(shard["records"] for shard in shards),
            "shards": list(shards),
        }
    manifest.update(extra)
    return manifest


def read_manifest(records_dir):
    """The manifest of a complete record set, checked for format and version.

    Raises:
        FileNotFoundError when ``records_dir`` has no manifest (not a record set, or an
        interrupted preprocessing run: run the same preprocess command again to finish it).
        ValueError when the manifest is not a yolo3 record set of a readable version.
    """
    path = fileio.join(records_dir, MANIFEST)
    if not fileio.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist: {records_dir} is not a complete record set. Create one "
            "with yolo3 preprocess, or rerun the same command to finish an interrupted run."
        )
    with fileio.open_file(path, "r") as f:
        try:
            manifest = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from err
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a {FORMAT_NAME} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {manifest.get('version')}; this library reads "
            f"version {FORMAT_VERSION}. Preprocess the data again with this version."
        )
    return manifest


@dataclasses.dataclass(frozen=True)
class RecordSet:
    """A complete record set and its manifest, read once.

    A job opens each record set once (:func:`open_record_set`) and hands this value to the
    parts that read it (datasets, validation, mAP), which then do not read the manifest
    again. Anything that takes a record set accepts this value or its folder.
    """

    directory: str
    manifest: dict

    def __str__(self):
        return str(self.directory)

    @property
    def classes(self):
        return list(self.manifest["classes"])

    @property
    def input_hw(self):
        return tuple(int(v) for v in self.manifest["input_size"])

    @property
    def image_format(self):
        return self.manifest["image_format"]

    def split_format(self, split):
        """How ``split``'s images are stored: its own format (a lossless validation split
        of a JPEG set: ``"png"``), else the set's."""
        return self.manifest["splits"][split].get("image_format", self.image_format)

    @property
    def max_boxes_per_image(self):
        return self.manifest.get("max_boxes_per_image")

    def has_split(self, split):
        return split in self.manifest["splits"]

    def shard_paths(self, split):
        """Full paths of the shards of ``split``, in order; an error names a missing split."""
        return shard_paths(self.directory, self.manifest, split)

    def shard_records(self, split):
        """Records in each shard of ``split``, in the order of :meth:`shard_paths`."""
        self.shard_paths(split)  # raises for a missing split
        return [int(shard["records"]) for shard in self.manifest["splits"][split]["shards"]]

    def num_records(self, split):
        self.shard_paths(split)  # raises for a missing split
        return int(self.manifest["splits"][split]["records"])

    def num_mosaic_records(self, split):
        """How many of ``split``'s records are mosaics; 0 in sets written without them."""
        self.shard_paths(split)  # raises for a missing split
        return int(self.manifest["splits"][split].get("mosaic_records", 0))


def open_record_set(source):
    """``source`` as a :class:`RecordSet`: one is returned as is, a folder's manifest is read."""
    if isinstance(source, RecordSet):
        return source
    return RecordSet(source, read_manifest(source))


def is_record_set(source):
    """True for a :class:`RecordSet` or a folder holding a manifest (not an annotation file)."""
    return isinstance(source, RecordSet) or fileio.exists(fileio.join(source, MANIFEST))


def shard_paths(records_dir, manifest, split):
    """Full paths of the shards of ``split`` listed in ``manifest``, in order."""
    if split not in manifest["splits"]:
        available = ", ".join(sorted(manifest["splits"])) or "none"
        raise ValueError(
            f"record set {records_dir} has no {split!r} split (it has: {available}); "
            "preprocess with a validation split (--val-fraction) or pass --val-records"
        )
    return [
        fileio.join(records_dir, shard["file"]) for shard in manifest["splits"][split]["shards"]
    ]


def verify(records_dir, *, check_checksums=True):
    """Checks a record set against its manifest and every record against the format.

    Counts records per shard against the manifest, compares checksums, decodes every
    image, and checks that each image has the manifest's size and that every box lies
    inside it with width and height >= 1 and a class id in range.

    Returns:
        ``(problems, counts)``: a list of human-readable problems (empty when the set is
        sound) and a dict with the ``records``, ``boxes`` and ``shards`` checked.
    """
    manifest = read_manifest(records_dir)
    height, width = manifest["input_size"]
    num_classes = len(manifest["classes"])
    problems = []
    counts = {"shards": 0, "records": 0, "boxes": 0}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            path = fileio.join(records_dir, shard["file"])
            if not fileio.exists(path):
                problems.append(f"{path}: listed in the manifest but missing")
                continue
            counts["shards"] += 1
            if check_checksums and file_sha256(path) != shard["sha256"]:
                problems.append(f"{path}: sha256 differs from the manifest (file changed)")
            # Only the soundly framed records are read: TensorFlow would try to allocate
            # whatever length the next header claims.
            framed, framing_problem = shard_check.scan_shard(path)
            found = 0
            try:
                for index, serialized in enumerate(_tfrecords(path, framed)):
                    found += 1
                    where = f"{path} record {index}"
                    problems.extend(
                        _check_record(serialized.numpy(), where, height, width, num_classes)
                    )
                    counts["boxes"] += _count_boxes(serialized.numpy())
            except tf.errors.DataLossError as err:
                problems.append(f"{path} record {found}: {_read_problem(err.message)}")
            else:
                if framing_problem is not None:
                    problems.append(f"{path} record {found}: {framing_problem}")
            counts["records"] += found
            if found != shard["records"]:
                problems.append(
                    f"{path}: {found} records; the manifest says {shard['records']} ({split})"
                )
    return problems, counts


MISSING = "missing, though the manifest lists it"


def changed_shards(record_set):
    """``(shard path, problem)`` for each shard of ``record_set`` that is missing or whose
    size is not the manifest's, in manifest order: the cheap check (one ``stat`` a shard)
    that finds a shard cut short, even at a record's end where it still reads."""
    record_set = open_record_set(record_set)
    changed = []
    for split in record_set.manifest["splits"]:
        entries = record_set.manifest["splits"][split]["shards"]
        for entry, path in zip(entries, record_set.shard_paths(split)):
            if not fileio.exists(path):
                changed.append((path, MISSING))
                continue
            size = tf.io.gfile.stat(path).length
            if size != entry["bytes"]:
                changed.append((path, f"{size} bytes where the manifest says {entry['bytes']}"))
    return changed


def find_damage(record_set):
    """The first record of ``record_set`` that cannot be read, for a run that stopped on a
    read error: ``(shard path, record index, problem)``, or None when every shard reads.

    Shards whose size differs from the manifest (:func:`changed_shards`) are read first, so
    a truncated shard is found without reading the others; a shard of the wrong size that
    still reads to its end is reported with index None, a missing one before anything is
    read. :func:`verify` checks more (whole-file checksums, every record's contents), and
    takes longer.
    """
    record_set = open_record_set(record_set)
    changed = changed_shards(record_set)
    for path, problem in changed:
        if problem == MISSING:
            return path, None, problem
    resized = [path for path, _ in changed]
    every = [
        path for split in record_set.manifest["splits"] for path in record_set.shard_paths(split)
    ]
    for path in resized + [path for path in every if path not in resized]:
        try:
            for _ in read_records(path):
                pass
        except BadRecord as err:
            return path, err.index, err.problem
    if changed:
        path, problem = changed[0]
        return path, None, problem
    return None


def check_framing(record_set, splits=None):
    """Checks the framing of every shard of ``splits`` (default: all) of ``record_set`` with
    :func:`yolo3.data.shard_check.check_shard`, reading only the record headers (20 ms for
    the demo's 4,300 records in 18 shards); :class:`BadRecord` names the first record
    TensorFlow must not read."""
    record_set = open_record_set(record_set)
    for split in record_set.manifest["splits"] if splits is None else splits:
        for path in record_set.shard_paths(split):
            shard_check.check_shard(path)


def find_undecodable(record_set, splits=None):
    """The first record of ``splits`` (default: all) of ``record_set`` that the training
    pipeline cannot decode: ``(shard path, record index, problem)``, or None.

    For a run whose input pipeline stopped on a decoding error, which names no record: this
    decodes every record in Python, as :func:`parse_example` would in TensorFlow (the
    split's image format, the set's image size, a class id per box), until one fails.
    """
    record_set = open_record_set(record_set)
    for split in record_set.manifest["splits"] if splits is None else splits:
        image_format = record_set.split_format(split)
        for path in record_set.shard_paths(split):
            try:
                for index, record in enumerate(decode_records(path)):
                    problem = _pipeline_problem(record, image_format, record_set.input_hw)
                    if problem is not None:
                        return path, index, f"cannot be decoded ({problem})"
            except BadRecord as err:
                return path, err.index, err.problem
    return None


def _pipeline_problem(record, image_format, input_hw):
    """Why :func:`parse_example` fails on a record that decodes in NumPy, or None."""
    if record["format"] != image_format:
        return f"its image is {record['format']} in a split of {image_format} images"
    if record["image"].shape[:2] != tuple(input_hw):
        return f"its image is {record['image'].shape[:2]}, the set's {tuple(input_hw)}"
    return None


def _read_problem(message):
    """What a TFRecord reader's DataLossError says, in words (its text names no file)."""
    if "truncated record" in message:
        return shard_check.CUT_SHORT
    if "corrupted record" in message:
        return shard_check.CORRUPT
    return re.sub(r"^\{\{.*?\}\} ", "", message).split(" [Op:")[0].strip()


def _count_boxes(serialized):
    try:
        example = tf.train.Example.FromString(serialized)
    except Exception:  # noqa: BLE001 - undecodable: _check_record reports it
        return 0
    return len(example.features.feature["classes"].int64_list.value)


def _check_record(serialized, where, height, width, num_classes):
    try:
        record = parse_example_numpy(serialized)
    except Exception as err:  # noqa: BLE001 - any decode failure is a finding, not a crash
        return [f"{where}: cannot be decoded ({_one_line(err)})"]
    problems = []
    if record["image"].shape != (height, width, 3):
        problems.append(
            f"{where}: image is {record['image'].shape}, expected ({height}, {width}, 3)"
        )
    boxes, classes = record["boxes"], record["classes"]
    for box, class_id in zip(boxes, classes):
        x0, y0, x1, y1 = (float(v) for v in box)
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height or x1 - x0 < 1 or y1 - y0 < 1:
            problems.append(
                f"{where}: box {x0:g},{y0:g},{x1:g},{y1:g} is outside the "
                f"{width}x{height} image or under 1 px"
            )
        if not 0 <= class_id < num_classes:
            problems.append(f"{where}: class id {class_id} outside [0, {num_classes})")
    return problems


def iterate_records(record_set, split="val"):
    """Yields ``(image, truth)`` from a record set (or its folder): uint8 arrays and boxes in
    their frame, as evaluation and calibration read them; :class:`BadRecord` names a record
    that is not sound."""
    for path in open_record_set(record_set).shard_paths(split):
        for record in decode_records(path):  # BadRecord names one that is not sound
            image = record["image"]
            yield (
                image,
                {
                    "boxes": record["boxes"],
                    "classes": record["classes"],
                    "difficult": record["difficult"],
                    "image_hw": image.shape[:2],
                },
            )
