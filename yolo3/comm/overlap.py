"""Overlapped synchronisation of local steps (``--overlap-sync T``): the change in flight.

With ``overlap`` no synchronisation of :mod:`yolo3.comm.local_steps` waits for the link. At
the end of each period of ``H`` steps each replica's weight change (``delta_i``) goes out,
and it travels during the first ``T`` steps of the next period, one ``1/T`` chunk in each
train step, beside the step's computation (a collective with no data dependency on it, so
the link works while the processor does; the steps after the ``T``-th send an empty chunk:
the collective stays, as every step must hold the same ones). After the ``T``-th step the
mean ``D`` has arrived: the outer step moves the anchor with it, and each replica goes on
from the new anchor plus its own steps since the change went out. Every change is applied
once, ``T`` steps late, as in overlapping local SGD (CO2, Sun et al., ICLR 2024; Streaming
DiLoCo, Douillard et al., 2025). A full synchronisation completes whatever is in flight and
leaves every replica at the same weights with nothing in flight, as without overlap.

While a change travels, each replica goes on from its own weights (``merge="own"``): its
own change is applied at once and whole, the others' arrive ``T`` steps late; with
``T = H`` the replicas then drift apart for two periods. With ``merge="eager"`` (eager
updates, Kale, Douillard and Donchev, 2025) each replica goes on from the anchor moved by
an *estimate* of the mean change: its own change over ``W`` (its share of the mean) plus
the others' share of the mean that landed last (their last change standing in for the one
still on its way). When the mean lands, the estimate is replaced by it, as the change is
under ``"own"``. After a full synchronisation (and at the start) the others' share is
zero, so a run resumed from a save goes on as the uninterrupted one.

State (:class:`OverlappedSync`, which the :class:`yolo3.comm.local_steps.LocalStepsState`
owns): the change in flight (``sent``, this replica's), its mean as far as it has arrived
(``received``) and the chunk the next step sends (``position``); with ``eager``, the
others' share of the last mean that landed (``stale``). None of these is saved: every save
is a full synchronisation, after which nothing is in flight. With ``--allreduce-dtype
int8`` or ``int4`` (:mod:`yolo3.comm.quantize`) the change is quantized when it goes out:
``sent`` and ``received`` hold packed words (this replica's, and their sum as far as it
has arrived), ``scales`` the shared scales, ``exact_mean`` the statistics' mean change, and
``own`` this replica's change itself, from which each replica's steps since it went out
are told. All are ``ON_READ`` variables: each replica assigns its own copy; ``received``
holds the same values on every replica, computed from all-reduced numbers.
"""

import math

import numpy as np
import tensorflow as tf

from yolo3.comm import quantize


