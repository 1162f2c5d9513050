"""Two float16 loss-scaled steps on 2 logical CPU replicas; run as a script by a test.

    python tests/loss_scale_step.py keras|ours

A one-weight model, loss ``sum(prediction * y)``: the gradient of the kernel is the sum of
``x * y`` over the batch. Step 1 gives replica 1 ``y = inf`` (its gradient overflows, replica
0's does not); step 2 is finite everywhere. Prints the kernel and the loss scale after each
step as JSON.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import tensorflow as tf  # noqa: E402

from yolo3.distributed.strategy import configure_devices  # noqa: E402

configure_devices(gpus=0, cpu_replicas=2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from yolo3.engine.trainer import ReplicaSafeLossScaleOptimizer  # noqa: E402


def main():
    kind = sys.argv[1]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
        )
        inner = keras.optimizers.SGD(0.1)
        wrapper = (
            keras.optimizers.LossScaleOptimizer
            if kind == "keras"
            else ReplicaSafeLossScaleOptimizer
        )
        optimizer = wrapper(inner)
        model.compile(optimizer=optimizer, loss=lambda y, p: tf.reduce_sum(p * y))
    x = np.ones((2, 1), np.float32)
    after = []
    for y in ([[1.0], [np.inf]], [[1.0], [1.0]]):
        data = tf.data.Dataset.from_tensor_slices((x, np.array(y, np.float32))).batch(2)
        model.fit(data, epochs=1, verbose=0)
        after.append(
            {
                "kernel": float(model.get_weights()[0].ravel()[0]),
                "scale": float(optimizer.dynamic_scale.numpy()),
            }
        )
    print(json.dumps(after))


if __name__ == "__main__":
    main()
