"""Test splits and sibling splits of the dataset readers (yolo3.data.formats), as users bring
them from Roboflow: a YOLO export (``data.yaml`` beside ``train/``, ``valid/``, ``test/``), a
COCO export (``train/``, ``valid/``, ``test/`` each with ``_annotations.coco.json``), a
Darknet ``.data`` file with a ``test =`` list and a VOC2007 devkit with its ``test`` set.
Each test split holds the images written for it; training reads only train and val.
"""

import json
import os

import numpy as np
import pytest
from helpers import load_tool, write_voc_xml
from PIL import Image

from yolo3.data import formats

preprocess_tool = load_tool("preprocess")

NAMES = ["bolt", "nut"]
# split -> [(stem, width, height, [(x0, y0, x1, y1, class_id), ...])]
IMAGES = {
    "train": [("a", 40, 30, [(2, 3, 20, 15, 0)]), ("b", 32, 48, [(0, 0, 32, 24, 1)])],
    "val": [("c", 48, 32, [(4, 4, 44, 28, 1)])],
    "test": [("d", 36, 36, [(6, 6, 30, 30, 0), (1, 1, 9, 9, 1)]), ("e", 30, 40, [])],
}
FOLDER = {"train": "train", "val": "valid", "test": "test"}


def _image(path, width, height):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(width * height).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(pixels).save(path)


def _yolo_export(root):
    """A Roboflow YOLO export: ``<split>/images`` and ``<split>/labels``, and its data.yaml."""
    for split, images in IMAGES.items():
        for stem, width, height, boxes in images:
            _image(root / FOLDER[split] / "images" / f"{stem}.jpg", width, height)
            labels = root / FOLDER[split] / "labels" / f"{stem}.txt"
            labels.parent.mkdir(parents=True, exist_ok=True)
            labels.write_text(
                "".join(
                    f"{c} {(x0 + x1) / 2 / width} {(y0 + y1) / 2 / height} "
                    f"{(x1 - x0) / width} {(y1 - y0) / height}\n"
                    for x0, y0, x1, y1, c in boxes
                )
            )
    (root / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n"
        "nc: 2\nnames: ['bolt', 'nut']\n"
    )
    return root


