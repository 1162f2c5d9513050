"""Mosaic augmentation: boxes against the pixels, the keep rule, determinism, the records.

The renderer is checked on synthetic tiles whose colours say where every pixel came from:
each tile has a blue level of its own (kept exactly by a resize, which maps a constant to
itself) and each rectangle a colour of its own. ``yolo3 preprocess --mosaic`` is then run end
to end through ``main([...])`` on the rectangles of :mod:`test_preprocess`.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from record_sets import make_examples, write_record_set
from test_preprocess import KEEP_COLOURS, _read_set, _rectangles_dataset, _tree, _write_classes
from train_helpers import train_args, write_anchors

from yolo3.commands import preprocess as tool
from yolo3.commands import train as train_tool
from yolo3.data import pipeline, records
from yolo3.data.augment import AugmentConfig
from yolo3.data.image import PAD_VALUE
from yolo3.data.mosaic import MIN_SIDE, MIN_VISIBLE_FRACTION, kept_after_cut, random_mosaic

INPUT_HW = (128, 160)
# Each tile's blue level; none near the gray padding (128), so a pixel's blue names its tile.
TILE_BLUE = (0, 60, 200, 255)
RECT_RED_GREEN = ((255, 0), (0, 255))  # rectangle 0 and 1 of every tile
BACKGROUND_RED_GREEN = (120, 120)
TOLERANCE = 40
# Colour off (the HSV jitter is the identity, colours survive), and resize factors kept
# under ~3 so that one pixel inside an edge is past the bicubic blur of that edge.
NO_COLOUR = AugmentConfig(jitter=0.1, scale=(0.4, 1.6), hue=0.0, saturation=1.0, value=1.0)

# Tests of something else than the validation split keep every image in training.
NO_VAL = ["--val-fraction", "0"]


def _tile(index, rng):
    """An image of a uniform background with two solid rectangles, and their boxes."""
    height, width = (int(v) for v in rng.integers(96, 129, size=2))
    image = np.empty((height, width, 3), np.uint8)
    image[...] = (*BACKGROUND_RED_GREEN, TILE_BLUE[index])
    boxes = []
    for red_green in RECT_RED_GREEN:
        box_w, box_h = (int(v) for v in rng.integers(14, 40, size=2))
        x0, y0 = int(rng.integers(0, width - box_w)), int(rng.integers(0, height - box_h))
        image[y0 : y0 + box_h, x0 : x0 + box_w] = (*red_green, TILE_BLUE[index])
        boxes.append([x0, y0, x0 + box_w, y0 + box_h])
    return image, np.asarray(boxes, np.float64)


@pytest.fixture(scope="module")
def tiles():
    """4 tiles; their rectangles overlap in some seeds' draws, never in colour."""
    rng = np.random.default_rng(7)
    return [_tile(index, rng) for index in range(4)]


def _colour(tile, rectangle):
    return np.array([*RECT_RED_GREEN[rectangle], TILE_BLUE[tile]])


def _matches(pixels, colour):
    return np.all(np.abs(pixels.astype(int) - colour) <= TOLERANCE, axis=-1)


def _quarters(centre, input_hw):
    xc, yc = centre
    height, width = input_hw
    return [(0, 0, xc, yc), (xc, 0, width, yc), (0, yc, xc, height), (xc, yc, width, height)]


def _inner_edges(image, box):
    """The pixels of the outermost rows and columns lying wholly inside ``box`` shrunk by
    1 px (the bicubic blur of its edges), or None when nothing is left."""
    x0, y0, x1, y1 = box
    left, top = int(np.ceil(x0)) + 1, int(np.ceil(y0)) + 1
    right, bottom = int(np.floor(x1)) - 2, int(np.floor(y1)) - 2  # last indices
    if right < left or bottom < top:
        return None
    inner = image[top : bottom + 1, left : right + 1]
    return np.concatenate([inner[0], inner[-1], inner[:, 0], inner[:, -1]])


