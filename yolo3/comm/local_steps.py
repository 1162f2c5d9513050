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
:class:`yolo3.comm.local_sync.LocalSync` (a collective cannot sit in a conditional branch of the
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

With ``overlap`` (``--overlap-sync T``) no synchronisation waits for the link: each
period's change travels during the first ``T`` steps of the next one and is applied there
(:mod:`yolo3.comm.overlap`, whose :class:`~yolo3.comm.overlap.OverlappedSync` the state
owns).

State (:class:`LocalStepsState`, a layer saved with the trainer): the anchors (the weights
at the last synchronisation; not saved, since every save is a synchronisation) and the
outer momentum buffers, and with ``overlap`` the change in flight. All are ``ON_READ``
variables: each replica assigns its own copy; the anchors and buffers hold the same values
on every replica, computed from all-reduced numbers.

With ``--allreduce-dtype int8`` or ``int4`` (:mod:`yolo3.comm.quantize`) the changes travel
as integers with stochastic rounding, in blocks that share a scale (the largest ``|value|``
of the block on any replica, agreed by an all-gather at each synchronisation), packed in
int64 words that one integer all-reduce sums exactly. The mean that arrives is within one
rounding step (the block's scale over 127, or 7) of the exact mean, and unbiased. The
weights that are not trainable when the state is built (the batch-norm statistics: a
rounded variance could fall below zero) travel exactly, in float32, in the scales'
all-gather. Each rounding's seed (:class:`yolo3.comm.quantize.Seeds`) is made of the run's
``--seed``, the replica's id, the optimizer's step count at the synchronisation (which
:class:`yolo3.comm.local_sync.LocalSync` passes) and the rounding's index among those made at
that step count. Every save is a full synchronisation, and the next rounding comes at a
later step count, as the first after a resume does: a run resumed from a save draws the
numbers that the uninterrupted run did.
"""

import keras
import numpy as np
import tensorflow as tf

from yolo3.comm import quantize
from yolo3.comm.allreduce import BYTES_PER_ELEMENT, all_reduce_gradients
from yolo3.comm.overlap import OverlappedSync
from yolo3.comm.reducer import install_reducer

# --overlap-merge: where a replica goes on from while its change travels.
MERGES = ("own", "eager")
DEFAULT_MERGE = "own"
# What the compiled synchronisations take: the optimizer's step count.
STEP_SPEC = tf.TensorSpec((), tf.int64)


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


def _step_count(step):
    """``step`` (an int, a tensor or a variable such as ``optimizer.iterations``; None: 0)
    as a scalar int64 tensor, the argument of the compiled synchronisations."""
    return tf.cast(tf.convert_to_tensor(0 if step is None else step), tf.int64)


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
            next period's first ``T`` steps (:mod:`yolo3.comm.overlap`).
        merge: with ``overlap``, where each replica goes on from while its change travels:
            ``"own"`` (its own weights) or ``"eager"`` (the anchor moved by an estimate of
            the mean change; see :mod:`yolo3.comm.overlap`).
        seed: the run's ``--seed``, which int8 and int4 round with (see the module's
            docstring).

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
        seed=0,
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
        self.in_flight = False  # a change sent at the last period end, not yet applied
        self.steps_since_sync = 0
        self.synced = [w for w in weights if _is_float(w)]
        # int8/int4: these travel exactly (see the module's docstring).
        self.exact = tuple(not w.trainable for w in self.synced)
        # With one replica nothing travels: nothing to quantize either.
        self.replicas = tf.distribute.get_strategy().num_replicas_in_sync
        self.quantized = (
            allreduce_dtype in quantize.LEVELS and self.replicas > 1 and not all(self.exact)
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
            for i, w in enumerate(self.synced)
        )
        buffers = ()
        if self.outer_momentum > 0:
            buffers = tuple(
                per_replica(f"momentum_{i}", tf.zeros(w.shape, w.dtype))
                for i, w in enumerate(self.synced)
            )
        # Kept in a tuple: plain tf.Variables that Keras does not collect as weights.
        self._state = (anchors, buffers)
        self.seeds = quantize.Seeds(seed, per_replica) if self.quantized else None
        self._overlapped = None
        if self.overlap:
            self._overlapped = OverlappedSync(
                self, self.overlap_steps, eager=merge == "eager", variable=per_replica
            )
        self._functions = {}
        self.built = True

    @property
    def anchors(self):
        return self._state[0]

    @property
    def momentum_buffers(self):
        return self._state[1]

    @property
    def draws(self):
        """int8/int4: the roundings this replica made at the last step count it rounded at
        (:class:`yolo3.comm.quantize.Seeds`)."""
        return self.seeds.draws

    @property
    def sent(self):
        """With ``overlap``: this replica's change in flight (:mod:`yolo3.comm.overlap`)."""
        return self._overlapped.sent

    @property
    def received(self):
        """With ``overlap``: the mean of ``sent`` as far as it has arrived."""
        return self._overlapped.received

    @property
    def position(self):
        """With ``overlap``: the chunk of ``sent`` that the next train step sends."""
        return self._overlapped.position

    # -- the synchronisation ------------------------------------------------------------

    def step_done(self):
        """Counts one optimizer step; True when ``H`` have passed since the last sync."""
        self.steps_since_sync += 1
        return self.steps_since_sync >= self.local_steps

    def reset(self, strategy):
        """Anchors from the current weights (identical on every replica, as after a
        restore or at the start), nothing in flight; the step count restarts."""
        self._function(strategy, "reset", ())(_step_count(None))
        self.steps_since_sync = 0
        self.in_flight = False

    def synchronize(self, strategy, optimizer_variables=(), *, step=None):
        """All-reduces the weight changes and applies the outer step on every replica.

        ``optimizer_variables`` (a full synchronisation): those of them that are float
        tensors of rank >= 1 (the inner optimizer's slots) are averaged over this process's
        replicas, in memory (never across workers: see the module's docstring); with
        ``overlap``, the changes in flight arrive first, and every replica ends at the
        same weights. Without them and with ``overlap``, the change only goes out here: it
        travels during the next steps (:meth:`exchange`), and only int8/int4 wait for the
        link here, for the all-gather of their shared scales (a 256th of the change, in
        float32). ``step``: the optimizer's step count (``optimizer.iterations``), which
        int8/int4 seed their roundings with (None: 0). Every worker must call it at the
        same step.
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
        self._function(strategy, kind, slots)(_step_count(step))
        self.in_flight = kind == "send"
        self.steps_since_sync = 0

    def landing_due(self):
        """True when the change sent at the last period end has all arrived (``overlap``)."""
        return self.in_flight and self.steps_since_sync >= self.overlap_steps

    def land(self, strategy):
        """Applies the arrived mean change with the outer step; each replica keeps its own
        steps since it was sent. Local: nothing travels."""
        self._function(strategy, "land", ())(_step_count(None))
        self.in_flight = False

    def trace(self, strategy):
        """Traces the synchronisation that ends a period of ``H`` steps (and with
        ``overlap`` the landing), without running it, so that its first call does not trace
        it (a benchmark's timed window). Every worker must call it at the same point, as
        the synchronisation."""
        for kind in ("send", "land") if self.overlap else ("sync",):
            self._function(strategy, kind, ()).get_concrete_function(STEP_SPEC)

    def exchange(self):
        """One train step's share of the overlapped synchronisation (``overlap``): the
        mean over replicas of the next chunk of the change in flight
        (:meth:`yolo3.comm.overlap.OverlappedSync.exchange`; replica context, inside the
        train step)."""
        self._overlapped.exchange()

    def _function(self, strategy, kind, slots):
        """The compiled synchronisation of ``kind``, a function of the step count (read by
        those that round: int8/int4's sync, send and full; reset and land are given 0)."""
        trainable = tuple(bool(w.trainable) for w in self.synced)
        key = (kind, trainable, tuple(id(v) for v in slots))
        if key not in self._functions:
            if kind == "reset":
                replica_fn = self._replica_reset
            elif kind == "send":
                replica_fn = self._overlapped.send
            elif kind in ("land", "full"):
                replica_fn = lambda: self._overlapped.land(trainable, full=kind == "full")  # noqa: E731
            else:
                replica_fn = lambda: self._replica_sync(trainable)  # noqa: E731
            rounds = self.quantized and kind in ("sync", "send", "full")
            keeps = kind == "reset" or (kind == "send" and not self._overlapped.eager)

            def at_step(step):
                if rounds:
                    self.seeds.count_from(step)
                return replica_fn()

            @tf.function(input_signature=[STEP_SPEC])
            def function(step):
                values = strategy.run(at_step, args=(step,))
                if keeps:  # the weights stay
                    return
                for variable, value in zip(self.synced, values):
                    _assign(strategy, variable, value)
                for slot in slots:
                    average_locally(strategy, slot)

            self._functions[key] = function
        return self._functions[key]

    def replica_weights(self):
        """This replica's copies of the synchronised weights, as tensors (replica context)."""
        return [_tensor(w) for w in self.synced]

    def _replica_reset(self):
        for anchor, weight in zip(self.anchors, self.replica_weights()):
            anchor.assign(weight)
        if self.overlap:
            self._overlapped.reset()
        if self.quantized:
            self.seeds.forget()

    def mean(self, tensors):
        """The mean over replicas of each of ``tensors``, sent in ``allreduce_dtype``
        (replica context; int8/int4: one rounding)."""
        if self.quantized:
            seed = self.seeds.next()
            return quantize.quantized_mean(tensors, self.allreduce_dtype, seed, self.exact)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        dtype = self.allreduce_dtype
        if dtype in quantize.LEVELS:  # one replica, or only exact weights: nothing to round
            dtype = "float32"
        totals = all_reduce_gradients(tensors, dtype)
        return [t / tf.cast(replicas, t.dtype) for t in totals]

    def outer_step(self, trainable, anchors, means):
        """The anchors moved by the mean weight changes ``means`` (assigned, and returned;
        replica context)."""
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

    def _replica_sync(self, trainable):
        anchors = [tf.identity(a) for a in self.anchors]
        deltas = [a - w for a, w in zip(anchors, self.replica_weights())]
        if self.overlap:
            self._overlapped.forget_stale()
        return self.outer_step(trainable, anchors, self.mean(deltas))

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
