"""8-bit and 4-bit weight changes of local steps (``yolo3.comm.quantize``): the packing and
the rounding against NumPy, and the synchronisations on the session's four replicas
against the float32 mean."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_local_steps import REPLICAS, _copies, _set_per_replica

from yolo3.comm import quantize
from yolo3.comm.local_steps import LocalStepsState, sync_bytes
from yolo3.comm.schemes import LocalSteps, communication_from
from yolo3.engine.config import TrainConfig


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("replicas", [2, 8])
def test_packed_words_sum_every_lane_exactly(dtype, replicas):
    levels = quantize.LEVELS[dtype]
    bits = quantize.lane_bits(levels, replicas)
    per_word = quantize.lanes_per_word(levels, replicas)
    # The narrowest lane that holds the largest sum, 2 L W; the sign bit stays clear.
    assert 2 ** (bits - 1) <= 2 * levels * replicas < 2**bits
    assert bits * per_word <= 63 < bits * (per_word + 1)
    rng = np.random.default_rng(0)
    count = 5 * per_word + 3  # the last word part-filled
    q = rng.integers(-levels, levels + 1, (replicas, count))
    q[:, :per_word] = levels  # every q = +L: the largest sum, 2 L W, in a whole word
    q[:, per_word : 2 * per_word] = -levels  # every q = -L: the lanes stay 0
    words = [quantize.pack(tf.constant(row + levels, tf.int64), bits, per_word) for row in q]
    for row, packed in zip(q, words):
        assert packed.shape == (6,) and np.all(packed.numpy() >= 0)
        back = quantize.unpack(packed, bits, per_word, count).numpy()
        np.testing.assert_array_equal(back, row + levels)
    # The integer all-reduce's SUM of the words, by NumPy: every lane's sum, no carries.
    summed = np.sum([w.numpy() for w in words], axis=0)
    assert np.all(summed >= 0)
    lanes = quantize.unpack(tf.constant(summed), bits, per_word, count).numpy()
    np.testing.assert_array_equal(lanes - replicas * levels, q.sum(axis=0))
    assert np.all(lanes[:per_word] == 2 * levels * replicas)


def test_stochastic_rounding_is_unbiased_within_one_step_and_exact_on_the_grid():
    # A step of 1/8: the grid's values are float32 numbers, and L / scale = 8 exactly.
    levels, scale, draws = 7, 0.875, 4000
    rng = np.random.default_rng(1)
    values = rng.uniform(-scale, scale, quantize.BLOCK).astype(np.float32)
    values[0], values[1] = scale, -scale  # the block's largest |value|
    on_grid = np.arange(-levels, levels + 1) * scale / levels
    values[2 : 2 + on_grid.size] = on_grid
    blocks = tf.constant(np.repeat(values[None], draws, 0))
    noise = tf.constant(rng.uniform(0, 1, blocks.shape).astype(np.float32))
    q = quantize.quantize(blocks, tf.fill((draws,), scale), levels, noise).numpy()
    assert q.min() >= -levels and q.max() <= levels
    got = q * scale / levels
    step = scale / levels
    assert np.abs(got - values).max() < step * (1 + 1e-6)  # every draw: a neighbour
    for column in got[:, 2 : 2 + on_grid.size]:
        np.testing.assert_array_equal(column, on_grid)
    # Each draw is off by at most half a step in standard deviation: the mean of 4000 by
    # 0.5 / sqrt(4000) = 0.008 steps; 0.04 is five of those.
    assert np.abs(got.mean(0) - values).max() < 0.04 * step
    # A zero block (scale 0) stays zero.
    zero = quantize.quantize(tf.zeros((1, quantize.BLOCK)), tf.zeros((1,)), levels, noise[:1])
    assert not np.any(zero.numpy())


def test_blocks_round_trip_each_tensor_padded_apart():
    rng = np.random.default_rng(2)
    tensors = [rng.normal(size=s) for s in [(3, 2), (300,), (256,), (1,)]]
    blocks = quantize.to_blocks([tf.constant(t) for t in tensors])
    assert blocks.shape == (1 + 2 + 1 + 1, quantize.BLOCK) and blocks.dtype == tf.float32
    assert not np.any(blocks.numpy()[0, 6:])  # the first tensor's padding
    back = quantize.from_blocks(blocks, [tf.constant(t) for t in tensors])
    for got, want in zip(back, tensors):
        assert got.dtype == tf.float64 and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-7)


def test_bytes_per_element_against_bfloat16s_two():
    # Lanes of 9 / 11 bits (int8, W = 2 / 8) and 5 / 7 (int4): 7, 5, 12 and 9 to a word of 8
    # bytes; the scales: 4 bytes a block of 256, gathered from W replicas (as an all-reduce
    # of W / 2 of them).
    assert quantize.bytes_per_element("int8", 2) == pytest.approx(8 / 7 + 4 / 256)  # 1.16
    assert quantize.bytes_per_element("int8", 8) == pytest.approx(8 / 5 + 16 / 256)  # 1.66
    assert quantize.bytes_per_element("int4", 2) == pytest.approx(8 / 12 + 4 / 256)  # 0.68
    assert quantize.bytes_per_element("int4", 8) == pytest.approx(8 / 9 + 16 / 256)  # 0.95
    # A (20, 30) kernel: 3 blocks; int4 among 4 replicas: 6-bit lanes, 10 to a word: 77
    # words of 8 bytes. Gathered, as an all-reduce of 4 / 2 times their 4 bytes: 3 scales and
    # 2 statistics (not trainable: sent exactly).
    variables = [tf.Variable(tf.zeros((20, 30))), tf.Variable(tf.zeros((2,)), trainable=False)]
    assert sync_bytes(variables, "int4", 4) == 77 * 8 + (3 + 2) * 4 * 2
    assert sync_bytes(variables, "bfloat16") == 602 * 2
    # A (29, 20) kernel and 20 biases: 3 + 1 blocks, 103 words, 4 scales.
    scheme = LocalSteps(4, dtype="int4", replicas=4)
    body = keras.Sequential([keras.Input((29,)), keras.layers.Dense(20)])
    assert scheme.bytes_per_step(body) == (103 * 8 + 32) / 4
    assert scheme.describe(body) == (
        "none in the step; weight changes every 4 steps in int4 (0.00 MB per worker with 4 "
        "replicas, stochastic rounding; averaging)"
    )


def test_int8_and_int4_are_refused_without_local_steps():
    for dtype in ("int8", "int4"):
        with pytest.raises(ValueError, match=f"^--allreduce-dtype {dtype} .*--local-steps") as e:
            communication_from(allreduce_dtype=dtype)
        assert "\n" not in str(e.value)
    assert communication_from(allreduce_dtype="int4", local_steps=2).dtype == "int4"
    # --seed reaches the rounding from the run's flags.
    config = TrainConfig(records="r", log_dir="l", allreduce_dtype="int4", local_steps=2, seed=7)
    assert config.communication().seed == 7


def _problem(strategy, dtype, overlap=False, merge="own", seed=0, rounded_at=(), reset=False):
    """A (20, 30) kernel (3 blocks of different sizes) and 2 statistics (not trainable:
    they travel exactly) whose copies differ on each replica, a state of ``dtype`` (and of
    the run's ``seed``) made before they moved, the weights a float32 synchronisation would
    give, and each replica's change (kernel, then statistics). Before they move the state
    synchronises at the step counts ``rounded_at``: it rounds changes of zero, which leaves
    the weights where they are; then, with ``reset``, it is reset (as after a restore)."""
    with strategy.scope():
        kernel = keras.Variable(np.zeros((20, 30)), dtype="float32", name="kernel")
        stat = keras.Variable(np.ones(2), dtype="float32", trainable=False, name="moving_mean")
        state = LocalStepsState(
            [kernel, stat], 1, allreduce_dtype=dtype, overlap=overlap, merge=merge, seed=seed
        )
    state.reset(strategy)
    for step in rounded_at:
        state.synchronize(strategy, step=step)
    if reset:  # as after a restore
        state.reset(strategy)
    rng = np.random.default_rng(3)
    size = np.geomspace(1e-3, 1, 600).reshape(20, 30)  # each block its own scale
    kernels = [(size * rng.normal(size=(20, 30))).astype(np.float32) for _ in range(REPLICAS)]
    stats = [rng.uniform(0, 2, 2).astype(np.float32) for _ in range(REPLICAS)]
    _set_per_replica(strategy, kernel.value, kernels)
    _set_per_replica(strategy, stat.value, stats)
    changes = [np.concatenate([-k.ravel(), 1 - s]) for k, s in zip(kernels, stats)]
    # Plain averaging: the anchors less the mean change, the mean of the weights.
    want = np.concatenate([np.zeros(600), np.ones(2)]) - np.mean(changes, 0)
    return state, (kernel, stat), want, changes


def _assert_within_steps(strategy, weights, want, changes, levels, steps=1.0):
    """Every replica holds the same weights, each kernel element within ``steps`` rounding
    steps (its block's largest |change| on any replica over ``levels``) of ``want``, the
    statistics at ``want`` (to float32's rounding)."""
    copies = [_copies(strategy, weight) for weight in weights]
    got = [np.concatenate([c.ravel() for c in replica]) for replica in zip(*copies)]
    for copy in got[1:]:
        np.testing.assert_array_equal(copy, got[0])
    largest = np.abs(changes).max(0)
    scales = [largest[i : i + 256].max() for i in (0, 256, 512)]
    step = np.concatenate([np.repeat(scales, [256, 256, 88]), [0, 0]]) / levels
    error = np.abs(got[0] - want)
    assert np.all(error <= steps * step * (1 + 1e-5) + 1e-6)
    return got[0], np.divide(error, step, out=np.zeros_like(error), where=step > 0)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_synchronisation_lands_within_one_step_of_the_mean(strategy, dtype):
    state, weights, want, changes = _problem(strategy, dtype)
    state.synchronize(strategy)
    _, steps = _assert_within_steps(strategy, weights, want, changes, quantize.LEVELS[dtype])
    assert steps[:600].mean() > 0.02  # the kernel was rounded (float32: off by 1e-7)


@pytest.mark.parametrize("merge", ["own", "eager"])
def test_the_overlapped_synchronisation_lands_where_the_blocking_one_does(strategy, merge):
    # Eager goes on from an estimate of the mean while the change travels; with no steps
    # before it lands, it lands where "own" does.
    levels = quantize.LEVELS["int4"]
    # The same problem twice: synchronised at once, and overlapped over T = 2 steps.
    blocked, blocked_weights, want, changes = _problem(strategy, "int4")
    blocked.synchronize(strategy)
    blocking, _ = _assert_within_steps(strategy, blocked_weights, want, changes, levels)
    state, weights, _, _ = _problem(strategy, "int4", overlap=2, merge=merge)
    assert state.sent.dtype == tf.int64 and state.sent.shape == (2, 39)  # 77 words in 2 rows
    exchange = tf.function(lambda: strategy.run(state.exchange))
    state.synchronize(strategy)  # sends, the weights stay
    words = _copies(strategy, state.sent)
    assert not np.array_equal(words[0], words[1])  # each replica its own change and draws
    for _ in range(2):  # the two chunks travel, the weights stay
        exchange()
        state.step_done()
    assert state.landing_due()
    np.testing.assert_array_equal(_copies(strategy, state.received)[0][:2], np.sum(words, 0))
    state.land(strategy)
    landed, _ = _assert_within_steps(strategy, weights, want, changes, levels)
    # The same draws (each state's first rounding): the same words, the same mean. Not
    # bitwise: each replica's steps since the send (none) are anchor - change - weights.
    np.testing.assert_allclose(landed, blocking, rtol=0, atol=1e-6)
    # The next period: every replica moves by its own amount, the change goes out, one
    # chunk arrives, and a full synchronisation sends the rest and the steps since: all
    # meet at the mean of their weights (two roundings: two steps).
    kernels = [landed[:600].reshape(20, 30) + 0.01 * r for r in range(REPLICAS)]
    _set_per_replica(strategy, weights[0].value, kernels)
    state.synchronize(strategy)
    exchange()
    with strategy.scope():
        slot = keras.Variable(np.zeros(3), name="slot")  # an optimizer's: a full one
    state.synchronize(strategy, [slot])
    assert not state.in_flight
    # Three roundings, each with its own seed: two sends and the steps since the second.
    assert [int(d) for d in _copies(strategy, state.draws)] == [3] * REPLICAS
    want = np.concatenate([landed[:600] + 0.015, landed[600:]])
    changes = [np.concatenate([np.full(600, -0.01 * r), [0, 0]]) for r in range(REPLICAS)]
    _assert_within_steps(strategy, weights, want, changes, levels, steps=2)


def _rounded(strategy, step=7, **problem):
    """The weights after an int8 synchronisation of :func:`_problem` at step count
    ``step``."""
    state, weights, want, changes = _problem(strategy, "int8", **problem)
    state.synchronize(strategy, step=step)
    return _assert_within_steps(strategy, weights, want, changes, quantize.LEVELS["int8"])[0]


def test_each_rounding_draws_from_the_seed_the_step_count_and_its_index(strategy):
    # A state that rounded before (at step 3) and one built afresh, as a resumed run's is,
    # round alike at step 7.
    went_on = _rounded(strategy, rounded_at=[3])
    np.testing.assert_array_equal(_rounded(strategy), went_on)
    # Another --seed, another step count, or a second rounding at step 7: other numbers.
    assert not np.array_equal(_rounded(strategy, seed=1), went_on)
    assert not np.array_equal(_rounded(strategy, step=8), went_on)
    assert not np.array_equal(_rounded(strategy, rounded_at=[7]), went_on)
    # A reset forgets the roundings made: as a state built afresh.
    np.testing.assert_array_equal(_rounded(strategy, rounded_at=[7], reset=True), went_on)
    # The run's --seed reaches the state from the flags.
    scheme = communication_from(allreduce_dtype="int8", local_steps=2, seed=5)
    with strategy.scope():
        scheme.build(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), None)
    assert scheme.state.seeds.seed == 5


def test_one_replica_has_nothing_to_round_and_synchronises_exactly():
    # A run with int8 on one device: nothing travels, nothing is rounded.
    strategy = tf.distribute.get_strategy()
    kernel = keras.Variable(np.zeros((3, 2)), dtype="float32", name="kernel")
    state = LocalStepsState([kernel], 2, allreduce_dtype="int8")
    state.reset(strategy)
    kernel.assign(np.full((3, 2), 0.3))
    state.synchronize(strategy)
    assert not state.quantized
    np.testing.assert_array_equal(kernel.numpy(), np.full((3, 2), 0.3, np.float32))
