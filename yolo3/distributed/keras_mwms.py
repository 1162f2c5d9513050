"""Make ``model.fit`` and ``model.evaluate`` work under ``MultiWorkerMirroredStrategy``.

What is broken upstream (Keras 3.15.1, TensorFlow backend; keras-team/keras#20585,
ray-project/ray#47464, tensorflow/tensorflow#72388). With more than one worker, ``fit`` and
``evaluate`` fail before the first step, in two places of ``keras/src/backend/tensorflow/
trainer.py``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` takes the first distributed batch and calls
   ``strategy.reduce("MEAN", batch, axis=None)`` on the whole ``(x, y)`` tuple, only to learn
   its shapes and dtypes. ``MirroredStrategy`` reduces a nest element by element; the
   multi-worker strategy hands the tuple whole to its collective ops, which raise
   ``ValueError: Attempt to convert a value (PerReplica:{...}) ... to a Tensor``. (Were it
   reduced, that would be a pointless cross-worker all-reduce of the input batch.)
2. ``reduce_per_replica`` reduces the logs returned by each step. In multi-worker mode it
   takes its own branch and calls ``strategy.reduce("MEAN", value, axis=0)``; the logs are
   scalars (per-replica metric results), which have no axis 0, so tracing the train function
   fails.

What :func:`apply` changes, only when the model's strategy is a ``MultiWorkerMirroredStrategy``
in multi-worker mode (every other strategy goes through the untouched upstream code):

1. ``_maybe_symbolic_build`` builds from the first local replica's slice of the first batch,
   which has the shapes and dtypes the build needs and involves no collective. It also refuses
   input that is not a ``tf.data.Dataset``, the only input tested this way: a ``PyDataset``
   feeds the workers wrong batches from the second epoch on.
2. ``reduce_per_replica`` with ``"auto"`` / ``"mean"`` all-reduces each log over the replicas
   of every worker with ``axis=None``: the mean of the per-replica results, which is what the
   single-machine branch (``tf.reduce_mean`` over the local replicas) computes, and the global
   value when replicas get equal batches. Every worker logs the same value. Epoch logs come
   from ``Model.get_metrics_result``, which reads the metrics' ``ON_READ`` variables and so
   sums totals and counts over all workers: they are the global values.

The data pipeline stays the caller's job: shard it (``AutoShardPolicy.DATA`` or explicitly)
and give every worker the same number of steps per epoch, or collectives wait forever.
``predict`` is not patched (upstream has a multi-worker branch for it).

:func:`apply` patches only Keras versions listed in ``TESTED_KERAS_VERSIONS`` and only when
the patched functions are byte-for-byte the ones it was written against (a SHA-256 of their
source). Setting ``YOLO3_KERAS_MWMS_UNTESTED=1`` skips the version check, never the source
check: a release that did not touch these functions (e.g. a patch release) can then be run
without editing this file, and a release that changed them still fails here instead of
training on a wrong assumption.
"""

import functools
import hashlib
import inspect
import os

import keras

TESTED_KERAS_VERSIONS = ("3.15.1",)
UNTESTED_OVERRIDE_ENV = "YOLO3_KERAS_MWMS_UNTESTED"

# SHA-256 of the source of every upstream function this module replaces or relies on, as
# shipped in the versions above. `_make_function` must keep calling `reduce_per_replica`
# through the module's globals for the replacement to take effect.
EXPECTED_SOURCE_SHA256 = {
    "TensorFlowTrainer._maybe_symbolic_build": (
        "92a504f5eba9b29f81f1bf26180bdd5bf5186b06b7bda426534b90d2d02bc1c2"
    ),
    "TensorFlowTrainer._make_function": (
        "bb33b7a0da3d27406c70fac54b8e9617156ef225f452b93f6addf8cc34aca0d0"
    ),
    "reduce_per_replica": "2e7d54b1e6edc29a8c6a7e6b66cd4c8be3ba7842412c93753ac3afe169fa7fb8",
    "_collective_all_reduce_multi_worker": (
        "0302369d850e6694978fa7691c0e97b79cd0cf83a6bbef7caed8738e1f1a5c24"
    ),
}

_PATCHED_MARK = "_yolo3_keras_mwms_original"


def _trainer_module():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _upstream_functions(trainer):
    return {
        "TensorFlowTrainer._maybe_symbolic_build": _unpatched(
            trainer.TensorFlowTrainer._maybe_symbolic_build
        ),
        "TensorFlowTrainer._make_function": trainer.TensorFlowTrainer._make_function,
        "reduce_per_replica": _unpatched(trainer.reduce_per_replica),
        "_collective_all_reduce_multi_worker": trainer._collective_all_reduce_multi_worker,
    }


def _unpatched(function):
    return getattr(function, _PATCHED_MARK, function)


