"""Training runs in a process of their own, started by test_distribute; also the model and
data that these runs and the test's one-process reference share.

    python tests/mwms_worker.py train PROBLEM.npz RESULT.npz INDEX PORTS
    python tests/mwms_worker.py unpatched PROBLEM.npz RESULT.json INDEX PORTS
    python tests/mwms_worker.py mirrored PROBLEM.npz RESULT.npz REPLICAS

``train`` is worker INDEX of a MultiWorkerMirroredStrategy job on 127.0.0.1 (PORTS: one port
per worker, comma-separated). It builds the strategy with
``yolo3.distributed.strategy.make_strategy`` (which applies ``yolo3.distributed.keras_mwms``), fits
two epochs, evaluates and saves through ``chief_only_path``. ``unpatched`` records how plain Keras
fails under the same strategy. ``mirrored`` fits on REPLICAS logical CPUs with the patch applied,
which must not change that path. TensorFlow lets a process join one collective group only, hence a
process per run.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

GLOBAL_BATCH = 8
EPOCHS = 2
LEARNING_RATE = 0.05


def build_model():
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def per_sample_loss(y_true, y_pred):
    """(N, 1) squared errors; Keras averages them over the global batch."""
    return keras.ops.square(y_true - y_pred)


def compile_model(model):
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss=per_sample_loss)


def make_dataset(problem):
    """Global batches of ``GLOBAL_BATCH``, in order.

    Under MultiWorkerMirroredStrategy the DATA policy splits each global batch into per-replica
    batches and hands worker k every k-th of them, so one step of the two workers together sees
    exactly the global batch a single process sees.
    """
    dataset = tf.data.Dataset.from_tensor_slices((problem["images"], problem["targets"]))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.batch(GLOBAL_BATCH).with_options(options)


class BatchLosses(keras.callbacks.Callback):
    """The running loss each training step logs (reduced across replicas by Keras)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def train(problem):
    """Fits ``EPOCHS`` epochs in the current strategy, validating on the training data.

    Returns the model, the (training, validation) loss of each epoch, the step losses and the
    loss of a final ``evaluate``.
    """
    from helpers import initial_weights

    model = build_model()
    model.set_weights(initial_weights(problem))
    compile_model(model)
    batch_losses = BatchLosses()
    history = model.fit(
        make_dataset(problem),
        validation_data=make_dataset(problem),
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[batch_losses],
    ).history
    epoch_losses = np.stack([history["loss"], history["val_loss"]], axis=1)
    eval_loss = model.evaluate(make_dataset(problem), verbose=0)
    return model, epoch_losses, batch_losses.losses, eval_loss


def _save_result(path, model, losses, info, **extra):
    epoch_losses, batch_losses, eval_loss = losses
    np.savez(
        path,
        **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
        epoch_losses=epoch_losses,
        batch_losses=np.array(batch_losses),
        eval_loss=eval_loss,
        is_chief=info.is_chief,
        worker_index=info.worker_index,
        num_workers=info.num_workers,
        num_replicas_in_sync=info.num_replicas_in_sync,
        **extra,
    )


def run_train(problem, result_path, out_dir):
    from yolo3.distributed import keras_mwms
    from yolo3.distributed import strategy as distribute

    strategy = distribute.make_strategy(gpus=0)
    trainer = keras_mwms._trainer_module()
    patched = (trainer.reduce_per_replica, trainer.TensorFlowTrainer._maybe_symbolic_build)
    keras_mwms.apply()  # a second call must change nothing
    unchanged = patched == (
        trainer.reduce_per_replica,
        trainer.TensorFlowTrainer._maybe_symbolic_build,
    )
    info = distribute.worker_info(strategy)
    with strategy.scope():
        model, *losses = train(problem)
    try:
        model.evaluate(problem["images"], problem["targets"], batch_size=GLOBAL_BATCH, verbose=0)
        numpy_rejected = ""
    except ValueError as error:
        numpy_rejected = str(error)
    with distribute.chief_only_path(out_dir / "final.weights.h5", info) as path:
        model.save_weights(path)
        wrote = os.path.exists(path)
    _save_result(
        result_path,
        model,
        losses,
        info,
        multi_worker=isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        apply_idempotent=unchanged,
        numpy_rejected=numpy_rejected,
        save_path=str(path),
        wrote=wrote,
        kept=os.path.exists(path),
    )


def run_mirrored(problem, result_path, replicas):
    from yolo3.distributed import keras_mwms
    from yolo3.distributed import strategy as distribute

    distribute.configure_devices(cpu_replicas=replicas)
    keras_mwms.apply()
    strategy = distribute.make_strategy(gpus=0, cpu_replicas=replicas)
    with strategy.scope():
        model, *losses = train(problem)
    _save_result(
        result_path,
        model,
        losses,
        distribute.worker_info(strategy),
        mirrored=isinstance(strategy, tf.distribute.MirroredStrategy),
    )


def run_unpatched(problem, result_path):
    from keras.src.backend.tensorflow import trainer

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    errors = {}
    try:
        with strategy.scope():
            train(problem)
        errors["fit"] = ""
    except Exception as error:  # the canary records whatever upstream raises
        errors["fit"] = f"{type(error).__name__}: {error}"

    @tf.function
    def reduce_scalar_logs():
        logs = strategy.run(lambda: {"loss": tf.constant(1.0)})
        return trainer.reduce_per_replica(logs, strategy, reduction="auto")

    try:
        reduce_scalar_logs()
        errors["reduce_per_replica"] = ""
    except Exception as error:
        errors["reduce_per_replica"] = f"{type(error).__name__}: {error}"
    Path(result_path).write_text(json.dumps(errors))


def main(argv):
    mode, problem_path, result_path, *run_args = argv
    from yolo3.distributed import strategy as distribute

    keras.config.disable_traceback_filtering()
    problem = dict(np.load(problem_path))
    if mode == "mirrored":
        run_mirrored(problem, result_path, int(run_args[0]))
        return
    index, ports = int(run_args[0]), run_args[1].split(",")
    os.environ["TF_CONFIG"] = distribute.tf_config([f"127.0.0.1:{p}" for p in ports], index)
    if mode == "train":
        run_train(problem, result_path, Path(result_path).parent)
    elif mode == "unpatched":
        run_unpatched(problem, result_path)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
