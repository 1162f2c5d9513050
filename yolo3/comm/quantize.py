"""8-bit and 4-bit weight changes for local steps (``--allreduce-dtype int8`` / ``int4``).

A synchronisation of ``--local-steps`` sends each replica's weight change; Streaming DiLoCo
(Douillard et al., 2025) sends these outer gradients in 4 bits. Here:

- every tensor is flattened and cut into blocks of :data:`BLOCK` elements (the last one
  padded with zeros), and the replicas agree on one scale per block: the largest ``|value|``
  of that block on any replica. TensorFlow's ``ReduceOp`` has SUM and MEAN only, so the
  maximum is a local ``reduce_max`` over an ``all_gather`` of the per-block maxima;
- each replica rounds ``value / scale * L`` to an integer ``q`` in ``[-L, L]`` (``L``: 127
  for int8, 7 for int4) *stochastically* (up with probability the fractional part), so
  that ``q * scale / L`` is ``value`` in expectation;
- TensorFlow's collectives do not sum int8, and an int32 all-reduce wraps on overflow, so
  the ``q + L`` (non-negative) travel packed in int64 words, ``lanes`` per word, each lane
  ``bits`` wide: enough for the sum over ``W`` replicas (at most ``2 L W``), so that one
  integer SUM of the words sums every lane exactly, with no carry into the next and the
  sign bit clear. Unpacked, less ``W L``, times the scale, over ``W``: the mean;
- the tensors marked *exact* (local steps mark the batch-norm statistics) are not rounded:
  they ride in the scales' all-gather as float32. A rounded moving variance could land
  below zero (a channel's tiny variance in a block whose largest change is large rounds
  to a whole step down now and then), and the normalisation of that channel would be NaN.
  They are few: 2 numbers a channel.

Bytes per element for ``W`` replicas: 8 per word over its lanes, plus the scales' share
(:func:`bytes_per_element`): int4 0.68 (W = 2) and 0.95 (W = 8), int8 1.16 and 1.66,
against bfloat16's 2. The lane grows with ``log2(W)``, so the saving shrinks with more
replicas.

Each rounding draws its noise from a stateless seed (:func:`rounding_seed`), a function of
the run's ``--seed``, the replica, the optimizer's step count and the rounding's index
among those made at that step count (:class:`Seeds` counts them): the replicas draw
independent numbers, each rounding new ones, another ``--seed`` others, and a run resumed
at a step count the numbers that the run that went on drew there.

The pure functions (:func:`to_blocks`, :func:`quantize`, :func:`pack`, :func:`unpack`,
:func:`lane_bits`) take and give tensors and hold no state; :func:`share`,
:func:`encode` and :func:`quantized_mean` run in a replica context.
"""

import math

import numpy as np
import tensorflow as tf

BLOCK = 256  # elements that share one scale
LEVELS = {"int8": 127, "int4": 7}  # the largest |q| of each dtype
WORD_BITS = 63  # of an int64 word: the sign bit stays clear
SCALE_BYTES = 4  # float32


def levels_of(dtype):
    """``L`` of ``dtype`` (``int8``: 127, ``int4``: 7)."""
    return LEVELS[dtype]


def lane_bits(levels, replicas):
    """Bits of a lane that holds the sum over ``replicas`` of ``q + levels`` (each in
    ``[0, 2 levels]``): ``ceil(log2(2 levels replicas + 1))``."""
    return (2 * levels * replicas).bit_length()


def lanes_per_word(levels, replicas):
    """Lanes in one int64 word, its sign bit clear."""
    return WORD_BITS // lane_bits(levels, replicas)


def num_blocks(sizes):
    """Blocks of :data:`BLOCK` that tensors of ``sizes`` elements take, each padded apart."""
    return sum(math.ceil(int(n) / BLOCK) for n in sizes)