def source_fingerprints():
    """SHA-256 of the installed source of each function in ``EXPECTED_SOURCE_SHA256``."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"keras_mwms patches the TensorFlow backend; KERAS_BACKEND is "
            f"{keras.backend.backend()!r}"
        )
    return sha256_of_sources(_upstream_functions(_trainer_module()))


def sha256_of_sources(functions):
    """``{name: SHA-256 of the installed source}`` of ``{name: function}``: how the project
    pins the Keras internals it patches (here and in :mod:`yolo3.comm.reducer`)."""
    return {
        name: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
        for name, function in functions.items()
    }


def check_sources(fingerprints, expected, *, patched, advice):
    """Raises ``RuntimeError`` naming each function whose installed source is not the one
    ``expected`` records: ``patched`` says what the project replaces, ``advice`` what to do."""
    changed = [
        f"{name}: expected {expected[name][:12]}..., found {digest[:12]}..."
        for name, digest in fingerprints.items()
        if digest != expected[name]
    ]
    if changed:
        raise RuntimeError(
            f"Keras {keras.__version__} changed {patched}: "
            + "; ".join(changed)
            + f". Read the new code: {advice}"
        )


def check_compatible():
    """Raises ``RuntimeError`` unless Keras is a tested version (or the override is set) and
    the patched functions' sources match ``EXPECTED_SOURCE_SHA256``."""
    if keras.__version__ not in TESTED_KERAS_VERSIONS and os.environ.get(
        UNTESTED_OVERRIDE_ENV
    ) not in ("1", "true", "True"):
        raise RuntimeError(
            f"yolo3.distributed.keras_mwms was tested with Keras "
            f"{', '.join(TESTED_KERAS_VERSIONS)}; "
            f"Keras {keras.__version__} is installed. Check whether keras-team/keras#20585 is "
            "fixed there (then drop this patch), else run tests/test_distribute.py against "
            f"it and add the version to TESTED_KERAS_VERSIONS. {UNTESTED_OVERRIDE_ENV}=1 "
            "skips this check but not the source fingerprint check."
        )
    check_sources(
        source_fingerprints(),
        EXPECTED_SOURCE_SHA256,
        patched="the code yolo3.distributed.keras_mwms patches in "
        "keras/src/backend/tensorflow/trainer.py",
        advice="if MultiWorkerMirroredStrategy works without the patch, drop it; else port the "
        "patch and update EXPECTED_SOURCE_SHA256.",
    )


def is_applied():
    """Whether :func:`apply` has patched Keras in this process."""
    trainer = _trainer_module()
    return hasattr(trainer.reduce_per_replica, _PATCHED_MARK)


def apply():
    """Patches Keras so that ``fit``/``evaluate`` run under ``MultiWorkerMirroredStrategy``.

    Idempotent. Call it before ``fit`` in every worker process; it changes nothing for other
    strategies. Raises ``RuntimeError`` if the installed Keras is untested or its code changed.
    """
    if is_applied():
        return
    check_compatible()
    trainer = _trainer_module()
    original_build = trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = trainer.reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = _patched_symbolic_build(
        trainer, original_build
    )
    trainer.reduce_per_replica = _patched_reduce_per_replica(trainer, original_reduce)


def _patched_symbolic_build(trainer, original):
    import tensorflow as tf
    from keras.src import tree
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    def first_local_replica(value, strategy):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        multi_worker = strategy is not None and trainer._collective_all_reduce_multi_worker(
            strategy
        )
        if iterator is None or not multi_worker:
            return original(self, iterator=iterator, data_batch=data_batch)
        if not isinstance(iterator.data_adapter, TFDatasetAdapter):
            raise ValueError(
                "Under MultiWorkerMirroredStrategy, pass a tf.data.Dataset to fit/evaluate; "
                f"got data served by {type(iterator.data_adapter).__name__}, which yolo3."
                "keras_mwms does not support (a PyDataset feeds the workers wrong batches "
                "from the second epoch on)."
            )
        for _, _, batches in iterator:
            batch = next(batches)
            break
        # Only shapes and dtypes matter here; one replica's slice has them, no collective.
        batch = tree.map_structure(lambda value: first_local_replica(value, strategy), batch)
        return original(self, data_batch=batch)

    setattr(_maybe_symbolic_build, _PATCHED_MARK, original)
    return _maybe_symbolic_build


def _patched_reduce_per_replica(trainer, original):

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return _mean_over_replicas(values, strategy)
        return original(values, strategy, reduction)

    setattr(reduce_per_replica, _PATCHED_MARK, original)
    return reduce_per_replica


def _mean_over_replicas(values, strategy):
    """The mean over every replica of each log, in one collective per dtype.

    The logs are scalars. Reduced one by one, each costs a collective (a round trip between
    the workers and CPU time on each) per step; stacked, all logs of a dtype travel in one.
    """
    import tensorflow as tf
    from keras.src import tree
    from tensorflow.python.distribute import values as distributed_values

    flat = tree.flatten(values)
    groups = {}
    for index, value in enumerate(flat):
        dtype = strategy.experimental_local_results(value)[0].dtype
        groups.setdefault(dtype, []).append(index)
    reduced = [None] * len(flat)
    for indices in groups.values():
        if isinstance(flat[indices[0]], tf.distribute.DistributedValues):
            local = [strategy.experimental_local_results(flat[i]) for i in indices]
            stacks = []
            for replica in range(len(local[0])):
                with tf.device(local[0][replica].device):
                    stacks.append(tf.stack([results[replica] for results in local]))
            stacked = distributed_values.PerReplica(tuple(stacks))
        else:  # one replica per worker: plain tensors
            stacked = tf.stack([flat[i] for i in indices])
        # axis=None: averaged across replicas only; the logs have no batch axis.
        mean = strategy.reduce("MEAN", stacked, axis=None)
        for position, index in enumerate(indices):
            reduced[index] = mean[position]
    return tree.pack_sequence_as(values, reduced)
