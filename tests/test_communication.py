"""The gradient all-reduce in reduced precision, the options of the job's collectives, and
the communication schemes the trainer is handed (``yolo3.comm.schemes``): which flags they
refuse, what they log, and that checkpoints keep the layout earlier releases wrote."""

import json
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, distribute_per_replica, make_head, tiny_model

from yolo3.comm import reducer
from yolo3.comm.allreduce import (
    FLOAT16_MAX,
    all_reduce_gradients,
    allreduce_bytes,
    communication_options,
    float16_scales,
)
from yolo3.comm.local_steps import sync_bytes
from yolo3.comm.powersgd import powersgd_bytes
from yolo3.comm.schemes import AllReduce, DenseWarmup, LocalSteps, PowerSGD, communication_from
from yolo3.engine.trainer import YoloTrainer

REPLICAS = 4  # conftest.NUM_LOGICAL_CPUS


def _reduce(strategy, per_replica, dtype):
    """``all_reduce_gradients`` of replica r's ``per_replica[r]`` (a list of arrays)."""
    outputs = tf.function(
        lambda grads: strategy.run(lambda g: all_reduce_gradients(list(g), dtype), args=(grads,))
    )(distribute_per_replica(strategy, per_replica))
    return [np.asarray(strategy.experimental_local_results(leaf)[0]) for leaf in outputs]


def test_float16_all_reduce_neither_overflows_nor_underflows(strategy):
    rng = np.random.default_rng(0)
    # Sums reach 4 x 40000, beyond float16's 65504; the small tensor is below its
    # smallest subnormal (6e-8) on every replica.
    large = [rng.uniform(3e4, 4e4, (5, 3)).astype(np.float32) for _ in range(REPLICAS)]
    small = [rng.uniform(1e-10, 2e-10, (7,)).astype(np.float32) for _ in range(REPLICAS)]
    mixed = [rng.normal(0, 1, (4, 4)).astype(np.float32) for _ in range(REPLICAS)]
    per_replica = [[large[r], small[r], mixed[r]] for r in range(REPLICAS)]
    got = _reduce(strategy, per_replica, "float16")
    for index, tensors in enumerate((large, small, mixed)):
        want = np.sum(np.stack(tensors).astype(np.float64), axis=0)
        assert np.all(np.isfinite(got[index]))
        # float16 keeps 11 significant bits; each of the 4 values and the partial sums
        # round once.
        np.testing.assert_allclose(got[index], want, rtol=0, atol=8 * 2**-11 * np.abs(want).max())
        assert got[index].dtype == np.float32
    # Without the scale the same sums overflow and vanish.
    with np.errstate(over="ignore"):
        plain = np.sum(np.stack(large).astype(np.float16), axis=0)
    assert not np.all(np.isfinite(plain))
    assert np.all(np.stack(small).astype(np.float16) == 0)


def test_bfloat16_all_reduce_keeps_eight_bits_and_float32_is_exact(strategy):
    rng = np.random.default_rng(1)
    per_replica = [[rng.normal(0, 1, (64,)).astype(np.float32)] for _ in range(REPLICAS)]
    want = np.sum(np.stack([p[0] for p in per_replica]).astype(np.float64), axis=0)
    (half,) = _reduce(strategy, per_replica, "bfloat16")
    (exact,) = _reduce(strategy, per_replica, "float32")
    np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-6)
    error = np.abs(half - want).max()
    assert 0 < error <= 8 * 2**-8 * np.abs(want).max()


def test_float16_scales_are_powers_of_two_under_the_limit():
    bounds = tf.constant([0.0, 1e-12, 1.0, 3e4, 1e9], tf.float32)
    scales = float16_scales(bounds).numpy()
    assert scales[0] == 1.0
    np.testing.assert_array_equal(np.log2(scales), np.round(np.log2(scales)))
    scaled = scales[1:] * bounds.numpy()[1:]
    assert np.all(scaled <= FLOAT16_MAX / 2)
    assert np.all(scaled > FLOAT16_MAX / 4)  # the top octave below the limit


def test_one_replica_returns_the_gradients_unchanged():
    grads = [tf.constant([1.0, 2.0])]
    assert all_reduce_gradients(grads, "float16")[0] is grads[0]


def test_bytes_and_options():
    variables = [tf.Variable(tf.zeros((3, 3, 16, 32))), tf.Variable(tf.zeros((32,)))]
    assert allreduce_bytes(variables, "float32") == (3 * 3 * 16 * 32 + 32) * 4
    assert allreduce_bytes(variables, "bfloat16") == (3 * 3 * 16 * 32 + 32) * 2
    options = communication_options(bytes_per_pack=1 << 20, timeout_seconds=30)
    assert (options.bytes_per_pack, options.timeout_seconds) == (1 << 20, 30)
    with pytest.raises(ValueError, match="--collective-timeout"):
        communication_options(timeout_seconds=0)
    with pytest.raises(ValueError, match="--bytes-per-pack"):
        communication_options(bytes_per_pack=-1)


