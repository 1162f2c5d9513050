"""A few train steps of tiny-YOLOv3 on two logical CPU replicas, counting how glibc serves a
24 MiB block before the first step and after each; run by test_malloc in a fresh process
(whatever earlier tests freed would change where such a block comes from).

    python tests/malloc_steps.py restore|keep

``keep`` turns the trainer's restoring off. Prints a JSON object: ``before_first``, how many
of three such blocks were mappings of their own once fit had made its input iterator, and
``after``, the same after each step.
"""

import ctypes
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from yolo3.distributed.strategy import configure_devices  # noqa: E402

configure_devices(gpus=0, cpu_replicas=2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers import SMALL_ANCHORS, make_head, random_boxes, tiny_model  # noqa: E402

from yolo3.distributed import malloc  # noqa: E402
from yolo3.engine.trainer import YoloTrainer  # noqa: E402

BLOCK = 24 << 20  # below glibc's adaptive ceiling of 32 MiB
SIZE, BATCH, STEPS = 64, 8, 3


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def mapped_blocks():
    """How many of three BLOCK-sized allocations in a row were mappings of their own."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    mapped = 0
    for _ in range(3):
        before = libc.mallinfo2().hblks
        block = libc.malloc(BLOCK)
        mapped += libc.mallinfo2().hblks - before
        libc.free(block)
    return mapped


class MappedBlocks(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.before_first = None
        self.after = []

    def on_train_batch_begin(self, batch, logs=None):
        if self.before_first is None:
            self.before_first = mapped_blocks()

    def on_train_batch_end(self, batch, logs=None):
        self.after.append(mapped_blocks())


def main(mode):
    if mode == "keep":
        malloc.restore_thresholds = lambda: False
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (BATCH * STEPS, SIZE, SIZE, 3)).astype(np.float32)
    boxes = random_boxes(rng, BATCH * STEPS, 4, SIZE, 2)
    with strategy.scope():
        trainer = YoloTrainer(tiny_model(size=SIZE), head=make_head(SMALL_ANCHORS, 2))
        trainer.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=False)
    blocks = MappedBlocks()
    trainer.fit(images, boxes, batch_size=BATCH, epochs=1, callbacks=[blocks], verbose=0)
    print(json.dumps({"before_first": blocks.before_first, "after": blocks.after}))


if __name__ == "__main__":
    main(sys.argv[1])
