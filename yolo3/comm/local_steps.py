"""Local steps: each replica trains alone for H optimizer steps, then they average.

On a slow link even a compressed gradient all-reduce costs every step. With local steps the
replicas exchange nothing while they train: each applies its own gradient (the optimizer's
all-reduce is replaced by :func:`local_reducer`), and every ``H`` optimizer steps they
synchronise: each all-reduces the change of its weights since the last synchronisation
(``delta = anchor - weights``, sent in ``--allreduce-dtype``), and all apply one *outer
step* to the anchor with the mean change ``D``, as DiLoCo (Douillard et al., "DiLoCo:
Distributed Low-Communication Training of Language Models", 2023):

- plain averaging (``outer_lr=1``, ``outer_momentum=0``): ``weights = anchor - D``, the
  mean of the replicas' weights;
- Nesterov momentum ``mu`` and learning rate ``lr``: ``buffer = mu * buffer + D``, then
  ``weights = anchor - lr * (D + mu * buffer)``.

Batch-norm moving statistics (and any other non-trainable weight) are averaged, with no
outer step. The inner optimizer's state (momentum, Adam's moments) stays each replica's own
between synchronisations, as in DiLoCo.

The synchronisation is a compiled function of its own, called between train steps by
:class:`yolo3.callbacks.LocalSync` (a collective cannot sit in a conditional branch of the
step). That callback also synchronises at every epoch end and before every backup or
checkpoint (a *full* synchronisation): every replica then holds the same weights, with
nothing in flight, and the ``H``-step count restarts. The inner optimizer's state stays
each worker's own there too: it never crosses the network (Adam's two moments in float32
are four times the weights' bfloat16 change: 14 s of a 100 Mbit/s link at every epoch end
for tiny YOLOv3). Only the replicas of one process average it, through memory, since a
worker's file holds one copy of each slot. Each worker's backup holds its own state and a
restore from backups loads each worker's own (:class:`yolo3.callbacks.WorkerBackup`), so
a run resumed from them continues as the uninterrupted run did; the chief's
``state.weights.h5`` holds the chief's, which every worker starts from after ``--resume``
from a finished run.

With ``overlap`` (``--overlap-sync T``) no synchronisation waits for the link. At the end
of each period of ``H`` steps each replica's weight change (``delta_i``) goes out, and it
travels during the first ``T`` steps of the next period, one ``1/T`` chunk in each train
step, beside the step's computation (a collective with no data dependency on it, so the
link works while the processor does; the steps after the ``T``-th send an empty chunk: the
collective stays, as every step must hold the same ones). After the ``T``-th step the mean
``D`` has arrived: the outer step moves the anchor with it, and each replica goes on from
the new anchor plus its own steps since the change went out. Every change is applied once,
``T`` steps late, as in overlapping local SGD (CO2, Sun et al., ICLR 2024; Streaming
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

State (:class:`LocalStepsState`, a layer saved with the trainer): the anchors (the weights
at the last synchronisation; not saved, since every save is a synchronisation) and the
outer momentum buffers, and with ``overlap`` the change in flight (``sent``, this
replica's), its mean as far as it has arrived (``received``) and the chunk the next step
sends (``position``) (none of these saved either: every save is a full synchronisation,
after which nothing is in flight). All are ``ON_READ`` variables: each replica assigns its
own copy; the anchors, buffers and ``received`` hold the same values on every replica,
computed from all-reduced numbers.

With ``--allreduce-dtype int8`` or ``int4`` (:mod:`yolo3.comm.quantize`) the changes travel
as integers with stochastic rounding, in blocks that share a scale (the largest ``|value|``
of the block on any replica, agreed by an all-gather at each synchronisation), packed in
int64 words that one integer all-reduce sums exactly. The mean that arrives is within one
rounding step (the block's scale over 127, or 7) of the exact mean, and unbiased. The
weights that are not trainable when the state is built (the batch-norm statistics: a
rounded variance could fall below zero) travel exactly, in float32, in the scales'
all-gather. With ``overlap`` the change is quantized when it goes out: ``sent`` and
``received`` hold packed words (this replica's, and their sum as far as it has arrived),
``scales`` the shared scales, ``exact_mean`` the statistics' mean change, and ``own`` this
replica's change itself, from which each replica's steps since it went out are told. A
counter (``draws``, each replica's, not saved: it restarts at a resume) numbers the
roundings, so that each draws new numbers.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from yolo3.comm import quantize
from yolo3.comm.allreduce import BYTES_PER_ELEMENT, all_reduce_gradients
from yolo3.comm.reducer import install_reducer

# --overlap-merge: where a replica goes on from while its change travels.
MERGES = ("own", "eager")
DEFAULT_MERGE = "own"


def sync_bytes(variables, dtype="float32", replicas=None):
    """Bytes one replica's synchronisation all-reduces: every float variable in ``dtype``.

    int8 and int4 (:func:`yolo3.comm.quantize.quantized_bytes`; the variables that are not
    trainable travel exactly) depend on the number of replicas in sync, ``replicas`` (None:
    the strategy in scope's).
    """
    floats = [v for v in variables if _is_float(v)]
    sizes = [int(np.prod(v.shape)) for v in floats]
    if dtype in quantize.LEVELS:
        if replicas is None:
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
        rounded, exact = quantize.partition(sizes, [not v.trainable for v in floats])
        return quantize.quantized_bytes(rounded, dtype, replicas, exact)
    return sum(sizes) * BYTES_PER_ELEMENT[dtype]


def optimizer_slots(variables):
    """The inner optimizer's slots among its ``variables``: the float ones of rank >= 1
    (momentum, Adam's moments), not the step counter or the learning rate."""
    return tuple(v for v in variables if _is_float(v) and len(v.shape) >= 1)


def local_reducer(grads_and_vars):
    """Keras's ``_all_reduce_sum_gradients`` without the all-reduce: each replica's own
    local mean gradient. Keras scaled each replica's loss by ``1 / replicas`` for a sum
    over replicas; that scale is undone here."""
    context = tf.distribute.get_replica_context()
    replicas = 1 if context is None else context.num_replicas_in_sync
    return [
        (None if grad is None else grad * tf.cast(replicas, grad.dtype), var)
        for grad, var in grads_and_vars
    ]


def install_local_reducer(optimizer):
    """Makes ``optimizer`` (a Keras 3 TensorFlow optimizer, or the inner one of a loss-scale
    optimizer) apply each replica's own gradient to that replica's copy of the weights."""
    return install_reducer(optimizer, local_reducer)


def _is_float(variable):
    return tf.as_dtype(variable.dtype).is_floating


def _tensor(variable):
    """This replica's copy of ``variable`` as a tensor on its device."""
    return tf.identity(distributed_value(variable))


def distributed_value(variable):
    """The distributed variable behind a Keras variable (the variable itself otherwise)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _assign(strategy, variable, value):
    """Each replica's copy of ``variable`` takes that replica's ``value`` (cross-replica
    context)."""
    strategy.extended.update(
        distributed_value(variable), lambda v, x: v.assign(x), args=(value,), group=False
    )


def average_locally(strategy, variable):
    """The copies of ``variable`` on this process's replicas take their mean: memory only,
    nothing crosses to other workers (cross-replica context)."""
    copies = strategy.experimental_local_results(distributed_value(variable))
    _assign(strategy, variable, tf.add_n([tf.identity(c) for c in copies]) / len(copies))


class LocalStepsState(keras.layers.Layer):
    """Anchors and outer momentum buffers for ``weights``; saved with the trainer.

    Build it under the strategy's scope, in the same order on every worker, after the
    weights hold their starting values.

    Args:
        weights: the model's weights (float ones are synchronised; the rest are left alone).
        local_steps: ``H``, optimizer steps between synchronisations.
        outer_lr, outer_momentum: the outer step (see the module's docstring).
        allreduce_dtype: the dtype the weight changes travel in (int8 and int4 with more
            than one replica in sync: quantized, see the module's docstring).
        overlap: False, ``T`` (1 to ``H``) or True (``H``): the changes travel during the
            next period's first ``T`` steps (see the module's docstring).
        merge: with ``overlap``, where each replica goes on from while its change travels:
            ``"own"`` (its own weights) or ``"eager"`` (the anchor moved by an estimate of
            the mean change; see the module's docstring).

    The values are taken as given: :func:`yolo3.comm.schemes.communication_from` is where
    the flags they come from are checked.
    """

    def __init__(
        self,
        weights,
        local_steps,
        *,
        outer_lr=1.0,
        outer_momentum=0.0,
        allreduce_dtype="float32",
        overlap=False,
        merge=DEFAULT_MERGE,
        name="local_steps",
    ):
        super().__init__(name=name, trainable=False)
        self.local_steps = int(local_steps)
        self.outer_lr, self.outer_momentum = float(outer_lr), float(outer_momentum)
        self.allreduce_dtype = allreduce_dtype
        # overlap: True (the change travels during the whole next period) or T steps.
        self.overlap_steps = None
        if overlap:
            self.overlap_steps = self.local_steps if overlap is True else int(overlap)
        self.overlap = self.overlap_steps is not None
        self.eager = self.overlap and merge == "eager"
        self.in_flight = False  # a change sent at the last period end, not yet applied
        self.steps_since_sync = 0
        self._weights_synced = [w for w in weights if _is_float(w)]
        # int8/int4: these travel exactly (see the module's docstring).
        self._exact = tuple(not w.trainable for w in self._weights_synced)
        # With one replica nothing travels: nothing to quantize either.
        self._replicas = tf.distribute.get_strategy().num_replicas_in_sync
        self.quantized = (
            allreduce_dtype in quantize.LEVELS and self._replicas > 1 and not all(self._exact)
        )
        on_read = tf.VariableSynchronization.ON_READ
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA

        def per_replica(name, initial):
            return tf.Variable(
                initial,
                trainable=False,
                synchronization=on_read,
                aggregation=first,
                name=name,
            )

        anchors = tuple(
            per_replica(f"anchor_{i}", tf.identity(distributed_value(w).read_value()))
            for i, w in enumerate(self._weights_synced)
        )
        buffers = ()
        if self.outer_momentum > 0:
            buffers = tuple(
                per_replica(f"momentum_{i}", tf.zeros(w.shape, w.dtype))
                for i, w in enumerate(self._weights_synced)
            )
        in_flight = ()
        if self.overlap:
            dtypes = {tf.as_dtype(w.dtype) for w in self._weights_synced}
            if len(dtypes) != 1:
                raise ValueError(
                    f"--overlap-sync sends every weight in one buffer; this model's weights "
                    f"have several dtypes ({sorted(d.name for d in dtypes)})"
                )
            self._sizes = [int(np.prod(w.shape)) for w in self._weights_synced]
            # T rows: the chunk sent in each of the first T steps of a period; received
            # has one more, which the steps after the T-th write their empty chunk to.
            steps = self.overlap_steps
            rows = (steps, math.ceil(sum(self._sizes) / steps))
            dtype = dtypes.pop()
            own = ()
            if self.quantized:  # packed words travel; each replica keeps its change
                rounded, exact = quantize.partition(self._sizes, self._exact)
                blocks = quantize.num_blocks(rounded)
                levels = quantize.levels_of(allreduce_dtype)
                words = quantize.num_words(blocks, levels, self._replicas)
                own = (
                    per_replica("own", tf.zeros(rows, dtype)),
                    per_replica("scales", tf.zeros((blocks,), tf.float32)),
                    per_replica("exact_mean", tf.zeros((sum(exact),), tf.float32)),
                )
                rows, dtype = (steps, math.ceil(words / steps)), tf.int64
            in_flight = (
                per_replica("sent", tf.zeros(rows, dtype)),
                per_replica("received", tf.zeros((steps + 1, rows[1]), dtype)),
                per_replica("position", tf.fill((), steps)),  # T: nothing to send
                *own,
            )
        draws = (per_replica("draws", tf.zeros((), tf.int64)),) if self.quantized else ()
        # eager: the others' share of the last mean that landed, (W - 1) / W of their mean
        # change, in the rows of ``own``; zero after a full synchronisation.
        stale = ()
        if self.eager:
            own = in_flight[3] if self.quantized else in_flight[0]
            stale = (per_replica("stale", tf.zeros(own.shape, own.dtype)),)
        # Kept in a tuple: plain tf.Variables that Keras does not collect as weights.
        self._state = (anchors, buffers, in_flight, draws, stale)
        self._functions = {}
        self.built = True

    @property
    def anchors(self):
        return self._state[0]

    @property
    def momentum_buffers(self):
        return self._state[1]

    # -- the synchronisation ------------------------------------------------------------

    def step_done(self):
        """Counts one optimizer step; True when ``H`` have passed since the last sync."""
        self.steps_since_sync += 1
        return self.steps_since_sync >= self.local_steps

    def reset(self, strategy):
        """Anchors from the current weights (identical on every replica, as after a
        restore or at the start), nothing in flight; the step count restarts."""
        self._function(strategy, "reset", ())()
        self.steps_since_sync = 0
        self.in_flight = False

    def synchronize(self, strategy, optimizer_variables=()):
        """All-reduces the weight changes and applies the outer step on every replica.

        ``optimizer_variables`` (a full synchronisation): those of them that are float
        tensors of rank >= 1 (the inner optimizer's slots) are averaged over this process's
        replicas, in memory (never across workers: see the module's docstring); with
        ``overlap``, the changes in flight arrive first, and every replica ends at the
        same weights. Without them and with ``overlap``, the change only goes out here: it
        travels during the next steps (:meth:`exchange`), and only int8/int4 wait for the
        link here, for the all-gather of their shared scales (a 256th of the change, in
        float32). Every worker must call it at the same step.
        """
        full = bool(optimizer_variables)
        slots = optimizer_slots(optimizer_variables)
        if slots and len(strategy.experimental_local_results(distributed_value(slots[0]))) == 1:
            slots = ()  # one replica in this process: nothing to average
        kind = "sync"
        if self.overlap and full and self.in_flight:
            kind = "full"  # what has not arrived is sent now, then this period's change
        elif self.overlap and not full:
            if self.in_flight:
                raise RuntimeError("a change is still in flight: apply it (land) first")
            kind = "send"
        self._function(strategy, kind, slots)()
        self.in_flight = kind == "send"
        self.steps_since_sync = 0

    def landing_due(self):
        """True when the change sent at the last period end has all arrived (``overlap``)."""
        return self.in_flight and self.steps_since_sync >= self.overlap_steps

    def land(self, strategy):
        """Applies the arrived mean change with the outer step; each replica keeps its own
        steps since it was sent. Local: nothing travels."""
        self._function(strategy, "land", ())()
        self.in_flight = False

    def trace(self, strategy):
        """Traces the synchronisation that ends a period of ``H`` steps (and with
        ``overlap`` the landing), without running it, so that its first call does not trace
        it (a benchmark's timed window). Every worker must call it at the same point, as
        the synchronisation."""
        for kind in ("send", "land") if self.overlap else ("sync",):
            self._function(strategy, kind, ()).get_concrete_function()

    def exchange(self):
        """One train step's share of the overlapped synchronisation (``overlap``): the
        mean over replicas of the next chunk of the change in flight. Runs in replica
        context, inside the train step; nothing in the step depends on it."""
        steps = self.overlap_steps
        position = tf.minimum(tf.identity(self.position), steps)
        width = self.sent.shape[1]
        # After the T-th step a one-element chunk, written to the spare row T: the
        # collective stays (every step holds the same ones on every worker) and sends next
        # to nothing. Not an empty one: TensorFlow's CPU collectives crash the process
        # (segmentation fault) within a few hundred all-reduces of zero elements.
        size = tf.where(position < steps, width, 1)
        chunk = tf.gather(tf.identity(self.sent), tf.minimum(position, steps - 1))[:size]
        if self.quantized:  # packed words: their sum, decoded when all has arrived
            context = tf.distribute.get_replica_context()
            mean = context.all_reduce(tf.distribute.ReduceOp.SUM, chunk)
        else:
            (mean,) = self._mean([chunk])
        mean = tf.pad(mean, [[0, width - size]])
        # In place, one row (ON_READ variables have no scatter_update; in replica context
        # their handle is this replica's own copy).
        tf.raw_ops.ResourceScatterUpdate(
            resource=self.received.handle, indices=position[None], updates=mean[None]
        )
        self.position.assign(position + 1)

    def _function(self, strategy, kind, slots):
        trainable = tuple(bool(w.trainable) for w in self._weights_synced)
        key = (kind, trainable, tuple(id(v) for v in slots))
        if key not in self._functions:
            if kind == "reset":
                replica_fn = self._replica_reset
            elif kind == "send":
                replica_fn = self._replica_send
            elif kind in ("land", "full"):
                replica_fn = lambda: self._replica_land(trainable, full=kind == "full")  # noqa: E731
            else:
                replica_fn = lambda: self._replica_sync(trainable)  # noqa: E731

            @tf.function
            def function():
                values = strategy.run(replica_fn)
                if kind == "reset" or (kind == "send" and not self.eager):
                    return
                for variable, value in zip(self._weights_synced, values):
                    _assign(strategy, variable, value)
                for slot in slots:
                    average_locally(strategy, slot)

            self._functions[key] = function
        return self._functions[key]

    @property
    def sent(self):
        return self._state[2][0]

    @property
    def received(self):
        return self._state[2][1]

    @property
    def position(self):
        return self._state[2][2]

    @property
    def own(self):
        """This replica's change in flight (``overlap``): ``sent`` itself, or with
        int8/int4 the float change that ``sent`` holds quantized."""
        return self._state[2][3] if self.quantized else self.sent

    @property
    def scales(self):
        return self._state[2][4]

    @property
    def exact_mean(self):
        return self._state[2][5]

    @property
    def stale(self):
        """``eager``: the others' share of the last mean that landed (in ``own``'s rows)."""
        return self._state[4][0]

    @property
    def draws(self):
        """How many roundings this replica has made (int8/int4): the next one's seed."""
        return self._state[3][0]

    def _replica_reset(self):
        for anchor, weight in zip(self.anchors, self._weights_synced):
            anchor.assign(_tensor(weight))
        if self.overlap:
            self.position.assign(self.overlap_steps)  # nothing to send
        self._forget_stale()

    def _forget_stale(self):
        """After a reset or a full synchronisation every replica holds the same weights:
        the next send's estimate starts from its own change alone (so a run resumed from a
        save, where nothing else is kept, goes on as the uninterrupted one)."""
        if self.eager:
            self.stale.assign(tf.zeros_like(self.stale))

    def _applied(self, own):
        """What a replica's weights went on from at the send, less the anchor: its own
        change, or with ``eager`` the estimate of the mean (its own share plus the others'
        share of the last mean that landed)."""
        if not self.eager:
            return own
        estimate = own / tf.cast(self._replicas, own.dtype) + tf.identity(self.stale)
        # Batch-norm statistics go on from their own, as under "own": an estimate could
        # take a moving variance below zero until the mean lands.
        exact = self._rows([tf.fill(w.shape, e) for w, e in zip(self._weights_synced, self._exact)])
        return tf.where(exact, own, estimate)

    def _mean(self, tensors, dtype=None):
        """The mean over replicas of each of ``tensors``, sent in ``dtype``."""
        if self.quantized:
            return quantize.quantized_mean(tensors, self.allreduce_dtype, self._seed(), self._exact)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        dtype = dtype or self.allreduce_dtype
        if dtype in quantize.LEVELS:  # one replica, or only exact weights: nothing to round
            dtype = "float32"
        totals = all_reduce_gradients(tensors, dtype)
        return [t / tf.cast(replicas, t.dtype) for t in totals]

    def _outer_step(self, trainable, anchors, means):
        """The anchors moved by the mean weight changes ``means`` (assigned, and returned)."""
        new_anchors = []
        for index, (anchor, mean) in enumerate(zip(anchors, means)):
            if not trainable[index]:
                value = anchor - mean  # batch-norm statistics: their mean
            elif self.momentum_buffers:
                buffer = self.momentum_buffers[index]
                momentum = tf.constant(self.outer_momentum, mean.dtype)
                velocity = momentum * tf.identity(buffer) + mean
                buffer.assign(velocity)
                value = anchor - tf.constant(self.outer_lr, mean.dtype) * (
                    mean + momentum * velocity
                )
            else:  # outer_lr 1 (plain averaging): the mean of the replicas' weights
                value = anchor - tf.constant(self.outer_lr, mean.dtype) * mean
            self.anchors[index].assign(value)
            new_anchors.append(value)
        return new_anchors

    def _seed(self):
        """The stateless seed of the next rounding: this replica's, a new one each time."""
        seed = quantize.replica_seed(tf.identity(self.draws))
        self.draws.assign_add(1)
        return seed

    def _replica_sync(self, trainable):
        anchors = [tf.identity(a) for a in self.anchors]
        deltas = [a - _tensor(w) for a, w in zip(anchors, self._weights_synced)]
        self._forget_stale()
        return self._outer_step(trainable, anchors, self._mean(deltas))

    def _pieces(self, rows):
        """The per-weight tensors of a flat ``(T, chunk)`` buffer."""
        flat = tf.reshape(rows, [-1])[: sum(self._sizes)]
        pieces = tf.split(flat, self._sizes)
        return [tf.reshape(p, w.shape) for p, w in zip(pieces, self._weights_synced)]

    def _rows(self, tensors, like=None):
        """``tensors`` flattened into one, padded with zeros to the shape of ``like`` (a
        ``(T, chunk)`` buffer; by default ``own``)."""
        shape = (self.own if like is None else like).shape
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
        padding = shape[0] * shape[1] - int(flat.shape[0])
        return tf.reshape(tf.pad(flat, [[0, padding]]), shape)

    def _replica_send(self):
        """This period's change goes out, over the next T steps; the weights stay (eager:
        they go on from the anchor moved by the estimate, returned). With
        int8/int4 it is quantized now (the shared scales: an all-gather)."""
        changes = [a - _tensor(w) for a, w in zip(self.anchors, self._weights_synced)]
        self.own.assign(self._rows(changes))
        if self.quantized:
            rounded, exact = quantize.partition(changes, self._exact)
            blocks = quantize.to_blocks(rounded)
            scales, exact_mean = quantize.share(blocks, quantize.flatten(exact))
            self.scales.assign(scales)
            self.exact_mean.assign(exact_mean)
            words = quantize.encode(blocks, scales, self.allreduce_dtype, self._seed())
            self.sent.assign(self._rows([words], like=self.sent))
        self.position.assign(0)
        if self.eager:  # the weights go on from the anchor moved by the estimate
            estimate = self._pieces(self._applied(tf.identity(self.own)))
            return [a - e for a, e in zip(self.anchors, estimate)]
        return None

    def _arrived(self, in_flight, *, full):
        """The mean change in flight, per weight: all arrived, or with ``full`` sent now in
        one piece (``in_flight``: ``own``'s value)."""
        if not self.quantized:
            if full:
                return self._pieces(self._mean([in_flight])[0])
            return self._pieces(tf.identity(self.received)[: self.overlap_steps])
        if full:
            context = tf.distribute.get_replica_context()
            words = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(self.sent))
        else:
            words = tf.identity(self.received)[: self.overlap_steps]
        mean = quantize.decode_mean(
            tf.reshape(words, [-1]), tf.identity(self.scales), self.allreduce_dtype, self._replicas
        )
        rounded, exact = quantize.partition(self._weights_synced, self._exact)
        means = quantize.from_blocks(mean, rounded)
        exact_means = quantize.unflatten(tf.identity(self.exact_mean), exact)
        return quantize.merge(means, exact_means, self._exact)

    def _replica_land(self, trainable, *, full):
        """The outer step with the mean of the change in flight (all arrived, or with
        ``full`` sent now in one piece); each replica goes on from the new anchor with its
        own steps since the change was sent, or with ``full`` everyone from the anchor
        moved by their mean too."""
        anchors = [tf.identity(a) for a in self.anchors]
        in_flight = tf.identity(self.own)
        means = self._arrived(in_flight, full=full)
        # The steps since the change was sent, which started at the old anchor less what
        # was applied then (the change itself, or eager's estimate).
        applied = self._pieces(self._applied(in_flight))
        since = [a - old - _tensor(w) for a, old, w in zip(anchors, applied, self._weights_synced)]
        anchors = self._outer_step(trainable, anchors, means)
        self.position.assign(self.overlap_steps)
        if full:
            self._forget_stale()
            return self._outer_step(trainable, anchors, self._mean(since))
        if self.eager:  # the others' share of this mean: the next send's estimate of theirs
            share = in_flight / tf.cast(self._replicas, in_flight.dtype)
            self.stale.assign(self._rows(means) - share)
        return [a - d for a, d in zip(anchors, since)]

    # -- checkpoints -------------------------------------------------------------------

    def save_own_variables(self, store):
        """The outer step's settings and momentum buffers (the anchors equal the saved
        weights: every save is a synchronisation)."""
        store["outer"] = np.asarray([self.outer_lr, self.outer_momentum])
        for index, buffer in enumerate(self.momentum_buffers):
            store[f"momentum_{index}"] = np.asarray(buffer.read_value())

    def load_own_variables(self, store):
        """Restores the momentum buffers.

        Strict, as :meth:`yolo3.comm.powersgd.PowerSGDState.load_own_variables`: a file
        without this state, or with buffers this run does not have, is refused.
        """
        keys = set(store.keys())
        expected = {"outer"} | {f"momentum_{i}" for i in range(len(self.momentum_buffers))}
        if keys != expected:
            saved = (
                "no --local-steps state" if not keys else f"{len(keys) - 1} outer momentum buffers"
            )
            raise ValueError(
                f"the checkpoint holds {saved}, this run needs {len(expected) - 1} outer "
                "momentum buffers: resume with the --local-steps and --outer-momentum it was "
                "saved with"
            )
        for index, buffer in enumerate(self.momentum_buffers):
            value = np.asarray(store[f"momentum_{index}"])
            if tuple(value.shape) != tuple(buffer.shape):
                raise ValueError(
                    f"outer momentum buffer {index}: saved {value.shape}, expected "
                    f"{tuple(buffer.shape)}; resume with the model it was saved with"
                )
            buffer.assign(value.astype(buffer.dtype.as_numpy_dtype))
