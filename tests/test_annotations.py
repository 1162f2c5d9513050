"""Annotation lines: parsing with reasons for every rejection, and writing."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yolo3.data.annotations import (
    format_line,
    parse_annotation_files,
    parse_annotations,
    write_annotations,
)

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="train.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_good_lines_background_spaces_blank_and_comments(tmp_path):
    text = (
        "# made by hand\n"
        "images/dog 1.jpg 48,240,195,371,1 8,12.5,352,498,0\n"
        "\n"
        "   \n"
        "images/empty.jpg\n"
        "/abs/cat,2.jpg -3,0,20,20,1\n"
    )
    path = write(tmp_path, text)
    entries, rejects, counts = parse_annotations(path, num_classes=2)
    assert rejects == []
    assert [e.path for e in entries] == [
        str(tmp_path / "images" / "dog 1.jpg"),
        str(tmp_path / "images" / "empty.jpg"),
        "/abs/cat,2.jpg",
    ]
    np.testing.assert_array_equal(entries[0].boxes, [[48, 240, 195, 371], [8, 12.5, 352, 498]])
    assert entries[0].boxes.dtype == np.float64 and entries[0].classes.dtype == np.int64
    np.testing.assert_array_equal(entries[0].classes, [1, 0])
    assert entries[1].boxes.shape == (0, 4) and entries[1].classes.shape == (0,)
    # Negative coordinates are kept: the preprocessing worker clips to the image.
    np.testing.assert_array_equal(entries[2].boxes, [[-3, 0, 20, 20]])
    assert [(e.source, e.line) for e in entries] == [(path, 2), (path, 5), (path, 6)]
    assert counts == {
        "lines": 6,
        "comment_lines": 1,
        "blank_lines": 2,
        "images": 3,
        "boxes": 3,
        "background_images": 1,
    }


def test_windows_line_endings_and_byte_order_mark(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes("\ufeffa.jpg 1,2,3,4,0\r\nb.jpg\r\n".encode())
    entries, rejects, _ = parse_annotations(path, num_classes=1)
    assert [os.path.basename(e.path) for e in entries] == ["a.jpg", "b.jpg"] and not rejects


@pytest.mark.parametrize(
    "box, reason, detail",
    [
        ("12,40,8,90,0", "inverted_box", "box 12,40,8,90,0 has x_max < x_min"),
        ("12,40,18,30,0", "inverted_box", "has y_max < y_min"),
        ("12,40,12,90,0", "zero_area_box", "zero width or height"),
        ("1,2,3,4", "malformed_box", "has 4 fields; expected 5"),
        ("1,2,3,4,0,5", "bad_difficult_flag", "has difficult flag '5'; expected 0 or 1"),
        ("1,2,3,4,0,1,1", "malformed_box", "has 7 fields"),
        ("1,2,x3,4,0", "malformed_number", "'x3', which is not a number"),
        ("1,2,inf,4,0", "non_finite", "non-finite coordinate 'inf'"),
        ("1,2,3,nan,0", "non_finite", "'nan'"),
        ("1,2,3,4,1.5", "bad_class_id", "class id '1.5'; expected an integer"),
        ("1,2,3,4,3", "class_out_of_range", r"class id 3, but the classes file has 3 classes"),
        ("1,2,3,4,-1", "class_out_of_range", "class id -1"),
    ],
)
def test_each_bad_box_is_rejected_alone_with_file_and_line(tmp_path, box, reason, detail):
    path = write(tmp_path, f"first.jpg 1,1,2,2,0\nimg.jpg 5,5,9,9,2 {box}\n")
    entries, rejects, counts = parse_annotations(path, num_classes=3)
    assert len(rejects) == 1
    reject = rejects[0]
    assert (reject.reason, reject.scope, reject.line, reject.source) == (reason, "box", 2, path)
    assert reject.message.startswith(f"{path}:2: box {box} ")
    assert re.search(detail, reject.message), reject.message
    assert reject.message.endswith("the box is skipped")
    # The valid box of the same line survives.
    np.testing.assert_array_equal(entries[1].boxes, [[5, 5, 9, 9]])
    assert counts["rejected_boxes"] == 1 and counts["boxes"] == 2


def test_whole_line_rejections(tmp_path):
    path = write(tmp_path, "1,2,3,4,0 img.jpg\nonly_bad.jpg 9,9,1,1,0\nok.jpg\n")
    entries, rejects, counts = parse_annotations(path, num_classes=1)
    assert [os.path.basename(e.path) for e in entries] == ["ok.jpg"]
    assert [(r.reason, r.scope, r.line) for r in rejects] == [
        ("missing_path", "line", 1),
        ("inverted_box", "box", 2),
        ("all_boxes_rejected", "line", 2),
    ]
    assert rejects[0].message.startswith(f"{path}:1: line starts with the box 1,2,3,4,0")
    assert "only_bad.jpg was rejected" in rejects[2].message
    assert counts["rejected_lines"] == 2 and counts["background_images"] == 1


def test_trailing_garbage_after_boxes_is_a_rejected_box(tmp_path):
    path = write(tmp_path, "a.jpg 1,2,3,4,0 junk\n")
    entries, rejects, _ = parse_annotations(path, num_classes=1)
    assert len(entries[0].boxes) == 1
    assert rejects[0].reason == "malformed_box" and "box junk has 1 field;" in rejects[0].message


def test_num_classes_none_checks_only_sign(tmp_path):
    path = write(tmp_path, "a.jpg 1,2,3,4,500 1,2,3,4,-2\n")
    entries, rejects, _ = parse_annotations(path, num_classes=None)
    assert entries[0].classes.tolist() == [500]
    assert [r.reason for r in rejects] == ["class_out_of_range"]
    with pytest.raises(ValueError, match="num_classes is 0"):
        parse_annotations(path, num_classes=0)


def test_image_root_and_absolute_paths(tmp_path):
    path = write(tmp_path, "sub/a.jpg\n/data/b.jpg\ngs://bucket/c.jpg\n")
    default, _, _ = parse_annotations(path, num_classes=1)
    assert [e.path for e in default] == [
        str(tmp_path / "sub" / "a.jpg"),
        "/data/b.jpg",
        "gs://bucket/c.jpg",
    ]
    rooted, _, _ = parse_annotations(path, num_classes=1, image_root="/images")
    assert [e.path for e in rooted] == ["/images/sub/a.jpg", "/data/b.jpg", "gs://bucket/c.jpg"]
    remote, _, _ = parse_annotations(path, num_classes=1, image_root="gs://bucket/root/")
    assert remote[0].path == "gs://bucket/root/sub/a.jpg"


def test_several_files_concatenate_and_sum_counts(tmp_path):
    first = write(tmp_path, "a.jpg 1,2,3,4,0\n", "a.txt")
    second = write(tmp_path, "b.jpg\nc.jpg 1,1,0,0,0 1,1,2,2,0\n", "b.txt")
    entries, rejects, counts = parse_annotation_files([first, second], num_classes=1)
    assert [(os.path.basename(e.path), e.source, e.line) for e in entries] == [
        ("a.jpg", first, 1),
        ("b.jpg", second, 1),
        ("c.jpg", second, 2),
    ]
    assert [(r.source, r.line) for r in rejects] == [(second, 2)]
    assert (counts["lines"], counts["boxes"], counts["images"]) == (3, 2, 3)


def test_format_and_write_round_trip(tmp_path):
    boxes = np.array([[1, 2, 30, 40], [0.5, 1.25, 7, 8.125]])
    line = format_line("my images/x.jpg", boxes, [3, 0])
    assert line == "my images/x.jpg 1,2,30,40,3 0.5,1.25,7,8.125,0"
    assert format_line("bg.jpg", np.zeros((0, 4)), []) == "bg.jpg"
    out = tmp_path / "nested" / "out.txt"
    assert write_annotations(out, [line, "bg.jpg"]) == 2
    assert [p.name for p in out.parent.iterdir()] == ["out.txt"]  # no temporary file left
    entries, rejects, _ = parse_annotations(out, num_classes=4)
    assert not rejects
    np.testing.assert_array_equal(entries[0].boxes, boxes)
    assert entries[0].classes.tolist() == [3, 0] and entries[0].path.endswith("my images/x.jpg")


def test_difficult_flag_reads_and_writes_back(tmp_path):
    path = write(tmp_path, "a.jpg 1,2,3,4,0,1 5,6,7,8,1,0 9,9,12,12,1\nb.jpg\n")
    entries, rejects, _ = parse_annotations(path, num_classes=2)
    assert not rejects
    assert entries[0].difficult.tolist() == [True, False, False]
    assert entries[1].difficult.tolist() == []
    line = format_line("a.jpg", entries[0].boxes, entries[0].classes, entries[0].difficult)
    assert line == "a.jpg 1,2,3,4,0,1 5,6,7,8,1 9,9,12,12,1"
    with pytest.raises(ValueError, match="2 difficult flags for 3 boxes"):
        format_line("a.jpg", entries[0].boxes, entries[0].classes, [True, False])


@pytest.mark.parametrize("path", ["", "a.jpg\nb.jpg", "1,2,3,4,0", "dir 1,2 x.jpg", "#1.jpg"])
def test_format_line_refuses_paths_that_would_not_read_back(path):
    with pytest.raises(ValueError, match="image path"):
        format_line(path, np.zeros((0, 4)), [])


def test_format_line_checks_lengths():
    with pytest.raises(ValueError, match="2 boxes but 1 class ids"):
        format_line("a.jpg", np.ones((2, 4)), [0])


# Each in an interpreter of its own: one module's imports must not hide another's (the
# VOC converter importing yolo3.data.formats once hid the kmeans command's way to TensorFlow).
LIGHT_MODULES = (
    "yolo3.data.annotations", "yolo3.data.hygiene", "yolo3.data.kmeans",
    "yolo3.commands.voc_annotation", "yolo3.commands.coco_annotation", "yolo3.commands.kmeans",
    "yolo3.commands.launch", "yolo3.data.preprocess", "yolo3.distributed.devices",
    "yolo3.data.formats", "yolo3.data.formats.coco", "yolo3.data.formats.darknet",
    "yolo3.data.formats.ultralytics", "yolo3.data.formats.voc",
)  # fmt: skip


def test_preprocessing_modules_do_not_import_tensorflow():
    code = (
        "import importlib, sys\n"
        "heavy = []\n"
        f"for name in {LIGHT_MODULES!r}:\n"
        "    for loaded in [m for m in sys.modules if m.startswith('yolo3')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "    heavy += [name] * any(m in sys.modules for m in ('tensorflow', 'keras'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
