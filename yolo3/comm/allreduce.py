"""What the replicas send each other: the gradient all-reduce, its dtype and its options.

A data-parallel step sums every trainable variable's gradient over the replicas. On a slow
network that all-reduce is the step: tiny-YOLOv3's 8.7M parameters are 35 MB of float32
gradient, about 2.8 s at 100 Mbit/s. Two things shrink it:

- ``allreduce_dtype``: gradients travel as bfloat16 or float16 (half the bytes) and are
  cast back for the update. float16 has a narrow range, so each tensor is first multiplied
  by a power of two that puts the largest possible sum just under float16's maximum
  (:func:`float16_scales`): no overflow, and small values keep as many bits as the range
  allows. bfloat16 has float32's range and needs no scale.
- gradient accumulation (``YoloTrainer(accumulate=K)``): one all-reduce per K micro-batches.

``int8`` and ``int4`` are for the weight changes of ``--local-steps`` only
(:mod:`yolo3.comm.quantize`): a gradient is not sent in them.

:func:`install_gradient_reducer` makes a Keras optimizer all-reduce through
:func:`all_reduce_gradients`; :func:`communication_options` builds the
``tf.distribute.experimental.CommunicationOptions`` every collective of the job uses.
"""

import math

import numpy as np
import tensorflow as tf

from yolo3.comm.quantize import LEVELS
from yolo3.comm.reducer import install_reducer
from yolo3.distributed.collectives import all_reduce_by_dtype

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# The values of --allreduce-dtype; the quantized ones (LEVELS) with --local-steps only.
ALLREDUCE_DTYPES = FLOAT_DTYPES + tuple(LEVELS)
FLOAT16_MAX = 65504.0
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def check_allreduce_dtype(dtype, *, local_steps=False):
    """``dtype`` if ``--allreduce-dtype`` may take it; ``local_steps``: whether
    ``--local-steps`` is on (int8 and int4 quantize its weight changes, not gradients)."""
    if dtype not in ALLREDUCE_DTYPES:
        raise ValueError(f"--allreduce-dtype {dtype!r}: use one of {ALLREDUCE_DTYPES}")
    if dtype in LEVELS and not local_steps:
        raise ValueError(
            f"--allreduce-dtype {dtype} quantizes the weight changes of --local-steps, not "
            f"gradients: pass --local-steps H too, or use one of {FLOAT_DTYPES}"
        )
    return dtype


def communication_options(bytes_per_pack=0, timeout_seconds=None):
    """``CommunicationOptions`` for a strategy's collectives.

    Args:
        bytes_per_pack: split each all-reduce into packs of about this many bytes, so that
            sending one pack overlaps the next (0: TensorFlow decides).
        timeout_seconds: a collective that has not completed in this time fails with
            ``DeadlineExceeded`` on every worker still running, instead of waiting forever
            for a dead or partitioned peer (None: wait forever).
    """
    if bytes_per_pack < 0:
        raise ValueError(f"--bytes-per-pack {bytes_per_pack}: use 0 (automatic) or more")
    if timeout_seconds is not None and timeout_seconds <= 0:
        raise ValueError(
            f"--collective-timeout {timeout_seconds}: use a positive number of seconds"
        )
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=int(bytes_per_pack), timeout_seconds=timeout_seconds
    )


def float16_scales(bounds):
    """Per-tensor powers of two that keep a float16 all-reduce finite.

    Args:
        bounds: ``(tensors,)`` float32, the sum over replicas of each tensor's largest
            absolute value: no element of the summed gradient can exceed it.

    Returns:
        ``2**floor(log2(FLOAT16_MAX / 2 / bound))`` per tensor (1 where a bound is 0), so the
        largest possible sum lands in the top octave below half of float16's maximum (the
        half keeps the partial sums of any reduction order finite too). A power of two
        scales and unscales without rounding.
    """
    safe = tf.where(bounds > 0, bounds, tf.ones_like(bounds))
    exponent = tf.floor(tf.math.log(FLOAT16_MAX / 2 / safe) / math.log(2.0))
    # A bound near float32's smallest numbers would give a scale beyond its largest.
    exponent = tf.clip_by_value(exponent, -100.0, 100.0)
    return tf.where(bounds > 0, tf.pow(2.0, exponent), tf.ones_like(bounds))


def all_reduce_gradients(grads, dtype="float32", options=None):
    """Sums ``grads`` (a list of tensors, no None) over the replicas, sent as ``dtype``.

    Must run in a replica context; with one replica it returns ``grads`` unchanged. The
    result has each gradient's own dtype. One ``all_reduce`` call per dtype. ``dtype`` is
    one of :data:`FLOAT_DTYPES` (int8 and int4: :func:`yolo3.comm.quantize.quantized_mean`).
    """
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"all_reduce_gradients sends {FLOAT_DTYPES}, not {dtype!r}")
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1 or not grads:
        return list(grads)
    sum_op = tf.distribute.ReduceOp.SUM
    if dtype == "float32":
        # Each gradient in its own dtype (float64 stays float64), one call per dtype.
        return all_reduce_by_dtype(context, grads, options)
    wire = tf.as_dtype(dtype)
    scales = None
    if dtype == "float16":
        largest = tf.stack([tf.cast(tf.reduce_max(tf.abs(g)), tf.float32) for g in grads])
        scales = float16_scales(context.all_reduce(sum_op, largest, options=options))
    sent = []
    for index, grad in enumerate(grads):
        if scales is not None:
            grad = grad * tf.cast(scales[index], grad.dtype)
        sent.append(tf.cast(grad, wire))
    summed = context.all_reduce(sum_op, sent, options=options)
    reduced = []
    for index, (grad, total) in enumerate(zip(grads, summed)):
        total = tf.cast(total, grad.dtype)
        if scales is not None:
            total = total / tf.cast(scales[index], grad.dtype)
        reduced.append(total)
    return reduced


def install_gradient_reducer(optimizer, dtype="float32", options=None):
    """Makes ``optimizer`` (a Keras 3 TensorFlow optimizer) all-reduce with
    :func:`all_reduce_gradients`.

    Keras sums the replicas' gradients in the optimizer's ``_all_reduce_sum_gradients``
    just before the update; this replaces it on the optimizer that applies the update (the
    inner one of a loss-scale optimizer). Gradients that are None stay None.
    """
    check_allreduce_dtype(dtype)

    def reduce(grads_and_vars):
        pairs = list(grads_and_vars)
        present = [index for index, (grad, _) in enumerate(pairs) if grad is not None]
        summed = all_reduce_gradients([pairs[i][0] for i in present], dtype, options)
        result = [(None, var) for _, var in pairs]
        for index, total in zip(present, summed):
            result[index] = (total, pairs[index][1])
        return result

    return install_reducer(optimizer, reduce)


def allreduce_bytes(variables, dtype="float32"):
    """Bytes one replica's gradient all-reduce carries for ``variables`` sent as ``dtype``."""
    elements = sum(int(np.prod(variable.shape)) for variable in variables)
    return elements * BYTES_PER_ELEMENT[dtype]
