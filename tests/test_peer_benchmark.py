"""The peer benchmark's own logic (benchmarks/peer.py), without Ultralytics: the dataset in
Ultralytics' layout, and our scoring of a detections file as peer_train.py writes it."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from benchmarks import peer
from yolo3.evaluation import metrics

CLASSES = ("square", "disc")


@pytest.fixture
def data(tmp_path):
    """Three images (100 wide x 50 high, 64 x 64, a 48 x 32 background) in train.txt and val.txt."""
    folder = tmp_path / "data"
    (folder / "images").mkdir(parents=True)
    for name, size in (("wide.png", (100, 50)), ("square.png", (64, 64)), ("empty.png", (48, 32))):
        Image.new("RGB", size, (90, 120, 30)).save(folder / "images" / name)
    lines = [
        # the second box runs past the right edge (x 120 > 100); the third is difficult
        "images/wide.png 10,5,30,25,1 80,30,120,50,0 0,0,10,10,1,1",
        "images/square.png 16,0,48,32,0",
        "images/empty.png",
    ]
    for split in ("train", "val"):
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    (folder / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return folder


def convert(data, work):
    return peer.convert_dataset(
        data / "train.txt", data / "val.txt", data / "classes.txt", work / "dataset"
    )


def test_labels_are_normalised_centre_and_size(data, tmp_path):
    dataset = convert(data, tmp_path)

    def labels(split, index):
        return (dataset.folder / "labels" / split / f"{index:06d}.txt").read_text().splitlines()

    assert labels("train", 0) == [
        "1 0.200000 0.300000 0.200000 0.400000",  # cx 20/100, cy 15/50, w 20/100, h 20/50
        "0 0.900000 0.800000 0.200000 0.400000",  # clipped to x 80..100: cx 90/100, w 20/100
    ]  # the difficult box left out of training, as our training leaves it out
    # kept for validation: cx 5/100, cy 5/50, w 10/100, h 10/50
    assert labels("val", 0)[2] == "1 0.050000 0.100000 0.100000 0.200000"
    assert labels("train", 1) == ["0 0.500000 0.250000 0.500000 0.500000"]  # 32 x 32 at (32, 16)
    assert labels("train", 2) == []  # the background image: an empty file
    assert dataset.images == {"train": 3, "val": 3} and dataset.skipped == {"train": [], "val": []}


def test_layout_links_the_original_images(data, tmp_path):
    dataset = convert(data, tmp_path)
    originals = [
        str((data / "images" / n).resolve()) for n in ("wide.png", "square.png", "empty.png")
    ]
    linked = sorted((dataset.folder / "images" / "val").iterdir())
    assert [p.name for p in linked] == ["000000.png", "000001.png", "000002.png"]
    assert [os.path.realpath(p) for p in linked] == originals
    assert dataset.val_images.read_text().splitlines() == originals
    described = json.loads(dataset.data_yaml.read_text())  # JSON is YAML
    assert described == {"path": str(dataset.folder), "train": "images/train",
                         "val": "images/val", "names": list(CLASSES)}  # fmt: skip
    cache = dataset.folder / "labels" / "train.cache"  # Ultralytics' label cache
    cache.write_text("stale")
    assert convert(data, tmp_path) == dataset and not cache.exists()


def truth_boxes():
    """val.txt's images in its order: ``(boxes, classes, difficult, (height, width))``."""
    return [
        ([[10, 5, 30, 25], [80, 30, 120, 50], [0, 0, 10, 10]], [1, 0, 1], [0, 0, 1], (50, 100)),
        ([[16, 0, 48, 32]], [0], [0], (64, 64)),
        ([], [], [], (32, 48)),
    ]


def write_detections(path, originals, shift_fraction):
    """A detections file of the ground truth, each box moved right by ``shift_fraction`` of its
    width, scores 0.9."""
    images = []
    for original, (boxes, classes, _, _) in zip(originals, truth_boxes()):
        boxes = np.asarray(boxes, float).reshape(-1, 4)
        boxes[:, [0, 2]] += shift_fraction * (boxes[:, 2:3] - boxes[:, 0:1])
        images.append({"path": original, "boxes": boxes.tolist(),
                       "scores": [0.9] * len(classes), "classes": classes})  # fmt: skip
    path.write_text(json.dumps({"train_seconds": 1.0, "epochs": 1, "images": images}))
    return images


def test_scores_the_ground_truth_perfectly(data, tmp_path):
    dataset = convert(data, tmp_path)
    originals = dataset.val_images.read_text().splitlines()
    write_detections(tmp_path / "detections.json", originals, 0.0)
    scored = peer.score_detections(
        tmp_path / "detections.json", data / "val.txt", data / "classes.txt"
    )
    by_iou = scored.pop(metrics.AP_BY_IOU)
    assert scored == pytest.approx({"AP": 1.0, "AP50": 1.0, "AP75": 1.0, "mAP50": 1.0})
    assert list(by_iou.values()) == pytest.approx([1.0] * 10)


def test_shifted_boxes_score_as_evaluate_coco_scores_them(data, tmp_path):
    dataset = convert(data, tmp_path)
    originals = dataset.val_images.read_text().splitlines()
    images = write_detections(tmp_path / "detections.json", originals, 0.1)
    scored = peer.score_detections(
        tmp_path / "detections.json", data / "val.txt", data / "classes.txt"
    )
    # Every box moved by a tenth of its width: IoU = 0.9 / 1.1 = 0.818, a match at the IoU
    # thresholds 0.50 ... 0.80 (7 of 10) and none above, so AP = 0.7; AP75 and mAP@0.5 stay 1.
    by_iou = scored.pop(metrics.AP_BY_IOU)
    assert scored == pytest.approx({"AP": 0.7, "AP50": 1.0, "AP75": 1.0, "mAP50": 1.0})
    assert list(by_iou.values()) == pytest.approx([1.0] * 7 + [0.0] * 3)
    truths = [
        {"boxes": np.reshape(b, (-1, 4)), "classes": np.asarray(c, int),
         "difficult": np.asarray(d, bool), "image_hw": hw}
        for b, c, d, hw in truth_boxes()
    ]  # fmt: skip
    found = [
        {"boxes": np.reshape(i["boxes"], (-1, 4)), "scores": np.asarray(i["scores"]),
         "classes": np.asarray(i["classes"], int)}
        for i in images
    ]  # fmt: skip
    direct = metrics.evaluate_coco(truths, found, num_classes=2, class_names=list(CLASSES))
    assert scored["AP"] == pytest.approx(direct["AP"])


def test_a_missing_or_extra_image_is_an_error(data, tmp_path):
    dataset = convert(data, tmp_path)
    originals = dataset.val_images.read_text().splitlines()
    path = tmp_path / "detections.json"
    write_detections(path, originals[:2], 0.0)
    with pytest.raises(ValueError, match="no detections entry for .*empty.png"):
        peer.score_detections(path, data / "val.txt", data / "classes.txt")
    images = write_detections(path, originals, 0.0)
    extra = {**images[0], "path": str(tmp_path / "other.png")}
    path.write_text(json.dumps({"images": [*images, extra]}))
    with pytest.raises(ValueError, match="1 images that .*val.txt does not keep"):
        peer.score_detections(path, data / "val.txt", data / "classes.txt")
