"""Data set hygiene: the rare-class filter and the deterministic validation split."""

import logging

import numpy as np
import pytest

from yolo3.data.annotations import Entry
from yolo3.data.hygiene import drop_rare_classes, split_validation


def entry(path, classes, boxes=None):
    classes = np.asarray(classes, np.int64)
    if boxes is None:
        boxes = [[i, i, i + 10, i + 10] for i in range(len(classes))]
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return Entry(path=path, boxes=boxes, classes=classes, source="a.txt", line=1)


def test_drop_rare_classes_by_hand():
    names = ["a", "b", "c", "d"]
    entries = [
        entry("1.jpg", [0, 1]),
        entry("2.jpg", [0, 2, 2]),
        entry("3.jpg", [3]),
        entry("4.jpg", [2]),
        entry("5.jpg", []),
    ]
    # images per class: a 2, b 1, c 2, d 1 -> with min_images=2, b and d go; c becomes 1.
    kept, kept_names, report = drop_rare_classes(entries, names, 2)
    assert kept_names == ["a", "c"]
    assert [e.classes.tolist() for e in kept] == [[0], [0, 1, 1], [], [1], []]
    np.testing.assert_array_equal(kept[0].boxes, entries[0].boxes[:1])
    np.testing.assert_array_equal(kept[1].boxes, entries[1].boxes)
    assert kept[2].boxes.shape == (0, 4) and kept[2].path == "3.jpg"
    assert report == {
        "dropped": [
            {"class_id": 1, "name": "b", "images": 1},
            {"class_id": 3, "name": "d", "images": 1},
        ],
        "boxes_removed": 2,
        "images_left_empty": 1,
    }
    same, same_names, same_report = drop_rare_classes(entries, names, 1)
    assert same_names == names and same_report["boxes_removed"] == 0
    assert [e.classes.tolist() for e in same] == [e.classes.tolist() for e in entries]


def test_drop_rare_classes_refuses_ids_beyond_the_names():
    with pytest.raises(ValueError, match="class id 4, but there are 2 class names"):
        drop_rare_classes([entry("1.jpg", [4])], ["a", "b"], 1)


def _dataset(num_images=60, num_classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return [
        entry(f"img{i}.jpg", rng.integers(num_classes, size=rng.integers(0, 4)))
        for i in range(num_images)
    ]


def test_fraction_split_is_deterministic_disjoint_and_ordered():
    entries = _dataset()
    train, val = split_validation(entries, fraction=0.25, seed=3)
    assert len(val) == 15 and len(train) == 45
    assert {e.path for e in train}.isdisjoint(e.path for e in val)
    # Each side keeps the original order.
    assert [e.path for e in train] == [e.path for e in entries if e in train]
    assert [e.path for e in val] == [e.path for e in entries if e in val]
    again = split_validation(entries, fraction=0.25, seed=3)
    assert [e.path for e in again[1]] == [e.path for e in val]
    other = split_validation(entries, fraction=0.25, seed=4)
    assert {e.path for e in other[1]} != {e.path for e in val}
    # An image's side depends on its path and the seed, not on the file order.
    _, reversed_val = split_validation(entries[::-1], fraction=0.25, seed=3)
    assert {e.path for e in reversed_val} == {e.path for e in val}


def test_duplicate_paths_stay_on_one_side():
    entries = _dataset(20)
    entries += [entry(e.path, [0]) for e in entries]
    for seed in range(5):
        train, val = split_validation(entries, fraction=0.5, seed=seed)
        assert {e.path for e in train}.isdisjoint(e.path for e in val)
        assert len(train) + len(val) == 40 and len(val) % 2 == 0


def test_per_class_split_serves_every_class_and_keeps_training_images(caplog):
    entries = _dataset(80, num_classes=6, seed=1)
    entries.append(entry("rare_a.jpg", [6]))
    entries.append(entry("rare_b.jpg", [6, 0]))
    entries.append(entry("single.jpg", [7]))  # one image: it must stay in training
    with caplog.at_level(logging.WARNING, logger="yolo3.data.annotations"):
        train, val = split_validation(entries, per_class=3, seed=0)
    assert {e.path for e in train}.isdisjoint(e.path for e in val)
    assert len(train) + len(val) == len(entries)

    def images_with(split, class_id):
        return sum(class_id in e.classes for e in split)

    for class_id in range(6):
        assert images_with(val, class_id) >= 3
        assert images_with(train, class_id) >= 1
    # Class 6 has 2 images: 1 goes to validation, 1 stays; class 7 stays in training.
    assert (images_with(val, 6), images_with(train, 6)) == (1, 1)
    assert (images_with(val, 7), images_with(train, 7)) == (0, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "class 6 is in 2 images; 1 go to validation (asked for 3) so that training keeps at "
        "least one",
        "class 7 is in 1 images; 0 go to validation (asked for 3) so that training keeps at "
        "least one",
    ]
    again = split_validation(entries, per_class=3, seed=0)
    assert [e.path for e in again[1]] == [e.path for e in val]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of"),
        ({"fraction": 0.1, "per_class": 1}, "exactly one of"),
        ({"fraction": 1.0}, "fraction is 1.0"),
        ({"per_class": 0}, "per_class is 0"),
    ],
)
def test_split_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        split_validation(_dataset(10), **kwargs)


def test_split_needs_two_images():
    with pytest.raises(ValueError, match="1 distinct images cannot be split"):
        split_validation([entry("a.jpg", [0]), entry("a.jpg", [1])], fraction=0.5)
