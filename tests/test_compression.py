"""PowerSGD (``--compress powersgd``): its math against NumPy, error feedback, and train.py.

The reducer runs in replica context on one device (no strategy) and on the test session's
four logical CPU replicas, in float64 so that comparisons are tight. train.py runs on two worker
processes and, for resume, on two replicas in a process of its own.
"""

import os
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, distribute_per_replica, make_head, tiny_model
from test_train_distributed import WORKER, _launch, _run, _sgd_args, _weights
from train_helpers import SIZE, job_inputs, small_record_set, train_args
from train_worker import SNAPSHOT_ENV

from yolo3.comm.allreduce import allreduce_bytes
from yolo3.comm.powersgd import (
    PowerSGDState,
    compressible,
    powersgd_all_reduce,
    powersgd_bytes,
    worth_compressing,
)
from yolo3.comm.schemes import communication_from
from yolo3.commands import train
from yolo3.engine.trainer import YoloTrainer
from yolo3.training import job as training

REPLICAS = 4  # conftest.NUM_LOGICAL_CPUS
# Kernel shapes (kh, kw, cin, cout), as (m = kh * kw * cin) x (n = cout) matrices tall,
# wide and square-ish.
SHAPES = [(3, 3, 4, 5), (1, 1, 6, 9), (2, 2, 2, 8)]


class Reducer:
    """Variables, a PowerSGD state and a compiled reducer step under ``strategy`` (None:
    one device, no strategy)."""

    def __init__(self, strategy, shapes, rank, *, bias=False, dtype="float32"):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        with self.strategy.scope():
            self.kernels = [tf.Variable(tf.zeros(s, tf.float64)) for s in shapes]
            self.bias = tf.Variable(tf.zeros((7,), tf.float64)) if bias else None
            # Every kernel, whatever the rule: a test may ask for the full rank.
            self.state = PowerSGDState(self.kernels, rank)
        self.variables = self.kernels + ([self.bias] if bias else [])

        def replica_step(grads):
            pairs = powersgd_all_reduce(self.state, list(zip(grads, self.variables)), dtype)
            return [grad for grad, _ in pairs]

        self._step = tf.function(
            lambda grads: self.strategy.run(replica_step, args=(grads,)), reduce_retracing=True
        )

    def step(self, per_replica):
        """``per_replica[r]``: replica r's local mean gradients (arrays). Returns the reduced
        gradients of every replica: ``[replica][variable]``."""
        # Keras hands each replica its local mean divided by the replica count.
        local = [[g / self.replicas for g in grads] for grads in per_replica]
        outputs = self._step(distribute_per_replica(self.strategy, local))
        return [
            [np.asarray(self.strategy.experimental_local_results(leaf)[r]) for leaf in outputs]
            for r in range(self.replicas)
        ]

    def errors(self):
        """``[variable][replica]``: each replica's error buffer."""
        return [
            [np.asarray(e) for e in self.strategy.experimental_local_results(error)]
            for error in self.state.errors
        ]

    def q_factors(self):
        return [np.asarray(q.read_value()) for q in self.state.q_factors]


def _gradients(rng, shapes, replicas, scale=1.0):
    return [[rng.normal(0, scale, s) for s in shapes] for _ in range(replicas)]


def _layouts(strategy):
    return {"one device": None, f"{REPLICAS} replicas": strategy}


@pytest.mark.parametrize("layout", ["one device", f"{REPLICAS} replicas"])
def test_full_rank_equals_the_uncompressed_mean(strategy, layout):
    # Rank 4 is the full rank min(n, m) of each kernel: 8 x 4, 6 x 4 and 4 x 5.
    shapes = [(2, 2, 1, 8), (1, 1, 4, 6), (1, 1, 5, 4)]
    reducer = Reducer(_layouts(strategy)[layout], shapes, 4, bias=True)
    rng = np.random.default_rng(0)
    for _ in range(2):  # the second step starts from the first's Q and error buffers
        grads = _gradients(rng, shapes + [(7,)], reducer.replicas)
        got = reducer.step(grads)
        want = [np.mean([g[i] for g in grads], axis=0) for i in range(len(shapes) + 1)]
        for replica in got:
            for value, expected in zip(replica, want):
                np.testing.assert_allclose(value, expected, rtol=0, atol=1e-12)
        # Nothing was left out: the mean error buffer stays zero.
        for per_replica in reducer.errors():
            np.testing.assert_allclose(np.mean(per_replica, axis=0), 0, atol=1e-12)
    if reducer.replicas > 1:  # each replica keeps its own part of the difference
        assert np.abs(reducer.errors()[0][0]).max() > 0.1


