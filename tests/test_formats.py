"""Datasets in other layouts (yolo3.data.formats): one set of boxes written as an annotation
file, an Ultralytics data.yaml, a Darknet .data file, COCO JSON and a VOCdevkit; each reader
must give exactly the boxes the annotation-line path gives, and agree with globox (YOLO,
VOC) and pycocotools (COCO), which read the same formats independently. Then the bad
inputs of each format, and ``yolo3 preprocess --data`` / ``yolo3 kmeans --data`` end to end.
"""

import json
import os
import shutil

import globox
import numpy as np
import pytest
from helpers import load_tool, write_voc_xml
from PIL import Image
from pycocotools.coco import COCO

from yolo3.data import formats
from yolo3.data.annotations import format_line, parse_annotations

preprocess_tool = load_tool("preprocess")
kmeans_tool = load_tool("kmeans")

NAMES = ["bolt", "nut"]
# (split, stem, width, height, [(x0, y0, x1, y1, class_id), ...]); the last train image is
# a background image.
IMAGES = [
    ("train", "a", 80, 60, [(4, 6, 40, 30, 0), (50, 10, 78, 58, 1)]),
    ("train", "b", 64, 96, [(0, 0, 64, 48, 1)]),
    ("train", "c", 100, 50, [(10, 5, 30, 45, 0), (40, 5, 90, 25, 0), (1, 2, 3, 4, 1)]),
    ("train", "d", 72, 72, []),
    ("val", "e", 96, 64, [(8, 8, 88, 56, 1)]),
]


