"""Offline augmentation: boxes follow the pixels, the original geometry, HSV numerics."""

import colorsys
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from yolo3.data.augment import (
    NUM_DRAWS,
    AugmentConfig,
    clip_boxes,
    hsv_to_rgb,
    jitter_hsv,
    letterbox,
    random_augment,
    rgb_to_hsv,
)
from yolo3.data.image import PAD_VALUE, letterbox_image

ROOT = Path(__file__).resolve().parents[1]
NO_COLOUR = AugmentConfig(hue=0.0, saturation=1.0, value=1.0)

# Saturated colours that neither the noisy background (channels in [60, 200]), the gray padding
# nor a blend of either with another rectangle can come within COLOUR_TOLERANCE of.
RECT_COLOURS = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8)
RECT_BOXES = np.array(
    [[40, 30, 140, 130], [300, 40, 420, 110], [480, 200, 600, 400], [120, 260, 260, 450]],
    np.float64,
)
COLOUR_TOLERANCE = 40


def _scene(seed=0, height=480, width=640):
    rng = np.random.default_rng(seed)
    image = rng.integers(60, 201, (height, width, 3), dtype=np.uint8)
    for colour, (x0, y0, x1, y1) in zip(RECT_COLOURS, RECT_BOXES.astype(int)):
        image[y0:y1, x0:x1] = colour
    return image


def _matches(pixels, colour):
    return np.all(np.abs(pixels.astype(int) - colour) <= COLOUR_TOLERANCE, axis=-1)


def _reference_sample(image, boxes, input_hw, draws, config):
    """The original get_random_data geometry, restated: full resize, PIL paste, flip, clip."""
    image_h, image_w = image.shape[:2]
    input_h, input_w = input_hw

    def rand(u, low, high):
        return low + u * (high - low)

    jitter = config.jitter
    new_ar = image_w / image_h * rand(draws[0], 1 - jitter, 1 + jitter)
    new_ar /= rand(draws[1], 1 - jitter, 1 + jitter)
    scale = rand(draws[2], *config.scale)
    if new_ar < 1:
        new_h = int(scale * input_h)
        new_w = int(new_h * new_ar)
    else:
        new_w = int(scale * input_w)
        new_h = int(new_w / new_ar)
    dx = int(rand(draws[3], 0, input_w - new_w))
    dy = int(rand(draws[4], 0, input_h - new_h))
    # Horizontal pass, then vertical, as the module resizes (the order changes rounding).
    resized = Image.fromarray(image).resize((new_w, image_h), Image.BICUBIC)
    resized = resized.resize((new_w, new_h), Image.BICUBIC)
    canvas = Image.new("RGB", (input_w, input_h), (PAD_VALUE,) * 3)
    canvas.paste(resized, (dx, dy))
    pixels = np.asarray(canvas)
    boxes = np.array(boxes, np.float64)
    boxes[:, [0, 2]] = boxes[:, [0, 2]] * new_w / image_w + dx
    boxes[:, [1, 3]] = boxes[:, [1, 3]] * new_h / image_h + dy
    if draws[5] < config.flip:
        pixels = pixels[:, ::-1]
        boxes[:, [0, 2]] = input_w - boxes[:, [2, 0]]
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, input_w)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, input_h)
    keep = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
    return pixels, boxes, keep, new_w / image_w


def test_boxes_move_with_the_pixels():
    image = _scene()
    flips = 0
    for seed in range(30):
        pixels, boxes, keep = random_augment(
            image, RECT_BOXES, (416, 416), np.random.default_rng(seed), NO_COLOUR
        )
        flips += np.random.default_rng(seed).random(NUM_DRAWS)[5] < 0.5
        # Bicubic blurs an edge over 2 source px, up to ~2.4 px each after the largest upscale.
        margin = 6
        for colour, box, kept in zip(RECT_COLOURS, boxes, keep):
            match = _matches(pixels, colour)
            if not kept:
                # Under 1 px wide or tall (or off the canvas): at most a blurred sliver remains.
                assert match.sum() <= 3 * 416, (seed, box)
                continue
            x0, y0, x1, y1 = np.round(box).astype(int)
            inner = match[y0 + margin : y1 - margin, x0 + margin : x1 - margin]
            if inner.size:
                assert inner.mean() > 0.95, (seed, colour, box)
            outside = match.copy()
            outside[max(y0 - margin, 0) : y1 + margin, max(x0 - margin, 0) : x1 + margin] = False
            assert outside.sum() == 0, (seed, colour, box)
    assert 5 < flips < 25  # both branches ran