def test_uncompressed_tensors_travel_in_the_allreduce_dtype(strategy):
    # float16 for the bias (scaled, 11 significant bits); the kernel's factors stay float64.
    shapes = [(1, 1, 4, 6)]
    reducer = Reducer(strategy, shapes, 4, bias=True, dtype="float16")
    grads = _gradients(np.random.default_rng(3), shapes + [(7,)], REPLICAS)
    kernel, bias = reducer.step(grads)[0]
    want = [np.mean([g[i] for g in grads], axis=0) for i in range(2)]
    np.testing.assert_allclose(kernel, want[0], rtol=0, atol=1e-12)
    error = np.abs(bias - want[1]).max()
    assert 0 < error <= 8 * 2**-11 * np.abs(want[1]).max()


def _numpy_powersgd(q_factors, grads_per_step, shapes):
    """The algorithm again, in NumPy: per step the update, the error buffers and Q."""
    replicas = len(grads_per_step[0])
    matrix = [(int(np.prod(s[:-1])), s[-1]) for s in shapes]  # (m, n): M transposed
    errors = [[np.zeros(s) for s in shapes] for _ in range(replicas)]
    q_factors = [q.copy() for q in q_factors]
    history = []
    for grads in grads_per_step:
        updates = []
        for i, shape in enumerate(shapes):
            ms = [
                grads[r][i].reshape(matrix[i]) + errors[r][i].reshape(matrix[i])
                for r in range(replicas)
            ]
            p = np.mean([m.T @ q_factors[i] for m in ms], axis=0)  # M Q, n x r
            p, _ = np.linalg.qr(p)
            q = np.mean([m @ p for m in ms], axis=0)  # M^T P, m x r
            approx = q @ p.T  # (P Q^T)^T
            for r in range(replicas):
                errors[r][i] = (ms[r] - approx).reshape(shape)
            q_factors[i] = q
            updates.append(approx.reshape(shape))
        history.append((updates, [[e.copy() for e in errs] for errs in errors], list(q_factors)))
    return history


@pytest.mark.parametrize("rank", [1, 2])
def test_reducer_matches_numpy(strategy, rank):
    reducer = Reducer(strategy, SHAPES, rank)
    rng = np.random.default_rng(rank)
    steps = [_gradients(rng, SHAPES, REPLICAS) for _ in range(3)]
    reference = _numpy_powersgd(reducer.q_factors(), steps, SHAPES)
    for grads, (updates, errors, q_factors) in zip(steps, reference):
        got = reducer.step(grads)
        for replica in got:  # every replica applies the same update
            for value, expected in zip(replica, updates):
                np.testing.assert_allclose(value, expected, rtol=0, atol=1e-10)
        for index, per_replica in enumerate(reducer.errors()):
            for r, error in enumerate(per_replica):
                np.testing.assert_allclose(error, errors[r][index], rtol=0, atol=1e-10)
        # QR's column signs are a convention (LAPACK's and TensorFlow's may differ), and
        # P Q^T does not depend on them.
        for q, expected in zip(reducer.q_factors(), q_factors):
            signs = np.sign(np.sum(q * expected, axis=0))
            np.testing.assert_allclose(q * signs, expected, rtol=0, atol=1e-10)
    # Rank 1 or 2 of matrices of rank 4 or more: the update is an approximation.
    mean = np.mean([g[0] for g in steps[-1]], axis=0)
    assert np.abs(got[0][0] - mean).max() > 0.1 * np.abs(mean).max()


def test_error_feedback_delays_but_loses_nothing(strategy):
    # sum(applied) = sum(mean gradient) + mean(E_0) - mean(E_T), E_0 = 0: whatever a step
    # leaves out is sent later. Gradients: a fixed full-rank part plus noise, rank 1.
    shapes = [(3, 3, 4, 6)]
    reducer = Reducer(strategy, shapes, rank=1)
    rng = np.random.default_rng(5)
    drift = rng.normal(0, 1, shapes[0])
    applied = np.zeros(shapes[0])
    true = np.zeros(shapes[0])
    lossy = []
    for _ in range(60):
        grads = [[drift + rng.normal(0, 0.5, shapes[0])] for _ in range(REPLICAS)]
        mean = np.mean([g[0] for g in grads], axis=0)
        update = reducer.step(grads)[0][0]
        lossy.append(np.linalg.norm(update - mean) / np.linalg.norm(mean))
        applied += update
        true += mean
    final_error = np.mean(reducer.errors()[0], axis=0)
    np.testing.assert_allclose(applied + final_error, true, rtol=0, atol=1e-9)
    # Each step alone sends a rank-1 matrix and is far from its gradient...
    assert np.median(lossy) > 0.5
    # ...but the delayed part stays bounded while the sum grows with the steps.
    assert np.linalg.norm(final_error) < 0.15 * np.linalg.norm(true)


