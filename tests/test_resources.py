"""Anchors and classes files: the shipped ones parse, bad ones are refused with a clear error."""

import numpy as np
import pytest

from yolo3.model.resources import (
    default_anchor_masks,
    parse_anchors,
    read_anchors,
    read_classes,
)


def test_shipped_files():
    anchors = read_anchors("model_data/yolo_anchors.txt")
    assert anchors.shape == (9, 2)
    np.testing.assert_array_equal(anchors[0], [10, 13])
    np.testing.assert_array_equal(anchors[-1], [373, 326])
    tiny = read_anchors("model_data/tiny_yolo_anchors.txt")
    assert tiny.shape == (6, 2)
    np.testing.assert_array_equal(tiny[-1], [344, 319])
    coco = read_classes("model_data/coco_classes.txt")
    voc = read_classes("model_data/voc_classes.txt")
    assert (len(coco), len(voc)) == (80, 20)
    assert coco[0] == "person" and coco[-1] == "toothbrush" and "traffic light" in coco
    assert voc[0] == "aeroplane" and voc[-1] == "tvmonitor"


def test_masks_cover_every_anchor_once():
    for count in (6, 9):
        masks = default_anchor_masks(count)
        assert sorted(i for mask in masks for i in mask) == list(range(count))


@pytest.mark.parametrize("pairs", [1, 5, 7, 8, 10])
def test_anchor_count_other_than_6_or_9_is_an_error(tmp_path, pairs):
    path = tmp_path / "anchors.txt"
    path.write_text(", ".join(f"{10 + i},{12 + i}" for i in range(pairs)))
    with pytest.raises(ValueError, match=f"anchors.txt has {pairs} pairs; expected 6 .* or 9"):
        read_anchors(path)


@pytest.mark.parametrize(
    "text, message",
    [("10,13, 16", "not a whole number of w,h pairs"), ("10,13, x,30", "'x' is not a number")],
)
def test_malformed_anchors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_anchors(text)


def test_non_positive_anchor():
    with pytest.raises(ValueError, match="must be positive"):
        parse_anchors(",".join(["10,13"] * 5 + ["0,4"]))


def test_empty_classes_file(tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match="classes.txt is empty"):
        read_classes(path)


def test_duplicate_class_names(tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("cat\ndog\ncat\n")
    with pytest.raises(ValueError, match=r"repeats \['cat'\]"):
        read_classes(path)


def test_darknet_weights_given_to_the_keras_loader(tmp_path):
    from yolo3.checkpoint.weights import load_weights
    from yolo3.model.network import build_model

    path = tmp_path / "yolov3.weights"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a Keras weights file.*yolo3 convert"):
        load_weights(build_model("tiny", 2), str(path))