@pytest.mark.parametrize("seed", range(12))
def test_geometry_matches_the_original_formulas(seed):
    image = _scene(seed)
    boxes = np.vstack([RECT_BOXES, [[0, 0, 640, 480], [630, 470, 640, 480]]])
    pixels, got_boxes, keep = random_augment(
        image, boxes, (320, 416), np.random.default_rng(seed), NO_COLOUR
    )
    draws = np.random.default_rng(seed).random(NUM_DRAWS)
    want_pixels, want_boxes, want_keep, _ = _reference_sample(
        image, boxes, (320, 416), draws, NO_COLOUR
    )
    np.testing.assert_allclose(got_boxes, want_boxes, atol=1e-3)
    np.testing.assert_array_equal(keep, want_keep)
    # Resizing only the visible part moves the float32 source box by ~1e-5 px, which flips
    # the rounding of a few pixels by a level or two; a 1 px shift would change most pixels
    # of this noisy image by tens of levels.
    diff = np.abs(pixels.astype(int) - want_pixels)
    assert diff.max() <= 2 and (diff > 0).mean() < 1e-2


def test_flip_maps_x_min_to_width_minus_x_max():
    # 400x200 into 208x416 at scale 1 without jitter: aspect 2 -> new 416x208 = the canvas,
    # so dx = dy = 0 and x, y scale by 416 / 400 = 208 / 200 = 1.04.
    image = _scene(height=200, width=400)
    box = np.array([[100.0, 50.0, 150.0, 120.0]])
    fixed = dict(jitter=0.0, scale=(1.0, 1.0), hue=0.0, saturation=1.0, value=1.0)
    plain, plain_boxes, _ = random_augment(
        image, box, (208, 416), np.random.default_rng(1), AugmentConfig(flip=0.0, **fixed)
    )
    flipped, flipped_boxes, keep = random_augment(
        image, box, (208, 416), np.random.default_rng(1), AugmentConfig(flip=1.0, **fixed)
    )
    np.testing.assert_allclose(plain_boxes, [[104.0, 52.0, 156.0, 124.8]], atol=1e-4)
    # x_min = 416 - 156, x_max = 416 - 104
    np.testing.assert_allclose(flipped_boxes, [[260.0, 52.0, 312.0, 124.8]], atol=1e-4)
    assert keep.all()
    resized = Image.fromarray(image).resize((416, 200), Image.BICUBIC)
    np.testing.assert_array_equal(plain, np.asarray(resized.resize((416, 208), Image.BICUBIC)))
    np.testing.assert_array_equal(flipped, plain[:, ::-1])


def test_boxes_are_clipped_to_the_image_before_the_transform():
    # 400x200 into 416x416 at scale 0.5 without jitter: 208x104 (a factor of 0.52) pasted at
    # (dx, dy) inside the canvas; the part of the box outside the image must not reach into
    # the padding around it.
    image = _scene(height=200, width=400)
    config = AugmentConfig(jitter=0.0, scale=(0.5, 0.5), flip=0.0)
    _, got, keep = random_augment(
        image, [[-50, -20, 100, 300]], (416, 416), np.random.default_rng(4), config
    )
    draws = np.random.default_rng(4).random(NUM_DRAWS)
    dx, dy = int(draws[3] * (416 - 208)), int(draws[4] * (416 - 104))
    np.testing.assert_allclose(got, [[dx, dy, dx + 52, dy + 104]], atol=1e-4)
    assert keep.all()


def test_letterbox_hand_computed():
    # 640x480 into 416x416: scale min(416/640, 416/480) = 0.65 -> 416x312, offset_y (416-312)/2.
    image = _scene()
    boxes = np.array([[100, 40, 300, 200], [-20, -10, 50, 30], [10, 10, 11, 100]], np.float64)
    pixels, got, keep = letterbox(image, boxes, (416, 416))
    want = [
        [65.0, 26.0 + 52, 195.0, 130.0 + 52],
        [0.0, 0.0 + 52, 32.5, 19.5 + 52],  # clipped to the image first
        [6.5, 6.5 + 52, 7.15, 65.0 + 52],  # 0.65 px wide
    ]
    np.testing.assert_allclose(got, want, atol=1e-4)
    np.testing.assert_array_equal(keep, [True, True, False])
    np.testing.assert_array_equal(pixels, letterbox_image(image, (416, 416)))
    assert (pixels[:52] == PAD_VALUE).all() and (pixels[52 + 312 :] == PAD_VALUE).all()


def test_tiny_boxes_are_dropped():
    # 832x832 into 416 at scale 0.25 without jitter: 104x104, a factor of 1/8.
    image = np.zeros((832, 832, 3), np.uint8)
    boxes = [[100, 100, 102, 102], [100, 100, 108, 140], [100, 100, 107.9, 140]]
    config = AugmentConfig(jitter=0.0, scale=(0.25, 0.25))
    _, got, keep = random_augment(image, boxes, (416, 416), np.random.default_rng(0), config)
    np.testing.assert_allclose(got[:, 2] - got[:, 0], [0.25, 1.0, 0.9875], atol=1e-5)
    np.testing.assert_array_equal(keep, [False, True, False])
    assert got.shape == (3, 4)  # rows stay aligned with the input


