"""``yolo3 evaluate --data PATH --split S``: any split of a dataset in another format, scored
on its original images. A tiny untrained tiny-YOLOv3 weights file goes through the real
model path; a stand-in exported detector that answers each image with its true boxes checks
the rest (split, class order, original pixels) against mAP 1.
"""

import json
import types

import numpy as np
import pytest
from helpers import SMALL_ANCHORS, load_tool, write_voc_xml
from PIL import Image

from yolo3.checkpoint.weights import save_weights
from yolo3.data.annotations import parse_annotations
from yolo3.model.head import HeadSpec
from yolo3.model.network import tiny_yolo_body

evaluate_tool = load_tool("evaluate")

NAMES = ["bolt", "nut"]
SIZE = 64
# split -> [(stem, width, height, [(x0, y0, x1, y1, class_id), ...])]; every image has a size
# of its own, by which the stand-in detector knows it.
IMAGES = {
    "train": [("a", 40, 30, [(2, 3, 20, 15, 0)])],
    "val": [("b", 48, 32, [(4, 4, 44, 28, 1)])],
    "test": [
        ("c", 36, 36, [(6, 6, 30, 30, 0), (1, 1, 9, 9, 1)]),
        ("d", 30, 40, [(3, 4, 20, 36, 1)]),
    ],
}
FOLDER = {"train": "train", "val": "valid", "test": "test"}


def _image(path, width, height):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(width * height).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(pixels).save(path)


def _yolo_export(root, splits=("train", "val", "test")):
    """A Roboflow YOLO export of :data:`IMAGES`: ``<split>/images``, ``<split>/labels``."""
    for split in splits:
        for stem, width, height, boxes in IMAGES[split]:
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
    yaml = "".join(f"{s}: ../{FOLDER[s]}/images\n" for s in splits) + "names: [bolt, nut]\n"
    (root / "data.yaml").write_text(yaml)
    return root


def _voc(root):
    """A VOC2007 devkit of :data:`IMAGES`: trainval the train and val images, test the test."""
    year = root / "VOC2007"
    (year / "ImageSets" / "Main").mkdir(parents=True)
    (year / "Annotations").mkdir()
    for images in IMAGES.values():
        for stem, width, height, boxes in images:
            _image(year / "JPEGImages" / f"{stem}.jpg", width, height)
            write_voc_xml(year / "Annotations" / f"{stem}.xml", boxes, NAMES)
    (year / "ImageSets" / "Main" / "trainval.txt").write_text("a\nb\n")
    (year / "ImageSets" / "Main" / "test.txt").write_text("c\nd\n")
    return root


def _weights(path, names):
    """An untrained tiny-YOLOv3 for ``names`` at 64 px, its head recorded as training does."""
    head = HeadSpec(anchors=SMALL_ANCHORS, class_names=names, input_hw=(SIZE, SIZE))
    body = tiny_yolo_body(None, 3, len(names), input_shape=(SIZE, SIZE, 3))
    save_weights(body, str(path), head.to_metadata())
    return str(path)


def _run(weights, data, *flags):
    output = data.parent / "eval"
    argv = ["--weights", weights, "--data", str(data), "--output", str(output)]
    return evaluate_tool.main([*argv, "--gallery", "0", "--progress", "off", *flags]), output


def test_the_test_split_of_a_yolo_export_is_scored(tmp_path, capsys):
    root = _yolo_export(tmp_path / "rf")
    weights = _weights(tmp_path / "model.weights.h5", NAMES)
    code, output = _run(weights, root / "data.yaml", "--split", "test")
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "(yolo): the test split, 2 images" in out and "2 images; report in" in out
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["num_images"] == 2
    assert [c["class"] for c in metrics["voc"]["per_class"]] == NAMES
    assert metrics["coco"] is not None  # pycocotools ran
    # The split as scored: its own images, boxes in their original pixels.
    entries, rejects, _ = parse_annotations(output / "annotations.txt", num_classes=2)
    assert not rejects
    assert [e.path for e in entries] == [
        str(root / "test/images/c.jpg"),
        str(root / "test/images/d.jpg"),
    ]
    np.testing.assert_allclose(entries[0].boxes, [[6, 6, 30, 30], [1, 1, 9, 9]], atol=1e-9)
    np.testing.assert_array_equal(entries[0].classes, [0, 1])