def _check_sample(sample, tiles):
    """Every box against the pixels, and each quarter holding only its own tile."""
    pixels = sample.pixels
    assert pixels.shape == (*INPUT_HW, 3) and pixels.dtype == np.uint8
    xc, yc = sample.centre
    assert INPUT_HW[1] // 4 <= xc <= 3 * INPUT_HW[1] // 4
    assert INPUT_HW[0] // 4 <= yc <= 3 * INPUT_HW[0] // 4
    # The quarters meet at the centre: a quarter holds its tile's blue or the gray, nothing
    # else, and some of its tile.
    for tile, (x0, y0, x1, y1) in enumerate(_quarters(sample.centre, INPUT_HW)):
        blue = pixels[y0:y1, x0:x1, 2].astype(int)
        assert np.all((np.abs(blue - TILE_BLUE[tile]) <= 2) | (blue == PAD_VALUE)), tile
        assert np.any(np.abs(blue - TILE_BLUE[tile]) <= 2), tile
    assert sample.boxes.shape == (8, 4) and sample.keep.shape == (8,)
    # Rows come tile by tile, rectangle by rectangle, as the tiles were given.
    np.testing.assert_array_equal(sample.tile, np.repeat(np.arange(4), 2))
    checked = 0
    for row, (box, kept, tile) in enumerate(zip(sample.boxes, sample.keep, sample.tile)):
        colour = _colour(tile, row % 2)
        x0, y0, x1, y1 = _quarters(sample.centre, INPUT_HW)[tile]
        assert x0 <= box[0] <= box[2] <= x1 and y0 <= box[1] <= box[3] <= y1, (row, box)
        # Every pixel of the rectangle's colour lies in its box (2 px of blur around it),
        # kept or dropped: no box is lost or misplaced.
        ys, xs = np.nonzero(_matches(pixels, colour))
        assert np.all((xs + 1 >= box[0] - 2) & (xs <= box[2] + 2)), (row, box)
        assert np.all((ys + 1 >= box[1] - 2) & (ys <= box[3] + 2)), (row, box)
        if not kept:
            continue
        assert box[2] - box[0] >= MIN_SIDE and box[3] - box[1] >= MIN_SIDE
        edges = _inner_edges(pixels, box)
        assert len(xs), (row, box)  # a kept box shows its rectangle
        if edges is not None:
            assert _matches(edges, colour).all(), (row, box, edges)
            checked += 1
    return checked


@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_boxes_follow_the_pixels_and_quarters_meet_at_the_centre(tiles, flip):
    config = dataclasses.replace(NO_COLOUR, flip=flip)
    checked = dropped = 0
    for seed in range(12):
        sample = random_mosaic(tiles, INPUT_HW, np.random.default_rng(seed), config)
        checked += _check_sample(sample, tiles)
        dropped += int(np.sum(~sample.keep))
    assert checked >= 40 and dropped >= 3  # both sides of the keep rule were exercised


def test_a_flip_mirrors_each_quarter_and_its_boxes(tiles):
    """The draws are the same with and without the flip, so the flipped mosaic is the plain
    one mirrored quarter by quarter: ``x -> x0 + x1 - x`` inside quarter ``[x0, x1)``."""
    plain_config = dataclasses.replace(NO_COLOUR, flip=0.0)
    flip_config = dataclasses.replace(NO_COLOUR, flip=1.0)
    for seed in range(3):
        plain = random_mosaic(tiles, INPUT_HW, np.random.default_rng(seed), plain_config)
        flipped = random_mosaic(tiles, INPUT_HW, np.random.default_rng(seed), flip_config)
        assert plain.centre == flipped.centre
        for tile, (x0, y0, x1, y1) in enumerate(_quarters(plain.centre, INPUT_HW)):
            np.testing.assert_array_equal(
                flipped.pixels[y0:y1, x0:x1], plain.pixels[y0:y1, x0:x1][:, ::-1]
            )
            rows = plain.tile == tile
            mirrored = plain.boxes[rows][:, [2, 1, 0, 3]] * (-1, 1, -1, 1)
            mirrored += (x0 + x1, 0, x0 + x1, 0)
            np.testing.assert_allclose(flipped.boxes[rows], mirrored, atol=1e-4)
        np.testing.assert_array_equal(flipped.keep, plain.keep)


