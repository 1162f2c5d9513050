"""The weights' moving average (--ema): its formula, the swap, and a run that saves,
validates and resumes it."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from train_helpers import SIZE, small_record_set, train_args, validation_loss, write_anchors

from yolo3.callbacks import read_training_state
from yolo3.checkpoint.weights import load_weights
from yolo3.commands import train
from yolo3.engine import averaging, training
from yolo3.model.network import tiny_yolo_body


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    # 12 training images in one shard: an epoch of 3 steps is one pass in the shard's
    # order (below), so a resumed run reads what the run that never stopped reads.
    records = small_record_set(folder / "set", train=12, val=7, num_shards=1)
    return records, write_anchors(folder / "anchors.txt")


def _small_model():
    inputs = keras.Input((3,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(4)(inputs))
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


def test_the_average_follows_its_formula_and_the_swap_is_exact():
    model = _small_model()
    average = averaging.WeightAverage(model, decay=0.9, warmup=2.0)
    strategy = tf.distribute.get_strategy()
    # Every float weight, BN's moving statistics included (8: two kernels, two biases,
    # gamma, beta, moving mean and variance).
    assert len(average.averages) == len(model.weights) == 8
    rng = np.random.default_rng(0)
    expected = None
    for t in range(5):
        values = [rng.normal(size=w.shape).astype(np.float32) for w in model.weights]
        model.set_weights(values)
        average.update(strategy)
        # By hand: d(t) = 0.9 (1 - exp(-t / 2)); d(0) = 0 copies the weights.
        d = 0.9 * (1.0 - math.exp(-t / 2.0))
        if expected is None:
            expected = values
        else:
            expected = [d * a + (1 - d) * v for a, v in zip(expected, values)]
        for got, want in zip(average.averages, expected):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert int(average.updates.numpy()) == 5
    raw = [w.numpy().copy() for w in model.weights]
    with average.swapped_in(strategy):
        for got, want in zip(model.weights, expected):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    for got, want in zip(model.weights, raw):
        np.testing.assert_array_equal(got.numpy(), want)  # back bit for bit
    assert averaging.decay_at(0, 0.9, 2.0) == 0.0


def test_bad_settings_name_the_flag():
    cases = ((1.0, 10, "--ema 1"), (-0.1, 10, "--ema -0.1"), (0.9, 0, "--ema-warmup 0"))
    for decay, warmup, flag in cases:
        with pytest.raises(ValueError, match=flag):
            averaging.check(decay, warmup)


def _arrays(path):
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    load_weights(body, str(path))
    return [w.numpy() for w in body.weights]


def _run(args, log=None):
    config = train.config_from_args(train.build_parser().parse_args(args))
    training.configure(config)
    return training.run(config, log=log or (lambda line: None))


def test_a_run_saves_and_validates_the_average_and_resumes_it(record_set, tmp_path):
    records, anchors = record_set
    ema = ("--ema", "0.8", "--ema-warmup", "2")
    # The same images in the same order every epoch; a learning rate that does not depend
    # on the planned number of epochs.
    ema += ("--flip", "0", "--shuffle-buffer", "1", "--lr-schedule", "constant")
    args = train_args(records, tmp_path / "run", anchors, *ema)
    # With --time too: a budget it cannot spend plans the one epoch --epochs allows, and
    # the schedule reads the plan (tests/test_train.py plans budgets that end a run).
    lines = []
    result = _run([*args, "--epochs", "1", "--time", "60"], log=lines.append)
    assert int(result.trainer.planned_steps.numpy()) == 3
    assert any(line.startswith("time budget: 1 epochs planned") for line in lines), lines
    trainer = result.trainer
    average = trainer.weight_average
    assert int(average.updates.numpy()) == 3  # one update per optimizer step
    last = tmp_path / "run/checkpoints/last.weights.h5"
    saved = _arrays(last)
    # The checkpoint holds the average (the body's float weights: all of tiny's), not the
    # weights training goes on from; validation scored the same average.
    for got, want in zip(saved, average.averages):
        np.testing.assert_array_equal(got, want.numpy())
    raw = [w.numpy() for w in trainer.body.weights]
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(saved, raw)) > 1e-3
    assert result.history["val_loss"][-1] == pytest.approx(
        validation_loss(last, records, anchors), rel=1e-5
    )
    assert read_training_state(str(tmp_path / "run/checkpoints"))[1]["epoch"] == 1
    # Resumed, the run continues the average it had: equal to the run that never stopped.
    resumed = _run([*args, "--epochs", "2", "--resume"])
    assert int(resumed.trainer.weight_average.updates.numpy()) == 6
    straight = _run([*train_args(records, tmp_path / "straight", anchors, *ema), "--epochs", "2"])
    pairs = [
        (resumed.trainer.body.weights, straight.trainer.body.weights),
        (resumed.trainer.weight_average.averages, straight.trainer.weight_average.averages),
    ]
    for ours, theirs in pairs:
        for got, want in zip(ours, theirs):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    # Off, nothing is kept.
    plain = train.config_from_args(train.build_parser().parse_args(args[:-10]))
    assert plain.ema_settings() is None
