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
checkpoint, and there additionally averages the inner optimizer's state (a *full*
synchronisation, in float32): every saved state is then one state shared by all replicas,
the ``H``-step count restarts from it, and a run resumed from it continues as the
uninterrupted run did.

State (:class:`LocalStepsState`, a layer saved with the trainer): the anchors (the weights
at the last synchronisation; not saved, since every save is a synchronisation) and the
outer momentum buffers. Both are ``ON_READ`` variables: each replica assigns its own copy;
all copies hold the same values, computed from all-reduced numbers.
"""

import keras
import numpy as np
import tensorflow as tf

from yolo3.communication import BYTES_PER_ELEMENT, all_reduce_gradients


def check_local_steps(local_steps, outer_lr=1.0, outer_momentum=0.0):
    """Raises ValueError naming the flag when ``--local-steps``, ``--outer-lr`` or
    ``--outer-momentum`` is unusable; returns them as int, float, float."""
    if local_steps is None:
        if outer_lr != 1.0 or outer_momentum != 0.0:
            raise ValueError(
                "--outer-lr and --outer-momentum set the outer step of --local-steps: pass "
                "--local-steps H too"
            )
        return None, 1.0, 0.0
    if int(local_steps) != local_steps or local_steps < 1:
        raise ValueError(
            f"--local-steps {local_steps}: use a whole number of optimizer steps >= 1 "
            "between synchronisations"
        )
    if not outer_lr > 0:
        raise ValueError(f"--outer-lr {outer_lr}: use a number > 0 (1 with plain averaging)")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"--outer-momentum {outer_momentum}: use a number in [0, 1)")
    return int(local_steps), float(outer_lr), float(outer_momentum)


def sync_bytes(variables, dtype="float32"):
    """Bytes one replica's synchronisation all-reduces: every float variable in ``dtype``."""
    elements = sum(int(np.prod(v.shape)) for v in variables if _is_float(v))
    return elements * BYTES_PER_ELEMENT[dtype]


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
    target = getattr(optimizer, "inner_optimizer", optimizer)
    target._all_reduce_sum_gradients = local_reducer
    return optimizer


def _is_float(variable):
    return tf.as_dtype(variable.dtype).is_floating


def _tensor(variable):
    """This replica's copy of ``variable`` as a tensor on its device."""
    return tf.identity(_distributed(variable))


def _distributed(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


class LocalStepsState(keras.layers.Layer):
    """Anchors and outer momentum buffers for ``weights``; saved with the trainer.

    Build it under the strategy's scope, in the same order on every worker, after the
    weights hold their starting values.

    Args:
        weights: the model's weights (float ones are synchronised; the rest are left alone).
        local_steps: ``H``, optimizer steps between synchronisations.
        outer_lr, outer_momentum: the outer step (see the module's docstring).
        allreduce_dtype: the dtype the weight changes travel in.
    """

    def __init__(
        self,
        weights,
        local_steps,
        *,
        outer_lr=1.0,
        outer_momentum=0.0,
        allreduce_dtype="float32",
        name="local_steps",
    ):
        super().__init__(name=name, trainable=False)
        self.local_steps, self.outer_lr, self.outer_momentum = check_local_steps(
            local_steps, outer_lr, outer_momentum
        )
        self.allreduce_dtype = allreduce_dtype
        self.steps_since_sync = 0
        self._weights_synced = [w for w in weights if _is_float(w)]
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
            per_replica(f"anchor_{i}", tf.identity(_distributed(w).read_value()))
            for i, w in enumerate(self._weights_synced)
        )
        buffers = ()
        if self.outer_momentum > 0:
            buffers = tuple(
                per_replica(f"momentum_{i}", tf.zeros(w.shape, w.dtype))
                for i, w in enumerate(self._weights_synced)
            )
        # Kept in a tuple: plain tf.Variables that Keras does not collect as weights.
        self._state = (anchors, buffers)
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
        restore or at the start); the step count restarts."""
        self._function(strategy, "reset", ())()
        self.steps_since_sync = 0

    def synchronize(self, strategy, optimizer_variables=()):
        """All-reduces the weight changes and applies the outer step on every replica.

        ``optimizer_variables`` (a full synchronisation): those of them that are float
        tensors of rank >= 1 (the inner optimizer's slots) are averaged too, in float32.
        Every worker must call it at the same step.
        """
        slots = tuple(v for v in optimizer_variables if _is_float(v) and len(v.shape) >= 1)
        self._function(strategy, "sync", slots)()
        self.steps_since_sync = 0

    def _function(self, strategy, kind, slots):
        trainable = tuple(bool(w.trainable) for w in self._weights_synced)
        key = (kind, trainable, tuple(id(v) for v in slots))
        if key not in self._functions:
            if kind == "reset":
                replica_fn = self._replica_reset
            else:
                replica_fn = lambda: self._replica_sync(trainable, slots)  # noqa: E731
            targets = self._weights_synced + list(slots)

            @tf.function
            def function():
                values = strategy.run(replica_fn)
                if kind == "reset":
                    return
                for variable, value in zip(targets, values):
                    strategy.extended.update(
                        _distributed(variable),
                        lambda v, x: v.assign(x),
                        args=(value,),
                        group=False,
                    )

            self._functions[key] = function
        return self._functions[key]

    def _replica_reset(self):
        for anchor, weight in zip(self.anchors, self._weights_synced):
            anchor.assign(_tensor(weight))

    def _replica_sync(self, trainable, slots):
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        anchors = [tf.identity(a) for a in self.anchors]
        deltas = [a - _tensor(w) for a, w in zip(anchors, self._weights_synced)]
        summed = all_reduce_gradients(deltas, self.allreduce_dtype)
        new_values = []
        for index, (anchor, total) in enumerate(zip(anchors, summed)):
            mean = total / tf.cast(replicas, total.dtype)
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
            new_values.append(value)
        if slots:
            totals = all_reduce_gradients([_tensor(s) for s in slots], "float32")
            new_values += [t / tf.cast(replicas, t.dtype) for t in totals]
        return new_values

    # -- checkpoints -------------------------------------------------------------------

    def save_own_variables(self, store):
        """The outer step's settings and momentum buffers (the anchors equal the saved
        weights: every save is a synchronisation)."""
        store["outer"] = np.asarray([self.outer_lr, self.outer_momentum])
        for index, buffer in enumerate(self.momentum_buffers):
            store[f"momentum_{index}"] = np.asarray(buffer.read_value())

    def load_own_variables(self, store):
        """Restores the momentum buffers.

        Strict, as :meth:`yolo3.compression.PowerSGDState.load_own_variables`: a file
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
