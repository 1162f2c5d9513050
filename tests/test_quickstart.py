"""The generated shapes data set and the README's first command, run briefly."""

from pathlib import Path

import numpy as np
from helpers import load_tool

from yolo3.data.synthetic import CLASS_NAMES, make_dataset

ROOT = Path(__file__).resolve().parents[1]


def test_generated_boxes_are_exact_and_deterministic():
    images, boxes = make_dataset(12, seed=5, size=(96, 128))
    again_images, again_boxes = make_dataset(12, seed=5, size=(96, 128))
    np.testing.assert_array_equal(images, again_images)
    np.testing.assert_array_equal(boxes, again_boxes)
    real = boxes[boxes[:, :, 2] > 0]
    assert len(real) > 0
    assert np.all(real[:, 0] >= 0) and np.all(real[:, 2] <= 128)
    assert np.all(real[:, 1] >= 0) and np.all(real[:, 3] <= 96)
    assert set(real[:, 4].astype(int)) <= set(range(len(CLASS_NAMES)))
    # The last shape drawn is on top: a rectangle there fills its box with one colour,
    # and the row above the box (the background or another shape) differs from it.
    checked = 0
    for image, image_boxes in zip(images, boxes):
        real_boxes = image_boxes[image_boxes[:, 2] > 0]
        if len(real_boxes) == 0 or real_boxes[-1, 4] != 0:
            continue
        x0, y0, x1, y1 = real_boxes[-1, :4].astype(int)
        assert len(np.unique(image[y0:y1, x0:x1].reshape(-1, 3), axis=0)) == 1
        checked += 1
    assert checked > 0


def test_quickstart_runs_end_to_end(capsys):
    quickstart = load_tool("quickstart")
    argv = ["--steps", "2", "--input-size", "64", "--train-images", "8", "--val-images", "2"]
    assert quickstart.main(argv + ["--batch-size", "4"]) == 0
    output = capsys.readouterr().out
    assert "step    2/2" in output and "held-out objects found" in output


def test_quickstart_refuses_bad_size(capsys):
    assert load_tool("quickstart").main(["--input-size", "100"]) == 2
    assert "--input-size 100 is not a multiple of 32" in capsys.readouterr().err
