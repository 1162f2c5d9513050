"""The run's epoch-by-epoch record: ``history.jsonl`` in the log folder."""

import json
import math
import os
import time

import keras

from yolo3 import fileio

HISTORY_FILE = "history.jsonl"


def read_history(log_dir):
    """The records of ``<log_dir>/history.jsonl``, oldest first ([] when there is none)."""
    path = os.path.join(os.fspath(log_dir), HISTORY_FILE)
    if not fileio.exists(path):
        return []
    with fileio.open_file(path, "r") as f:
        return [json.loads(line) for line in f if line.strip()]


class EpochHistory(keras.callbacks.Callback):
    """Writes one JSON line per epoch to ``<log_dir>/history.jsonl`` (the chief's).

    Each line holds ``epoch`` (from 1), ``seconds`` (the run's wall time at the epoch's end,
    counted from the command's start, less the time spent scoring mAP during training:
    the clock of training alone, start-up and checkpoints included) and every finite
    number of the epoch's logs: ``loss``, ``val_loss``, ``val_mAP50`` on evaluated epochs,
    ``images_per_second``, ``learning_rate``. A curve of mAP against training time, as
    the accuracy benchmark plots it, needs nothing else.

    The whole file is rewritten atomically at every epoch end (it is a few hundred bytes an
    epoch). A run resumed with ``--resume`` keeps the lines of the epochs it resumes after,
    drops any later ones (the epochs trained again), and counts its seconds on from the last
    kept line's.

    Args:
        log_dir: the run's folder.
        started: ``time.perf_counter()`` at the command's start.
        evaluation: the run's :class:`yolo3.callbacks.MapEvaluation` (its ``seconds``
            are taken off the clock), or None.
    """

    def __init__(self, log_dir, *, started=None, evaluation=None):
        super().__init__()
        self.path = os.path.join(os.fspath(log_dir), HISTORY_FILE)
        self.started = time.perf_counter() if started is None else started
        self.evaluation = evaluation
        self.records = None  # read at the first epoch's start
        self.offset = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        if self.records is not None:
            return
        kept = [r for r in read_history(os.path.dirname(self.path)) if r["epoch"] <= epoch]
        self.records = kept
        self.offset = kept[-1]["seconds"] if kept else 0.0

    def on_epoch_end(self, epoch, logs=None):
        if self.records is None:
            self.on_epoch_begin(epoch)
        evaluating = self.evaluation.seconds if self.evaluation is not None else 0.0
        seconds = self.offset + time.perf_counter() - self.started - evaluating
        record = {"epoch": epoch + 1, "seconds": round(seconds, 3)}
        for key, value in sorted((logs or {}).items()):
            number = _number(value)
            if number is not None:
                record[key] = number
        self.records = [r for r in self.records if r["epoch"] < epoch + 1] + [record]
        fileio.write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))


def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
