"""Hostile dataset files: what a user's annotation files, data.yaml and images may hold,
through the commands that read them (``yolo3 preprocess``, ``yolo3 kmeans``, in-process).

One test per reported input (issue 58): a class id of 10**30, a decompression bomb, lines of
megabytes and images of thousands of boxes, a YAML alias bomb, and a list-file line that
leads out of the dataset. Each ends as a counted reject where the tool keeps going, or as one
``error:`` line naming the file and exit status 2, in bounded time and memory.

Then property-based fuzzing (Hypothesis) of the annotation-line parser and the four dataset
readers: whatever the generated file holds, it is read, or refused with one ValueError line
naming the file; never another exception. Inputs are tiny and the examples few, so each
takes a few seconds.
"""

import json
import shutil
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import load_tool
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from yolo3.data import formats, limits
from yolo3.data.annotations import parse_annotations
from yolo3.data.formats import yolo_labels

preprocess_tool = load_tool("preprocess")
kmeans_tool = load_tool("kmeans")

NAMES = "names: [bolt, nut]\n"
# Few examples, no database: the fuzz tests are a bounded check in every run, not a search.
FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _png(path, width, height, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return path


def _two_images(root):
    """``root/images/train/{a,b}.png`` with YOLO labels: a 64 x 48 with 2 boxes, b 48 x 64
    with 1."""
    _png(root / "images" / "train" / "a.png", 64, 48, 1)
    _png(root / "images" / "train" / "b.png", 48, 64, 2)
    _write(root / "labels" / "train" / "a.txt", "0 0.5 0.5 0.5 0.5\n1 0.3 0.3 0.2 0.4\n")
    _write(root / "labels" / "train" / "b.txt", "1 0.5 0.5 0.25 0.5\n")
    return root


def _preprocess(tmp_path, source, name="records"):
    """Runs ``yolo3 preprocess`` on ``source`` (flags); returns the manifest and rejects.txt."""
    output = tmp_path / name
    argv = [*source, "--output", str(output), "--input-size", "32", "--copies", "0"]
    argv += ["--val-fraction", "0"]  # every image in training, where the counts look
    assert preprocess_tool.main([*argv, "--workers", "1", "--progress", "off"]) == 0
    manifest = json.loads((output / "manifest.json").read_text())
    return manifest, (output / "rejects.txt").read_text().splitlines()


def _kmeans(*flags):
    return kmeans_tool.main([*flags, "-k", "2", "--restarts", "1", "--threads", "1"])


def test_a_class_id_of_10_to_the_30_is_a_counted_reject_in_kmeans_as_in_preprocess(
    tmp_path, capsys
):
    _png(tmp_path / "a.png", 64, 48)
    _png(tmp_path / "b.png", 48, 64)
    annotations = _write(
        tmp_path / "train.txt",
        "a.png 1,1,9,9,0 2,2,30,12,1\n"
        "b.png 3,3,30,20,1 1,1,5,9,0\n"
        f"b.png 1,1,9,9,{10**30}\n"  # its only box: the line goes
        "a.png -1e300,0,1e300,5,0 4,4,20,40,1\n",  # a coordinate bound as well
    )
    assert _kmeans("--annotations", str(annotations)) == 0
    out = capsys.readouterr().out
    assert out.startswith("5 boxes from 3 images")
    assert "skipped class_out_of_range: 1" in out
    assert "skipped coordinates_out_of_range: 1" in out
    assert "skipped all_boxes_rejected: 1" in out
    assert (
        f"{annotations}:3: box 1,1,9,9,{10**30} has class id {10**30}, but class ids lie in "
        "0..65535; the box is skipped"
    ) in out
    # One parser for both tools: preprocess, with a classes file, rejects the same boxes.
    _, kmeans_rejects, _ = parse_annotations(annotations, num_classes=None)
    _, preprocess_rejects, _ = parse_annotations(annotations, num_classes=2)
    reasons = [(r.line, r.reason) for r in kmeans_rejects]
    assert reasons == [(r.line, r.reason) for r in preprocess_rejects]
    assert reasons == [
        (3, "class_out_of_range"),
        (3, "all_boxes_rejected"),
        (4, "coordinates_out_of_range"),
    ]


def _bomb_png(path, side=30000):
    """A PNG of ``side`` x ``side`` black pixels in about 100 KB: one bit a pixel, all zero,
    deflated (Pillow would hold it as 900 MB)."""
    row = b"\0" * (1 + (side + 7) // 8)  # filter byte, then the row's bits
    deflate = zlib.compressobj(9)
    data = b"".join(deflate.compress(row * 1000) for _ in range(side // 1000)) + deflate.flush()

    def chunk(kind, body):
        crc = zlib.crc32(kind + body)
        return len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big")

    header = side.to_bytes(4, "big") * 2 + bytes([1, 0, 0, 0, 0])  # 1 bit gray
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )
    return path


def test_a_decompression_bomb_is_a_counted_unreadable_image_in_every_reader(tmp_path, capsys):
    root = _two_images(tmp_path / "ds")
    bomb = _bomb_png(root / "images" / "train" / "bomb.png")
    assert bomb.stat().st_size < 200_000
    _write(root / "labels" / "train" / "bomb.txt", "0 0.5 0.5 0.1 0.1\n")
    data = _write(root / "data.yaml", "train: images/train\n" + NAMES)
    annotations = _write(
        root / "train.txt",
        "images/train/a.png 1,1,30,20,0 5,5,20,40,1\n"
        "images/train/b.png 2,2,20,30,1\n"
        "images/train/bomb.png 1,1,100,100,0\n",
    )
    said = f"cannot read image {bomb}: Image size (900000000 pixels) exceeds limit"

    assert _kmeans("--annotations", str(annotations)) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 boxes from 3 images")
    assert "skipped 1 images that could not be read" in out and said in out
    assert _kmeans("--data", str(data)) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 boxes from 2 images")
    assert "skipped unreadable_image: 1" in out and said in out

    for form in (["--data", str(data)], ["--annotations", str(annotations), "--classes"]):
        if form[0] == "--annotations":
            form.append(str(_write(root / "classes.txt", "bolt\nnut\n")))
        manifest, rejects = _preprocess(tmp_path, form, name=form[0][2:])
        assert manifest["rejects"] == {"unreadable_image": 1}
        assert manifest["splits"]["train"]["images"] == 2
        (line,) = rejects
        assert "\tunreadable_image\t" in line and str(bomb) in line
        assert "900000000 pixels" in line


def test_long_lines_and_crowded_images_are_cut_counted_and_listed(tmp_path, capsys):
    root = _two_images(tmp_path / "ds")
    too_long = " 1,1,30,20,0" * (limits.MAX_LINE_BYTES // 12 + 1)  # 2 MiB and a bit
    crowd = " 2,2,20,30,1" * (limits.MAX_BOXES_PER_IMAGE + 1)  # 120 KB
    annotations = _write(
        root / "train.txt",
        "images/train/a.png 1,1,30,20,0\n"
        f"images/train/a.png{too_long}\n"
        f"images/train/b.png{crowd}\n"
        "images/train/b.png 2,2,20,30,1\n",
    )
    classes = _write(root / "classes.txt", "bolt\nnut\n")
    manifest, rejects = _preprocess(
        tmp_path, ["--annotations", str(annotations), "--classes", str(classes)], "lines"
    )
    assert manifest["rejects"] == {"line_too_long": 1, "too_many_boxes": 1}
    assert manifest["counts"]["rejected_lines"] == 2 and manifest["counts"]["boxes"] == 2
    assert rejects == [
        f"{annotations}:2\tline_too_long\t{annotations}:2: the line is {18 + len(too_long)} "
        f"bytes, over the limit of {limits.MAX_LINE_BYTES}; it is skipped",
        f"{annotations}:3\ttoo_many_boxes\t{annotations}:3: 10001 boxes on images/train/b.png; "
        "an image may have at most 10000, so it is skipped",
    ]
    capsys.readouterr()
    assert _kmeans("--annotations", str(annotations)) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 boxes from 2 images")
    assert "skipped line_too_long: 1" in out and "skipped too_many_boxes: 1" in out

    # The data.yaml form: a label line too long, a label file of too many boxes, and a list
    # file line longer than any path.
    labels = root / "labels" / "train"
    with open(labels / "a.txt", "a") as f:  # after a's two boxes
        f.write("0" + " 0.5" * (limits.MAX_LINE_BYTES // 4))
    _write(labels / "b.txt", "1 0.5 0.5 0.25 0.5\n" * (limits.MAX_BOXES_PER_IMAGE + 1))
    _png(root / "images" / "val" / "c.png", 32, 32)
    _write(root / "val.txt", "images/val/c.png\n" + "x" * (limits.MAX_PATH_BYTES + 1) + "\n")
    data = _write(root / "data.yaml", "train: images/train\nval: val.txt\n" + NAMES)
    assert _kmeans("--data", str(data)) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 boxes from 1 images")
    assert "skipped line_too_long: 2" in out and "skipped too_many_boxes: 1" in out
    assert f"{labels / 'b.txt'}: more than 10000 boxes on {root / 'images/train/b.png'}" in out
    manifest, rejects = _preprocess(tmp_path, ["--data", str(data)], "data")
    assert manifest["rejects"] == {"line_too_long": 2, "too_many_boxes": 1}
    assert len(rejects) == 3 and max(len(line) for line in rejects) < 400

    # Read as a stream: a line of 50 MB costs a chunk of memory, not the line.
    huge = _write(tmp_path / "huge.txt", b"a.png 1,1,9,9,0\na.png" + b" 1,1,9,9,0" * 5_000_000)
    tracemalloc.start()
    try:
        entries, line_rejects, _ = parse_annotations(huge, num_classes=2)
        objects, label_rejects, _ = yolo_labels.read_labels(huge, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(entries) == 1 and [r.reason for r in line_rejects] == ["line_too_long"]
    assert [r.reason for r in label_rejects] == ["malformed_label", "line_too_long"]
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB to read a file of a 50 MB line"


def _alias_bomb(path, levels=9):
    """A data.yaml whose names expand to 9**levels strings ("billion laughs")."""
    lines = [
        "train: images/train",
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
    ]
    names = "abcdefghijklmnop"
    for previous, name in zip(names[: levels - 1], names[1:levels]):
        lines.append(f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]")
    lines.append(f"names: *{names[levels - 1]}")
    return _write(path, "\n".join(lines) + "\n")


def test_a_yaml_alias_bomb_is_refused_in_one_line_at_once(tmp_path, capsys):
    root = _two_images(tmp_path / "ds")
    data = _alias_bomb(root / "data.yaml")
    expected = (
        f"error: {data}:3: the alias *a; aliases are refused in a dataset file (nested ones "
        "expand exponentially): write the value out"
    )
    for tool, argv in (
        (preprocess_tool, ["--data", str(data), "--output", str(tmp_path / "out")]),
        (kmeans_tool, ["--data", str(data)]),
    ):
        started = time.perf_counter()
        assert tool.main(argv) == 2
        assert time.perf_counter() - started < 2.0
        assert capsys.readouterr().err.splitlines() == [expected]
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="alias"):
            formats.read_dataset(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB to refuse the alias bomb"


def test_a_list_line_out_of_the_dataset_resolves_only_to_itself(tmp_path, capsys, monkeypatch):
    # Beside the dataset: an image with its label file, and a label file of nothing.
    outside = tmp_path / "outside"
    _png(outside / "images" / "x.png", 40, 40, 3)
    _write(outside / "labels" / "x.txt", "0 0.5 0.5 0.5 0.5\n")
    _write(outside / "labels" / "stray.txt", "1 0.5 0.5 0.5 0.5\n")
    root = _two_images(tmp_path / "ds")
    _write(root / "labels" / "train" / "orphan.txt", "1 0.5 0.5 0.5 0.5\n")  # inside: listed
    _write(root / "train.txt", "images/train/a.png\nimages/train/b.png\n../outside/images/x.png\n")
    data = _write(root / "data.yaml", "train: train.txt\n" + NAMES)

    assert _kmeans("--data", str(data)) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 boxes from 3 images")  # x.png is read, with its own labels
    assert "skipped label_without_image: 1" in out and "orphan.txt" in out
    assert "stray.txt" not in out
    dataset = formats.read_dataset(data)
    assert [(Path(r.source).name, r.reason) for r in dataset.rejects] == [
        ("orphan.txt", "label_without_image")
    ]

    # Darknet's layout: the .data file in data/, images and labels side by side in data/obj/.
    darknet = tmp_path / "darknet"
    obj = _write(darknet / "data" / "obj" / "orphan.txt", "1 0.5 0.5 0.5 0.5\n").parent
    for name in ("a", "b"):
        shutil.copy(root / "images" / "train" / f"{name}.png", obj)
        shutil.copy(root / "labels" / "train" / f"{name}.txt", obj)
    shutil.copy(outside / "images" / "x.png", outside / "labels")  # beside x.txt and stray.txt
    _write(darknet / "data" / "obj.names", "bolt\nnut\n")
    listed = "data/obj/a.png\ndata/obj/b.png\n../outside/labels/x.png\n"
    _write(darknet / "data" / "train.txt", listed)
    settings_text = "classes = 2\ntrain = data/train.txt\nnames = data/obj.names\n"
    _write(darknet / "data" / "obj.data", settings_text)
    monkeypatch.chdir(darknet)  # Darknet's paths start at its root
    dataset = formats.read_dataset("data/obj.data")
    assert len(dataset.splits["train"]) == 3 and dataset.counts["boxes"] == 4
    assert [(Path(r.source).name, r.reason) for r in dataset.rejects] == [
        ("orphan.txt", "label_without_image")
    ]


# Fuzzing. Each test writes the generated files over the same names in one folder of the
# module and reads them with the reader the commands use. The strategies are mostly well
# formed with hostile parts, so that most examples get past the first check to the boxes.


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    """Two images in each layout the fuzz tests write their files into."""
    root = tmp_path_factory.mktemp("fuzz")
    for name, (width, height) in (("a", (64, 48)), ("b", (48, 64))):
        for folder in ("yolo/images/train", "darknet/data/obj", "coco"):
            _png(root / folder / f"{name}.png", width, height)
    (root / "voc" / "VOCdevkit" / "VOC2007" / "Annotations").mkdir(parents=True)
    return root


def _refused(error, *paths):
    """``error`` is one line naming one of ``paths``."""
    event("refused")
    _assert_one_line_naming(error, *paths)


def _assert_one_line_naming(error, *paths):
    message = str(error)
    assert "\n" not in message, message
    assert any(str(path) in message for path in paths), message


def _assert_sound(dataset, num_classes, *paths):
    """What a reader returns keeps the bounds: finite, ordered boxes within the coordinate
    bound, class ids in range, every reject naming one of ``paths``."""
    event("read, with boxes" if dataset.counts["boxes"] else "read, no boxes")
    for entries in dataset.splits.values():
        for entry in entries:
            assert np.all(np.isfinite(entry.boxes)), entry
            assert np.all(np.abs(entry.boxes) <= limits.MAX_COORDINATE), entry
            assert np.all(entry.boxes[:, 2:] > entry.boxes[:, :2]), entry
            assert np.all((entry.classes >= 0) & (entry.classes < num_classes)), entry
    for reject in dataset.rejects:
        _assert_one_line_naming(reject.message, *paths)


def _mostly(usual, other):
    """``usual`` three times in four, ``other`` the rest."""
    return st.integers(0, 3).flatmap(lambda draw: other if draw == 3 else usual)


def _text_file(lines, max_lines=5):
    """Files of up to ``max_lines`` of ``lines``, or now and then any short text."""
    text = st.lists(lines, max_size=max_lines).map("\n".join)
    return _mostly(text, st.text(max_size=12))


# Numbers of every kind a hostile file may hold, most of them usable.
_NUMBERS = ["0", "1", "2", "10", "20", "30", "-4", "3.5", "1e30", str(10**30), "1e999", "nan"]
_NUMBERS += ["-inf", "٣", "1_0", "x", ""]
_CORNERS = st.tuples(st.integers(-5, 20), st.integers(-5, 20), st.integers(21, 70))
_BOX = _mostly(
    st.tuples(_CORNERS, st.integers(21, 70), st.integers(0, 3)).map(
        lambda box: f"{box[0][0]},{box[0][1]},{box[0][2]},{box[1]},{box[2]}"
    ),
    st.lists(st.sampled_from(_NUMBERS), min_size=3, max_size=7).map(",".join),
)
_ANNOTATION_LINE = st.tuples(
    _mostly(
        st.sampled_from(["a.png", "images/b c.jpg"]),
        st.sampled_from(["#", "", "1,2,3,4,0", "\x00.png", "a.jpg,x", "/" * 5000]),
    ),
    st.lists(_BOX | st.sampled_from(["\t", "\r", "\ufeff", "/", "1,2,30,40,1,1"]), max_size=4),
).map(lambda line: " ".join([line[0], *line[1]]))


@FUZZ
@given(
    data=_text_file(_ANNOTATION_LINE).map(str.encode) | st.binary(max_size=48),
    num_classes=st.sampled_from([None, 3]),
)
def test_fuzz_the_annotation_line_parser(fuzz_root, data, num_classes):
    path = _write(fuzz_root / "lines" / "train.txt", data)
    try:
        entries, rejects, counts = parse_annotations(path, num_classes=num_classes)
    except ValueError as err:  # not UTF-8: the file and line
        assert str(err).startswith(f"{path}:")
        _refused(err, path)
        return
    event("read, with boxes" if counts["boxes"] else "read, no boxes")
    upper = num_classes or limits.MAX_CLASSES
    for entry in entries:
        assert np.all(np.isfinite(entry.boxes)) and entry.boxes.dtype == np.float64
        assert np.all(np.abs(entry.boxes) <= limits.MAX_COORDINATE)
        assert np.all(entry.boxes[:, 2:] > entry.boxes[:, :2])
        assert np.all((entry.classes >= 0) & (entry.classes < upper))
        assert 1 <= entry.line <= counts["lines"]
    for reject in rejects:
        assert reject.message.startswith(f"{path}:{reject.line}: ")
        _assert_one_line_naming(reject.message, path)
    assert counts["images"] == len(entries)


_UNIT = _mostly(
    st.sampled_from(["0.5", "0.25", "0.1", "0.3"]),
    st.sampled_from(["0", "1", "2", "1.5", "-0.2", "1e30", "nan", "inf", "x"]),
)
_LABEL_LINE = st.tuples(
    _mostly(st.sampled_from(["0", "1"]), st.sampled_from(["2", "-1", "1e30", str(10**30), "x"])),
    _mostly(st.lists(_UNIT, min_size=4, max_size=4), st.lists(_UNIT, max_size=8)),
).map(lambda line: " ".join([line[0], *line[1]]))
_LABELS = _text_file(_LABEL_LINE | st.sampled_from(["", "\r", "\x0c", "\x00"]))
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# The yaml names the dataset's folders and they are read as it names them, so these stay
# inside the fuzz folder: a yaml naming "/" would be searched whole (see ultralytics.py).
_SPLITS = st.sampled_from(
    ["images/train", "train.txt", ["images/train", "train.txt"], "missing", 7, None, [], [3]]
)
_YAML = st.fixed_dictionaries(
    {
        "train": _SPLITS,
        "names": st.sampled_from([["bolt", "nut"], {0: "bolt", 1: "nut"}, {0: "a", 2: "b"}])
        | _VALUES
        | st.dictionaries(st.integers(-2, 3) | st.floats(), _SCALARS, max_size=3),
    },
    optional={"val": _SPLITS, "nc": _SCALARS, "path": st.sampled_from([".", "", "missing", None])},
)
_HOSTILE_YAML = [
    "names: {.inf: a}\ntrain: x\n",
    "train: &t x\nval: *t\n" + NAMES,
    "train: images/train\nnames: [" * 40 + "]" * 40 + "\n",
    "train: images/train\nnames: 2021-02-30\n",
    "train: images/train\nnames: [!!binary YWJj, !!python/name:os.system]\n",
]
_DESCRIPTION = _mostly(
    st.just("train: images/train\nval: train.txt\n" + NAMES),
    st.sampled_from(_HOSTILE_YAML)
    | _YAML.map(lambda data: __import__("yaml").safe_dump(data))
    | st.text(alphabet="abnt01:-[]{}&*!|>'\"#\n ,?%@`\t~", max_size=60),
)
_LISTED = ["images/train/a.png", "images/train/b.png", "../a.png", "/x.png", "#", "x", "\x00"]


@FUZZ
@given(
    description=_DESCRIPTION,
    labels=_LABELS.map(str.encode) | st.binary(max_size=24),
    listed=_text_file(st.sampled_from(_LISTED), max_lines=3),
)
def test_fuzz_the_ultralytics_reader(fuzz_root, description, labels, listed):
    root = fuzz_root / "yolo"
    paths = [
        _write(root / "data.yaml", description),
        _write(root / "labels" / "train" / "a.txt", labels),
        _write(root / "train.txt", listed),
    ]
    try:
        dataset = formats.read_dataset(paths[0])
    except ValueError as err:
        _refused(err, *paths)
        return
    _assert_sound(dataset, len(dataset.classes), *paths)


_SETTINGS = [
    "classes = 2",
    "classes = x",
    "train = data/train.txt",
    "valid = data/train.txt",
    "names = data/obj.names",
    "names = missing.names",
    "train = data/obj",
    "backup = backup/",
    "# c",
    "=",
    "\r",
    "x",
]


@FUZZ
@given(
    settings_lines=_mostly(
        st.just(["train = data/train.txt", "names = data/obj.names", "classes = 2"]),
        st.lists(st.sampled_from(_SETTINGS), max_size=5),
    ),
    names=_mostly(st.just("bolt\nnut\n"), _text_file(st.sampled_from(["bolt", "nut", " "]), 3)),
    listed=_mostly(
        st.just("data/obj/a.png\ndata/obj/b.png\n"),
        _text_file(st.sampled_from([*_LISTED, "data/obj/a.png", "data/obj/b.png"]), 3),
    ),
    labels=_LABELS,
)
def test_fuzz_the_darknet_reader(fuzz_root, settings_lines, names, listed, labels):
    root = fuzz_root / "darknet" / "data"
    paths = [
        _write(root / "obj.data", "\n".join(settings_lines)),
        _write(root / "obj.names", names),
        _write(root / "train.txt", listed),
        _write(root / "obj" / "a.txt", labels),
    ]
    try:
        dataset = formats.read_dataset(paths[0])
    except ValueError as err:
        _refused(err, *paths, root)
        return
    _assert_sound(dataset, len(dataset.classes), *paths)


_NUMBER = st.integers(-5, 100) | st.floats() | st.sampled_from([10**30, 10**400, True])
_IMAGE = st.fixed_dictionaries(
    {"id": st.integers(0, 1), "file_name": _mostly(st.just("a.png"), st.just("../a.png"))}
)
_CATEGORY = st.fixed_dictionaries(
    {"id": st.integers(0, 1), "name": st.sampled_from(["bolt", "nut"])},
    optional={"supercategory": st.just("parts")},
)
_ANNOTATION = st.fixed_dictionaries(
    {
        "id": st.integers(0, 9),
        "image_id": _mostly(st.integers(0, 1), _VALUES),
        "category_id": _mostly(st.integers(0, 1), _VALUES),
        "bbox": _mostly(
            st.lists(st.integers(0, 30), min_size=4, max_size=4),
            st.lists(_NUMBER, min_size=4, max_size=4) | _VALUES,
        ),
    },
    optional={"iscrowd": st.sampled_from([0, 1]) | _VALUES},
)
_COCO = st.fixed_dictionaries(
    {
        "images": _mostly(st.lists(_IMAGE, min_size=1, max_size=3), st.lists(_VALUES, max_size=2)),
        "annotations": st.lists(_mostly(_ANNOTATION, _VALUES), min_size=1, max_size=4),
        "categories": _mostly(
            st.lists(_CATEGORY, min_size=1, max_size=3),
            st.lists(_VALUES | _CATEGORY.map(lambda c: {**c, "id": str(c["id"])}), max_size=2),
        ),
    }
)


@FUZZ
@given(
    document=_mostly(
        _COCO.map(json.dumps),
        _VALUES.map(json.dumps)
        | st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth)
        | st.just('{"images": [], "annotations": [], "categories": [], "x": 1' + "0" * 5000 + "}")
        | st.binary(max_size=24),
    )
)
def test_fuzz_the_coco_reader(fuzz_root, document):
    path = _write(fuzz_root / "coco" / "instances.json", document)
    try:
        dataset = formats.read_dataset(path)
    except ValueError as err:
        _refused(err, path)
        return
    _assert_sound(dataset, len(dataset.classes), path)


_EDGE = st.sampled_from(["0", "10", "20", "30", "20.5", "-3", "1e30", "1e400", "nan", "", "x"])
_OBJECT = st.tuples(
    st.sampled_from(["bolt", "nut", "", "other", "\x01"]),
    st.sampled_from(["0", "1", "x"]),
    _mostly(
        _CORNERS.map(lambda corners: [str(corners[0]), str(corners[1]), str(corners[2]), "60"]),
        st.lists(_EDGE, min_size=4, max_size=4) | st.none(),
    ),
)


def _voc_xml(objects):
    from xml.sax.saxutils import escape  # noqa: PLC0415

    parts = []
    for name, difficult, edges in objects:
        box = ""
        if edges is not None:
            tags = ("xmin", "ymin", "xmax", "ymax")
            box = "<bndbox>" + "".join(f"<{t}>{escape(v)}</{t}>" for t, v in zip(tags, edges))
            box += "</bndbox>"
        parts.append(f"<object><name>{name}</name><difficult>{difficult}</difficult>{box}</object>")
    return f"<annotation>{''.join(parts)}</annotation>"


# Entities nested 8 deep, 10 to a level: 10**8 "lol"s if expanded.
_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY l0 "lol">'
    + "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 9))
    + "]><annotation>&l8;</annotation>"
)


@FUZZ
@given(
    xml=_mostly(
        st.lists(_OBJECT, max_size=4).map(_voc_xml),
        st.text(alphabet="<>/&;!annotobject ", max_size=30)
        | st.binary(max_size=24)
        | st.sampled_from([_LAUGHS, '<?xml version="1.0" encoding="bogus"?><a/>']),
    ),
    image_set=_mostly(st.just("a\n"), _text_file(st.sampled_from(["a", "b", "../x", "a 1", " "]))),
)
def test_fuzz_the_voc_reader(fuzz_root, xml, image_set):
    year = fuzz_root / "voc" / "VOCdevkit" / "VOC2007"
    paths = [
        _write(year / "Annotations" / "a.xml", xml),
        _write(year / "ImageSets" / "Main" / "train.txt", image_set),
    ]
    try:
        dataset = formats.read_dataset(year.parent, data_format="voc")
    except ValueError as err:
        _refused(err, *paths, year.parent)
        return
    _assert_sound(dataset, len(dataset.classes), *paths, year)