def test_clip_boxes_flags_boxes_partly_outside():
    boxes = [[-10, 5, 50, 500], [10, 10, 20, 20], [190, -1, 250, 50], [0, 0, 200, 100]]
    clipped, was_clipped = clip_boxes(boxes, (100, 200))
    np.testing.assert_array_equal(
        clipped, [[0, 5, 50, 100], [10, 10, 20, 20], [190, 0, 200, 50], [0, 0, 200, 100]]
    )
    np.testing.assert_array_equal(was_clipped, [True, False, True, False])
    assert clipped.dtype == np.float32


def _colorsys_jitter(pixels, hue_shift, saturation_factor, value_factor):
    out = []
    for pixel in pixels / 255.0:
        hue, saturation, value = colorsys.rgb_to_hsv(*pixel)
        rgb = colorsys.hsv_to_rgb(
            (hue + hue_shift) % 1.0,
            min(saturation * saturation_factor, 1.0),
            min(value * value_factor, 1.0),
        )
        out.append(np.round(np.array(rgb) * 255.0))
    return np.array(out)


EDGE_PIXELS = [[0, 0, 0], [255, 255, 255], [128, 128, 128], [255, 0, 0], [0, 255, 0]]
EDGE_PIXELS += [[0, 0, 255], [255, 0, 1], [255, 255, 0], [1, 0, 0], [0, 1, 1], [200, 200, 199]]


@pytest.mark.parametrize(
    "hue_shift, saturation_factor, value_factor",
    [(0.07, 1.4, 0.7), (-0.09, 1 / 1.3, 1.45), (0.5, 1.0, 1.0), (-0.1, 1.5, 1.5), (0.0, 1, 1)],
)
def test_hsv_jitter_matches_colorsys(hue_shift, saturation_factor, value_factor):
    rng = np.random.default_rng(7)
    pixels = np.vstack([EDGE_PIXELS, rng.integers(0, 256, (3000, 3))]).astype(np.uint8)
    got = jitter_hsv(pixels[None], hue_shift, saturation_factor, value_factor)[0]
    want = _colorsys_jitter(pixels, hue_shift, saturation_factor, value_factor)
    assert np.abs(got.astype(int) - want).max() <= 1


def test_rgb_hsv_conversions_match_colorsys():
    rng = np.random.default_rng(3)
    rgb = np.vstack([np.array(EDGE_PIXELS) / 255.0, rng.random((2000 - len(EDGE_PIXELS), 3))])
    hsv = rgb_to_hsv(rgb)
    want = np.array([colorsys.rgb_to_hsv(*pixel) for pixel in rgb])
    hue_error = np.abs(hsv[:, 0] - want[:, 0])
    assert np.minimum(hue_error, 1 - hue_error).max() < 1e-5
    np.testing.assert_allclose(hsv[:, 1:], want[:, 1:], atol=1e-5)
    assert hsv.dtype == np.float32 and (hsv[:, 0] >= 0).all() and (hsv[:, 0] < 1).all()
    want_rgb = np.array([colorsys.hsv_to_rgb(*pixel) for pixel in want])
    np.testing.assert_allclose(hsv_to_rgb(want), want_rgb, atol=1e-5)
    image_shaped = hsv_to_rgb(hsv.reshape(20, 100, 3))
    np.testing.assert_allclose(image_shaped, rgb.reshape(20, 100, 3), atol=1e-5)


def test_hue_wraps_around():
    # Red (hue 0) - 0.1 -> hue 0.9 = (1, 0, 0.6). (255, 0, 51) has hue 1 - 0.2 / 6; + 0.1 wraps
    # to 0.4 / 6 = (1, 0.4, 0).
    pixels = np.array([[[255, 0, 0]], [[255, 0, 51]]], np.uint8)
    np.testing.assert_array_equal(jitter_hsv(pixels[:1], -0.1, 1, 1), [[[255, 0, 153]]])
    np.testing.assert_array_equal(jitter_hsv(pixels[1:], 0.1, 1, 1), [[[255, 102, 0]]])


