"""glibc's malloc thresholds, which TensorFlow's multi-device input iterator pins.

glibc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with a fresh ``mmap`` and
hands it back with ``munmap`` when it is freed, so its pages are faulted in and zeroed
again the next time. The threshold starts at 128 KiB and adapts: whenever such a block is
freed, the threshold grows to its size (up to 32 MiB on 64-bit) and the heap's trim
threshold to twice that, so the buffers a program frees and asks for again, step after
step, soon come from the heap.

TensorFlow 2.21's ``GeneratorDataset`` kernel sets ``M_MMAP_THRESHOLD`` to 128 KiB when it
is built, which also turns the adaptation off for the whole process, and ``tf.distribute``
builds one for every input iterator of a ``MirroredStrategy`` or
``MultiWorkerMirroredStrategy`` (its multi-device iterator). From then on each activation
and gradient buffer above 128 KiB is mapped, faulted in and unmapped again in every step.
In a two-worker job of tiny-YOLOv3 at 128 px on one core each, the kernel's page-fault
work took 8.7% of each worker's compute thread, against 0.8% in a process without a
strategy (``perf`` samples over the same steps), and restoring the thresholds made the
workers' steps 5% shorter.

:func:`restore_thresholds` sets the thresholds where glibc's adaptation ends, 32 MiB and
64 MiB; :class:`yolo3.engine.trainer.YoloTrainer` calls it before each train and test step when it
trains under a strategy, so that an iterator built at any time (validation included)
cannot leave the pinned setting behind.
"""

import ctypes
import functools
import platform

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# glibc's ceiling for its adaptive mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX),
# and the trim threshold its adaptation pairs with it.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


@functools.cache
def _glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def restore_thresholds():
    """Sets glibc's mmap and trim thresholds to the values its adaptation ends at.

    Returns:
        True when both were set; False where the C library is not glibc, or refused them.
    """
    libc = _glibc()
    if libc is None:
        return False
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(mapped and trimmed)
