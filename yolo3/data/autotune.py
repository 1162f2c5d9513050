"""tf.data's autotuning model, off in every pipeline the trainer iterates.

In TensorFlow 2.21 the model's thread, started by an iterator's first ``next``, wakes up at
a period that doubles (up to a minute), and once an iterator has run about 20 s, deleting
it waits for the thread's next wake-up instead of cancelling it: an iterator of the record
pipeline deleted after 25 s of use took 16 s to delete, after 30 s 11 s (both waited for
the wake-up at 41 s), after 17 s no time. Keras deletes the train and validation iterators
when ``fit`` returns, so a run ended up to a minute after its last step, and in a
multi-worker job the chief, exiting first, left the workers still waiting there to time
out against its closed port.

Without the model, ``tf.data.AUTOTUNE`` still means something: a parallel map or
interleave runs as many calls at once as :func:`untuned_options` says, one per CPU core
this process may use (tf.data's own default is 16 at most), and ``prefetch`` grows its
buffer whenever its consumer finds it empty. The record pipeline ran as fast, within the
noise of two runs a side (``python tools/benchmark.py io``; Benchmarks page).

Two places take the options: :func:`untuned_options`, for the datasets this package
builds (the training pipeline, the synthetic batches, and
:func:`yolo3.data.records.read_shard`, through which evaluation and the record checks read
a shard), and :func:`untune_device_datasets`, for the per-device datasets through which
``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` hand each replica its batch:
``tf.distribute`` builds those itself, with default options (the options of the dataset it
distributes do not reach them), and they too would start the thread. Each is only a buffer
of one batch, which the model has nothing to tune in.
"""

import functools

import tensorflow as tf

from yolo3.distributed.devices import available_cores


def untuned_options():
    """``tf.data.Options`` with the autotuning model off and ``AUTOTUNE`` parallelism at
    one call per usable core, to merge into a dataset's own."""
    options = tf.data.Options()
    options.autotune.enabled = False
    options.autotune.initial_parallelism = available_cores()
    return options


def untune_device_datasets():
    """Makes ``tf.distribute``'s multi-device iterators build their per-device datasets
    with the autotuning model off (``multi_device_iterator_ops._create_device_dataset``,
    the one function that builds them, wrapped once per process). A TensorFlow without that
    module or function is left as it is: its runs then only end later (tests/test_data.py fails)."""
    try:
        from tensorflow.python.data.ops import multi_device_iterator_ops  # noqa: PLC0415
    except ImportError:
        return
    original = getattr(multi_device_iterator_ops, "_create_device_dataset", None)
    if original is None or getattr(original, "untuned", False):
        return

    @functools.wraps(original)
    def create_untuned(*args, **kwargs):
        return original(*args, **kwargs).with_options(untuned_options())

    create_untuned.untuned = True
    multi_device_iterator_ops._create_device_dataset = create_untuned