def test_keep_rule_by_hand():
    # A 10 x 10 box (area 100) cut to 2.5 x 10 keeps 25 % (kept), to 1.5 x 10 15 % (dropped);
    # cut to 10 x 1.9 it keeps 19 % and is under MIN_SIDE high (dropped); a whole 1.5 x 20
    # box is under MIN_SIDE wide (dropped); a whole 2 x 2 box is kept.
    assert MIN_VISIBLE_FRACTION == 0.2 and MIN_SIDE == 2.0
    boxes = [[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [5, 0, 6.5, 20], [3, 3, 5, 5]]
    clipped = [[7.5, 0, 10, 10], [8.5, 0, 10, 10], [0, 8.1, 10, 10], [5, 0, 6.5, 20], [3, 3, 5, 5]]
    np.testing.assert_array_equal(
        kept_after_cut(np.array(boxes), np.array(clipped)), [True, False, False, False, True]
    )
    # 4 x 10 of a 20 x 10 box keeps exactly 20 %: kept.
    assert kept_after_cut(np.array([[0, 0, 20, 10]]), np.array([[16, 0, 20, 10]])).tolist() == [
        True
    ]


def test_same_seed_same_mosaic(tiles):
    def render(seed):
        sample = random_mosaic(tiles, INPUT_HW, np.random.default_rng(seed))
        return sample.pixels.tobytes() + sample.boxes.tobytes() + sample.keep.tobytes()

    assert render(3) == render(3)
    assert render(3) != render(4)


def test_wrong_number_of_tiles_names_it(tiles):
    with pytest.raises(ValueError, match="a mosaic takes 4 .* got 3"):
        random_mosaic(tiles[:3], INPUT_HW, np.random.default_rng(0))


# --- yolo3 preprocess --mosaic --------------------------------------------------------------

SIZE = 64


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 images with one solid box each: ``(annotations, classes)``."""
    folder = tmp_path_factory.mktemp("mosaic")
    annotations, _ = _rectangles_dataset(folder / "images", 8, np.random.default_rng(3))
    return annotations, _write_classes(folder)


def _argv(dataset, output, *extra):
    annotations, classes = dataset
    argv = ["--annotations", annotations, "--classes", classes, "--output", str(output)]
    return [*argv, "--input-size", str(SIZE), "--workers", "1", "--quiet", *NO_VAL, *extra]


def _shard_bytes(directory):
    return {name: data for name, data in _tree(directory).items() if name.endswith(".tfrecord")}


def test_mosaic_zero_changes_nothing_and_plain_copies_keep_their_draws(dataset, tmp_path):
    argv = ["--copies", "2", "--num-shards", "2", "--format", "raw"]
    assert tool.main(_argv(dataset, tmp_path / "without", *argv)) == 0
    assert tool.main(_argv(dataset, tmp_path / "zero", *argv, "--mosaic", "0")) == 0
    assert _tree(tmp_path / "without") == _tree(tmp_path / "zero")
    manifest = records.read_manifest(str(tmp_path / "zero"))
    assert "mosaic" not in manifest and "mosaic_records" not in manifest["splits"]["train"]

    # Half the copies mosaics: the decision has its own generator, so every record that is
    # not a mosaic is byte for byte the one of the run without mosaics, at the same place.
    assert tool.main(_argv(dataset, tmp_path / "half", *argv, "--mosaic", "0.5")) == 0
    plain, half = _shard_bytes(tmp_path / "zero"), _shard_bytes(tmp_path / "half")
    assert sorted(plain) == sorted(half)
    kinds = set()
    for name in plain:
        path_plain, path_half = (str(d / name) for d in (tmp_path / "zero", tmp_path / "half"))
        for a, b in zip(records.read_shard(path_plain), records.read_shard(path_half), strict=True):
            record = records.parse_example_numpy(b.numpy())
            kinds.add((record["copy"] > 0, record["mosaic"]))
            if not record["mosaic"]:
                assert a.numpy() == b.numpy()
                # No feature at all, as records were before it: older sets keep their bytes.
                assert "mosaic" not in tf.train.Example.FromString(b.numpy()).features.feature
    assert kinds == {(False, 0), (True, 0), (True, 1)}


def test_preprocess_writes_mosaic_records_end_to_end(dataset, tmp_path, capsys):
    output = tmp_path / "out"
    argv = ["--copies", "2", "--val-fraction", "0.25", *KEEP_COLOURS]
    assert tool.main(_argv(dataset, output, *argv, "--mosaic", "1")) == 0
    summary = capsys.readouterr().out
    manifest, decoded = _read_set(output)
    train, val = decoded["train"], decoded["val"]
    assert manifest["source_images"] == {"train": 6, "val": 2}
    assert manifest["mosaic"] == 1.0
    # Every augmented training copy is a mosaic: 6 images x 2 copies.
    assert manifest["splits"]["train"]["mosaic_records"] == 12
    assert manifest["counts"]["mosaic_records"] == 12
    assert "mosaic_records" not in manifest["splits"]["val"]
    assert "6 images -> 18 records (12 mosaics)" in summary and "mosaic_records=12" in summary
    record_set = records.open_record_set(str(output))
    assert record_set.num_mosaic_records("train") == 12
    assert record_set.num_mosaic_records("val") == 0
    assert (
        sorted((r["copy"], r["mosaic"]) for r in train)
        == [(0, 0)] * 6 + [(1, 1)] * 6 + [(2, 1)] * 6
    )
    assert all(r["mosaic"] == 0 and r["copy"] == 0 for r in val)
    train_sources = {r["source"] for r in train if r["copy"] == 0}
    assert {r["source"] for r in train if r["mosaic"]} == train_sources
    # Each image has one box, so a mosaic starts from 4: each is stored or counted.
    dropped = manifest["counts"].get("boxes_dropped_mosaic", 0)
    stored = sum(len(r["boxes"]) for r in train if r["mosaic"])
    assert stored + dropped == 4 * 12 and stored > 0
    assert "boxes_dropped_mosaic" in summary or dropped == 0
    for record in train:
        boxes = record["boxes"]
        assert ((boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)).all()
        assert (boxes >= 0).all() and (boxes[:, [0, 2]] <= SIZE).all()
    assert tool.main(["--verify", str(output)]) == 0

    # TensorFlow's parser reads the flag, and is_mosaic (the pipeline's filter) agrees.
    paths = records.shard_paths(str(output), manifest, "train")
    parsed = tf.data.TFRecordDataset(paths).map(
        lambda s: (records.parse_example(s, "jpeg")["mosaic"], records.is_mosaic(s))
    )
    flags = [(int(m), bool(is_mosaic)) for m, is_mosaic in parsed]
    numpy_flags = [
        records.parse_example_numpy(s.numpy())["mosaic"] for s in tf.data.TFRecordDataset(paths)
    ]
    assert [m for m, _ in flags] == numpy_flags and sum(numpy_flags) == 12
    assert all(is_mosaic == bool(m) for m, is_mosaic in flags)

    # A resumed run with another --mosaic is refused, naming it.
    assert tool.main(_argv(dataset, output, *argv, "--mosaic", "0.5")) == 2
    assert "different mosaic" in capsys.readouterr().err

    # The training pipeline's filter (--close-mosaic): with its switch off, no mosaic
    # passes; on, every record.
    switch = tf.Variable(False)
    options = dict(
        batch_size=1, training=False, targets=False, mosaic=switch,
    )  # fmt: skip
    assert sum(1 for _ in pipeline.make_dataset(str(output), "train", **options)) == 6
    switch.assign(True)
    assert sum(1 for _ in pipeline.make_dataset(str(output), "train", **options)) == 18

    # A run with --close-mosaic 1 reads them in its first epoch and not in its second.
    anchors = write_anchors(tmp_path / "anchors.txt")
    run = train_args(output, tmp_path / "run", anchors, "--epochs", "2", "--steps-per-epoch",
                     "1", "--close-mosaic", "1", "--progress", "lines")  # fmt: skip
    assert train_tool.main(run) == 0
    assert "epoch 2: no mosaic records from here on (--close-mosaic 1)" in capsys.readouterr().out


def test_record_sets_written_without_the_flag_read_mosaic_zero(tmp_path):
    examples = make_examples(np.random.default_rng(0), 3)
    directory = write_record_set(tmp_path, {"train": examples}, num_shards=1)
    record_set = records.open_record_set(directory)
    assert record_set.num_mosaic_records("train") == 0
    (path,) = record_set.shard_paths("train")
    for serialized in records.read_shard(path):
        assert records.parse_example(serialized, "raw")["mosaic"].numpy() == 0
        assert not records.is_mosaic(serialized).numpy()
        assert records.parse_example_numpy(serialized.numpy())["mosaic"] == 0


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_bad_mosaic_values_give_one_line_naming_the_flag(dataset, tmp_path, capsys, value):
    assert tool.main(_argv(dataset, tmp_path / "out", "--mosaic", value)) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--mosaic" in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()


def test_mosaic_with_fewer_than_four_training_images_is_refused(dataset, tmp_path, capsys):
    annotations, classes = dataset
    three = tmp_path / "three.txt"
    lines = open(annotations).read().splitlines()[:3]
    three.write_text("".join(f"{line}\n" for line in lines))
    argv = ["--annotations", str(three), "--classes", classes, "--output", str(tmp_path / "o")]
    argv += ["--image-root", str(Path(annotations).parent), "--input-size", str(SIZE), "--quiet"]
    argv += ["--val-fraction", "0"]
    assert tool.main([*argv, "--mosaic", "0.5"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "--mosaic 0.5: a mosaic takes 4 images and the training split has 3" in error
    assert not (tmp_path / "o").exists()


def test_output_is_the_same_for_any_number_of_workers_and_bad_partners_stay_gray(dataset, tmp_path):
    """Partners are chosen in the main process; a worker renders what its task names. An
    image that cannot be read is rejected once, on its own line, and is a gray quarter in the
    mosaics that drew it."""
    annotations, classes = dataset
    lines = Path(annotations).read_text()
    with_missing = Path(annotations).parent / "with-missing.txt"
    with_missing.write_text(lines + "missing.png 1,1,9,9,0\n")
    argv = ["--annotations", str(with_missing), "--classes", classes, "--quiet", *NO_VAL]
    argv += ["--input-size", str(SIZE), "--copies", "2", "--mosaic", "1", "--num-shards", "2"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert tool.main([*argv, "--output", str(one), "--workers", "1"]) == 0
    assert tool.main([*argv, "--output", str(two), "--workers", "2"]) == 0
    assert _tree(one) == _tree(two)
    manifest = records.read_manifest(str(one))
    assert manifest["rejects"] == {"missing_image": 1}
    assert manifest["splits"]["train"]["mosaic_records"] == 8 * 2
    # 9 images, 16 mosaics of 3 partners each drawn from the 8 others: the missing one is
    # drawn 16 * 3 / 8 = 6 times on average, and this seed draws it.
    assert manifest["counts"]["mosaic_partners_unreadable"] > 0