class OverlappedSync:
    """The change in flight of a :class:`yolo3.comm.local_steps.LocalStepsState` with
    ``overlap``, and its way: :meth:`send` at a period's end, :meth:`exchange` in each train
    step, :meth:`land` once it has all arrived.

    Made by ``state``'s constructor, whose weights, anchors, outer step and means it uses.
    The methods run in replica context: :meth:`exchange` inside the train step, the others
    inside ``state``'s compiled synchronisations.

    Args:
        state: the owner (its ``synced`` weights, ``exact``, ``replicas``, ``quantized`` and
            ``allreduce_dtype`` are read here).
        steps: ``T``, the train steps a change travels (1 to ``H``).
        eager: ``merge="eager"`` (see the module's docstring).
        variable: ``variable(name, initial)`` makes one of ``state``'s per-replica
            variables.
    """

    def __init__(self, state, steps, *, eager, variable):
        self.state, self.steps, self.eager = state, int(steps), bool(eager)
        dtypes = {tf.as_dtype(w.dtype) for w in state.synced}
        if len(dtypes) != 1:
            raise ValueError(
                f"--overlap-sync sends every weight in one buffer; this model's weights "
                f"have several dtypes ({sorted(d.name for d in dtypes)})"
            )
        self._sizes = [int(np.prod(w.shape)) for w in state.synced]
        # T rows: the chunk sent in each of the first T steps of a period; received has one
        # more, which the steps after the T-th write their empty chunk to.
        rows = (self.steps, math.ceil(sum(self._sizes) / self.steps))
        dtype = dtypes.pop()
        own = ()
        if state.quantized:  # packed words travel; each replica keeps its change
            rounded, exact = quantize.partition(self._sizes, state.exact)
            blocks = quantize.num_blocks(rounded)
            levels = quantize.levels_of(state.allreduce_dtype)
            words = quantize.num_words(blocks, levels, state.replicas)
            own = (
                variable("own", tf.zeros(rows, dtype)),
                variable("scales", tf.zeros((blocks,), tf.float32)),
                variable("exact_mean", tf.zeros((sum(exact),), tf.float32)),
            )
            rows, dtype = (self.steps, math.ceil(words / self.steps)), tf.int64
        in_flight = (
            variable("sent", tf.zeros(rows, dtype)),
            variable("received", tf.zeros((self.steps + 1, rows[1]), dtype)),
            variable("position", tf.fill((), self.steps)),  # T: nothing to send
            *own,
        )
        # eager: the others' share of the last mean that landed, (W - 1) / W of their mean
        # change, in the rows of ``own``; zero after a full synchronisation.
        stale = ()
        if self.eager:
            own = in_flight[3] if state.quantized else in_flight[0]
            stale = (variable("stale", tf.zeros(own.shape, own.dtype)),)
        self._variables = (in_flight, stale)

    @property
    def sent(self):
        return self._variables[0][0]

    @property
    def received(self):
        return self._variables[0][1]

    @property
    def position(self):
        return self._variables[0][2]

    @property
    def own(self):
        """This replica's change in flight: ``sent`` itself, or with int8/int4 the float
        change that ``sent`` holds quantized."""
        return self._variables[0][3] if self.state.quantized else self.sent

    @property
    def scales(self):
        return self._variables[0][4]

    @property
    def exact_mean(self):
        return self._variables[0][5]

    @property
    def stale(self):
        """``eager``: the others' share of the last mean that landed (in ``own``'s rows)."""
        return self._variables[1][0]

    def exchange(self):
        """One train step's share: the mean over replicas of the next chunk of the change in
        flight. Runs in replica context, inside the train step; nothing in the step depends
        on it."""
        steps = self.steps
        position = tf.minimum(tf.identity(self.position), steps)
        width = self.sent.shape[1]
        # After the T-th step a one-element chunk, written to the spare row T: the
        # collective stays (every step holds the same ones on every worker) and sends next
        # to nothing. Not an empty one: TensorFlow's CPU collectives crash the process
        # (segmentation fault) within a few hundred all-reduces of zero elements. With one
        # replica nothing crosses a link, and the chunk keeps its width: a size read from
        # ``position`` must be known when XLA compiles the step (XLA is on only with one
        # replica), which would then compile it once for each value ``position`` takes.
        size = width if self.state.replicas == 1 else tf.where(position < steps, width, 1)
        chunk = tf.gather(tf.identity(self.sent), tf.minimum(position, steps - 1))[:size]
        if self.state.quantized:  # packed words: their sum, decoded when all has arrived
            context = tf.distribute.get_replica_context()
            mean = context.all_reduce(tf.distribute.ReduceOp.SUM, chunk)
        else:
            (mean,) = self.state.mean([chunk])
        mean = tf.pad(mean, [[0, width - size]])
        # In place, one row (ON_READ variables have no scatter_update; in replica context
        # their handle is this replica's own copy).
        tf.raw_ops.ResourceScatterUpdate(
            resource=self.received.handle, indices=position[None], updates=mean[None]
        )
        self.position.assign(position + 1)

    def reset(self):
        """Nothing in flight, nothing to send."""
        self.position.assign(self.steps)
        self.forget_stale()

    def forget_stale(self):
        """After a reset or a full synchronisation every replica holds the same weights:
        the next send's estimate starts from its own change alone (so a run resumed from a
        save, where nothing else is kept, goes on as the uninterrupted one)."""
        if self.eager:
            self.stale.assign(tf.zeros_like(self.stale))

    def send(self):
        """This period's change goes out, over the next T steps; the weights stay (eager:
        they go on from the anchor moved by the estimate, returned). With int8/int4 it is
        quantized now (the shared scales: an all-gather)."""
        state = self.state
        changes = [a - w for a, w in zip(state.anchors, state.replica_weights())]
        self.own.assign(self._rows(changes))
        if state.quantized:
            rounded, exact = quantize.partition(changes, state.exact)
            blocks = quantize.to_blocks(rounded)
            scales, exact_mean = quantize.share(blocks, quantize.flatten(exact))
            self.scales.assign(scales)
            self.exact_mean.assign(exact_mean)
            words = quantize.encode(blocks, scales, state.allreduce_dtype, state.seeds.next())
            self.sent.assign(self._rows([words], like=self.sent))
        self.position.assign(0)
        if self.eager:  # the weights go on from the anchor moved by the estimate
            estimate = self._pieces(self._applied(tf.identity(self.own)))
            return [a - e for a, e in zip(state.anchors, estimate)]
        return None

    def land(self, trainable, *, full):
        """The outer step with the mean of the change in flight (all arrived, or with
        ``full`` sent now in one piece); each replica goes on from the new anchor with its
        own steps since the change was sent, or with ``full`` everyone from the anchor
        moved by their mean too. Returns the weights."""
        state = self.state
        anchors = [tf.identity(a) for a in state.anchors]
        in_flight = tf.identity(self.own)
        means = self._arrived(in_flight, full=full)
        # The steps since the change was sent, which started at the old anchor less what
        # was applied then (the change itself, or eager's estimate).
        applied = self._pieces(self._applied(in_flight))
        since = [a - old - w for a, old, w in zip(anchors, applied, state.replica_weights())]
        anchors = state.outer_step(trainable, anchors, means)
        self.position.assign(self.steps)
        if full:
            self.forget_stale()
            return state.outer_step(trainable, anchors, state.mean(since))
        if self.eager:  # the others' share of this mean: the next send's estimate of theirs
            share = in_flight / tf.cast(state.replicas, in_flight.dtype)
            self.stale.assign(self._rows(means) - share)
        return [a - d for a, d in zip(anchors, since)]

    def _applied(self, own):
        """What a replica's weights went on from at the send, less the anchor: its own
        change, or with ``eager`` the estimate of the mean (its own share plus the others'
        share of the last mean that landed)."""
        if not self.eager:
            return own
        state = self.state
        estimate = own / tf.cast(state.replicas, own.dtype) + tf.identity(self.stale)
        # Batch-norm statistics go on from their own, as under "own": an estimate could
        # take a moving variance below zero until the mean lands.
        exact = self._rows([tf.fill(w.shape, e) for w, e in zip(state.synced, state.exact)])
        return tf.where(exact, own, estimate)

    def _pieces(self, rows):
        """The per-weight tensors of a flat ``(T, chunk)`` buffer."""
        flat = tf.reshape(rows, [-1])[: sum(self._sizes)]
        pieces = tf.split(flat, self._sizes)
        return [tf.reshape(p, w.shape) for p, w in zip(pieces, self.state.synced)]

    def _rows(self, tensors, like=None):
        """``tensors`` flattened into one, padded with zeros to the shape of ``like`` (a
        ``(T, chunk)`` buffer; by default ``own``)."""
        shape = (self.own if like is None else like).shape
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
        padding = shape[0] * shape[1] - int(flat.shape[0])
        return tf.reshape(tf.pad(flat, [[0, padding]]), shape)

    def _arrived(self, in_flight, *, full):
        """The mean change in flight, per weight: all arrived, or with ``full`` sent now in
        one piece (``in_flight``: ``own``'s value)."""
        state = self.state
        if not state.quantized:
            if full:
                return self._pieces(state.mean([in_flight])[0])
            return self._pieces(tf.identity(self.received)[: self.steps])
        if full:
            context = tf.distribute.get_replica_context()
            words = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(self.sent))
        else:
            words = tf.identity(self.received)[: self.steps]
        mean = quantize.decode_mean(
            tf.reshape(words, [-1]), tf.identity(self.scales), state.allreduce_dtype, state.replicas
        )
        rounded, exact = quantize.partition(state.synced, state.exact)
        means = quantize.from_blocks(mean, rounded)
        exact_means = quantize.unflatten(tf.identity(self.exact_mean), exact)
        return quantize.merge(means, exact_means, state.exact)