def _image(path, width, height, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(pixels).save(path, quality=95)


def _yolo_line(box, width, height):
    x0, y0, x1, y1, class_id = box
    cx, cy = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height
    return f"{class_id} {cx:.10f} {cy:.10f} {(x1 - x0) / width:.10f} {(y1 - y0) / height:.10f}"


def _coco(split_images, start_id=1):
    images, annotations = [], []
    for image_id, (_, stem, width, height, boxes) in enumerate(split_images, start_id):
        images.append(
            {"id": image_id, "file_name": f"{stem}.jpg", "width": width, "height": height}
        )
        for x0, y0, x1, y1, c in boxes:
            annotations.append(
                {
                    "id": len(annotations) + 100 * image_id,
                    "image_id": image_id,
                    "category_id": c + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    categories = [
        {"id": i + 1, "name": name, "supercategory": "parts"} for i, name in enumerate(NAMES)
    ]
    return {"images": images, "annotations": annotations, "categories": categories}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The same images and boxes in every layout: ``{name: path for --data}``, plus the
    reference annotation files under ``"lines"``."""
    root = tmp_path_factory.mktemp("formats")
    paths = {}
    lines = {"train": [], "val": []}
    for seed, (split, stem, width, height, boxes) in enumerate(IMAGES):
        # Ultralytics: images/<split>/ and labels/<split>/
        image = root / "yolo" / "images" / split / f"{stem}.jpg"
        _image(image, width, height, seed)
        labels = root / "yolo" / "labels" / split / f"{stem}.txt"
        labels.parent.mkdir(parents=True, exist_ok=True)
        if stem != "d":  # d: no label file at all, a background image
            labels.write_text("".join(_yolo_line(b, width, height) + "\n" for b in boxes))
        lines[split].append(format_line(str(image), [b[:4] for b in boxes], [b[4] for b in boxes]))
        # Darknet: labels beside the images, listed by train.txt / valid.txt
        darknet_image = root / "darknet" / "data" / "obj" / f"{stem}.jpg"
        darknet_image.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, darknet_image)
        if boxes:
            darknet_image.with_suffix(".txt").write_text(
                "".join(_yolo_line(b, width, height) + "\n" for b in boxes)
            )
        # COCO: annotations/instances_<split>.json, images in <split>/
        coco_image = root / "coco" / split / f"{stem}.jpg"
        coco_image.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, coco_image)
        # VOC: VOCdevkit/VOC2007, test.txt the validation set
        voc = root / "voc" / "VOCdevkit" / "VOC2007"
        (voc / "JPEGImages").mkdir(parents=True, exist_ok=True)
        (voc / "Annotations").mkdir(parents=True, exist_ok=True)
        shutil.copy(image, voc / "JPEGImages" / f"{stem}.jpg")
        write_voc_xml(
            voc / "Annotations" / f"{stem}.xml",
            boxes,
            NAMES,
            image_size=(width, height),
            difficult=(),
        )
    (root / "yolo" / "data.yaml").write_text(
        "path: .\ntrain: images/train\nval: images/val\nnames:\n  0: bolt\n  1: nut\n"
    )
    darknet = root / "darknet" / "data"
    (darknet / "obj.names").write_text("bolt\nnut\n")
    for split, name in (("train", "train.txt"), ("val", "valid.txt")):
        stems = [stem for s, stem, *_ in IMAGES if s == split]
        (darknet / name).write_text("".join(f"data/obj/{stem}.jpg\n" for stem in stems))
    (darknet / "obj.data").write_text(
        "classes = 2\ntrain = data/train.txt\nvalid = data/valid.txt\n"
        "names = data/obj.names\nbackup = backup/\n"
    )
    (root / "coco" / "annotations").mkdir()
    for split in ("train", "val"):
        data = _coco([i for i in IMAGES if i[0] == split], start_id=1 if split == "train" else 50)
        (root / "coco" / "annotations" / f"instances_{split}.json").write_text(json.dumps(data))
    sets = root / "voc" / "VOCdevkit" / "VOC2007" / "ImageSets" / "Main"
    sets.mkdir(parents=True)
    for split, name in (("train", "trainval"), ("val", "test")):
        stems = [stem for s, stem, *_ in IMAGES if s == split]
        (sets / f"{name}.txt").write_text("".join(f"{stem}\n" for stem in stems))
    for split in ("train", "val"):
        (root / f"{split}.txt").write_text("".join(f"{line}\n" for line in lines[split]))
    paths.update(
        yolo=str(root / "yolo" / "data.yaml"),
        darknet=str(darknet / "obj.data"),
        coco=str(root / "coco" / "annotations" / "instances_train.json"),
        voc=str(root / "voc" / "VOCdevkit"),
        lines={split: str(root / f"{split}.txt") for split in ("train", "val")},
        root=root,
    )
    return paths


def _by_stem(entries):
    return {os.path.splitext(os.path.basename(e.path))[0]: e for e in entries}


@pytest.mark.parametrize("data_format", formats.FORMATS)
def test_each_format_gives_the_boxes_of_the_annotation_lines(datasets, data_format, monkeypatch):
    monkeypatch.chdir(datasets["root"] / "darknet")  # Darknet's paths start at its root
    dataset = formats.read_dataset(datasets[data_format])
    assert dataset.format == data_format
    assert dataset.classes == NAMES
    assert not dataset.rejects
    for split in ("train", "val"):
        expected, _, _ = parse_annotations(datasets["lines"][split], num_classes=2)
        got = _by_stem(dataset.splits[split])
        assert sorted(got) == sorted(_by_stem(expected))
        for stem, want in _by_stem(expected).items():
            # YOLO labels hold fractions written to 10 places: a pixel back to 1e-7.
            np.testing.assert_allclose(got[stem].boxes, want.boxes, atol=1e-6, rtol=0)
            np.testing.assert_array_equal(got[stem].classes, want.classes)
            assert os.path.exists(got[stem].path)
    counts = dataset.counts
    assert (counts["images"], counts["boxes"], counts["background_images"]) == (5, 7, 1)
    if data_format == "yolo":  # d has no label file; Darknet's d has none either
        assert counts["images_without_labels"] == 1


def _globox_boxes(annotation_set):
    return {
        os.path.splitext(str(a.image_id))[0]: sorted(
            (*(round(v, 6) for v in b.ltrb), b.label) for b in a.boxes
        )
        for a in annotation_set
    }


def _our_boxes(entries, label=lambda c: NAMES[c]):
    return {
        stem: sorted(
            (*(round(float(v), 6) for v in box), label(c)) for box, c in zip(e.boxes, e.classes)
        )
        for stem, e in _by_stem(entries).items()
    }


def test_readers_agree_with_globox_and_pycocotools(datasets):
    root = datasets["root"]
    yolo = formats.read_dataset(datasets["yolo"]).splits["train"]
    theirs = globox.AnnotationSet.from_yolo_v5(
        root / "yolo" / "labels" / "train", image_folder=root / "yolo" / "images" / "train"
    )
    ours = _our_boxes(yolo, label=str)
    del ours["d"]  # globox reads label files; d has none
    assert _globox_boxes(theirs) == ours
    voc = formats.read_dataset(datasets["voc"])
    theirs = globox.AnnotationSet.from_pascal_voc(
        root / "voc" / "VOCdevkit" / "VOC2007" / "Annotations"
    )
    ours = _our_boxes(voc.splits["train"] + voc.splits["val"])
    assert _globox_boxes(theirs) == ours
    coco = formats.read_dataset(datasets["coco"])
    oracle = COCO(datasets["coco"])
    for image_id, image in oracle.imgs.items():
        stem = os.path.splitext(image["file_name"])[0]
        want = sorted(
            (x, y, x + w, y + h, oracle.cats[a["category_id"]]["name"])
            for a in oracle.loadAnns(oracle.getAnnIds(imgIds=[image_id]))
            for x, y, w, h in [a["bbox"]]
        )
        assert _our_boxes(coco.splits["train"])[stem] == sorted(
            (*(round(v, 6) for v in b[:4]), b[4]) for b in want
        )


def _copy(datasets, tmp_path, name):
    shutil.copytree(datasets["root"] / name, tmp_path / name)
    return tmp_path / name


def _reasons(dataset):
    return sorted((os.path.basename(r.source), r.line, r.reason) for r in dataset.rejects)


def test_yolo_bad_labels_are_named_counted_and_refused_with_strict(datasets, tmp_path, capsys):
    root = _copy(datasets, tmp_path, "yolo")
    labels = root / "labels" / "train"
    with open(labels / "a.txt", "a") as f:  # lines 3-7 after a's two good ones
        f.write("0 0.5 0.5 0.2\n5 0.5 0.5 0.1 0.1\n1 1.5 0.5 0.1 0.1\n0 0.5 0.5 0 0.1\n")
        f.write("1 0.1 0.1 0.3 0.1 0.3 0.4\n")  # a triangle: the box around it
    (labels / "c.txt").write_text("x 0.5 0.5 0.1 0.1\n")  # every box bad: c is skipped
    (labels / "z.txt").write_text("0 0.5 0.5 0.1 0.1\n")  # no image z.*
    dataset = formats.read_dataset(root / "data.yaml")
    assert _reasons(dataset) == [
        ("a.txt", 3, "malformed_label"),
        ("a.txt", 4, "class_out_of_range"),
        ("a.txt", 5, "coordinates_out_of_range"),
        ("a.txt", 6, "zero_area_box"),
        ("c.txt", 0, "all_boxes_rejected"),
        ("c.txt", 1, "malformed_number"),
        ("z.txt", 0, "label_without_image"),
    ]
    a = _by_stem(dataset.splits["train"])["a"]
    np.testing.assert_allclose(a.boxes[-1], [0.1 * 80, 0.1 * 60, 0.3 * 80, 0.4 * 60], atol=1e-9)
    assert "c" not in _by_stem(dataset.splits["train"])
    message = next(r.message for r in dataset.rejects if r.reason == "class_out_of_range")
    assert message.startswith(f"{labels / 'a.txt'}:4: ") and "2 classes" in message
    assert (dataset.counts["rejected_boxes"], dataset.counts["rejected_lines"]) == (5, 2)

    output = tmp_path / "records"
    flags = ["--data", str(root / "data.yaml"), "--output", str(output), "--input-size", "64"]
    flags += ["--copies", "0", "--workers", "1", "--progress", "off"]
    assert preprocess_tool.main([*flags, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "rejected input (--strict)" in err and f"{labels / 'a.txt'}:3:" in err
    assert "Traceback" not in err
    assert preprocess_tool.main(flags) == 0
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["source_format"] == "yolo" and manifest["classes"] == NAMES
    assert manifest["rejects"]["label_without_image"] == 1
    assert manifest["splits"]["train"]["images"] == 3 and manifest["splits"]["val"]["images"] == 1
    listed = (output / "rejects.txt").read_text().splitlines()
    assert len(listed) == 7 and f"{labels / 'z.txt'}\tlabel_without_image\t" in listed[-1]


def test_each_format_refuses_what_it_cannot_read_in_one_line(datasets, tmp_path, capsys):
    darknet = _copy(datasets, tmp_path, "darknet") / "data"
    data = darknet / "obj.data"
    data.write_text(data.read_text().replace("classes = 2", "classes = 3"))
    with pytest.raises(ValueError, match=r"classes = 3 but .*obj.names names 2 classes"):
        formats.read_dataset(data)
    yaml_path = _copy(datasets, tmp_path, "yolo") / "data.yaml"
    yaml_path.write_text("train: images/train\nnames: {0: bolt, 2: nut}\n")
    with pytest.raises(ValueError, match=r"names' ids are \[0, 2\]; expected 0..1"):
        formats.read_dataset(yaml_path)
    with pytest.raises(ValueError, match="cannot tell its format"):
        formats.read_dataset(darknet / "obj.names")
    output = str(tmp_path / "out")
    classes = tmp_path / "classes.txt"
    classes.write_text("bolt\nnut\n")
    argv = ["--data", datasets["yolo"], "--classes", str(classes), "--output", output]
    assert preprocess_tool.main(argv) == 2
    assert "a yolo dataset names its classes itself; drop --classes" in capsys.readouterr().err
    argv = ["--data", datasets["yolo"], "--output", output, "--val-fraction", "0.5"]
    assert preprocess_tool.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {datasets['yolo']} names a validation split already; drop "
        "--val-fraction/--val-per-class"
    ]


def test_coco_crowd_unknown_and_roboflow_layout(datasets, tmp_path):
    coco = _copy(datasets, tmp_path, "coco")
    train = coco / "annotations" / "instances_train.json"
    data = json.loads(train.read_text())
    data["annotations"] += [
        {"id": 901, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 1},
        {"id": 902, "image_id": 1, "category_id": 7, "bbox": [1, 1, 5, 5]},
        {"id": 903, "image_id": 99, "category_id": 1, "bbox": [1, 1, 5, 5]},
        {"id": 904, "image_id": 2, "category_id": 2, "bbox": [1, 1, 0, 5]},
    ]
    train.write_text(json.dumps(data))
    dataset = formats.read_dataset(coco)  # the folder: annotations/instances_*.json
    assert sorted(r.reason for r in dataset.rejects) == [
        "unknown_category",
        "unknown_image",
        "zero_area_box",
    ]
    assert "annotation id 902" in next(r.message for r in dataset.rejects if "902" in r.message)
    assert dataset.counts["crowd_regions"] == 1 and dataset.counts["boxes"] == 7
    # Roboflow: train/_annotations.coco.json beside its images, and a first category that
    # only names the others' supercategory.
    roboflow = tmp_path / "roboflow"
    for split, folder in (("train", "train"), ("val", "valid")):
        shutil.copytree(coco / split, roboflow / folder)
        data = json.loads((coco / "annotations" / f"instances_{split}.json").read_text())
        data["categories"].insert(0, {"id": 0, "name": "parts", "supercategory": "none"})
        (roboflow / folder / "_annotations.coco.json").write_text(json.dumps(data))
    dataset = formats.read_dataset(roboflow)
    assert dataset.format == "coco" and dataset.classes == NAMES
    assert len(dataset.splits["train"]) == 4 and len(dataset.splits["val"]) == 1


def test_voc_missing_xml_and_chosen_classes(datasets, tmp_path):
    devkit = _copy(datasets, tmp_path, "voc") / "VOCdevkit"
    (devkit / "VOC2007" / "Annotations" / "b.xml").unlink()
    dataset = formats.read_dataset(devkit, classes=["nut"])
    assert dataset.classes == ["nut"]
    assert _reasons(dataset) == [
        ("trainval.txt", 1, "unknown_class"),
        ("trainval.txt", 2, "missing_xml"),
        ("trainval.txt", 3, "unknown_class"),  # c: two bolts and a nut, the nut kept
        ("trainval.txt", 3, "unknown_class"),
    ]
    c = _by_stem(dataset.splits["train"])["c"]
    np.testing.assert_array_equal(c.boxes, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(c.classes, [0])
    assert "b" not in _by_stem(dataset.splits["train"])
    assert dataset.counts["rejected_lines"] == 1 and dataset.counts["rejected_boxes"] == 3


def test_kmeans_fits_the_training_split_of_a_dataset(datasets, capsys):
    assert kmeans_tool.main(["--data", datasets["yolo"], "-k", "6", "--input-size", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 boxes from 4 images, sizes in pixels of a 64 px input")
    assert "anchors: " in out


def test_roboflow_yaml_and_darknet_voc_labels(datasets, tmp_path, monkeypatch):
    """Roboflow's data.yaml says ``train: ../train/images`` beside a ``train/`` folder;
    Darknet's VOC lists point at JPEGImages/ with labels in labels/."""
    yolo = datasets["root"] / "yolo"
    export = tmp_path / "export"
    for split, folder in (("train", "train"), ("val", "valid")):
        shutil.copytree(yolo / "images" / split, export / folder / "images")
        shutil.copytree(yolo / "labels" / split, export / folder / "labels")
    (export / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\nnc: 2\nnames: ['bolt', 'nut']\n"
    )
    dataset = formats.read_dataset(export / "data.yaml")
    assert not dataset.rejects and dataset.counts["boxes"] == 7
    assert sorted(_by_stem(dataset.splits["val"])) == ["e"]
    voc = tmp_path / "VOC2007"
    shutil.copytree(yolo / "images" / "train", voc / "JPEGImages")
    shutil.copytree(yolo / "labels" / "train", voc / "labels")
    (tmp_path / "train.txt").write_text("VOC2007/JPEGImages/a.jpg\nVOC2007/JPEGImages/b.jpg\n")
    (tmp_path / "voc.names").write_text("bolt\nnut\n")
    (tmp_path / "voc.data").write_text("train = train.txt\nnames = voc.names\n")
    monkeypatch.chdir(tmp_path)
    dataset = formats.read_dataset("voc.data")
    boxes = _our_boxes(dataset.splits["train"])
    assert sorted(boxes) == ["a", "b"] and len(boxes["a"]) == 2
    # c.txt and d's missing label: c's label file lies in labels/ with no listed image,
    # but its image is in JPEGImages/, so it is not an orphan.
    assert not dataset.rejects


@pytest.mark.parametrize("data_format", ["darknet", "coco", "voc"])
def test_train_data_caches_each_format_with_its_validation_split(datasets, data_format, tmp_path):
    """``yolo3 train --data``'s first stage for the formats the one-command test
    (tests/test_train_data.py, a YOLO export) does not train on: the records and the
    dataset's own validation split in the cache, found again by a second call."""
    from yolo3.data import cache  # noqa: PLC0415
    from yolo3.data.preprocess import PreprocessConfig  # noqa: PLC0415

    config = PreprocessConfig(
        output="", input_size=(32, 32), data=datasets[data_format], copies=0,
        classes=tuple(NAMES) if data_format == "voc" else (),
    )  # fmt: skip
    first = cache.prepare(config, cache_dir=tmp_path, workers=1, log=lambda line: None)
    manifest = json.loads((tmp_path / first.records / "manifest.json").read_text())
    assert manifest["source_images"] == {"train": 4, "val": 1}
    assert manifest["validation"]["source"] == "named"
    again = cache.prepare(config, cache_dir=tmp_path, workers=1, log=lambda line: None)
    assert again.records == first.records and first.built and not again.built