def test_the_optimizer_reduction_is_replaced_in_one_place_under_a_source_check(monkeypatch):
    # Only yolo3/comm/reducer.py assigns Keras's private reduction method.
    package = Path(reducer.__file__).resolve().parents[1]
    assigning = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "._all_reduce_sum_gradients =" in path.read_text()
    )
    assert assigning == ["comm/reducer.py"]
    reducer.check_compatible()  # the installed Keras is the one the fingerprints are of

    def reduce(pairs):
        return pairs

    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    assert reducer.install_reducer(scaled, reduce) is scaled
    assert scaled.inner_optimizer._all_reduce_sum_gradients is reduce
    with pytest.raises(ValueError, match="^not under loss scaling$"):
        reducer.install_reducer(scaled, reduce, loss_scale_refusal="not under loss scaling")
    changed = {**reducer.EXPECTED_SOURCE_SHA256, "TFOptimizer._backend_update_step": "0" * 64}
    monkeypatch.setattr(reducer, "EXPECTED_SOURCE_SHA256", changed)
    with pytest.raises(RuntimeError, match="_backend_update_step: expected 000000000000"):
        reducer.check_compatible()


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"allreduce_dtype": "int16"}, "--allreduce-dtype 'int16'"),
        ({"allreduce_dtype": "int8"}, "--allreduce-dtype int8 .* pass --local-steps H too"),
        ({"allreduce_dtype": "int4", "compress": "powersgd"}, "--allreduce-dtype int4"),
        ({"compress": "zip"}, "--compress 'zip'"),
        ({"compress": "powersgd", "rank": 0}, "--rank 0"),
        ({"rank": -2}, "--rank -2"),
        ({"rank": 1.5}, "--rank 1.5"),
        ({"local_steps": 0}, "--local-steps 0"),
        ({"local_steps": 2.5}, "--local-steps 2.5"),
        ({"local_steps": 4, "outer_lr": 0.0}, "--outer-lr 0"),
        (
            {"local_steps": 4, "outer_momentum": 1.0},
            r"--outer-momentum 1.0: use a number in \[0, 1\)",
        ),
        ({"local_steps": 4, "outer_momentum": -0.1}, "--outer-momentum -0.1"),
        ({"outer_momentum": 0.9}, "--outer-momentum set the outer step of --local-steps"),
        ({"outer_lr": 0.7}, "--outer-lr and --outer-momentum .* pass --local-steps H too"),
        ({"overlap_sync": 2}, "--overlap-sync .* pass --local-steps H too"),
        (
            {"local_steps": 2, "overlap_sync": 3},
            r"--overlap-sync 3: .* from 1 to --local-steps \(2\)",
        ),
        ({"local_steps": 2, "overlap_sync": 0}, "--overlap-sync 0"),
        ({"local_steps": 4, "compress": "powersgd"}, "--local-steps and --compress powersgd"),
        ({"compress": "powersgd", "dense_steps": -1}, "--dense-steps -1"),
        ({"local_steps": 2, "dense_steps": 0.5}, "--dense-steps 0.5"),
        ({"dense_steps": 10}, "--dense-steps .* --compress powersgd or --local-steps"),
        ({"local_steps": 4, "sync_bn": True}, "--sync-bn on .* --local-steps"),
        ({"compress": "powersgd", "precision": "mixed_float16"}, "--compress powersgd .* float16"),
        ({"compress": "powersgd", "precision": "float16"}, "--mixed-precision bfloat16 or off"),
    ],
)
def test_communication_from_refuses_what_does_not_work(flags, message):
    with pytest.raises(ValueError, match=message):
        communication_from(**flags)


@pytest.mark.parametrize(
    "flags, kind, in_step",
    [
        ({}, AllReduce, True),
        ({"allreduce_dtype": "float16", "sync_bn": True}, AllReduce, True),
        ({"compress": "powersgd", "rank": 2, "precision": "mixed_bfloat16"}, PowerSGD, True),
        ({"local_steps": 4, "sync_bn": False, "precision": "mixed_float16"}, LocalSteps, False),
        ({"local_steps": 2, "overlap_sync": False}, LocalSteps, False),
        ({"local_steps": 2, "allreduce_dtype": "int4"}, LocalSteps, False),
        ({"compress": "powersgd", "dense_steps": 5}, DenseWarmup, True),
        ({"local_steps": 2, "dense_steps": 5}, DenseWarmup, False),
    ],
)
def test_communication_from_builds_the_scheme_of_the_flags(flags, kind, in_step):
    scheme = communication_from(**flags)
    assert type(scheme) is kind
    # The sync-BN default of train.py: off where the step holds no collective.
    assert scheme.all_reduces_in_step is in_step
    assert scheme.dtype == flags.get("allreduce_dtype", "float32")
    assert scheme.state is None  # built by the trainer's compile


