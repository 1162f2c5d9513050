"""One SGD step of tiny-YOLOv3 on N logical CPU replicas; run as a script by test_sharding.

TensorFlow lets a process run collectives for only one device group, so each replica count
gets a process of its own.

    python tests/sharding_step.py REPLICAS PROBLEM.npz RESULT.npz

REPLICAS 0 means no strategy (one device). The result holds the trainable weights after a
step with the per-image loss (``per_image_*``) and with a local-mean scalar (``local_mean_*``).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZE = 64
LEARNING_RATE = 0.01


def run(replicas, images, boxes, initial):
    from helpers import SMALL_ANCHORS, tiny_model

    from yolo3.loss import replica_loss, yolo_loss
    from yolo3.targets import build_targets

    if replicas:
        devices = [f"/cpu:{i}" for i in range(replicas)]
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        strategy = tf.distribute.get_strategy()
    global_batch = len(images)
    dataset = tf.data.Dataset.from_tensor_slices((images, boxes)).batch(global_batch)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    results = {}
    for per_image in (True, False):
        with strategy.scope():
            model = tiny_model(size=SIZE)
            model.set_weights(initial)
            optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
            optimizer.build(model.trainable_variables)

        def replica_step(images, boxes, model=model, optimizer=optimizer, per_image=per_image):
            targets = build_targets(
                boxes, input_hw=(SIZE, SIZE), anchors=SMALL_ANCHORS, num_classes=2
            )
            with tf.GradientTape() as tape:
                # Moving batch-norm statistics: the comparison isolates the loss reduction.
                outputs = model(images, training=False)
                total, _ = yolo_loss(targets, outputs, anchors=SMALL_ANCHORS, num_classes=2)
                # The original's scalar is a mean over the local batch only.
                loss = replica_loss(total, global_batch) if per_image else tf.reduce_mean(total)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        tf.function(lambda b, step=replica_step: strategy.run(step, args=b))(batch)
        name = "per_image" if per_image else "local_mean"
        for index, variable in enumerate(model.trainable_variables):
            results[f"{name}_{index}"] = variable.numpy()
    return results


def main():
    replicas, problem_path, result_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if replicas:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
        )
    problem = np.load(problem_path)
    initial = [problem[f"initial_{i}"] for i in range(int(problem["num_weights"]))]
    np.savez(result_path, **run(replicas, problem["images"], problem["boxes"], initial))


if __name__ == "__main__":
    main()
