"""Local steps (``--local-steps H``): the synchronisation against NumPy, the trainer against
ordinary training, and train.py on two workers and across a resume.

In-process tests run on the test session's four logical CPU replicas; train.py runs in
processes of its own (two workers, or two replicas).
"""

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    SMALL_ANCHORS,
    distribute_per_replica,
    make_head,
    micro_model,
    random_boxes,
    tiny_model,
)
from test_compression import _max_difference, _wait, _worker, assert_trained_alike
from test_compression import setup as setup  # noqa: F401 (the records fixture)
from test_train_distributed import _launch, _run, _sgd_args, _weights
from train_helpers import SIZE, small_record_set, train_args
from train_worker import SNAPSHOT_ENV

from yolo3.callbacks import LocalSync
from yolo3.comm.local_steps import LocalStepsState, local_reducer, sync_bytes
from yolo3.comm.local_sync import overlap_advice
from yolo3.comm.schemes import communication_from
from yolo3.commands import train
from yolo3.engine.trainer import YoloTrainer, make_optimizer
from yolo3.model.loss import LossOptions
from yolo3.training import job as training

REPLICAS = 4  # conftest.NUM_LOGICAL_CPUS


def _set_per_replica(strategy, variable, values):
    """Gives each replica's copy of a mirrored ``variable`` its own value."""
    distributed = distribute_per_replica(strategy, values)

    @tf.function
    def assign():
        strategy.extended.update(variable, lambda v, x: v.assign(x), args=(distributed,))

    assign()


def _copies(strategy, variable):
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return [np.asarray(c) for c in strategy.experimental_local_results(value)]


class Weights:
    """A trainable and a non-trainable (batch-norm-like) weight under ``strategy``."""

    def __init__(self, strategy, **outer):
        with strategy.scope():
            self.kernel = keras.Variable(np.zeros((3, 2)), dtype="float64", name="kernel")
            self.stat = keras.Variable(
                np.ones((2,)), dtype="float64", trainable=False, name="moving_mean"
            )
            self.slot = keras.Variable(np.zeros((3, 2)), dtype="float64", name="slot")
            self.state = LocalStepsState([self.kernel, self.stat], 2, **outer)
        self.strategy = strategy
        self.state.reset(strategy)


def test_plain_averaging_gives_every_replica_the_mean(strategy):
    weights = Weights(strategy)
    rng = np.random.default_rng(0)
    kernels = [rng.normal(size=(3, 2)) for _ in range(REPLICAS)]
    stats = [rng.uniform(0, 2, size=(2,)) for _ in range(REPLICAS)]
    slots = [rng.normal(size=(3, 2)) for _ in range(REPLICAS)]
    _set_per_replica(strategy, weights.kernel.value, kernels)
    _set_per_replica(strategy, weights.stat.value, stats)
    _set_per_replica(strategy, weights.slot.value, slots)
    weights.state.trace(strategy)  # runs nothing
    for copy, own in zip(_copies(strategy, weights.kernel), kernels):
        np.testing.assert_array_equal(copy, own)
    weights.state.synchronize(strategy)
    for copy in _copies(strategy, weights.kernel):
        np.testing.assert_allclose(copy, np.mean(kernels, axis=0), rtol=0, atol=1e-12)
    for copy in _copies(strategy, weights.stat):
        np.testing.assert_allclose(copy, np.mean(stats, axis=0), rtol=0, atol=1e-12)
    # A plain synchronisation leaves the optimizer's state alone; a full one averages it.
    for copy, own in zip(_copies(strategy, weights.slot), slots):
        np.testing.assert_array_equal(copy, own)
    weights.state.synchronize(strategy, [weights.slot])
    for copy in _copies(strategy, weights.slot):
        np.testing.assert_allclose(copy, np.mean(slots, axis=0), rtol=0, atol=1e-12)


