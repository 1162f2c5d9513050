"""One SGD step of YoloTrainer on N logical CPU replicas; run as a script by test_sharding.

TensorFlow lets a process run collectives for only one device group, so each replica count
gets a process of its own.

    python tests/sharding_step.py REPLICAS PROBLEM.npz RESULT.npz

REPLICAS 0 means no strategy (one device). The step is the trainer's own, run by
``model.fit`` as ``train.py`` runs it: batch norm in training mode, synchronised across
replicas when there are several (as ``train.py`` does by default). The result holds the
trainable weights after the step with the trainer's loss reduction (``per_image_*``) and
with the original's scalar mean over the local batch (``local_mean_*``). The network runs in
float64, so that the layouts differ by rounding only.
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
    import keras
    from helpers import SMALL_ANCHORS, make_head, micro_model

    from yolo3.engine.trainer import YoloTrainer

    class LocalMeanTrainer(YoloTrainer):
        """The original's reduction: each replica differentiates its local batch mean."""

        def replica_loss(self, per_image):
            return tf.reduce_mean(per_image)

    # A float64 network: in float32 a rounding difference between layouts can move an
    # activation across LeakyReLU's kink and reroute a gradient (see test_train_distributed).
    keras.backend.set_floatx("float64")
    if replicas:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    else:
        strategy = tf.distribute.get_strategy()
    dataset = tf.data.Dataset.from_tensor_slices((images, boxes)).batch(len(images))
    results = {}
    for name, trainer_class in (("per_image", YoloTrainer), ("local_mean", LocalMeanTrainer)):
        with strategy.scope():
            body = micro_model(size=SIZE, synchronized_bn=replicas > 1)
            body.set_weights(initial)
            trainer = trainer_class(body, head=make_head(SMALL_ANCHORS, 2))
            trainer.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), jit_compile=False)
        trainer.fit(dataset, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
        for index, variable in enumerate(body.trainable_variables):
            results[f"{name}_{index}"] = variable.numpy()
    return results


def main():
    replicas, problem_path, result_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if replicas:
        from yolo3.distributed.strategy import configure_devices

        configure_devices(gpus=0, cpu_replicas=replicas)
    from graph_rewrites import skip_graph_rewrites

    skip_graph_rewrites()  # every layout alike
    from helpers import initial_weights

    problem = np.load(problem_path)
    initial = initial_weights(problem)
    np.savez(result_path, **run(replicas, problem["images"], problem["boxes"], initial))


if __name__ == "__main__":
    main()
