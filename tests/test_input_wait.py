"""The input wait the trainer logs: the time a step waited for its batch, and nothing else.

Two workers with fast input read a small wait too: tests/test_train_distributed.py (the
multi-scale run).
"""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, make_head, micro_model, random_boxes

from yolo3.callbacks import Throughput
from yolo3.data.multiscale import ScaleSchedule
from yolo3.engine.trainer import YoloTrainer

SIZE, BATCH, STEPS = 64, 4, 6


def _batches(replicas):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (BATCH * replicas, SIZE, SIZE, 3), dtype=np.uint8)
    boxes = random_boxes(rng, BATCH * replicas, 6, SIZE, 2).astype(np.float32)
    return tf.data.Dataset.from_tensors((images, boxes)).repeat()


def _fit(dataset, strategy=None, **options):
    """``(input_wait_fraction, trainer)`` of a one-epoch fit on ``dataset``."""
    keras.utils.set_random_seed(0)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        body = micro_model(2, None if options.get("multi_scale") else SIZE)
        trainer = YoloTrainer(body, head=make_head(SMALL_ANCHORS, 2), **options)
        trainer.compile(optimizer=keras.optimizers.SGD(0.01))
    trainer.measure_input_wait()
    throughput = Throughput(BATCH * strategy.num_replicas_in_sync * trainer.accumulate)
    trainer.fit(
        dataset, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=[throughput], shuffle=False
    )
    return throughput.history[0]["input_wait_fraction"], trainer


def _sleep(seconds):
    def slow(images, boxes):
        pause = tf.numpy_function(lambda: np.float32(time.sleep(seconds) or 0), [], tf.float32)
        with tf.control_dependencies([pause]):
            return tf.identity(images), boxes

    return slow


# One device taking two micro-batches a step, and four replicas taking one each.
@pytest.mark.parametrize("replicas, accumulate", [(1, 2), (4, 1)])
def test_a_slow_input_pipeline_reads_as_input_wait(request, replicas, accumulate):
    strategy = request.getfixturevalue("four_replicas") if replicas > 1 else None
    # A batch takes 0.4 s to make, a step on 4 images of 64 px per replica about 20 ms
    # alone and a few times that beside a busy suite: most of each step waits for input,
    # with or without prefetching.
    dataset = _batches(replicas).map(_sleep(0.4))
    wait, _ = _fit(dataset, strategy, accumulate=accumulate)
    assert wait > 0.5


def test_tracing_a_new_multi_scale_size_is_not_input_wait():
    schedule = ScaleSchedule((32, 64), seed=1, total_steps=STEPS, period=2)
    wait, trainer = _fit(_batches(1), multi_scale=schedule)
    # Step 2 (after the first, left out of the figures) traces the step for 64 px: seconds
    # of Python before the call, which a wait timed from the host counts (1.0 measured).
    assert trainer.scale_history == [32, 32, 64, 64, 64, 64]
    assert wait < 0.05