def test_overlap_true_sends_during_the_whole_next_period():
    assert communication_from(local_steps=3, overlap_sync=True).overlap == 3
    assert communication_from(local_steps=3, overlap_sync=2).overlap == 2
    assert communication_from(local_steps=3).overlap is None


@pytest.fixture(scope="module")
def body():
    return tiny_model()  # 2 classes, 64 px


def test_what_each_scheme_sends_and_logs(body, strategy):
    trainable, weights = body.trainable_weights, body.weights
    plain = communication_from(allreduce_dtype="bfloat16")
    assert plain.bytes_per_step(body) == allreduce_bytes(trainable, "bfloat16")
    assert plain.describe(body) == "bfloat16"

    compressed = communication_from(compress="powersgd", rank=2)
    sent, full = powersgd_bytes(trainable, 2), allreduce_bytes(trainable)
    assert compressed.bytes_per_step(body) == sent < full / 40
    assert compressed.describe(body) == (
        f"float32 + PowerSGD rank 2 ({sent / 1e6:.2f} MB per step per worker, "
        f"{full / 1e6:.2f} MB uncompressed)"
    )
    # The figure test_compression's two-worker run logs for this model.
    assert "(0.19 MB per step per worker" in compressed.describe(body)

    local = communication_from(
        allreduce_dtype="bfloat16", local_steps=4, outer_lr=0.7, outer_momentum=0.9, overlap_sync=1
    )
    synced = sync_bytes(weights, "bfloat16")
    assert local.bytes_per_step(body) == synced / 4  # once per H steps
    assert local.describe(body) == (
        "none in the step; weight changes every 4 steps, sent during the next 1 step in "
        f"bfloat16 ({synced / 1e6:.2f} MB per worker; outer lr 0.7, Nesterov momentum 0.9)"
    )

    # int8: the lanes widen with the replicas in sync (the strategy's, in its scope).
    quantized = communication_from(allreduce_dtype="int8", local_steps=4)
    sent = sync_bytes(weights, "int8", REPLICAS)
    assert sent < sync_bytes(weights, "bfloat16")
    with strategy.scope():
        assert quantized.bytes_per_step(body) == sent / 4
        described = quantized.describe(body)
    assert described.endswith(
        f"int8 ({sent / 1e6:.2f} MB per worker with 4 replicas, stochastic rounding; averaging)"
    )
    # The warm-up's whole gradient is not quantized: float32.
    warmed = communication_from(allreduce_dtype="int4", local_steps=2, dense_steps=10)
    assert warmed.describe(body).startswith("the whole gradient in float32 for the first 10 ")

    warmed = communication_from(local_steps=2, overlap_sync=True, dense_steps=100)
    assert warmed.bytes_per_step(body) == sync_bytes(weights) / 2  # after the warm-up
    assert warmed.describe(body) == (
        "the whole gradient for the first 100 steps, then none in the step; weight changes "
        f"every 2 steps, sent during the next 2 steps in float32 "
        f"({sync_bytes(weights) / 1e6:.2f} MB per worker; averaging)"
    )


LAYOUT = Path(__file__).parent / "data" / "trainer_weights_layout.json"


@pytest.mark.parametrize(
    "kind, flags",
    [
        ("local", {"local_steps": 2, "outer_lr": 0.7, "outer_momentum": 0.9}),
        ("powersgd", {"compress": "powersgd", "rank": 2}),
    ],
)
def test_checkpoints_keep_the_layout_earlier_releases_wrote(tmp_path, kind, flags):
    # Keras addresses a model's state by attribute name, public ones first in name order,
    # then ``layers`` by class name: the communication's state must stay under
    # layers/local_steps_state and layers/power_sgd_state, where the trainer of commit
    # e735809 (which took the flags as its own arguments) saved it, so that its
    # checkpoints and backups resume. The same path and shape for every dataset.
    keras.utils.set_random_seed(0)
    trainer = YoloTrainer(
        tiny_model(),
        head=make_head(SMALL_ANCHORS, 2),
        communication=communication_from(**flags),
    )
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False)
    trainer.build((None, 64, 64, 3))
    trainer.optimizer.build(trainer.trainable_variables)
    trainer.save_weights(tmp_path / "trainer.weights.h5")
    written = {}

    def record(name, item):  # returns None: visititems stops at the first other value
        if isinstance(item, h5py.Dataset):
            written[name] = list(item.shape)

    with h5py.File(tmp_path / "trainer.weights.h5", "r") as f:
        f.visititems(record)
    assert written == json.loads(LAYOUT.read_text())[kind]