def num_words(blocks, levels, replicas):
    """int64 words that carry ``blocks`` blocks."""
    return math.ceil(blocks * BLOCK / lanes_per_word(levels, replicas))


def scale_bytes(count, replicas):
    """What the all-gather of ``count`` float32 numbers from each replica costs one
    replica, in bytes of an all-reduce: a ring all-gather sends ``W - 1`` times each
    replica's share, a ring all-reduce of ``N`` bytes ``2 (W - 1) / W`` times ``N``: as an
    all-reduce of ``W / 2`` shares."""
    return count * SCALE_BYTES * replicas // 2


def quantized_bytes(sizes, dtype, replicas, exact_sizes=()):
    """Bytes one replica's quantized synchronisation of tensors of ``sizes`` elements, and
    of tensors of ``exact_sizes`` elements sent exactly, carries (as an all-reduce of that
    many bytes would): the words, and the all-gather of the scales and the exact ones."""
    blocks = num_blocks(sizes)
    words = num_words(blocks, levels_of(dtype), replicas)
    return 8 * words + scale_bytes(blocks + sum(exact_sizes), replicas)


def bytes_per_element(dtype, replicas):
    """Bytes per element of a large tensor sent in ``dtype`` (int8 or int4) among
    ``replicas``: a word's 8 bytes over its lanes, plus the scales' share."""
    levels = levels_of(dtype)
    return 8 / lanes_per_word(levels, replicas) + scale_bytes(1, replicas) / BLOCK


# -- pure functions ---------------------------------------------------------------------


def partition(items, exact):
    """``items`` in two lists, in order: those rounded, and those where ``exact`` (one
    bool an item) is True."""
    return [x for x, e in zip(items, exact) if not e], [x for x, e in zip(items, exact) if e]


def merge(rounded, kept, exact):
    """The inverse of :func:`partition`."""
    rounded, kept = iter(rounded), iter(kept)
    return [next(kept) if e else next(rounded) for e in exact]


def flatten(tensors):
    """``tensors`` flattened into one ``(n,)`` float32."""
    return tf.concat(
        [tf.zeros((0,))] + [tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0
    )


def unflatten(flat, like):
    """The inverse of :func:`flatten`: tensors with the shapes and dtypes of ``like``."""
    pieces = tf.split(flat, [int(np.prod(t.shape)) for t in like]) if like else []
    return [tf.cast(tf.reshape(p, t.shape), t.dtype) for p, t in zip(pieces, like)]


def to_blocks(tensors):
    """``tensors`` (float, any shapes) as one ``(blocks, BLOCK)`` float32 matrix: each
    flattened and padded with zeros to whole blocks, in order."""
    rows = []
    for tensor in tensors:
        flat = tf.reshape(tf.cast(tensor, tf.float32), [-1])
        size = int(flat.shape[0])
        padded = tf.pad(flat, [[0, math.ceil(size / BLOCK) * BLOCK - size]])
        rows.append(tf.reshape(padded, [-1, BLOCK]))
    return tf.concat(rows, 0)


def from_blocks(blocks, like):
    """The inverse of :func:`to_blocks`: tensors with the shapes and dtypes of ``like``."""
    sizes = [int(np.prod(t.shape)) for t in like]
    pieces = tf.split(blocks, [math.ceil(n / BLOCK) for n in sizes])
    return [
        tf.cast(tf.reshape(tf.reshape(p, [-1])[:n], t.shape), t.dtype)
        for p, n, t in zip(pieces, sizes, like)
    ]


def quantize(blocks, scales, levels, noise):
    """Stochastic rounding of ``blocks / scales * levels``.

    Args:
        blocks: ``(blocks, BLOCK)`` float32.
        scales: ``(blocks,)`` float32, each ``>=`` its block's largest ``|value|`` (0 for
            an all-zero block).
        levels: ``L``.
        noise: like ``blocks``, uniform in ``[0, 1)``.

    Returns:
        ``(blocks, BLOCK)`` int64 in ``[-L, L]``: ``floor(x + noise)`` for ``x = value /
        scale * L``, which is ``ceil(x)`` with probability ``x - floor(x)``: unbiased,
        within one step of ``x``, and exact where ``x`` is a whole number.
    """
    safe = tf.where(scales > 0, scales, tf.ones_like(scales))
    x = blocks * (levels / safe)[:, None]
    q = tf.clip_by_value(tf.floor(x + noise), -levels, levels)
    return tf.cast(q, tf.int64)


def dequantize(q, scales, levels):
    """``q * scale / L``: ``(blocks, BLOCK)`` float32 of ``(blocks, BLOCK)`` integers."""
    return tf.cast(q, tf.float32) * (scales[:, None] / levels)


def pack(lanes, bits, per_word):
    """Non-negative integers below ``2**bits`` packed ``per_word`` to an int64 word.

    Args:
        lanes: ``(n,)`` int64, each in ``[0, 2**bits)``.
        bits, per_word: lane width and lanes per word (``bits * per_word <= 63``).

    Returns:
        ``(ceil(n / per_word),)`` int64: lane ``j`` of word ``i`` holds ``lanes[i *
        per_word + j]`` in bits ``j * bits`` up; the last word padded with zero lanes.
    """
    size = int(lanes.shape[0])
    padded = tf.pad(lanes, [[0, -size % per_word]])
    shifts = tf.range(per_word, dtype=tf.int64) * bits
    # The lanes do not overlap: the sum is their bitwise OR.
    return tf.reduce_sum(tf.bitwise.left_shift(tf.reshape(padded, [-1, per_word]), shifts), 1)


def unpack(words, bits, per_word, count):
    """The first ``count`` lanes of ``words`` (:func:`pack`'s layout), ``(count,)`` int64."""
    shifts = tf.range(per_word, dtype=tf.int64) * bits
    mask = tf.constant((1 << bits) - 1, tf.int64)
    lanes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[:, None], shifts), mask)
    return tf.reshape(lanes, [-1])[:count]


