"""Custom Keras layers.

``SyncBatchNormalization`` is batch normalization whose training statistics cover the global
batch of a data-parallel ``tf.distribute`` strategy. Keras's own
``BatchNormalization(synchronized=True)`` all-reduces sums of ``x`` and ``x**2`` and takes
``E[x**2] - E[x]**2`` in float32, which cancels catastrophically when a channel's mean is
large against its spread: for a channel at 1000 +- 0.01 it returns a variance a thousand
times too large, where one device (``tf.nn.moments``) is right to 1e-4. Here the variance is
the mean squared deviation about the already-reduced global mean: two all-reduces, the
second over small numbers, as accurate as one device.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="yolo3")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with two-pass cross-replica training statistics.

    Same arguments (except ``synchronized``), variables (``gamma``, ``beta``,
    ``moving_mean``, ``moving_variance``) and weight order as ``BatchNormalization``, so
    weights move between the two in either direction.

    In training mode inside a replica context with more than one replica (any strategy:
    ``MirroredStrategy``, ``MultiWorkerMirroredStrategy``, ...), per channel:

    1. all-reduce SUM of the local sums of ``x`` and the local element counts;
       ``mean = sum / count``;
    2. all-reduce SUM of the local sums of ``(x - mean)**2``; ``variance = that / count``.

    The variance is biased (divided by ``count``), as in ``BatchNormalization`` for both the
    normalisation and the moving variance, so N replicas match one device on the global batch.
    Statistics are computed in float32 or wider (float16/bfloat16 inputs are cast up; ``call``
    casts the output back to the compute dtype). With one replica, outside a strategy, or in
    inference mode it is exactly ``BatchNormalization``.
    """

    def __init__(self, **kwargs):
        if "synchronized" in kwargs:
            raise ValueError(
                "SyncBatchNormalization always synchronizes its statistics across replicas; "
                f"got synchronized={kwargs['synchronized']!r}. Drop the argument, or use "
                "keras.layers.BatchNormalization for per-replica statistics."
            )
        super().__init__(**kwargs)

    def get_config(self):
        config = super().get_config()
        del config["synchronized"]
        return config

    def _moments(self, inputs, mask):
        """Per-channel ``(mean, variance)``, each of shape ``(channels,)``."""
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return super()._moments(inputs, mask)

        dtype = inputs.dtype
        # At least float32: half-precision sums over a global batch overflow and round badly.
        x = tf.cast(inputs, keras.backend.result_type(dtype, "float32"))
        keep = None
        if mask is not None:  # (N, ...) without the channel axis, as BatchNormalization takes it
            keep = tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(x))

        def local_sum(values):
            if keep is not None:
                values = tf.where(keep, values, tf.zeros_like(values))
            return tf.reduce_sum(values, self._reduction_axes, keepdims=True)

        sums = local_sum(x)
        if keep is None:
            count = tf.cast(tf.size(x) // tf.shape(x)[self.axis], x.dtype)
            counts = tf.fill(tf.shape(sums), count)
        else:
            counts = local_sum(tf.ones_like(x))
        # Pass 1, one all-reduce for sums and element counts together.
        total_sum, count = tf.unstack(
            context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack([sums, counts]))
        )
        mean = tf.math.divide_no_nan(total_sum, count)
        # Pass 2, deviations about the global mean. As in tf.nn.moments no gradient flows
        # through the mean here: the deviations sum to zero, so it would add only rounding.
        squared = local_sum(tf.square(x - tf.stop_gradient(mean)))
        variance = tf.math.divide_no_nan(
            context.all_reduce(tf.distribute.ReduceOp.SUM, squared), count
        )
        return tf.cast(tf.reshape(mean, [-1]), dtype), tf.cast(tf.reshape(variance, [-1]), dtype)
