"""glibc's malloc thresholds: TensorFlow's multi-device input iterator pins them, the trainer
sets them back before each step (yolo3.distributed.malloc).

A pinned threshold means that a block above 128 KiB which no free chunk of the heap can
hold is a fresh mapping of its own, faulted in and unmapped again every time it is asked
for. tests/malloc_steps.py trains a few steps on two replicas in a fresh process and reads
glibc's count of mapped blocks (``mallinfo2``) while it holds a 24 MiB block.
"""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from yolo3.distributed import malloc

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt's thresholds and mallinfo2 are glibc's; this C library has other ones",
)

SCRIPT = Path(__file__).with_name("malloc_steps.py")


def _steps(mode):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_glibc_takes_the_thresholds():
    assert malloc.restore_thresholds()


@pytest.mark.slow
def test_the_trainer_restores_what_the_input_iterator_pinned_before_every_step():
    kept = _steps("keep")
    # TensorFlow 2.21: once fit has made its iterator over the replicas, every such block is
    # a mapping of its own, and stays so step after step. Should this fail after a
    # TensorFlow upgrade, the pin may be gone, and yolo3.distributed.malloc with it.
    assert kept == {"before_first": 3, "after": [3, 3, 3]}
    restored = _steps("restore")
    assert restored == {"before_first": 3, "after": [0, 0, 0]}