def test_a_split_the_dataset_lacks_is_one_line(tmp_path, capsys):
    root = _yolo_export(tmp_path / "rf", splits=("train", "val"))
    weights = _weights(tmp_path / "model.weights.h5", NAMES)
    code, _ = _run(weights, root, "--split", "test")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --data {root} has no test split (it has: train, val); give --split train or val"
    ]
    assert _run(weights, root, "--split", "valid")[0] == 2
    assert "--split valid: a dataset's splits are train, val, test" in capsys.readouterr().err


def test_weights_for_another_class_count_are_refused(tmp_path, capsys):
    root = _yolo_export(tmp_path / "rf")
    weights = _weights(tmp_path / "model.weights.h5", ["bolt", "nut", "washer"])
    assert _run(weights, root / "data.yaml")[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "names 2 classes (bolt, nut) but" in err[0]
    assert "predicts 3 (bolt, nut, washer)" in err[0]


class _TruthDetector:
    """Answers each image with the true boxes of the :data:`IMAGES` entry of its size, class
    ids in ``class_names``' order: a stand-in for an exported model."""

    def __init__(self, class_names):
        self.class_names = class_names
        self.spec = types.SimpleNamespace(score_threshold=0.01)
        self.sizes = []

    def detect(self, images):
        found = []
        for image in images:
            height, width = image.shape[:2]
            self.sizes.append((width, height))
            (boxes,) = [b for i in IMAGES.values() for _, w, h, b in i if (w, h) == (width, height)]
            ids = [self.class_names.index(NAMES[c]) for *_, c in boxes]
            found.append(
                {
                    "boxes": np.asarray([b[:4] for b in boxes], np.float32).reshape(-1, 4),
                    "scores": np.full(len(boxes), 0.9, np.float32),
                    "classes": np.asarray(ids, np.int64),
                }
            )
        return found


@pytest.mark.parametrize("layout", ["yolo", "voc"])
def test_an_exported_model_scores_the_split_on_original_pixels(
    layout, tmp_path, monkeypatch, capsys
):
    """The VOC devkit names no class order: it takes the model's (here nut before bolt)."""
    data = _yolo_export(tmp_path / "rf") if layout == "yolo" else _voc(tmp_path / "VOCdevkit")
    model = tmp_path / "model.tflite"
    model.write_bytes(b"\0\0\0\0TFL3")  # what tells a TFLite file; the stand-in loads it
    detector = _TruthDetector(NAMES if layout == "yolo" else ["nut", "bolt"])
    monkeypatch.setattr(evaluate_tool, "load_detector", lambda path, **_: detector)
    code, output = _run(str(model), data, "--split", "test")
    assert code == 0, capsys.readouterr().err
    assert sorted(detector.sizes) == [(30, 40), (36, 36)]  # the test images, as they are
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["num_images"] == 2
    assert metrics["voc"]["mAP"] == pytest.approx(1.0)
    assert [c["class"] for c in metrics["voc"]["per_class"]] == detector.class_names


def test_other_names_for_as_many_classes_are_a_warning(tmp_path, monkeypatch, capsys):
    data = _yolo_export(tmp_path / "rf")
    model = tmp_path / "model.tflite"
    model.write_bytes(b"\0\0\0\0TFL3")
    monkeypatch.setattr(
        evaluate_tool, "load_detector", lambda path, **_: _TruthDetector(["bolt", "screw"])
    )
    monkeypatch.setattr(_TruthDetector, "detect", lambda self, images: [_empty() for _ in images])
    code, output = _run(str(model), data / "data.yaml", "--no-coco")
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "warning: --data" in out and "names its classes bolt, nut" in out
    assert "the exported model bolt, screw: scored by class id" in out
    assert json.loads((output / "metrics.json").read_text())["num_images"] == 1  # val: b


def _empty():
    return {
        "boxes": np.zeros((0, 4), np.float32),
        "scores": np.zeros(0, np.float32),
        "classes": np.zeros(0, np.int64),
    }
