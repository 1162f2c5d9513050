"""Training-mode SGD steps of the micro model (``helpers.micro_model``: three batch norms, at
three scales) on N logical CPU replicas; run by test_sync_bn.

TensorFlow lets a process run collectives for only one device group, so each replica count
gets a process of its own.

    python tests/sync_bn_step.py REPLICAS PROBLEM.npz RESULT.npz RUN [RUN ...]

REPLICAS 0 means no strategy (one device). PROBLEM holds the starting weights
``initial_{i}`` and global batches ``images`` (steps, global_batch, 64, 64, 3) in [0, 1] and
``boxes`` (steps, global_batch, max_boxes, 5). Each RUN is ``FLOATX:STEPS:BATCH_NORM``: the
Keras float type (``float32`` or ``float64``), how many of the batches to take one SGD step
on, and ``sync`` (``SyncBatchNormalization``) or ``keras`` (Keras's
``BatchNormalization(synchronized=True)``, for comparison). RESULT holds, per RUN with its
``:`` written ``_``, every weight after the first and after the last step
(``{run}_step_{k}_weight_{i}`` in ``model.weights`` order, moving statistics included) and
``{run}_replica_spread``: the largest difference between the copies of one variable on
different replicas at the end.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from graph_rewrites import skip_graph_rewrites  # noqa: E402

SIZE = 64
LEARNING_RATE = 0.01


def _build_model(batch_norm):
    from helpers import micro_model

    if batch_norm == "sync":
        return micro_model(size=SIZE, synchronized_bn=True)
    model = micro_model(size=SIZE, synchronized_bn=False)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            # Read at call time by BatchNormalization._moments: Keras's one-pass sync moments.
            layer.synchronized = True
    return model


def _replica_spread(model):
    spread = 0.0
    for weight in model.weights:
        copies = [np.asarray(c) for c in getattr(weight.value, "values", [weight.value])]
        spread = max([spread] + [float(np.max(np.abs(c - copies[0]))) for c in copies])
    return spread


def run(strategy, images, boxes, initial, batch_norm):
    """SGD steps on ``images`` (steps, global_batch, SIZE, SIZE, 3).

    Returns the model and ``{step: [weights as arrays]}`` after the first and the last step.
    """
    from helpers import SMALL_ANCHORS, make_head

    from yolo3.model.loss import replica_loss, yolo_loss
    from yolo3.model.targets import build_targets

    global_batch = images.shape[1]
    with strategy.scope():
        model = _build_model(batch_norm)
        model.set_weights(initial)
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        optimizer.build(model.trainable_variables)

    def replica_step(images, boxes):
        targets = build_targets(boxes, input_hw=(SIZE, SIZE), head=make_head(SMALL_ANCHORS, 2))
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            total, _ = yolo_loss(targets, outputs, head=make_head(SMALL_ANCHORS, 2))
            loss = replica_loss(total, global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
    dataset = tf.data.Dataset.from_tensor_slices((images, boxes)).unbatch().batch(global_batch)
    snapshots = {}
    for number, batch in enumerate(strategy.experimental_distribute_dataset(dataset), 1):
        step(batch)
        if number in (1, len(images)):
            snapshots[number] = [weight.numpy() for weight in model.weights]
    return model, snapshots


def main():
    replicas, problem_path, result_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if replicas:
        from yolo3.distributed.strategy import configure_devices

        configure_devices(gpus=0, cpu_replicas=replicas)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    else:
        strategy = tf.distribute.get_strategy()
    skip_graph_rewrites()  # both processes alike
    from helpers import initial_weights

    problem = np.load(problem_path)
    initial = initial_weights(problem)
    results = {}
    for spec in sys.argv[4:]:
        floatx, steps, batch_norm = spec.split(":")
        if floatx not in ("float32", "float64") or batch_norm not in ("sync", "keras"):
            raise SystemExit(f"RUN is FLOATX:STEPS:BATCH_NORM, got {spec!r}")
        # Layers take their dtype from the global policy, which does not follow floatx.
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(floatx)
        images = problem["images"][: int(steps)].astype(floatx)
        model, snapshots = run(
            strategy, images, problem["boxes"][: int(steps)], initial, batch_norm
        )
        name = spec.replace(":", "_")
        for number, weights in snapshots.items():
            for index, weight in enumerate(weights):
                results[f"{name}_step_{number}_weight_{index}"] = weight
        results[f"{name}_replica_spread"] = np.float64(_replica_spread(model))
    np.savez(result_path, **results)


if __name__ == "__main__":
    main()