# -- in a replica context -----------------------------------------------------------------


def share(blocks, exact):
    """One all-gather (TensorFlow's all-reduce has no MAX) of this replica's per-block
    maxima and ``exact``.

    Args:
        blocks: ``(blocks, BLOCK)`` float32, this replica's.
        exact: ``(n,)`` float32, this replica's numbers that travel as they are.

    Returns:
        The scale of each block that every replica uses, the largest ``|value|`` of that
        block on any replica, ``(blocks,)`` float32; and the mean of ``exact`` over the
        replicas, ``(n,)`` float32.
    """
    context = tf.distribute.get_replica_context()
    count = int(blocks.shape[0])
    local = tf.concat([tf.reduce_max(tf.abs(blocks), 1), exact], 0)
    gathered = context.all_gather(local[None], axis=0)  # its shape unknown to the graph
    replicas = context.num_replicas_in_sync
    gathered = tf.reshape(gathered, [replicas, count + int(exact.shape[0])])
    return tf.reduce_max(gathered[:, :count], 0), tf.reduce_sum(gathered[:, count:], 0) / replicas


def encode(blocks, scales, dtype, seed):
    """This replica's ``blocks`` quantized with ``scales`` and packed, ``(words,)`` int64.

    ``seed``: ``(2,)`` int64, the stateless random seed of the rounding: give each replica
    and each rounding its own (see :func:`rounding_seed`).
    """
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    levels = levels_of(dtype)
    noise = tf.random.stateless_uniform(tf.shape(blocks), seed, dtype=tf.float32)
    q = quantize(blocks, scales, levels, noise) + levels
    bits = lane_bits(levels, replicas)
    return pack(tf.reshape(q, [-1]), bits, WORD_BITS // bits)


def decode_mean(words, scales, dtype, replicas):
    """The mean over ``replicas`` from the SUM of their :func:`encode` words and the shared
    ``scales``: ``(blocks, BLOCK)`` float32."""
    levels = levels_of(dtype)
    bits = lane_bits(levels, replicas)
    blocks = int(scales.shape[0])
    total = unpack(words, bits, WORD_BITS // bits, blocks * BLOCK) - replicas * levels
    return dequantize(tf.reshape(total, [blocks, BLOCK]), scales, levels) / replicas


def rounding_seed(seed, step, index):
    """The stateless seed of one rounding, ``(2,)`` int64, in replica context.

    A function of the run's ``seed`` (``--seed``, a Python int), the replica's id in sync
    (global across workers), the optimizer's step count ``step`` at the rounding and its
    ``index`` among the roundings made at that step count (scalar int64 tensors): replicas
    draw independent numbers, every rounding new ones, and a run that reaches the same step
    count the same ones (``tf.random.fold_in``: the seed, replica and step hashed into the
    first word, the index the second).
    """
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(replica, tf.int64)])
    key = tf.random.fold_in(key, tf.cast(step, tf.int64))
    return tf.random.fold_in(key, tf.cast(index, tf.int64))


