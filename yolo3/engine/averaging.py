"""An exponential moving average of the weights, the weights a run saves and evaluates.

After each optimizer step, every float weight of the body (the trainable ones and batch
norm's moving statistics) moves its average ``a`` towards its value ``w``:
``a <- d a + (1 - d) w``, with the decay ramped up from 0 over the first updates,

    d(t) = decay * (1 - exp(-t / warmup)),   t = updates before this one,

so that the first update copies the weights and the early, poor weights are forgotten
quickly (the ramp of Ultralytics' and timm's ``ModelEMA``). The averages are what the run
validates (its validation loss), scores (``--map-every``) and writes to ``last``, ``best``
and ``epoch-N`` checkpoints; training continues from the raw weights, which the training
state and the backups keep along with the averages, so a resumed run continues both.

Each replica averages its own copy of the weights, in memory, with no communication: with
all-reduced gradients the copies are equal. With ``--local-steps`` (replicas that drift
apart between synchronisations) the copies of one process are averaged before they are
read; the average of averages is the average of the replicas' mean weights, the EMA being
linear. Workers keep their own, as they keep their optimizer's slots.
"""

import contextlib
import math

import keras
import tensorflow as tf

from yolo3.comm.local_steps import average_locally, distributed_value


def decay_at(updates, decay, warmup):
    """The decay of the update that follows ``updates`` earlier ones (a number or a
    tensor): ``decay * (1 - exp(-updates / warmup))``."""
    if isinstance(updates, (int, float)):
        return decay * (1.0 - math.exp(-updates / warmup))
    return decay * (1.0 - tf.exp(-tf.cast(updates, tf.float32) / warmup))


def check(decay, warmup):
    """Raises ValueError, naming the flag, for a decay outside [0, 1) or a warm-up <= 0."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"--ema {decay:g}: give a decay in [0, 1), such as 0.999 (0: off)")
    if warmup <= 0:
        raise ValueError(f"--ema-warmup {warmup:g}: give a number of steps > 0")


class WeightAverage(keras.layers.Layer):
    """The averages of ``body``'s float weights and the count of updates; saved with the
    trainer that tracks it (training state, backups).

    Args:
        body: the model whose weights are averaged.
        decay: the decay the ramp tends to, in [0, 1).
        warmup: updates over which the ramp rises (its time constant), > 0.
    """

    def __init__(self, body, *, decay, warmup, **kwargs):
        super().__init__(name=kwargs.pop("name", "weight_average"), **kwargs)
        check(decay, warmup)
        self.decay = float(decay)
        self.warmup = float(warmup)
        # The body's variables, kept out of Keras's tracking: they are the body's to save.
        object.__setattr__(
            self, "_sources", [w for w in body.weights if tf.as_dtype(w.dtype).is_floating]
        )
        self.averages = [
            self.add_weight(
                shape=w.shape,
                initializer="zeros",
                dtype=w.dtype,
                trainable=False,
                name=f"average_{index}",
            )
            for index, w in enumerate(self._sources)
        ]
        self.updates = self.add_weight(
            shape=(), initializer="zeros", dtype="int64", trainable=False, name="updates"
        )
        self._update_function = None
        self._swap_function = None

    def update(self, strategy):
        """One update of every average from its weight (cross-replica context, after an
        optimizer step)."""
        if self._update_function is None:
            self._update_function = tf.function(lambda: self._update(strategy))
        self._update_function()

    def _update(self, strategy):
        decay = decay_at(distributed_value(self.updates), self.decay, self.warmup)

        def move(average, weight):
            return average.assign(decay * average + (1.0 - decay) * tf.cast(weight, average.dtype))

        for average, weight in zip(self.averages, self._sources):
            strategy.extended.update(
                distributed_value(average), move, args=(distributed_value(weight),), group=False
            )
        distributed_value(self.updates).assign_add(1)

    def started(self):
        """True once an update has run (before it, the averages hold nothing)."""
        return int(distributed_value(self.updates).numpy()) > 0

    @contextlib.contextmanager
    def swapped_in(self, strategy, *, replicas_drift=False):
        """Within the block the body holds the averages (its weights wait in their place);
        after it, the weights are back, bit for bit. Nothing before the first update.

        ``replicas_drift``: the replicas of this process may hold different weights (local
        steps): their averages are first made their mean, on each of them.
        """
        if not self.started():
            yield
            return
        if replicas_drift:
            for average in self.averages:
                average_locally(strategy, average)
        self._swap(strategy)
        try:
            yield
        finally:
            self._swap(strategy)

    def _swap(self, strategy):
        if self._swap_function is None:

            def exchange(weight, average):
                held = tf.identity(weight)
                with tf.control_dependencies([held]):
                    weight.assign(tf.cast(average, weight.dtype))
                with tf.control_dependencies([weight.read_value()]):
                    return average.assign(tf.cast(held, average.dtype))

            def swap():
                for average, weight in zip(self.averages, self._sources):
                    strategy.extended.update(
                        distributed_value(weight),
                        exchange,
                        args=(distributed_value(average),),
                        group=False,
                    )

            self._swap_function = tf.function(swap)
        self._swap_function()
