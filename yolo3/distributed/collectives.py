"""Collective operations on the replicas of a strategy, below the communication schemes.

The strategy's own helpers (:func:`yolo3.distributed.strategy.common_newest`) and every
scheme of :mod:`yolo3.comm` sum tensors over the replicas through here.
"""

import tensorflow as tf


def all_reduce_by_dtype(context, tensors, options=None):
    """SUM of each of ``tensors`` over the replicas, one ``all_reduce`` call per dtype.

    ``context`` is the replica context (``tf.distribute.get_replica_context()``);
    ``options`` a ``tf.distribute.experimental.CommunicationOptions`` or None.
    """
    groups = {}
    for index, tensor in enumerate(tensors):
        groups.setdefault(tensor.dtype, []).append(index)
    reduced = [None] * len(tensors)
    for indices in groups.values():
        summed = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [tensors[i] for i in indices], options=options
        )
        for index, total in zip(indices, summed):
            reduced[index] = total
    return reduced