def test_nesterov_outer_steps_match_numpy(strategy):
    lr, mu = 0.7, 0.9
    weights = Weights(strategy, outer_lr=lr, outer_momentum=mu)
    rng = np.random.default_rng(1)
    anchor, buffer = np.zeros((3, 2)), np.zeros((3, 2))
    for _ in range(3):
        kernels = [anchor + rng.normal(0, 0.1, (3, 2)) for _ in range(REPLICAS)]
        stats = [rng.uniform(0, 2, size=(2,)) for _ in range(REPLICAS)]
        _set_per_replica(strategy, weights.kernel.value, kernels)
        _set_per_replica(strategy, weights.stat.value, stats)
        weights.state.synchronize(strategy)
        # DiLoCo's outer step, by hand: the mean change is the outer gradient.
        change = anchor - np.mean(kernels, axis=0)
        buffer = mu * buffer + change
        anchor = anchor - lr * (change + mu * buffer)
        for copy in _copies(strategy, weights.kernel):
            np.testing.assert_allclose(copy, anchor, rtol=0, atol=1e-12)
        for copy in _copies(strategy, weights.stat):  # statistics: averaged, no outer step
            np.testing.assert_allclose(copy, np.mean(stats, axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        weights.state.momentum_buffers[0].read_value(), buffer, rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("delay, merge", [(1, "own"), (2, "own"), (2, "eager")])
def test_overlapped_synchronisations_match_numpy(strategy, delay, merge):
    # H = 2. Each period's changes travel during the first T steps of the next period (a
    # chunk a step) and move the anchor there; each replica goes on from the anchor with its
    # own steps since. A full synchronisation lands what is in flight. Eager: while a change
    # travels a replica goes on from the anchor less its own change over W plus the others'
    # share of the last mean that landed (the statistics from their own, as without it).
    lr, mu = 0.7, 0.9
    weights = Weights(strategy, outer_lr=lr, outer_momentum=mu, overlap=delay, merge=merge)
    state = weights.state
    state.trace(strategy)  # traces the period's end, runs nothing (the oracle below agrees)
    exchange = tf.function(lambda: strategy.run(state.exchange))
    rng = np.random.default_rng(2)
    names = ("kernel", "stat")
    anchor = {"kernel": np.zeros((3, 2)), "stat": np.ones(2)}
    held = {name: [value] * REPLICAS for name, value in anchor.items()}
    sent = {name: [np.zeros_like(value)] * REPLICAS for name, value in anchor.items()}
    stale = {name: [np.zeros_like(value)] * REPLICAS for name, value in anchor.items()}
    buffer = np.zeros((3, 2))
    in_flight, since_sent = False, 0

    def outer(name, mean):
        nonlocal buffer
        if name == "stat":
            return anchor[name] - mean  # statistics: no outer step
        buffer = mu * buffer + mean
        return anchor[name] - lr * (mean + mu * buffer)

    def applied(name):  # what each replica went on from at the send, less the anchor
        if merge == "own" or name == "stat":  # statistics go on from their own
            return sent[name]
        return [s / REPLICAS + o for s, o in zip(sent[name], stale[name])]

    def land(name):  # the outer step with the mean sent; returns each replica's own since
        since = [anchor[name] - a - w for a, w in zip(applied(name), held[name])]
        mean = np.mean(sent[name], axis=0)
        anchor[name] = outer(name, mean)
        stale[name] = [mean - s / REPLICAS for s in sent[name]]
        return since

    for period in range(4):
        full = period == 3
        for _ in range(1 if full else 2):
            held["kernel"] = [k + rng.normal(0, 0.1, (3, 2)) for k in held["kernel"]]
            held["stat"] = [rng.uniform(0, 2, (2,)) for _ in range(REPLICAS)]
            _set_per_replica(strategy, weights.kernel.value, held["kernel"])
            _set_per_replica(strategy, weights.stat.value, held["stat"])
            exchange()
            state.step_done()
            since_sent += 1
            assert state.landing_due() == (in_flight and since_sent == delay)
            if state.landing_due():
                state.land(strategy)
                for name in names:
                    held[name] = [anchor[name] - d for d in land(name)]
                in_flight = False
                if merge == "eager":  # the next send's estimate of the others' share
                    assert np.abs(stale["kernel"][0]).max() > 1e-3
        if full:
            state.synchronize(strategy, [weights.slot])
            for name in names:
                since = land(name) if in_flight else [anchor[name] - w for w in held[name]]
                anchor[name] = outer(name, np.mean(since, axis=0))
                held[name] = [anchor[name]] * REPLICAS
                stale[name] = [np.zeros_like(anchor[name])] * REPLICAS
        else:
            state.synchronize(strategy)  # sends: the weights stay (eager: the estimate)
            for name in names:
                sent[name] = [anchor[name] - w for w in held[name]]
                held[name] = [anchor[name] - a for a in applied(name)]
            in_flight, since_sent = True, 0
        for name in names:
            for copy, want in zip(_copies(strategy, getattr(weights, name)), held[name]):
                np.testing.assert_allclose(copy, want, rtol=0, atol=1e-12)
        if period == 1:  # between full synchronisations the replicas differ
            copies = _copies(strategy, weights.kernel)
            assert np.abs(copies[0] - copies[1]).max() > 1e-3
    np.testing.assert_allclose(state.momentum_buffers[0].read_value(), buffer, rtol=0, atol=1e-12)


def test_steps_after_the_chunks_have_gone_exchange_without_crashing(strategy):
    # Once the T chunks of a period are sent, each step's exchange sends a placeholder
    # element. An all-reduce of no elements there crashed the process (segmentation
    # fault) within 500 steps, every time, in TensorFlow 2.21's CPU collectives.
    weights = Weights(strategy, outer_lr=0.7, outer_momentum=0.9, overlap=1)
    state = weights.state
    exchange = tf.function(lambda: strategy.run(state.exchange))
    for _ in range(500):
        exchange()
    received = _copies(strategy, state.received)
    assert all(np.array_equal(copy[:1], np.zeros_like(copy[:1])) for copy in received)
    assert not state.landing_due()


def test_the_weight_change_travels_in_the_allreduce_dtype(strategy):
    with strategy.scope():
        kernel = keras.Variable(np.zeros((4,)), dtype="float32")
        state = LocalStepsState([kernel], 1, allreduce_dtype="bfloat16")
    state.reset(strategy)
    # 1 + 2**-10 is not a bfloat16 number (8 bits of mantissa): the change arrives rounded.
    values = [np.full((4,), 1 + 2.0**-10, np.float32)] * REPLICAS
    _set_per_replica(strategy, kernel.value, values)
    state.synchronize(strategy)
    np.testing.assert_array_equal(_copies(strategy, kernel)[0], np.ones(4, np.float32))
    assert sync_bytes([kernel], "bfloat16") == 8 and sync_bytes([kernel]) == 16


def test_the_reducer_hands_each_replica_its_own_local_mean(strategy):
    def replica():
        context = tf.distribute.get_replica_context()
        grad = tf.cast(context.replica_id_in_sync_group, tf.float32) / REPLICAS
        return local_reducer([(grad, None), (None, None)])

    outputs = strategy.run(tf.function(replica))
    own = [float(g) for g in strategy.experimental_local_results(outputs[0][0])]
    assert own == [0.0, 1.0, 2.0, 3.0]
    assert outputs[1][0] is None


def _batches(steps, batch):
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (steps * batch, SIZE, SIZE, 3)).astype(np.float32)
    boxes = random_boxes(rng, steps * batch, 4, SIZE, 2)
    return images, boxes


def _fit(
    strategy, local_steps, steps=3, options=None, optimizer=None, body=micro_model,
    trainer_options=None, **extra,
):  # fmt: skip
    """A trainer of ``body`` (the micro model: these tests compare runs with each other) on
    the four replicas, trained ``steps`` steps (by default of SGD with momentum;
    ``optimizer``: a function that makes another, called under the strategy's scope as
    train.py does); ``options``: more of the communication's arguments, ``trainer_options``
    of the trainer's."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        trainer = YoloTrainer(
            body(size=SIZE),
            head=make_head(SMALL_ANCHORS, 2),
            communication=communication_from(local_steps=local_steps, **(options or {})),
            **(trainer_options or {}),
        )
        optimizer = optimizer() if optimizer else keras.optimizers.SGD(0.05, momentum=0.9)
        trainer.compile(optimizer=optimizer, jit_compile=False)
    state = trainer.communication.state
    sync = None if local_steps is None else LocalSync(state, status=trainer.status)
    _more_steps(trainer, steps, sync, **extra)
    return trainer, sync


def _more_steps(trainer, steps, sync=None, **extra):
    images, boxes = _batches(steps, 2 * REPLICAS)
    trainer.fit(
        images, boxes, batch_size=2 * REPLICAS, epochs=1, shuffle=False,
        callbacks=[sync] if sync else [], verbose=0, **extra,
    )  # fmt: skip


@pytest.mark.slow
def test_one_local_step_with_plain_averaging_equals_ordinary_training(strategy):
    ordinary, _ = _fit(strategy, None)
    local, sync = _fit(strategy, 1)
    assert sync.synchronisations == 3
    # SGD with momentum is linear: the mean of the replicas' updates is the update of the
    # mean gradient, step after step.
    _assert_trained_alike(ordinary, local, atol=2e-5)


def _assert_trained_alike(ordinary, other, atol, body=micro_model):
    """``other``'s weights within ``atol`` of ``ordinary``'s, which moved from the start."""
    moved = 0.0
    for a, b, start in zip(
        ordinary.body.trainable_weights, other.body.trainable_weights, _start_weights(body)
    ):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=atol)
        moved = max(moved, float(np.max(np.abs(np.asarray(a) - start))))
    assert moved > 1e-2  # it trained


def _start_weights(body=micro_model):
    keras.utils.set_random_seed(0)
    return [np.asarray(w) for w in body(size=SIZE).trainable_weights]


@pytest.mark.slow
def test_replicas_drift_apart_between_synchronisations_and_meet_at_each(strategy):
    trainer, _ = _fit(strategy, 3, steps=2)  # 2 steps, H = 3: only the epoch end synchronised
    kernel = trainer.body.trainable_weights[0]
    copies = _copies(strategy, kernel)
    for copy in copies[1:]:
        np.testing.assert_array_equal(copy, copies[0])
    state = trainer.communication.state
    # Two more local steps without the callback: each replica moves on its own.
    _more_steps(trainer, 2)
    copies = _copies(strategy, kernel)
    assert max(float(np.max(np.abs(c - copies[0]))) for c in copies[1:]) > 1e-6
    state.synchronize(strategy)
    copies = _copies(strategy, kernel)
    for copy in copies[1:]:
        np.testing.assert_array_equal(copy, copies[0])


@pytest.mark.slow
def test_overlapped_local_steps_send_a_chunk_in_each_train_step(strategy):
    trainer, sync = _fit(strategy, 2, steps=2, options={"overlap_sync": True})
    state = trainer.communication.state
    kernel = trainer.body.trainable_weights[0]

    def assert_met():  # a full synchronisation: one model, nothing in flight
        copies = _copies(strategy, kernel)
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0])
        assert not state.in_flight
        assert min(int(p) for p in _copies(strategy, state.position)) >= 2  # none to send

    assert sync.synchronisations == 1  # the epoch end's
    assert_met()
    # Three more steps, H = 2, no epoch-end synchronisation: after step 2 each replica's
    # change is in flight; step 3 brought the first chunk's mean.
    sync = LocalSync(state, epoch_ends=False)
    _more_steps(trainer, 3, sync)
    assert sync.synchronisations == 1
    # Timed for the advice on --overlap-sync: step 2 computed alone, step 3 carried a chunk
    # (step 1, the epoch's first, carries its setup).
    assert [len(sync.step_seconds[chunk]) for chunk in (False, True)] == [1, 1]
    sent = _copies(strategy, state.sent)
    assert sent[0].shape == (2, -(-sum(int(np.prod(w.shape)) for w in trainer.body.weights) // 2))
    assert np.abs(sent[0] - sent[1]).max() > 1e-6  # each replica its own change
    for received in _copies(strategy, state.received):
        np.testing.assert_allclose(received[0], np.mean(sent, axis=0)[0], rtol=1e-6, atol=1e-7)
        assert not np.any(received[1])  # the second chunk travels in the next step
    assert [int(p) for p in _copies(strategy, state.position)] == [1] * REPLICAS
    copies = _copies(strategy, kernel)
    assert np.abs(copies[0] - copies[1]).max() > 1e-6
    state.synchronize(strategy, trainer.optimizer.variables)
    assert_met()


def test_overlap_advice_spreads_the_change_over_enough_steps():
    # 8 chunk steps of 0.35 s against 0.21 s: the link needs 2.8 s for a change, which 14
    # steps of computation (2.94 s) hide.
    advice = overlap_advice(8, 64, 0.35, 0.21)
    assert "took 0.35 s against 0.21 s" in advice and "about 2.8 s for a change" in advice
    assert advice.endswith("--overlap-sync 14 would send it behind the computation")
    # H = 10 is too short a period for it: a larger --local-steps.
    assert "a larger --local-steps (at least 14) with --overlap-sync 14" in overlap_advice(
        8, 10, 0.35, 0.21
    )
    assert overlap_advice(8, 64, 0.22, 0.21) is None  # within 10%: nothing to gain


@pytest.mark.slow
def test_overlapped_local_steps_compile_with_xla_on_one_device():
    # One GPU alone turns XLA on (--jit-compile auto), so the step with its exchange must
    # compile. With one replica and plain averaging every outer step hands back the
    # replica's own change, one period late: ordinary training, to rounding.
    images, boxes = _batches(3, 4)

    def train(**local):
        keras.utils.set_random_seed(0)
        trainer = YoloTrainer(
            micro_model(size=SIZE), head=make_head(SMALL_ANCHORS, 2),
            communication=communication_from(**local),
        )  # fmt: skip
        trainer.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=True)
        state = trainer.communication.state
        callbacks = [LocalSync(state, status=trainer.status)] if local else []
        trainer.fit(
            images, boxes, batch_size=4, epochs=1, shuffle=False, callbacks=callbacks,
            verbose=0,
        )  # fmt: skip
        return trainer, callbacks

    ordinary, _ = train()
    overlapped, (sync,) = train(local_steps=2, overlap_sync=True)
    assert sync.synchronisations == 2  # after step 2, and the full one at the epoch end
    _assert_trained_alike(ordinary, overlapped, atol=1e-5)


def test_one_replicas_overlapped_exchange_is_one_xla_program_at_every_position():
    # XLA specialises a compiled function on any variable whose value must be known when
    # it compiles; a chunk sized from the position would make the train step compile once
    # for each position a change passes through (T + 2 programs where one would do:
    # tests/test_xla.py's train.py run took 100 s with them, 33 s without).
    # With one replica (the only case XLA is on) the program must not depend on it.
    weights = [tf.Variable(tf.ones((5, 3))), tf.Variable(tf.zeros((4,)))]
    state = LocalStepsState(weights, 2, overlap=True)
    exchange = tf.function(state.exchange, jit_compile=True, autograph=False)
    programs = set()
    for position in range(4):  # sending the first chunk, the second, done, idle
        state._overlapped.position.assign(position)
        programs.add(exchange.experimental_get_compiler_ir()(stage="hlo"))
    assert len(programs) == 1
    state._overlapped.sent.assign(tf.reshape(tf.range(20, dtype=tf.float32), (2, 10)))
    state._overlapped.position.assign(0)
    for _ in range(3):
        exchange()
    received = state._overlapped.received.numpy()
    np.testing.assert_array_equal(received[:2].ravel(), np.arange(20))  # the mean of one
    assert int(state._overlapped.position.numpy()) == 3


def test_the_outer_momentum_is_saved_with_the_trainer(tmp_path, strategy):
    def make(momentum):
        with strategy.scope():
            trainer = YoloTrainer(
                tiny_model(size=SIZE), head=make_head(SMALL_ANCHORS, 2),
                communication=communication_from(
                    local_steps=4, outer_lr=0.7, outer_momentum=momentum
                ),
            )  # fmt: skip
            trainer.compile(optimizer=keras.optimizers.SGD(0.01))
        trainer.build((None, SIZE, SIZE, 3))
        return trainer

    saved = make(0.9)
    assert not any("anchor" in v.name or "momentum_" in v.name for v in saved.weights)
    rng = np.random.default_rng(0)
    buffers = saved.communication.state.momentum_buffers
    for buffer in buffers:
        buffer.assign(rng.normal(0, 1, buffer.shape).astype(np.float32))
    saved.save_weights(tmp_path / "state.weights.h5")
    loaded = make(0.9)
    loaded.load_weights(tmp_path / "state.weights.h5")
    for a, b in zip(buffers, loaded.communication.state.momentum_buffers):
        np.testing.assert_array_equal(a.read_value(), b.read_value())
    with pytest.raises(ValueError, match="--outer-momentum"):
        make(0.0).load_weights(tmp_path / "state.weights.h5")
    make(0.0).save_weights(tmp_path / "plain.weights.h5")
    with pytest.raises(ValueError, match="--outer-momentum"):
        make(0.9).load_weights(tmp_path / "plain.weights.h5")


# Three steps per epoch and H = 2: the first run stops at step 3, one step into a cycle,
# and its epoch-end save is a full synchronisation that the uninterrupted run makes at the
# same step. SGD with momentum: its slots are each replica's own between synchronisations.
RESUMED = ["--steps-per-epoch", "3", "--flip", "0", "--shuffle-buffer", "1"]
RESUMED += ["--lr-schedule", "constant", "--sync-bn", "off"]
RESUMED += ["--local-steps", "2", "--outer-lr", "0.8", "--outer-momentum", "0.5"]


def _assert_resumed_as_uninterrupted(whole, resumed):
    weights, whole_dump = _weights(whole)
    resumed_weights, resumed_dump = _weights(resumed)
    assert int(resumed_dump["step"]) == int(whole_dump["step"]) == 6
    assert int(resumed_dump["epochs_this_run"]) == 1
    difference = _max_difference(weights, resumed_weights)
    print(f"\nresumed vs uninterrupted: {difference:.1e}")
    # Bitwise equal when measured: each replica resumes with the state it saved.
    assert difference <= 1e-6


@pytest.mark.slow
def test_overlapped_replicas_resumed_between_synchronisations_continue_as_uninterrupted(
    setup, tmp_path
):
    _, anchors, initial = setup
    # One shard: the shards' order is drawn anew on each pass over the data, which changes
    # which replica trains on which images after a restart. With one, each step's two
    # halves are the same images in both runs. Two replicas of one process: the epoch-end
    # save averages their slots in memory and lands the changes still in flight.
    records = small_record_set(tmp_path / "records", train=8, val=0, num_shards=1, noise=20)
    fixed = [*RESUMED, "--cpu-replicas", "2", "--overlap-sync", "2"]

    def args(name, epochs, *extra):
        return _sgd_args(
            records, tmp_path / name, anchors, initial, "--epochs", str(epochs), *fixed, *extra
        )

    # "half": the uninterrupted run's folder as it stood after epoch 1 (test_compression).
    _wait([_worker(tmp_path / "whole", args("whole", 2), snapshot=(1, tmp_path / "half"))])
    _wait([_worker(tmp_path / "resumed", args("half", 2, "--resume"))])
    _assert_resumed_as_uninterrupted(
        tmp_path / "whole/worker-0.npz", tmp_path / "resumed/worker-0.npz"
    )


def _momentum_slots(path):
    with h5py.File(path, "r") as f:
        group = f["optimizer/vars"]
        return [group[k][()] for k in sorted(group, key=int) if group[k].ndim >= 1]


@pytest.mark.slow
def test_two_overlapped_workers_keep_their_own_optimizer_state_and_resume_from_it(
    setup, tmp_path, monkeypatch
):
    _, anchors, initial = setup
    # Two shards of 4 images, one a worker: each step of a worker is its whole shard, in
    # the same order after a restart.
    records = small_record_set(tmp_path / "records", train=8, val=0, num_shards=2, noise=20)
    monkeypatch.setenv(SNAPSHOT_ENV, f"1:{tmp_path / 'half'}")
    # Overlapped, T = 1: a period's change travels during the step after it; each epoch
    # end's save synchronises in full and lands what is still in flight.
    flags = ["--epochs", "2", *RESUMED, "--allreduce-dtype", "bfloat16", "--overlap-sync", "1"]
    log = _run(_launch(tmp_path / "whole", tmp_path / "job", records, anchors, initial, *flags))
    when = "every 2 steps, sent during the next 1 step in bfloat16"
    assert f"all-reduce none in the step; weight changes {when}" in log
    assert "outer lr 0.8, Nesterov momentum 0.5" in log
    start = assert_trained_alike(tmp_path / "whole", initial)
    config = training.read_config(str(tmp_path / "job/config.json"))
    assert (config.local_steps, config.overlap_sync, config.sync_bn) == (2, 1, False)
    with h5py.File(tmp_path / "job/checkpoints/state.weights.h5", "r") as f:
        buffers = f["layers/local_steps_state/vars"]
        assert len(buffers) == len(start.weights) + 1  # and the outer step's settings
        assert max(float(np.abs(buffers[k][()]).max()) for k in buffers) > 0
    monkeypatch.delenv(SNAPSHOT_ENV)
    # The epoch-end synchronisation sent the weights' change, not the optimizer's state:
    # each worker's backup holds its own momentum.
    backups = [tmp_path / f"half/backup/worker-{i}/backup-000000003.weights.h5" for i in (0, 1)]
    own = [_momentum_slots(path) for path in backups]
    assert own[0] and _max_difference(*own) > 1e-6
    # Each worker resumes from its own backup (the chief's would not match the run that
    # went on): the resumed job ends where the uninterrupted one did, on both workers.
    flags += ["--resume"]
    _run(_launch(tmp_path / "resumed", tmp_path / "half", records, anchors, initial, *flags))
    for index in (0, 1):
        _assert_resumed_as_uninterrupted(
            tmp_path / f"whole/worker-{index}.npz", tmp_path / f"resumed/worker-{index}.npz"
        )


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--local-steps", "0"), "--local-steps"),
        (("--local-steps", "-3"), "--local-steps"),
        (("--local-steps", "4", "--outer-lr", "0"), "--outer-lr"),
        (("--local-steps", "4", "--outer-momentum", "1"), "--outer-momentum"),
        (("--local-steps", "4", "--outer-momentum", "-0.1"), "--outer-momentum"),
        (("--outer-momentum", "0.9"), "--local-steps"),
        (("--local-steps", "4", "--compress", "powersgd"), "--compress"),
        (("--local-steps", "4", "--sync-bn", "on"), "--sync-bn"),
        (("--overlap-sync", "2"), "--local-steps"),
        (("--local-steps", "2", "--overlap-sync", "3"), "--overlap-sync"),
        (("--local-steps", "2", "--overlap-sync", "0"), "--overlap-sync"),
        (("--allreduce-dtype", "int4"), "--allreduce-dtype int4 quantizes"),
        (("--local-steps", "2", "--overlap-merge", "eager"), "--overlap-merge says"),
    ],
)
def test_local_steps_flags_reject_bad_values(setup, tmp_path, capsys, flags, named):
    records, anchors, _ = setup
    assert train.main(train_args(records, tmp_path, anchors, *flags)) == 2
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_float16_mixed_precision_trains_and_synchronises(strategy):
    # The loss-scale optimizer applies each replica's own update inside its finite-gradient
    # conditional: with local steps the step holds no collective, so that is allowed. Its
    # first steps overflow and are skipped while the scale comes down (from 2^15).
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        # YOLOv3's loss and assignment: its gradients overflow float16 at the first steps
        # and never after on this data (the recipe's CIoU term overflows once mid-run
        # instead, which resets the step counter the assertions below count with).
        trainer, sync = _fit(
            strategy, 4, steps=8, optimizer=lambda: make_optimizer("sgd", 1e-3),
            trainer_options={"loss_options": LossOptions(iou_loss="mse"), "iou_thresh": 1.0},
        )  # fmt: skip
    finally:
        keras.mixed_precision.set_global_policy("float32")
    optimizer = trainer.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    # The step counter (the learning-rate schedule's) counts each applied step once, not
    # once per replica (as it did when the optimizer was made outside the scope).
    applied = {int(n) for n in strategy.experimental_local_results(optimizer.step_counter.value)}
    assert len(applied) == 1 and 0 < min(applied) < 8  # some of the 8 steps were skipped
    assert int(optimizer.iterations.numpy()) == min(applied)
    assert sync.synchronisations == 2  # after step 4, and the full one at the epoch end
    moved = 0.0
    for weight, start in zip(trainer.body.trainable_weights, _start_weights()):
        copies = _copies(strategy, weight)
        assert np.all(np.isfinite(copies[0]))
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0])
        moved = max(moved, float(np.max(np.abs(copies[0] - start))))
    assert moved > 1e-4
