"""The demo data set generator: deterministic files, exact boxes, a parseable annotation set."""

from pathlib import Path

import numpy as np
import pytest
from helpers import load_tool
from PIL import Image

from yolo3.data import synthetic
from yolo3.data.annotations import parse_annotations
from yolo3.model.resources import read_classes

SIZE = (96, 128)  # height, width: not square, so a swapped axis shows
make_demo_dataset = load_tool("make_demo_dataset")


def _generate(folder, *extra, train=40, val=12, seed=3):
    argv = ["--output", str(folder), "--train", str(train), "--val", str(val)]
    argv += ["--seed", str(seed), "--size", f"{SIZE[0]}x{SIZE[1]}", *extra]
    assert make_demo_dataset.main(argv) == 0
    return folder


def _files(folder):
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("demo"))


def _entries(folder, split):
    entries, rejects, counts = parse_annotations(
        folder / f"{split}.txt", num_classes=len(synthetic.DEMO_CLASS_NAMES)
    )
    return entries, rejects, counts


def test_same_seed_writes_identical_bytes(dataset, tmp_path):
    again = _generate(tmp_path / "again")
    files = _files(dataset)
    assert files == _files(again)
    # 40 + 12 images and the three text files, nothing else.
    assert len(files) == 40 + 12 + 3
    other = _files(_generate(tmp_path / "other", seed=4))
    assert other.keys() == files.keys()
    assert other["train.txt"] != files["train.txt"]


def test_an_image_depends_on_seed_split_and_index_only(dataset, tmp_path):
    smaller = _files(_generate(tmp_path / "smaller", train=25, val=3))
    files = _files(dataset)
    for name, data in smaller.items():
        if name.startswith("images/"):
            assert files[name] == data, name
    assert (
        files["train.txt"].decode().splitlines()[:25]
        == smaller["train.txt"].decode().split("\n")[:25]
    )


def test_annotations_parse_without_rejects(dataset):
    assert read_classes(dataset / "classes.txt") == list(synthetic.DEMO_CLASS_NAMES)
    for split, count in (("train", 40), ("val", 12)):
        entries, rejects, counts = _entries(dataset, split)
        assert rejects == []
        assert counts["images"] == count
        text = (dataset / f"{split}.txt").read_text()
        for entry, line in zip(entries, text.splitlines()):
            # Paths are written relative to the annotation file's folder.
            assert line.startswith(f"images/{split}/")
            assert Path(entry.path).is_file()
            with Image.open(entry.path) as image:
                assert image.format == "PNG" and image.mode == "RGB"
                assert image.size == (SIZE[1], SIZE[0])
            assert np.all(entry.boxes[:, :2] >= 0)
            assert np.all(entry.boxes[:, 2] <= SIZE[1]) and np.all(entry.boxes[:, 3] <= SIZE[0])
            assert np.all(entry.boxes == np.round(entry.boxes))  # whole pixel edges
    train, _, counts = _entries(dataset, "train")
    # empty_fraction 0.1 of 40 images: some are empty, most are not.
    assert 0 < counts["background_images"] < 20
    classes = np.concatenate([entry.classes for entry in train])
    assert set(classes.tolist()) == set(range(len(synthetic.DEMO_CLASS_NAMES)))


def test_top_shape_colour_touches_all_four_box_edges(dataset):
    # The last box of a line is the shape drawn last, so it is wholly visible. Its flat
    # colour is the most frequent exact RGB value in its box (the background is noisy).
    # An exact box has that colour on each of its four edges and none just outside them.
    checked = 0
    for split in ("train", "val"):
        for entry in _entries(dataset, split)[0]:
            if not len(entry.boxes):
                continue
            image = np.asarray(Image.open(entry.path).convert("RGB"))
            x0, y0, x1, y1 = entry.boxes[-1].astype(int)
            inside = image[y0:y1, x0:x1]
            values, counts = np.unique(inside.reshape(-1, 3), axis=0, return_counts=True)
            shape = np.all(inside == values[np.argmax(counts)], axis=-1)
            assert shape[0].any() and shape[-1].any(), entry.path
            assert shape[:, 0].any() and shape[:, -1].any(), entry.path
            padded = np.pad(image, ((1, 1), (1, 1), (0, 0)))
            ring = np.all(padded[y0 : y1 + 2, x0 : x1 + 2] == values[np.argmax(counts)], axis=-1)
            ring[1:-1, 1:-1] = False
            assert not ring.any(), entry.path
            checked += 1
    assert checked > 30


def test_scenes_match_files_and_every_box_is_its_shapes_extent(dataset):
    config = synthetic.SceneConfig(size=SIZE)
    occluded = 0
    for split, count in (("train", 40), ("val", 12)):
        entries = _entries(dataset, split)[0]
        for index in range(count):
            scene = synthetic.draw_scene(synthetic.scene_rng(3, split, index), config)
            image = np.asarray(Image.open(entries[index].path).convert("RGB"))
            np.testing.assert_array_equal(image, scene.image)
            np.testing.assert_array_equal(entries[index].boxes, scene.boxes)
            np.testing.assert_array_equal(entries[index].classes, scene.classes)
            for box, mask, shown, colour in zip(
                scene.boxes, scene.masks, scene.visible, scene.colours
            ):
                rows, columns = np.nonzero(mask)
                assert box.tolist() == [
                    columns.min(),
                    rows.min(),
                    columns.max() + 1,
                    rows.max() + 1,
                ]
                assert np.all(image[shown] == colour)
                assert shown.sum() >= config.min_visible * mask.sum()
                occluded += shown.sum() < mask.sum()
    assert occluded > 0  # partial occlusion does happen


def test_every_class_draws_and_no_occlusion_when_asked():
    config = synthetic.SceneConfig(size=(64, 64), min_visible=1.0, max_objects=6)
    seen = set()
    for index in range(30):
        scene = synthetic.draw_scene(np.random.default_rng(index), config)
        np.testing.assert_array_equal(scene.visible, scene.masks)
        seen.update(scene.classes.tolist())
    assert seen == set(range(len(synthetic.DEMO_CLASS_NAMES)))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "8"], "image size 8x8 is too small"),
        (["--object-size", "0.6", "0.3"], "min_side 0.6 and max_side 0.3"),
        (["--train", "-1"], "train image count is -1"),
        (["--val", "-2"], "val image count is -2"),
    ],
)
def test_bad_arguments_are_refused_before_writing(tmp_path, capsys, argv, message):
    assert make_demo_dataset.main(["--output", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_size_text_is_a_usage_error(tmp_path, capsys):
    assert make_demo_dataset.main(["--output", str(tmp_path), "--size", "big"]) == 2
    assert "use 96 or HEIGHTxWIDTH" in capsys.readouterr().err
