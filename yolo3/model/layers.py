"""Custom Keras layers.

``SyncBatchNormalization`` is batch normalization whose training statistics cover the global
batch of a data-parallel ``tf.distribute`` strategy. Keras's own
``BatchNormalization(synchronized=True)`` all-reduces sums of ``x`` and ``x**2`` and takes
``E[x**2] - E[x]**2`` in float32, which cancels catastrophically when a channel's mean is
large against its spread: for a channel at 1000 +- 0.01 it returns a variance a thousand
times too large, where one device (``tf.nn.moments``) is right to 1e-4. Here the variance is
combined from each replica's count, mean and sum of squared deviations about its own
mean (the parallel-variance formula): one all-gather per layer, as accurate as one device.
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
    ``MirroredStrategy``, ``MultiWorkerMirroredStrategy``, ...), per channel: each replica
    computes its element count ``n_r``, mean ``m_r`` (as a rounded value and its residual)
    and sum of squared deviations ``S_r`` about ``m_r``; one all-gather brings them to every
    replica; then, in float64,
    ``mean = sum(n_r m_r) / N`` and ``variance = (sum(S_r) + sum(n_r (m_r - mean)**2)) / N``
    with ``N = sum(n_r)``. One collective per layer (latency matters more than bytes for
    these small vectors on a slow network) and no ``E[x**2] - E[x]**2`` cancellation.

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

        # This replica's count, mean and sum of squared deviations per channel, by the
        # corrected two-pass algorithm: the mean rounded to x's dtype (hi), the residual
        # mean of the deviations from it (lo, which hi + lo recovers to far below one
        # rounding step), and the squared deviations corrected by the residual.
        sums = local_sum(x)
        if keep is None:
            count = tf.cast(tf.size(x) // tf.shape(x)[self.axis], x.dtype)
            counts = tf.fill(tf.shape(sums), count)
        else:
            counts = local_sum(tf.ones_like(x))
        hi = tf.math.divide_no_nan(sums, counts)
        deviations = x - tf.stop_gradient(hi)
        residual = tf.stop_gradient(local_sum(deviations))  # the gradient flows through hi
        lo = tf.math.divide_no_nan(residual, counts)
        squares = local_sum(tf.square(deviations)) - residual * lo
        # One collective per layer: every replica's four statistics, combined in float64
        # (they are per-channel vectors) with the parallel-variance formula (Chan, Golub and
        # LeVeque): as exact as two passes over the global batch.
        gathered = context.all_gather(tf.stack([counts, hi, lo, squares])[tf.newaxis], axis=0)
        gathered.set_shape([context.num_replicas_in_sync, 4, *sums.shape])  # lost in transit
        counts, hi, lo, squares = tf.unstack(tf.cast(gathered, tf.float64), axis=1)
        count = tf.reduce_sum(counts, axis=0)
        mean = tf.math.divide_no_nan(tf.reduce_sum(counts * (hi + lo), axis=0), count)
        spread = tf.reduce_sum(squares + counts * tf.square(hi - mean + lo), axis=0)
        variance = tf.math.divide_no_nan(spread, count)
        return tf.cast(tf.reshape(mean, [-1]), dtype), tf.cast(tf.reshape(variance, [-1]), dtype)