def test_value_factor_scales_brightness():
    dark = np.random.default_rng(0).integers(0, 120, (64, 64, 3), dtype=np.uint8)
    brighter = jitter_hsv(dark, 0.0, 1.0, 1.5)
    assert brighter.mean() / dark.mean() == pytest.approx(1.5, abs=0.01)
    # Hue and saturation do not change under a value factor, so every channel scales alike.
    assert np.abs(brighter.astype(int) - np.round(dark * 1.5)).max() <= 1

    image = (_scene() * 0.5).astype(np.uint8)  # dark enough that x1.5 never clips
    brightness_only = AugmentConfig(hue=0.0, saturation=1.0, value=1.5)
    ratios = []
    for seed in range(12):
        rng = np.random.default_rng(seed)
        plain = random_augment(image, RECT_BOXES, (416, 416), rng, NO_COLOUR)
        rng = np.random.default_rng(seed)
        lit = random_augment(image, RECT_BOXES, (416, 416), rng, brightness_only)
        # The colour ranges do not change the draws, so the geometry is the same.
        np.testing.assert_array_equal(lit[1], plain[1])
        ratios.append(lit[0].mean() / plain[0].mean())
    ratios = np.array(ratios)
    assert (ratios > 1 / 1.5 - 0.01).all() and (ratios < 1.5 + 0.01).all()
    assert (ratios > 1.05).any() and (ratios < 0.95).any()


def test_colour_jitter_equals_jitter_of_the_whole_canvas():
    # The padding is converted once rather than per pixel; it must match converting everything.
    image = _scene()
    config = AugmentConfig()
    for seed in range(6):
        got, _, _ = random_augment(image, RECT_BOXES, (416, 416), np.random.default_rng(seed))
        canvas, _, _ = random_augment(
            image, RECT_BOXES, (416, 416), np.random.default_rng(seed), NO_COLOUR
        )
        draws = np.random.default_rng(seed).random(NUM_DRAWS)
        hue = -config.hue + draws[6] * 2 * config.hue
        saturation = 1 + draws[8] * (config.saturation - 1)
        value = 1 + draws[10] * (config.value - 1)
        saturation = saturation if draws[7] < 0.5 else 1 / saturation
        value = value if draws[9] < 0.5 else 1 / value
        np.testing.assert_array_equal(got, jitter_hsv(canvas, hue, saturation, value))


def test_output_types_and_shapes():
    image = _scene()
    pixels, boxes, keep = random_augment(image, RECT_BOXES, (320, 480), np.random.default_rng(0))
    assert pixels.shape == (320, 480, 3) and pixels.dtype == np.uint8
    assert pixels.flags.c_contiguous
    assert boxes.shape == (4, 4) and boxes.dtype == np.float32
    assert keep.shape == (4,) and keep.dtype == bool
    pixels, boxes, keep = random_augment(
        Image.fromarray(image).convert("L"), np.zeros((0, 4)), (64, 96), np.random.default_rng(0)
    )
    assert pixels.shape == (64, 96, 3) and boxes.shape == (0, 4) and keep.shape == (0,)
    pixels, boxes, keep = letterbox(image, [], (96, 64))
    assert pixels.shape == (96, 64, 3) and boxes.shape == (0, 4) and keep.dtype == bool


def _digest(seed):
    image = _scene()
    pixels, boxes, keep = random_augment(image, RECT_BOXES, (416, 416), np.random.default_rng(seed))
    return hashlib.sha256(pixels.tobytes() + boxes.tobytes() + keep.tobytes()).hexdigest()


def test_deterministic_per_seed_and_in_a_fresh_process_without_tensorflow():
    assert _digest(5) == _digest(5)
    assert _digest(5) != _digest(6)
    script = (
        "import sys\n"
        "from test_augment import _digest\n"
        "assert 'tensorflow' not in sys.modules, 'yolo3.data.augment imported tensorflow'\n"
        "print(_digest(5))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == _digest(5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"jitter": 1.0}, r"jitter must be in \[0, 1\), got 1.0"),
        ({"jitter": -0.1}, "jitter"),
        ({"scale": (2.0, 1.0)}, "scale must satisfy 0 < min <= max, got min 2.0 max 1.0"),
        ({"scale": (0.0, 1.0)}, "scale"),
        ({"scale": (0.5,)}, r"scale must be a \(min, max\) pair"),
        ({"flip": 1.5}, "flip"),
        ({"hue": 0.6}, "hue"),
        ({"saturation": 0.5}, "saturation must be >= 1"),
        ({"value": 0.9}, "value must be >= 1"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AugmentConfig(**kwargs)


def test_config_from_json_lists_is_hashable():
    config = AugmentConfig(scale=[0.5, 1.5])
    assert config.scale == (0.5, 1.5) and hash(config) == hash(AugmentConfig(scale=(0.5, 1.5)))


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="uint8"):
        random_augment(np.zeros((8, 8, 3), np.float32), [], (32, 32), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\(M, 4\)"):
        letterbox(np.zeros((8, 8, 3), np.uint8), [[1, 2, 3]], (32, 32))
