"""Darknet's letterbox resampling against a loop-by-loop NumPy transcription of image.c.

The oracle follows pjreddie's ``resize_image`` and ``letterbox_image`` statement by
statement, one pixel at a time, in float32 (``load_image`` reads ``uint8 / 255.`` in
double and stores a float). The library's version is vectorised; they must agree bit for
bit.
"""

import numpy as np
import pytest
from helpers import SMALL_ANCHORS, tiny_model
from PIL import Image

from yolo3.checkpoint.weights import save_weights
from yolo3.data.image import darknet_resize, letterbox_darknet, letterbox_image
from yolo3.inference.detect import Detector

F = np.float32


def resize_image_loops(im, w, h):
    """``image resize_image(image im, int w, int h)`` for an (H, W, C) float32 array."""
    im_h, im_w, channels = im.shape
    part = np.zeros((im_h, w, channels), F)
    w_scale = F(im_w - 1) / F(w - 1)
    h_scale = F(im_h - 1) / F(h - 1)
    for k in range(channels):
        for r in range(im_h):
            for c in range(w):
                if c == w - 1 or im_w == 1:
                    val = im[r, im_w - 1, k]
                else:
                    sx = F(c) * w_scale
                    ix = int(sx)
                    dx = F(sx - F(ix))
                    val = F(F(F(1) - dx) * im[r, ix, k]) + F(dx * im[r, ix + 1, k])
                part[r, c, k] = val
    resized = np.zeros((h, w, channels), F)
    for k in range(channels):
        for r in range(h):
            sy = F(r) * h_scale
            iy = int(sy)
            dy = F(sy - F(iy))
            for c in range(w):
                resized[r, c, k] = F(F(1) - dy) * part[iy, c, k]
            if r == h - 1 or im_h == 1:
                continue
            for c in range(w):
                resized[r, c, k] = F(resized[r, c, k] + F(dy * part[iy + 1, c, k]))
    return resized


def letterbox_image_loops(pixels, w, h):
    """``image letterbox_image(image im, int w, int h)``, from uint8 pixels."""
    im = np.zeros(pixels.shape, F)
    for index, value in np.ndenumerate(pixels):
        im[index] = F(float(value) / 255.0)  # (float)data[i] / 255.
    im_h, im_w = im.shape[:2]
    if F(w) / F(im_w) < F(h) / F(im_h):
        new_w, new_h = w, (im_h * w) // im_w
    else:
        new_h, new_w = h, (im_w * h) // im_h
    resized = resize_image_loops(im, new_w, new_h)
    boxed = np.full((h, w, 3), F(0.5), F)
    dx, dy = (w - new_w) // 2, (h - new_h) // 2
    boxed[dy : dy + new_h, dx : dx + new_w] = resized
    return boxed


@pytest.mark.parametrize(
    "source_hw, target_hw",
    [((37, 53), (20, 29)), ((9, 14), (40, 61)), ((30, 1), (45, 7)), ((1, 12), (5, 30))],
    ids=["down", "up", "one column", "one row"],
)
def test_resize_matches_the_transcription_bit_for_bit(source_hw, target_hw):
    image = np.random.default_rng(0).uniform(0, 1, (*source_hw, 3)).astype(F)
    ours = darknet_resize(image, target_hw)
    expected = resize_image_loops(image, target_hw[1], target_hw[0])
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize(
    "image_hw, input_hw", [((48, 80), (64, 64)), ((75, 50), (64, 96)), ((23, 23), (32, 32))]
)
def test_letterbox_matches_the_transcription_bit_for_bit(image_hw, input_hw):
    pixels = np.random.default_rng(1).integers(0, 256, (*image_hw, 3), dtype=np.uint8)
    ours = letterbox_darknet(pixels, input_hw)
    expected = letterbox_image_loops(pixels, input_hw[1], input_hw[0])
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)


def test_darknet_and_bicubic_inputs_differ_where_resampling_matters():
    # A hard edge downscaled: bicubic rings and antialiases, Darknet's linear resize does not.
    pixels = np.zeros((64, 128, 3), np.uint8)
    pixels[:, 61:] = 255
    darknet = letterbox_darknet(pixels, (32, 32))
    bicubic = letterbox_image(pixels, (32, 32)).astype(F) / 255
    assert np.abs(darknet - bicubic).max() > 0.05


def test_detector_letterboxes_and_merges_boxes_as_its_weights_ask(tmp_path):
    model = tiny_model(size=64)
    ours, converted = str(tmp_path / "ours.weights.h5"), str(tmp_path / "converted.weights.h5")
    save_weights(model, ours, {"model_type": "tiny", "num_classes": 2})
    metadata = {"model_type": "tiny", "num_classes": 2, "source": "darknet:a.cfg,a.weights"}
    save_weights(model, converted, metadata)
    anchors, classes = tmp_path / "anchors.txt", tmp_path / "classes.txt"
    anchors.write_text(", ".join(f"{int(w)},{int(h)}" for w, h in SMALL_ANCHORS))
    classes.write_text("a\nb\n")
    pixels = np.random.default_rng(2).integers(0, 256, (50, 90, 3), dtype=np.uint8)

    def detector(weights, **kwargs):
        return Detector(weights, anchors, classes, input_size=64, **kwargs)

    assert detector(ours).resampling == "bicubic"
    assert detector(converted).resampling == "darknet"
    assert detector(converted, resampling="bicubic").resampling == "bicubic"
    # Darknet's detections keep its plain NMS; weights trained here merge boxes.
    assert detector(ours).spec.box_merge and not detector(converted).spec.box_merge
    assert detector(converted, box_merge=True).spec.box_merge
    np.testing.assert_array_equal(
        detector(converted).letterbox(Image.fromarray(pixels)),
        letterbox_image_loops(pixels, 64, 64),
    )
    np.testing.assert_array_equal(
        detector(ours).letterbox(pixels), letterbox_image(pixels, (64, 64)).astype(F) / 255
    )
    with pytest.raises(ValueError, match="resampling 'nearest'"):
        detector(ours, resampling="nearest")
    [found] = detector(converted).detect(pixels)
    assert set(found) >= {"boxes", "scores", "classes", "labels"}
