"""Runs the train.py job in its own process and dumps what the tests compare.

    python tests/train_worker.py DUMP_DIR [--cpu-replicas N] -- <train.py flags>

Writes ``DUMP_DIR/worker-<index>.npz`` (index from TF_CONFIG, 0 for a single process):
every weight of the template model in layer order (``w0``, ``w1``, ...), its predictions
on a fixed input (``p0``, ``p1``), the optimizer step and the epochs trained in this run.

With ``SNAPSHOT_AFTER_EPOCH=N:FOLDER`` in the environment, the job's ``--log-dir`` is copied
to FOLDER once epoch N has ended and every callback has saved what it saves there: the
folder a run stopped after epoch N leaves, from which ``--resume`` continues it. The resume
tests take it instead of training the first N epochs a second time.

A run that fails under way ends as train.py's does: one line, ``error: ...``, status 1.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402

PROBE_SEED = 123
SNAPSHOT_ENV = "SNAPSHOT_AFTER_EPOCH"


def _worker_index():
    """This worker's index in the job (TF_CONFIG's task), 0 for a single process."""
    return json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]


def _snapshot_after_epoch(epoch, log_dir, folder):
    """Every fit of the trainer ends its callbacks with one that copies ``log_dir`` to
    ``folder`` at the end of epoch ``epoch`` (1-based), after the others have saved. In a
    job of several workers each copies its own backups, and the chief the rest."""
    import shutil

    import keras

    from yolo3.engine.trainer import YoloTrainer

    index = _worker_index()
    own = f"worker-{index}"

    def others_backups(directory, names):
        if os.path.basename(directory) != "backup":
            return []
        return [n for n in names if n.startswith("worker-") and n != own]

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, done, logs=None):
            if done + 1 != epoch:
                return
            if index == 0:
                shutil.copytree(log_dir, folder, ignore=others_backups, dirs_exist_ok=True)
            else:
                backups = os.path.join("backup", own)
                shutil.copytree(
                    os.path.join(log_dir, backups),
                    os.path.join(folder, backups),
                    dirs_exist_ok=True,
                )

    fit = YoloTrainer.fit

    def fit_then_snapshot(self, *args, callbacks=None, **kwargs):
        return fit(self, *args, callbacks=[*(callbacks or []), Snapshot()], **kwargs)

    YoloTrainer.fit = fit_then_snapshot


def probe_images(size):
    return np.random.default_rng(PROBE_SEED).uniform(0, 1, (2, size, size, 3)).astype(np.float32)


def main():
    dump_dir, rest = sys.argv[1], sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    from yolo3.cli import KNOWN_ERRORS, run_main
    from yolo3.commands import train
    from yolo3.training import job as training

    return run_main(
        train.build_parser(),
        rest,
        lambda args: _train_and_dump(train.config_from_args(args), dump_dir),
        errors=(*KNOWN_ERRORS, training.XlaCompileError),
    )


def _train_and_dump(config, dump_dir):
    from yolo3.data import records
    from yolo3.training import job as training

    training.configure(config)
    if SNAPSHOT_ENV in os.environ:
        epoch, folder = os.environ[SNAPSHOT_ENV].split(":", 1)
        _snapshot_after_epoch(int(epoch), config.log_dir, folder)
    result = training.run(config)
    body = result.trainer.body
    # A multi-scale body takes any size: probe at the records' size.
    size = body.input_shape[1] or records.open_record_set(config.records).input_hw[0]
    outputs = body(probe_images(size))
    index = _worker_index()
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(body.get_weights())}
    arrays.update({f"p{i}": np.asarray(o) for i, o in enumerate(outputs)})
    arrays["step"] = int(result.trainer.optimizer.iterations.value.numpy())
    arrays["epochs_this_run"] = len(result.history.get("loss", []))
    arrays["scale_history"] = np.asarray(result.trainer.scale_history, np.int64)
    os.makedirs(dump_dir, exist_ok=True)
    np.savez(os.path.join(dump_dir, f"worker-{index}.npz"), **arrays)
    if result.preempted_at is not None:
        from yolo3.callbacks import PREEMPTED_STATUS

        return PREEMPTED_STATUS
    return 1 if result.stopped_reason else 0


if __name__ == "__main__":
    from graph_rewrites import skip_graph_rewrites

    skip_graph_rewrites()  # the runs it dumps are compared with each other
    sys.exit(main())
