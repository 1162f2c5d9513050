"""One SGD step of tiny-YOLOv3 on two logical CPU replicas, with and without --remat; run
by test_remat in a process of its own (TensorFlow lets a process run collectives for only
one device group, and the test session's other strategies use the same devices). Two
replicas are enough: the step's gradients are all-reduced and its statistics updated the
same way on any number.

    python tests/remat_replicas.py RESULT.npz

RESULT holds, for ``off`` and ``full``, the logged loss (``{remat}_loss``), the change of
every trainable weight (``{remat}_change_{i}``) and every moving statistic after the step
(``{remat}_statistic_{i}``); and ``sync_bn_error``, the message with which --remat refuses
synchronised batch norm on the replicas.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import tensorflow as tf  # noqa: E402

from yolo3.distributed.strategy import configure_devices  # noqa: E402

REPLICAS = 2
configure_devices(gpus=0, cpu_replicas=REPLICAS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from helpers import SMALL_ANCHORS, make_head, random_boxes, tiny_model  # noqa: E402

from yolo3.engine.trainer import YoloTrainer  # noqa: E402

SIZE, NUM_CLASSES = 64, 2


def one_step(strategy, remat, images, boxes):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        body = tiny_model(NUM_CLASSES, SIZE)
        trainer = YoloTrainer(body, head=make_head(SMALL_ANCHORS, NUM_CLASSES), remat=remat)
        trainer.compile(optimizer=keras.optimizers.SGD(1.0))
    before = [v.numpy() for v in body.trainable_variables]
    dataset = tf.data.Dataset.from_tensors((images, boxes))
    history = trainer.fit(dataset, epochs=1, verbose=0, shuffle=False).history
    result = {f"{remat}_loss": history["loss"][0]}
    for index, (variable, old) in enumerate(zip(body.trainable_variables, before)):
        result[f"{remat}_change_{index}"] = variable.numpy() - old
    for index, variable in enumerate(body.non_trainable_variables):
        result[f"{remat}_statistic_{index}"] = variable.numpy()
    return result


def main(result_path):
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (8, SIZE, SIZE, 3), dtype=np.uint8)
    boxes = random_boxes(rng, 8, 4, SIZE, NUM_CLASSES)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    result = {}
    for remat in ("off", "full"):
        result |= one_step(strategy, remat, images, boxes)
    with strategy.scope():
        body = tiny_model(NUM_CLASSES, SIZE, synchronized_bn=True)
        try:
            YoloTrainer(body, head=make_head(SMALL_ANCHORS, NUM_CLASSES), remat="full")
            result["sync_bn_error"] = ""
        except ValueError as err:
            result["sync_bn_error"] = str(err)
    np.savez(result_path, **result)


if __name__ == "__main__":
    main(sys.argv[1])
