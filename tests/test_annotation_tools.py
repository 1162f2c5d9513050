"""tools/voc_annotation.py and tools/coco_annotation.py on tiny hand-made data sets."""

import json
from pathlib import Path

import numpy as np
from helpers import load_tool

from yolo3.data.annotations import parse_annotations

ROOT = Path(__file__).resolve().parents[1]


voc_tool = load_tool("voc_annotation")
coco_tool = load_tool("coco_annotation")


def _voc_object(name, box, difficult=None):
    difficult_tag = "" if difficult is None else f"<difficult>{difficult}</difficult>"
    edges = "".join(f"<{tag}>{v}</{tag}>" for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
    return f"<object><name>{name}</name>{difficult_tag}<bndbox>{edges}</bndbox></object>"


def make_devkit(root):
    """VOC2007 with 4 listed images (one XML missing), VOC2012 with 2 (one XML broken)."""
    xml = {
        ("2007", "000001"): [
            _voc_object("dog", (48, 240, 195, 371), 0),
            _voc_object("person", (8, 12, 352, 498), 0),
        ],
        ("2007", "000002"): [
            _voc_object("cat", (10, 20, 30, 40), 1),
            _voc_object("dog", (1, 2, 3, 4)),  # no <difficult> tag, as in some VOC2012 files
        ],
        ("2007", "000004"): [_voc_object("cat", (5, 5, 50, 50), 1)],
        ("2012", "2008_000001"): [
            _voc_object(" cat ", ("273.5", "10.4", "300.49", "99.5"), 0),
            _voc_object("unicorn", (1, 1, 9, 9), 0),
            _voc_object("dog", (30, 30, 30, 60), 0),  # zero width
        ],
    }
    for (year, image_id), objects in xml.items():
        folder = root / f"VOC{year}" / "Annotations"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{image_id}.xml").write_text(f"<annotation>{''.join(objects)}</annotation>")
    (root / "VOC2012" / "Annotations" / "2008_000002.xml").write_text("<annotation><object>")
    sets = {
        "2007": "000001\n000002\n000003\n000004\n",
        "2012": "2008_000001\n2008_000002\n",
    }
    for year, text in sets.items():
        folder = root / f"VOC{year}" / "ImageSets" / "Main"
        folder.mkdir(parents=True)
        (folder / "trainval.txt").write_text(text)


def _assert_printed(capsys, *lines):
    """Each of ``lines`` is in what the tool printed on standard output."""
    printed = capsys.readouterr().out
    for line in lines:
        assert line in printed, line


def test_voc_lines_match_hand_written(tmp_path, capsys):
    make_devkit(tmp_path / "VOCdevkit")
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    output = tmp_path / "out" / "train.txt"
    argv = ["--devkit", str(tmp_path / "VOCdevkit"), "--classes", str(classes)]
    assert voc_tool.main(argv + ["--difficult", "skip", "--output", str(output)]) == 0
    base = "../VOCdevkit/VOC{}/JPEGImages/{}.jpg"
    assert output.read_text().splitlines() == [
        base.format(2007, "000001") + " 48,240,195,371,1",  # person is not in the classes
        base.format(2007, "000002") + " 1,2,3,4,1",  # the difficult cat is skipped
        base.format(2007, "000004"),  # only a difficult object: a background image
        base.format(2012, "2008_000001") + " 274,10,300,100,0",  # fractions rounded
    ]
    _assert_printed(
        capsys,
        "4 images, 3 boxes, 1 images without boxes, 0 boxes flagged difficult",
        "skipped difficult: 2",
        "skipped missing_xml: 1",
        "skipped unreadable_xml: 1",
        "skipped unknown_class/person: 1",
        "skipped unknown_class/unicorn: 1",
        "skipped bad_box: 1",
        "000003.xml does not exist",
        "2008_000002.xml: not valid XML",
    )

    # The written paths resolve back to the devkit's images.
    entries, rejects, _ = parse_annotations(output, num_classes=2)
    assert not rejects
    assert entries[0].path == str(tmp_path / "VOCdevkit" / "VOC2007" / "JPEGImages" / "000001.jpg")


def test_voc_include_difficult_sets_and_classes_output(tmp_path):
    make_devkit(tmp_path / "VOCdevkit")
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    output, classes_out = tmp_path / "train.txt", tmp_path / "names.txt"
    argv = ["--devkit", str(tmp_path / "VOCdevkit"), "--classes", str(classes)]
    argv += ["--sets", "2007:trainval", "--difficult", "include", "--output", str(output)]
    assert voc_tool.main(argv + ["--classes-output", str(classes_out)]) == 0
    assert output.read_text().splitlines() == [
        "VOCdevkit/VOC2007/JPEGImages/000001.jpg 48,240,195,371,1",
        "VOCdevkit/VOC2007/JPEGImages/000002.jpg 10,20,30,40,0 1,2,3,4,1",
        "VOCdevkit/VOC2007/JPEGImages/000004.jpg 5,5,50,50,0",
    ]
    assert classes_out.read_text() == "cat\ndog\n"


def test_voc_flags_difficult_objects_by_default(tmp_path, capsys):
    make_devkit(tmp_path / "VOCdevkit")
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    output = tmp_path / "train.txt"
    argv = ["--devkit", str(tmp_path / "VOCdevkit"), "--classes", str(classes)]
    assert voc_tool.main([*argv, "--sets", "2007:trainval", "--output", str(output)]) == 0
    assert output.read_text().splitlines() == [
        "VOCdevkit/VOC2007/JPEGImages/000001.jpg 48,240,195,371,1",
        "VOCdevkit/VOC2007/JPEGImages/000002.jpg 10,20,30,40,0,1 1,2,3,4,1",
        "VOCdevkit/VOC2007/JPEGImages/000004.jpg 5,5,50,50,0,1",
    ]
    _assert_printed(capsys, "3 images, 4 boxes, 0 images without boxes, 2 boxes flagged difficult")
    entries, rejects, _ = parse_annotations(output, num_classes=2)
    assert not rejects
    assert [entry.difficult.tolist() for entry in entries] == [[False], [True, False], [True]]


def test_voc_strict_and_bad_arguments(tmp_path, capsys):
    make_devkit(tmp_path / "VOCdevkit")
    output = tmp_path / "train.txt"
    argv = ["--devkit", str(tmp_path / "VOCdevkit"), "--output", str(output)]
    assert voc_tool.main(argv + ["--strict"]) == 2
    assert "2 XML files missing or unreadable (--strict)" in capsys.readouterr().err
    assert not output.exists()
    assert voc_tool.main(argv + ["--sets", "2007:test"]) == 2
    assert "ImageSets/Main/test.txt does not exist; check --sets" in capsys.readouterr().err
    assert voc_tool.main(argv + ["--sets", "2007"]) == 2
    assert "'2007' is not YEAR:SET" in capsys.readouterr().err


def test_voc_default_classes_are_the_twenty_voc_classes(tmp_path):
    make_devkit(tmp_path / "VOCdevkit")
    output = tmp_path / "train.txt"
    argv = ["--devkit", str(tmp_path / "VOCdevkit"), "--sets", "2007:trainval"]
    assert voc_tool.main(argv + ["--output", str(output)]) == 0
    # voc_classes.txt: cat 7, dog 11, person 14.
    assert output.read_text().splitlines()[0].split(" ")[1:] == [
        "48,240,195,371,11",
        "8,12,352,498,14",
    ]


COCO = {
    # Category ids are sparse and out of order, as in the real files.
    "categories": [
        {"id": 90, "name": "toothbrush"},
        {"id": 1, "name": "person"},
        {"id": 3, "name": "car"},
    ],
    "images": [
        {"id": 7, "file_name": "b.jpg"},
        {"id": 2, "file_name": "a.jpg"},
        {"id": 9, "file_name": "empty.jpg"},
    ],
    "annotations": [
        # [10.4, 20.6, 30.2, 40.0] -> edges 10.4, 20.6, 40.6, 60.6 -> 10, 21, 41, 61.
        {"image_id": 2, "category_id": 3, "bbox": [10.4, 20.6, 30.2, 40.0], "iscrowd": 0},
        {"image_id": 2, "category_id": 1, "bbox": [0, 0, 50, 50], "iscrowd": 1},
        # 0.3 px wide: both x edges round to 5.
        {"image_id": 7, "category_id": 90, "bbox": [5, 5, 0.3, 10], "iscrowd": 0},
        {"image_id": 7, "category_id": 1, "bbox": [1, 2, 3, 4], "iscrowd": 0},
        {"image_id": 7, "category_id": 90, "bbox": [0.5, 2.5, 3, 4], "iscrowd": 0},
        {"image_id": 100, "category_id": 1, "bbox": [1, 2, 3, 4], "iscrowd": 0},
        {"image_id": 7, "category_id": 5, "bbox": [1, 2, 3, 4], "iscrowd": 0},
    ],
}


def run_coco(tmp_path, *flags):
    source = tmp_path / "instances.json"
    source.write_text(json.dumps(COCO))
    output = tmp_path / "out" / "coco.txt"
    argv = ["--annotations", str(source), "--images", str(tmp_path / "images")]
    return coco_tool.main(argv + ["--output", str(output), *flags]), output


def test_coco_lines_and_classes(tmp_path, capsys):
    status, output = run_coco(tmp_path)
    assert status == 0
    assert output.read_text().splitlines() == [
        "../images/a.jpg 10,21,41,61,1",
        "../images/b.jpg 1,2,4,6,0 1,3,4,7,2",  # 0.5 -> 1 and 2.5 -> 3: halves round up
        "../images/empty.jpg",
    ]
    assert (tmp_path / "out" / "coco_classes.txt").read_text() == "person\ncar\ntoothbrush\n"
    _assert_printed(
        capsys,
        "3 images, 3 boxes in 3 classes, 1 background images",
        "skipped crowd: 1",
        "skipped zero_size_box: 1",
        "skipped unknown_image: 1",
        "skipped unknown_category: 1",
    )
    entries, rejects, _ = parse_annotations(output, num_classes=3)
    assert not rejects and entries[0].path == str(tmp_path / "images" / "a.jpg")
    np.testing.assert_array_equal(entries[0].boxes, [[10, 21, 41, 61]])


def test_coco_crowd_and_empty_flags(tmp_path, capsys):
    classes = tmp_path / "names.txt"
    status, output = run_coco(
        tmp_path, "--include-crowd", "--skip-empty", "--classes-output", str(classes)
    )
    assert status == 0
    assert output.read_text().splitlines() == [
        "../images/a.jpg 10,21,41,61,1 0,0,50,50,0",
        "../images/b.jpg 1,2,4,6,0 1,3,4,7,2",
    ]
    assert classes.read_text() == "person\ncar\ntoothbrush\n"
    summary = capsys.readouterr().out
    assert "skipped empty_image: 1" in summary and "skipped crowd" not in summary


def test_coco_rejects_a_file_that_is_not_instances(tmp_path, capsys):
    source = tmp_path / "captions.json"
    source.write_text(json.dumps({"images": [], "annotations": []}))
    argv = ["--annotations", str(source), "--images", "x", "--output", str(tmp_path / "o.txt")]
    assert coco_tool.main(argv) == 2
    assert "no 'categories' list; is this an instances_*.json file?" in capsys.readouterr().err
    assert not (tmp_path / "o.txt").exists()
