"""A few SGD steps of YoloTrainer in one layout; run as a script by test_accumulate.

    python tests/accumulate_step.py LAYOUT PROBLEM.npz RESULT.npz SETTINGS.json

LAYOUT is ``one`` (no strategy), ``replicas:N`` (MirroredStrategy on N logical CPUs) or
``worker:INDEX:PORT,PORT`` (worker INDEX of a MultiWorkerMirroredStrategy job on 127.0.0.1,
one replica each). SETTINGS: ``accumulate``, ``batch`` (images per replica and
micro-batch), ``steps``, ``allreduce_dtype``, ``frozen_bn`` (batch norm in inference mode),
``floatx``, ``total_replicas`` (of the widest layout compared) and optionally ``lr``.

Every layout reads the same images in the same order: micro-batch k of step s is the
``replicas x batch`` images from ``(s * accumulate + k) * replicas * batch`` on, and replica
r takes the r-th ``batch`` of them. So one device with ``batch x replicas`` per micro-batch
sees exactly what the replicas see together. The result holds the body's weights (moving
batch-norm statistics included) after the steps.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZE = 64
LEARNING_RATE = 0.01


def _strategy(layout):
    from yolo3.distributed import strategy as distribute

    kind, _, rest = layout.partition(":")
    if kind == "one":
        return tf.distribute.get_strategy(), 0
    if kind == "replicas":
        count = int(rest)
        distribute.configure_devices(gpus=0, cpu_replicas=count)
        return distribute.make_strategy(gpus=0, cpu_replicas=count), 0
    index, ports = rest.split(":")
    addresses = [f"127.0.0.1:{port}" for port in ports.split(",")]
    os.environ["TF_CONFIG"] = distribute.tf_config(addresses, int(index))
    distribute.configure_devices(gpus=0)
    return distribute.make_strategy(gpus=0), int(index)


def run(layout, problem, settings):
    import keras
    from helpers import SMALL_ANCHORS, initial_weights, make_head, micro_model

    from yolo3.comm.schemes import AllReduce
    from yolo3.engine.trainer import YoloTrainer

    strategy, worker = _strategy(layout)
    keras.backend.set_floatx(settings["floatx"])
    replicas = strategy.num_replicas_in_sync
    local = replicas // (2 if layout.startswith("worker") else 1)
    batch, accumulate, steps = settings["batch"], settings["accumulate"], settings["steps"]
    images, boxes = problem["images"], problem["boxes"]
    total_replicas = settings["total_replicas"]  # of the widest layout compared
    share = total_replicas // replicas  # chunks of `batch` this layout's replica takes

    def dataset_fn(context):
        del context
        chunks = []
        for micro in range(steps * accumulate):
            start = micro * total_replicas * batch
            for replica in range(worker * local, (worker + 1) * local):
                first = start + replica * share * batch
                chunks.append(np.arange(first, first + share * batch))
        order = np.concatenate(chunks)
        dataset = tf.data.Dataset.from_tensor_slices((images[order], boxes[order]))
        return dataset.batch(share * batch)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        body = micro_model(size=SIZE, synchronized_bn=replicas > 1)
        body.set_weights(initial_weights(problem))
        if settings["frozen_bn"]:
            for layer in body.layers:
                if "BatchNormalization" in type(layer).__name__:
                    layer.trainable = False
        trainer = YoloTrainer(
            body,
            head=make_head(SMALL_ANCHORS, 2),
            ignore_thresh=0.5,
            accumulate=accumulate,
            communication=AllReduce(settings["allreduce_dtype"]),
        )
        trainer.compile(
            optimizer=keras.optimizers.SGD(settings.get("lr", LEARNING_RATE)), jit_compile=False
        )
    # An epoch per step, so that the history holds each step's loss.
    history = trainer.fit(data, epochs=steps, steps_per_epoch=1, shuffle=False, verbose=0)
    return {
        **{f"weight_{i}": w for i, w in enumerate(body.get_weights())},
        "loss": np.asarray(history.history["loss"]),
        "iterations": int(trainer.optimizer.iterations.numpy()),
    }


def main(argv):
    layout, problem_path, result_path, settings_path = argv
    settings = json.loads(Path(settings_path).read_text())
    result = run(layout, np.load(problem_path), settings)
    np.savez(result_path, **result)


if __name__ == "__main__":
    from graph_rewrites import skip_graph_rewrites

    skip_graph_rewrites()  # every layout alike
    main(sys.argv[1:])