class Seeds:
    """The seeds of one replica's roundings (:func:`rounding_seed`), counted in per-replica
    variables: ``draws``, the roundings made at step count ``drawn_at``. Neither is saved:
    local steps save only after a full synchronisation, and the first rounding after a
    resume comes at a later step count, with index 0, as it does in the run that went on.
    (Not quite always under ``--mixed-precision float16``: the step count stands still over
    steps the loss scale skips, and if every step between a save and the next
    synchronisation is skipped, the resumed run draws that synchronisation's numbers at
    index 0, the run that went on at 1.)

    Args:
        seed: the run's ``--seed``.
        variable: ``variable(name, initial)`` makes a per-replica variable.
    """

    def __init__(self, seed, variable):
        self.seed = int(seed)
        self.draws = variable("draws", tf.zeros((), tf.int64))
        self.drawn_at = variable("drawn_at", tf.constant(-1, tf.int64))

    def count_from(self, step):
        """The roundings that follow are made at step count ``step`` (scalar int64): their
        index goes on from ``draws`` if the last ones were made at that step count too, and
        starts at 0 otherwise. Replica context."""
        same = tf.equal(tf.identity(self.drawn_at), step)
        self.draws.assign(tf.where(same, tf.identity(self.draws), tf.zeros((), tf.int64)))
        self.drawn_at.assign(step)

    def forget(self):
        """As built: no rounding made yet (a reset, as after a restore). Replica context."""
        self.draws.assign(tf.zeros((), tf.int64))
        self.drawn_at.assign(tf.constant(-1, tf.int64))

    def next(self):
        """The next rounding's seed, ``(2,)`` int64. Replica context."""
        seed = rounding_seed(self.seed, tf.identity(self.drawn_at), tf.identity(self.draws))
        self.draws.assign_add(1)
        return seed


def quantized_mean(tensors, dtype, seed, exact, options=None):
    """The mean over the replicas of each of ``tensors`` (float), sent in ``dtype``.

    Runs in a replica context: an all-gather of the scales (and of the tensors that
    ``exact``, one bool a tensor, marks: float32, not rounded), then one int64 all-reduce
    of the packed words of the others (at least one). Returns tensors of ``tensors``'
    shapes and dtypes, each rounded element within one step (its block's scale over ``L``)
    of the exact mean; with one replica, ``tensors`` unchanged (nothing travels).
    """
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    if replicas == 1:
        return list(tensors)
    rounded, kept = partition(tensors, exact)
    blocks = to_blocks(rounded)
    scales, kept_mean = share(blocks, flatten(kept))
    words = encode(blocks, scales, dtype, seed)
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, words, options=options)
    means = from_blocks(decode_mean(summed, scales, dtype, replicas), rounded)
    return merge(means, unflatten(kept_mean, kept), exact)
