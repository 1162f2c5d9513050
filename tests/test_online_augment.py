"""Online augmentation (yolo3.data.online): boxes follow the pixels, the colour change is the
offline one's, boxes pushed out are dropped, and the pipeline applies it by seed."""

import re

import numpy as np
import pytest
import tensorflow as tf
from record_sets import make_examples, write_record_set

from yolo3.data import augment as offline
from yolo3.data import online
from yolo3.data import pipeline as data
from yolo3.data.image import PAD_VALUE
from yolo3.engine.config import TrainConfig

SIZE = 96
RED = (220, 20, 20)


def _red_square_image(box):
    image = np.full((SIZE, SIZE, 3), PAD_VALUE, np.uint8)
    x0, y0, x1, y1 = box
    image[y0:y1, x0:x1] = RED
    return image


def _red_extent(image):
    """(x_min, y_min, x_max, y_max) pixel edges of the red pixels."""
    red = (image[..., 0] > 170) & (image[..., 1] < 80)
    ys, xs = np.nonzero(red)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_boxes_move_with_the_pixels():
    box = (30, 20, 70, 40)
    image = _red_square_image(box)
    config = online.OnlineAugment(scale=0.5, translate=0.1)
    draws = tf.constant([0.75, 0.75, 0.25] + [0.5] * 5)
    moved, boxes = online.transform(image, np.array([[*box, 1]], np.float32), draws, config)
    # By hand: s = 1 - 0.5 + 2 * 0.5 * 0.75 = 1.25, shifts +-(0.5 * 0.1 * 96) = +-4.8, about
    # the centre 48: x -> 1.25 (x - 48) + 52.8, y -> 1.25 (y - 48) + 43.2.
    expected = [30.3, 8.2, 80.3, 33.2, 1.0]
    np.testing.assert_allclose(boxes.numpy(), [expected], atol=1e-4)
    # The red pixels land where the box says, to within the resampling's blur of a pixel.
    np.testing.assert_allclose(_red_extent(moved.numpy()), expected[:4], atol=1.0)
    assert moved.dtype == tf.uint8 and moved.shape == image.shape


def test_a_box_pushed_mostly_out_is_dropped():
    boxes = np.array([[0, 10, 20, 30, 0], [40, 40, 60, 60, 1]], np.float32)
    config = online.OnlineAugment(translate=0.2)
    # Shift left by 0.2 * 96 = 19.2 px: the first box keeps 0.8 of its 20 px width (4%,
    # under MIN_VISIBLE), the second moves whole.
    draws = tf.constant([0.5, 0.0, 0.5] + [0.5] * 5)
    _, kept = online.transform(_red_square_image((0, 0, 1, 1)), boxes, draws, config)
    np.testing.assert_allclose(kept.numpy(), [[20.8, 40, 40.8, 60, 1]], atol=1e-4)
    # Shift left by 14 px: 0.3 of the first box's width (6 of 20 px) stays: kept, clipped.
    draws = tf.constant([0.5, (1 - 14 / 19.2) / 2, 0.5] + [0.5] * 5)
    _, kept = online.transform(_red_square_image((0, 0, 1, 1)), boxes, draws, config)
    np.testing.assert_allclose(kept.numpy(), [[0, 10, 6, 30, 0], [26, 40, 46, 60, 1]], atol=1e-3)


def test_the_colour_change_is_the_offline_one():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    config = online.OnlineAugment(hue=0.1, saturation=1.5, value=1.5)
    # hue shift (2 * 0.75 - 1) * 0.1 = 0.05; saturation up: 1 + 0.5 * 0.5 = 1.25; value
    # down: 1 / (1 + 0.2 * 0.5) = 1 / 1.1.
    draws = tf.constant([0.5, 0.5, 0.5, 0.75, 0.25, 0.5, 0.75, 0.2])
    changed, _ = online.transform(image, np.zeros((0, 5), np.float32), draws, config)
    expected = offline.jitter_hsv(image, 0.05, 1.25, 1 / 1.1)
    difference = np.abs(changed.numpy().astype(int) - expected.astype(int))
    assert difference.max() <= 1  # rounding of two float32 conversions


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    examples = make_examples(np.random.default_rng(5), 8, 64)
    return write_record_set(tmp_path_factory.mktemp("online"), {"train": examples})


def _batches(record_set, config, seed=0):
    dataset = data.make_dataset(
        record_set, batch_size=8, targets=False, repeat=False, seed=seed, online=config
    )
    return [tuple(part.numpy() for part in batch) for batch in dataset]


def test_the_pipeline_applies_it_by_seed(record_set):
    plain = _batches(record_set, None)
    # The defaults change nothing: the same batches as without it.
    for a, b in zip(plain, _batches(record_set, online.OnlineAugment()), strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    config = online.OnlineAugment(scale=0.3, translate=0.1, hue=0.02, saturation=1.5)
    first, again = _batches(record_set, config), _batches(record_set, config)
    assert not np.array_equal(first[0][0], plain[0][0])
    for a, b in zip(first, again, strict=True):  # the same seed, the same batches
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(_batches(record_set, config, seed=1)[0][0], first[0][0])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"scale_jitter": 1.0}, "--scale-jitter must be in [0, 1)"),
        ({"translate_jitter": -0.1}, "--translate-jitter must be in [0, 1)"),
        ({"hue_jitter": 0.6}, "--hue-jitter must be in [0, 0.5]"),
        ({"saturation_jitter": 0.5}, "--saturation-jitter must be >= 1 (1: off)"),
    ],
)
def test_out_of_range_flags_are_named(flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainConfig(records="r", log_dir="l", **flags)
