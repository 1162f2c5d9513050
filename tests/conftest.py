"""Test session setup: four logical CPU devices, so multi-replica code runs without GPUs.

Logical devices can only be configured before TensorFlow initialises its runtime, which is
why this happens at import time of the test session, before any test module builds a model.

XLA compiles with LLVM's optimisations off (``--xla_backend_optimization_level=0``), in this
process and in every process a test starts: the tests check that steps compile and compute
the right numbers, not how fast the machine code runs, and the optimisations took about 40%
of an XLA test's time (tests/test_xla.py's train.py run: 24 s with them, 15 s without). XLA's
own graph passes, which decide what is computed, run either way.
"""

import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# One thread per operation, here and in every process a test starts: the two test processes
# already keep both cores busy, and the tests that start several TensorFlow processes start
# up to eight on two cores, where a thread per core in each cost CPU time and did no more work
# (tests/test_eight_workers.py alone: 182 s, 190 s of CPU, with one thread; 216 s, 229 s
# with TensorFlow's default of one per core).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# TensorFlow's environment as every tool sets it (oneDNN's kernels on x86-64), so that the
# tests compute with the kernels the tools use on every CPU.
from yolo3.cli import tensorflow_environment  # noqa: E402

tensorflow_environment()

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from graph_rewrites import skip_graph_rewrites  # noqa: E402

NUM_LOGICAL_CPUS = 4

_cpu = tf.config.list_physical_devices("CPU")[0]
# Grappler's rewrites off in this process: its tests compare runs with each other
# (tests/graph_rewrites.py says why and which runs keep them).
skip_graph_rewrites()
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)


@pytest.fixture(scope="session")
def four_replicas():
    """The MirroredStrategy over the four logical CPUs of every in-process test.

    Collectives of a second strategy over the same devices in one process fail, so the tests
    share the one the library keeps for these devices (``make_strategy``'s).
    """
    from yolo3.distributed.strategy import make_strategy

    return make_strategy(gpus=0, cpu_replicas=NUM_LOGICAL_CPUS)


@pytest.fixture(scope="session")
def strategy(four_replicas):
    """:func:`four_replicas` under the name the in-process multi-replica tests give it."""
    return four_replicas


# The tests that start eight TensorFlow processes (about 0.8 GB each) run first, while the
# test processes beside them are fresh: a test process that has run many in-process tests
# holds several GB (8.4 GB in one run), and with the eight processes beside it the kernel
# ended it for want of memory on a 24 GiB machine. ``--dist loadfile`` hands files to the
# test processes in the order collected once pytest-xdist's own reordering (the files with
# most tests first) is off. After the first files come the files with most ``slow`` tests,
# then the files with most tests: a file of one long test handed out last keeps one test
# process busy for minutes while the other idles (the ten kills and the learning test ran
# last on one process, one after the other, for about 5.5 minutes in one run); quick files
# at the end even the two out.
FIRST = ("test_eight_workers.py",)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    tests_in_file = collections.Counter(item.path for item in items)
    slow_in_file = collections.Counter(
        item.path for item in items if item.get_closest_marker("slow") is not None
    )
    items.sort(
        key=lambda item: (
            item.path.name not in FIRST,
            -slow_in_file[item.path],
            -tests_in_file[item.path],
        )
    )
