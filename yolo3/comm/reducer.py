"""The one place the project replaces Keras's gradient reduction.

Under a ``tf.distribute`` strategy, Keras 3's TensorFlow optimizer sums the replicas'
gradients in ``TFOptimizer._all_reduce_sum_gradients``, which ``_backend_update_step``
calls just before the update. Every way this project sends gradients (the all-reduce in
another dtype, PowerSGD, local steps) replaces that method on the optimizer that applies the
update, through :func:`install_reducer`. Both methods are private, so their source is pinned
here: a Keras release that changes them fails at the first install with a message to read
the new code, never with gradients silently summed twice or not at all.
"""

import keras

from yolo3.distributed.keras_mwms import check_sources, sha256_of_sources

# SHA-256 of the installed source of the methods install_reducer relies on (Keras 3.15.1).
EXPECTED_SOURCE_SHA256 = {
    "TFOptimizer._all_reduce_sum_gradients": (
        "953512efa56c968002e3ddf9c13f593a893cad8770391ab6c7a1c001fde513b0"
    ),
    "TFOptimizer._backend_update_step": (
        "00bd759c099a6b72e88785836a38006d3d197c329b14bf6e75b77339460d3bc3"
    ),
}


def source_fingerprints():
    """SHA-256 of the installed source of each method in :data:`EXPECTED_SOURCE_SHA256`."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer  # noqa: PLC0415

    return sha256_of_sources(
        {
            "TFOptimizer._all_reduce_sum_gradients": TFOptimizer._all_reduce_sum_gradients,
            "TFOptimizer._backend_update_step": TFOptimizer._backend_update_step,
        }
    )


def check_compatible():
    """RuntimeError unless the installed Keras has the methods this module replaces as
    they were when it was written."""
    check_sources(
        source_fingerprints(),
        EXPECTED_SOURCE_SHA256,
        patched="how its optimizer reduces gradients across replicas "
        "(keras/src/backend/tensorflow/optimizer.py)",
        advice="yolo3.comm.reducer replaces _all_reduce_sum_gradients; port it and update "
        "EXPECTED_SOURCE_SHA256.",
    )


_checked = False


def install_reducer(optimizer, reduce, *, loss_scale_refusal=None):
    """Makes ``optimizer`` reduce its gradients with ``reduce`` (a function of the list of
    ``(gradient, variable)`` pairs returning the pairs to apply).

    A loss-scale optimizer applies the update through its inner optimizer, which gets
    ``reduce``; with ``loss_scale_refusal`` (a reduction that cannot run there) it is refused
    with that message instead. Returns ``optimizer``.
    """
    global _checked
    if not _checked:
        check_compatible()
        _checked = True
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if loss_scale_refusal:
            raise ValueError(loss_scale_refusal)
        target = optimizer.inner_optimizer
    else:
        target = optimizer
    target._all_reduce_sum_gradients = reduce
    return optimizer
