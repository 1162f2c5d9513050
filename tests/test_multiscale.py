"""Multi-scale training: Darknet's sizes, a schedule every replica and worker agrees on,
batches resized in the step, and one compiled train function per size."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from train_helpers import SIZE, small_record_set, train_args, write_anchors

from yolo3.checkpoint.weights import load_weights
from yolo3.commands import train
from yolo3.data.multiscale import ScaleSchedule, darknet_sizes, parse_sizes, resize_batch
from yolo3.model.network import tiny_yolo_body
from yolo3.training import job as training


def test_darknet_sizes_are_320_to_608_at_416_and_scale_with_the_records():
    assert darknet_sizes(416) == tuple(range(320, 609, 32))  # (rand() % 10 + 10) * 32
    assert darknet_sizes(608) == (480, 512, 576, 608, 640, 704, 736, 800, 832, 896)
    assert darknet_sizes(96) == (64, 96, 128)
    assert parse_sizes("auto", (416, 416)) == darknet_sizes(416)
    assert parse_sizes("64:160", (96, 96)) == (64, 96, 128, 160)


@pytest.mark.parametrize(
    "text, hw, message",
    [
        ("auto", (96, 128), "square"),
        ("64-128", (96, 96), "MIN:MAX"),
        ("60:128", (96, 96), "multiples of 32"),
        ("128:64", (96, 96), "MIN <= MAX"),
    ],
)
def test_bad_sizes_are_refused(text, hw, message):
    with pytest.raises(ValueError, match=message):
        parse_sizes(text, hw)


def test_schedule_is_a_function_of_step_and_seed():
    sizes = darknet_sizes(416)
    schedule = ScaleSchedule(sizes, seed=3, total_steps=5000)
    drawn = [schedule.size_at(step) for step in range(5000)]
    # A new size every 10 steps, the same within each period.
    for start in range(0, 4800, 10):
        assert len(set(drawn[start : start + 10])) == 1
    assert set(drawn[:4800]) == set(sizes)  # every size comes up
    assert set(drawn[4800:]) == {608}  # the last 200 steps at the largest, as Darknet
    # Another process (a worker, a resumed run) computes the same sizes; another seed not.
    again = ScaleSchedule(sizes, seed=3, total_steps=5000)
    assert [again.size_at(step) for step in range(0, 5000, 7)] == drawn[::7]
    other = ScaleSchedule(sizes, seed=4, total_steps=5000)
    assert [other.size_at(step) for step in range(0, 4800, 10)] != drawn[:4800:10]
    # A short run keeps at most its last tenth at the largest size.
    short = ScaleSchedule(sizes, seed=3, total_steps=100)
    assert short.final_steps == 10 and short.size_at(90) == 608


def test_resize_batch_scales_boxes_with_the_image():
    images = np.zeros((2, 64, 64, 3), np.uint8)
    images[0, 16:48, 8:40] = 255  # a white box at x 8..40, y 16..48
    boxes = np.zeros((2, 3, 5), np.float32)
    boxes[0, 0] = [8, 16, 40, 48, 1]
    resized, scaled = resize_batch(tf.constant(images), tf.constant(boxes), 96)
    assert resized.shape == (2, 96, 96, 3) and resized.dtype == tf.float32
    np.testing.assert_allclose(scaled[0, 0], [12, 24, 60, 72, 1])
    np.testing.assert_array_equal(scaled[0, 1:], 0)  # padding stays padding
    np.testing.assert_array_equal(scaled[1], 0)
    inside, outside = resized[0, 30:66, 14:58].numpy(), resized[0, :20].numpy()
    assert inside.min() == 1.0 and outside.max() == 0.0  # the box moved with its pixels
    same, _ = resize_batch(tf.constant(images), tf.constant(boxes), 64)
    np.testing.assert_array_equal(same.numpy(), images / 255.0)


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("multiscale")
    return small_record_set(folder / "set", train=16, val=8), write_anchors(folder / "a.txt")


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


# Without XLA: each size's function is a tf.function of its own whether XLA compiles it or
# not, so the trace count below is the same either way. XLA compiling the resized step is
# trained by tests/test_combinations.py's "XLA, PowerSGD" row (multi-scale is in every row),
# which pays for its compiles anyway; a run here with XLA on compiled three sizes again
# (64 s alone).
@pytest.mark.slow
def test_training_changes_size_and_compiles_each_size_once(record_set, tmp_path):
    records, anchors = record_set
    args = train_args(records, tmp_path, anchors, "--epochs", "2", "--steps-per-epoch", "10",
                      "--multi-scale", "32:96", "--jit-compile", "off")  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    training.configure(config)
    logged = []
    result = training.run(config, log=logged.append)
    assert any("multi-scale 32-96 (3 sizes)" in line for line in logged)
    trainer = result.trainer
    expected = ScaleSchedule((32, 64, 96), seed=0, total_steps=20)
    assert trainer.scale_history == [expected.size_at(step) for step in range(20)]
    assert len(set(trainer.scale_history)) >= 2  # the size did change
    for size, function in trainer.scale_functions.items():
        assert function.experimental_get_tracing_count() == 1, size
    assert all(np.isfinite(result.history["loss"]))
    # The checkpoint is the bare body: it loads into a model of the records' fixed size.
    fixed = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    load_weights(fixed, str(tmp_path / "checkpoints" / "last.weights.h5"))
    images = np.random.default_rng(0).uniform(0, 1, (1, SIZE, SIZE, 3)).astype(np.float32)
    for ours, theirs in zip(fixed(images), trainer.body(images)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-6)