def _coco_json(images, categories=None):
    data = {"images": [], "annotations": [], "categories": categories}
    for image_id, (stem, width, height, boxes) in enumerate(images, 1):
        data["images"].append(
            {"id": image_id, "file_name": f"{stem}.jpg", "width": width, "height": height}
        )
        for x0, y0, x1, y1, c in boxes:
            data["annotations"].append(
                {
                    "id": len(data["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": c + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    return data


# Roboflow's first category only names the others' supercategory.
ROBOFLOW_CATEGORIES = [
    {"id": 0, "name": "parts", "supercategory": "none"},
    *({"id": i + 1, "name": name, "supercategory": "parts"} for i, name in enumerate(NAMES)),
]


def _coco_export(root, folders=FOLDER):
    """A Roboflow COCO export: each split's folder holds its images and its JSON."""
    for split, images in IMAGES.items():
        folder = root / folders[split]
        for stem, width, height, _ in images:
            _image(folder / f"{stem}.jpg", width, height)
        data = _coco_json(images, ROBOFLOW_CATEGORIES)
        (folder / "_annotations.coco.json").write_text(json.dumps(data))
    return root


def _stems(entries):
    return sorted(os.path.splitext(os.path.basename(e.path))[0] for e in entries)


def _assert_splits(dataset):
    """Every split of :data:`IMAGES`, each with its own images (each stem is in one split's
    folder only) and boxes."""
    assert dataset.classes == NAMES
    assert dataset.named == ("train", "val", "test")
    for split, images in IMAGES.items():
        entries = {os.path.basename(e.path): e for e in dataset.splits[split]}
        assert sorted(entries) == sorted(f"{stem}.jpg" for stem, *_ in images)
        for stem, _, _, boxes in images:
            entry = entries[f"{stem}.jpg"]
            assert os.path.isfile(entry.path)
            want = np.asarray([b[:4] for b in boxes], np.float64).reshape(-1, 4)
            np.testing.assert_allclose(entry.boxes, want, atol=1e-6)
            np.testing.assert_array_equal(entry.classes, [b[4] for b in boxes])


def test_yolo_export_has_a_test_split_read_only_when_asked_for(tmp_path):
    root = _yolo_export(tmp_path / "rf")
    dataset = formats.read_dataset(root / "data.yaml")
    assert sorted(dataset.splits) == ["train", "val"] and dataset.named == formats.SPLITS
    assert dataset.counts["images"] == 3  # the test images cost nothing when not asked for
    _assert_splits(formats.read_dataset(root / "data.yaml", splits=formats.SPLITS))
    test = formats.read_dataset(root / "data.yaml", splits=("test",))
    assert list(test.splits) == ["test"] and _stems(test.splits["test"]) == ["d", "e"]
    assert test.counts["images"] == 2 and test.counts["background_images"] == 1


def test_a_test_entry_that_does_not_exist_matters_only_when_asked_for(tmp_path):
    root = _yolo_export(tmp_path / "rf")
    (root / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../gone/images\nnames: [bolt, nut]\n"
    )
    assert sorted(formats.read_dataset(root / "data.yaml").splits) == ["train", "val"]
    with pytest.raises(ValueError, match=r"data.yaml: test entry '../gone/images' is neither"):
        formats.read_dataset(root / "data.yaml", splits=("test",))
    with pytest.raises(ValueError, match=r"split 'tset': a dataset's splits are train, val, test"):
        formats.read_dataset(root / "data.yaml", splits=("tset",))


def test_a_folder_holding_data_yaml_is_read_as_yolo(tmp_path):
    root = _yolo_export(tmp_path / "rf")
    assert formats.detect_format(root) == "yolo"
    _assert_splits(formats.read_dataset(root, splits=formats.SPLITS))
    # Another name: the one yaml that names train and names; other yaml files are not it.
    (root / "data.yaml").rename(root / "parts.yml")
    (root / "notes.yaml").write_text("owner: someone\n")
    assert formats.read_dataset(root).format == "yolo"
    (root / "copy.yaml").write_text((root / "parts.yml").read_text())
    with pytest.raises(ValueError, match=r"holds copy.yaml and parts.yml; give --data the one"):
        formats.detect_format(root)


def test_a_folder_of_no_format_is_one_line_naming_what_was_looked_for(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    _image(tmp_path / "photos" / "a.jpg", 8, 8)
    with pytest.raises(ValueError) as raised:
        formats.detect_format(tmp_path / "photos")
    message = str(raised.value)
    assert "\n" not in message
    for looked_for in ("data.yaml (yolo)", "_annotations.coco.json (coco)", "VOC<year>/ (voc)"):
        assert looked_for in message
    argv = ["--data", str(tmp_path / "photos"), "--output", str(tmp_path / "out")]
    assert preprocess_tool.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --data ")


@pytest.mark.parametrize(
    "named",
    ["rf", "rf/train/_annotations.coco.json", "rf/Valid/_annotations.coco.json", "rf/Test"],
)
def test_coco_export_splits_are_found_from_any_of_its_parts(tmp_path, named):
    """The folder, any split's JSON or a split's folder names the whole export; folder names
    in any case; each split's images beside its own JSON."""
    _coco_export(tmp_path / "rf", folders={"train": "train", "val": "Valid", "test": "Test"})
    assert formats.detect_format(tmp_path / named) == "coco"
    dataset = formats.read_dataset(tmp_path / named, splits=formats.SPLITS)
    _assert_splits(dataset)
    for entries in dataset.splits.values():
        assert all(os.path.dirname(e.path) == os.path.dirname(e.source) for e in entries)
    assert formats.read_dataset(tmp_path / named).named == formats.SPLITS


def test_coco_classes_do_not_depend_on_the_splits_read(tmp_path):
    """A category named as a supercategory is a class where annotations use it: the test
    split alone, which does not, still gets the training split's classes."""
    root = _coco_export(tmp_path / "rf")
    train = root / "train" / "_annotations.coco.json"
    data = json.loads(train.read_text())
    data["annotations"].append(
        {"id": 99, "image_id": 1, "category_id": 0, "bbox": [1, 1, 4, 4], "iscrowd": 0}
    )
    train.write_text(json.dumps(data))
    everything = formats.read_dataset(root, splits=formats.SPLITS)
    test = formats.read_dataset(root, splits=("test",))
    assert everything.classes == test.classes == ["parts", *NAMES]
    assert list(test.splits) == ["test"]
    np.testing.assert_array_equal(
        _by_name(test.splits["test"])["d.jpg"].classes,
        _by_name(everything.splits["test"])["d.jpg"].classes,
    )


def _by_name(entries):
    return {os.path.basename(e.path): e for e in entries}


def test_coco_instances_layout_finds_val_and_test_beside_train(tmp_path):
    root = tmp_path / "coco"
    for split, images in IMAGES.items():
        for stem, width, height, _ in images:
            _image(root / f"{split}2017" / f"{stem}.jpg", width, height)
        categories = [
            {"id": i + 1, "name": name, "supercategory": "part"} for i, name in enumerate(NAMES)
        ]
        path = root / "annotations" / f"instances_{split}2017.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_coco_json(images, categories)))
    for named in (root, root / "annotations" / "instances_train2017.json"):
        _assert_splits(formats.read_dataset(named, splits=formats.SPLITS))


def test_darknet_test_list_and_voc_test_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    for split, images in IMAGES.items():
        for stem, width, height, boxes in images:
            _image(data / "obj" / f"{stem}.jpg", width, height)
            (data / "obj" / f"{stem}.txt").write_text(
                "".join(
                    f"{c} {(x0 + x1) / 2 / width} {(y0 + y1) / 2 / height} "
                    f"{(x1 - x0) / width} {(y1 - y0) / height}\n"
                    for x0, y0, x1, y1, c in boxes
                )
            )
        (data / f"{split}.txt").write_text("".join(f"data/obj/{s}.jpg\n" for s, *_ in images))
    (data / "obj.names").write_text("bolt\nnut\n")
    (data / "obj.data").write_text(
        "classes = 2\ntrain = data/train.txt\nvalid = data/val.txt\ntest = data/test.txt\n"
        "names = data/obj.names\n"
    )
    dataset = formats.read_dataset(data / "obj.data", splits=formats.SPLITS)
    _assert_splits(dataset)
    assert not dataset.rejects  # the unread lists are list files, not labels without images
    assert not formats.read_dataset(data / "obj.data").rejects

    year = tmp_path / "VOCdevkit" / "VOC2007"
    sets = year / "ImageSets" / "Main"
    sets.mkdir(parents=True)
    (year / "Annotations").mkdir()
    for images in IMAGES.values():
        for stem, width, height, boxes in images:
            _image(year / "JPEGImages" / f"{stem}.jpg", width, height)
            write_voc_xml(year / "Annotations" / f"{stem}.xml", boxes, NAMES)
    (sets / "trainval.txt").write_text("a\nb\nc\n")
    (sets / "test.txt").write_text("d\ne\n")
    dataset = formats.read_dataset(year.parent, classes=NAMES, splits=formats.SPLITS)
    assert dataset.named == ("train", "val", "test")
    assert _stems(dataset.splits["test"]) == _stems(dataset.splits["val"]) == ["d", "e"]
    # VOC2007 test is the validation split too: its images are read and counted once.
    assert dataset.counts["images"] == 5 and dataset.counts["boxes"] == 5


def test_preprocess_reads_train_and_val_only(tmp_path):
    root = _yolo_export(tmp_path / "rf")
    (root / "test" / "labels" / "d.txt").write_text("7 0.5 0.5 0.1 0.1\n")  # bad, unread
    output = tmp_path / "records"
    argv = ["--data", str(root), "--output", str(output), "--input-size", "32"]
    argv += ["--copies", "0", "--workers", "1", "--progress", "off", "--strict"]
    assert preprocess_tool.main(argv) == 0
    manifest = json.loads((output / "manifest.json").read_text())
    assert sorted(manifest["splits"]) == ["train", "val"]
    assert manifest["source_images"] == {"train": 2, "val": 1}
    assert not manifest["rejects"]