def test_saving_gives_every_replica_the_saved_mean_and_changes_no_update(strategy):
    # The updates depend on the error buffers only through their mean, so a job that goes
    # on from the saved mean (as a resumed one does) takes the same steps as one that
    # keeps each replica's own buffer.
    shapes = [(3, 3, 4, 6), (1, 1, 6, 9)]
    kept, saved = Reducer(strategy, shapes, rank=2), Reducer(strategy, shapes, rank=2)
    rng = np.random.default_rng(7)
    batches = [_gradients(rng, shapes, REPLICAS) for _ in range(4)]
    for grads in batches[:2]:
        kept.step(grads)
        saved.step(grads)
    before = saved.errors()
    assert np.abs(before[0][0] - before[0][1]).max() > 0.1  # the replicas' buffers differ
    store = {}
    saved.state.save_own_variables(store)
    for index, per_replica in enumerate(saved.errors()):
        np.testing.assert_allclose(
            store[f"error_{index}"], np.mean(before[index], axis=0), atol=1e-12
        )
        for error in per_replica:
            np.testing.assert_array_equal(error, store[f"error_{index}"])
    for grads in batches[2:]:
        for a, b in zip(kept.step(grads)[0], saved.step(grads)[0]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_which_kernels_are_compressed_and_the_bytes():
    assert worth_compressing((3, 3, 256, 512), 4)
    assert worth_compressing((3, 3, 3, 16), 4)  # (27 + 16) x 4 x 2 = 344 <= 432
    assert not worth_compressing((3, 3, 3, 16), 8)
    assert not worth_compressing((512,), 1)  # biases and batch norm: never
    assert not worth_compressing((4, 8), 1)  # only convolution kernels
    variables = [tf.Variable(tf.zeros((3, 3, 64, 128))), tf.Variable(tf.zeros((128,)))]
    assert [v.shape for v in compressible(variables, 4)] == [variables[0].shape]
    assert powersgd_bytes(variables, 4) == (576 + 128) * 4 * 4 + 128 * 4
    assert powersgd_bytes(variables, 4, "bfloat16") == (576 + 128) * 4 * 4 + 128 * 2
    assert allreduce_bytes(variables) / powersgd_bytes(variables, 4) > 25


def _trainer(compress, rank=2):
    trainer = YoloTrainer(
        tiny_model(size=SIZE),
        head=make_head(SMALL_ANCHORS, 2),
        communication=communication_from(compress=compress, rank=rank),
    )
    trainer.compile(optimizer=keras.optimizers.SGD(0.01))
    trainer.build((None, SIZE, SIZE, 3))
    return trainer


def test_the_state_is_saved_with_the_trainer_and_loads_only_where_it_fits(tmp_path):
    saved = _trainer("powersgd")
    state = saved.communication.state
    # The trainer's own collection: every kernel of tiny-YOLOv3, none of its weights.
    assert len(state) == 13
    assert not any("powersgd" in v.name for v in saved.weights)
    rng = np.random.default_rng(0)
    for variable in (*state.q_factors, *state.errors):
        variable.assign(rng.normal(0, 1, variable.shape).astype(np.float32))
    saved.save_weights(tmp_path / "state.weights.h5")
    loaded = _trainer("powersgd")
    loaded.load_weights(tmp_path / "state.weights.h5")
    restored = loaded.communication.state
    for a, b in zip((*state.q_factors, *state.errors), (*restored.q_factors, *restored.errors)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="--rank"):
        _trainer("powersgd", rank=4).load_weights(tmp_path / "state.weights.h5")
    _trainer("none").save_weights(tmp_path / "plain.weights.h5")
    with pytest.raises(ValueError, match="--compress"):
        _trainer("powersgd").load_weights(tmp_path / "plain.weights.h5")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Eight noisy records in two shards, anchors and seeded initial weights."""
    return job_inputs(tmp_path_factory.mktemp("compression"), val=0)


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def _saved_state(path):
    with h5py.File(path, "r") as f:
        group = f["layers/power_sgd_state/vars"]
        return {key: group[key][()] for key in group}


def assert_trained_alike(dump, initial):
    """Both workers' dumped weights moved away from ``initial`` and are bitwise equal;
    returns the template model with the initial weights."""
    from yolo3.checkpoint.weights import load_weights
    from yolo3.model.network import tiny_yolo_body

    chief, _ = _weights(dump / "worker-0.npz")
    other, _ = _weights(dump / "worker-1.npz")
    start = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    load_weights(start, initial)
    assert _max_difference(chief, start.get_weights()) > 1e-2  # it trained
    assert _max_difference(chief, other) == 0.0
    return start


@pytest.mark.slow
def test_two_workers_with_powersgd_end_identical(setup, tmp_path):
    records, anchors, initial = setup
    flags = ["--epochs", "2", "--steps-per-epoch", "1", "--flip", "0"]
    # Two micro-batches per step: compressed once, after they are summed.
    flags += ["--compress", "powersgd", "--rank", "2", "--accumulate", "2"]
    log = _run(_launch(tmp_path / "dump", tmp_path / "job", records, anchors, initial, *flags))
    assert "2 replicas x 4 x 2 micro-batches = global batch 16" in log
    assert "all-reduce float32 + PowerSGD rank 2 (0.19 MB per step per worker" in log
    assert_trained_alike(tmp_path / "dump", initial)
    config = training.read_config(str(tmp_path / "job/config.json"))
    assert (config.compress, config.rank, config.accumulate) == ("powersgd", 2, 2)
    # The chief's state holds Q and the mean error buffer (of both workers' replicas).
    state = _saved_state(tmp_path / "job/checkpoints/state.weights.h5")
    assert len(state) == 2 * 13 and np.abs(state["error_5"]).max() > 0


def _worker(dump, args, snapshot=None):
    """train.py through tests/train_worker.py; ``snapshot``: ``(epoch, folder)``, the log
    folder as it stands after that epoch, copied there (what a run stopped then leaves)."""
    env = None
    if snapshot:
        env = {**os.environ, SNAPSHOT_ENV: f"{snapshot[0]}:{snapshot[1]}"}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(dump), "--", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait(processes):
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]


@pytest.mark.slow
def test_a_resumed_run_continues_as_an_uninterrupted_one(setup, tmp_path):
    _, anchors, initial = setup
    # Two replicas: each keeps its own error buffer; the checkpoint keeps their mean, which
    # the saving run also takes on. The same 8 images every step, in the order of their one
    # shard (with two, a resume draws a new order of the shards), so a fresh input stream
    # changes nothing. A constant learning rate: the cosine schedule depends on
    # the run's planned length. The first step all-reduces the whole gradient: the resumed
    # run must not take a second dense step.
    fixed = ["--steps-per-epoch", "2", "--flip", "0", "--shuffle-buffer", "1"]
    fixed += ["--lr-schedule", "constant"]
    fixed += ["--cpu-replicas", "2", "--compress", "powersgd", "--rank", "2"]
    fixed += ["--dense-steps", "1"]
    records = small_record_set(tmp_path / "records", train=8, val=0, num_shards=1, noise=20)

    def args(name, epochs, *extra):
        return _sgd_args(
            records, tmp_path / name, anchors, initial, "--epochs", str(epochs), *fixed, *extra
        )

    # The uninterrupted run leaves its folder as it stood after epoch 1 in "half": what a
    # run stopped there leaves; the same command with --resume continues it.
    _wait([_worker(tmp_path / "whole", args("whole", 2), snapshot=(1, tmp_path / "half"))])
    state = _saved_state(tmp_path / "half/checkpoints/state.weights.h5")
    assert np.abs(state["error_5"]).max() > 0  # there is error feedback to carry over
    _wait([_worker(tmp_path / "resumed", args("half", 2, "--resume"))])
    weights, whole_dump = _weights(tmp_path / "whole/worker-0.npz")
    resumed, resumed_dump = _weights(tmp_path / "resumed/worker-0.npz")
    assert int(resumed_dump["step"]) == int(whole_dump["step"]) == 4
    assert int(resumed_dump["epochs_this_run"]) == 1
    # Bitwise. A resume that lost the error buffers (restored as zeros) ends 0.47 away; one
    # that restored their mean while the saving run went on with its own two, 4e-7 away.
    assert _max_difference(weights, resumed) == 0.0


@pytest.fixture
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--compress", "zip"), "--compress"),
        (("--compress", "powersgd", "--rank", "0"), "--rank"),
        (("--rank", "-2"), "--rank"),
        (("--compress", "powersgd", "--mixed-precision", "float16"), "--compress"),
    ],
)
def test_compression_flags_reject_bad_values(setup, tmp_path, capsys, float32_policy, flags, named):
    records, anchors, _ = setup
    assert train.main(train_args(records, tmp_path, anchors, *flags)) == 2
    error = capsys.readouterr().err
    assert named in error
    if "float16" in flags:
        assert "--mixed-precision bfloat16 or off" in error


def test_rank_above_a_kernel_is_refused(strategy):
    with strategy.scope():
        kernel = tf.Variable(tf.zeros((1, 1, 3, 8)))
    with pytest.raises(ValueError, match="--rank 4"):
        PowerSGDState([kernel], 4)
