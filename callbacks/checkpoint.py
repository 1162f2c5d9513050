"""Checkpoints of the single-device template model, and the training state for ``--resume``.

Files in the checkpoint folder (the chief worker's; the other workers of a multi-worker job
save the same files through :func:`yolo3.distributed.strategy.chief_only_path` into scratch folders
that are deleted, because reading some distributed variables is a collective that every
worker must join):

``last.weights.h5``           the bare ``yolo_body`` after the latest epoch
``best.weights.h5``           the bare ``yolo_body`` of the best ``monitor``: the highest
                              ``val_fitness`` (COCO AP) where AP is measured, else the
                              lowest ``val_loss``
``epoch-0010.weights.h5``     every ``every`` epochs, when asked
``state.weights.h5``          the whole trainer: body, optimizer slots and step counter,
                              learning-rate scale; its metadata holds the finished epoch

Every file is written under a temporary name and renamed, so a killed run never leaves a
file that looks complete but is not. The template files load with
:func:`yolo3.checkpoint.weights.load_weights` into a model built with no strategy.
"""

import contextlib
import math
import os
import shutil

import keras

from yolo3.checkpoint.run_files import BEST, LAST, STATE
from yolo3.checkpoint.weights import read_metadata, save_weights, write_weights_file
from yolo3.distributed import strategy as distribute
from yolo3.fileio import atomic_write, remove_temporaries
from yolo3.status import TrainingStatus


def _finite_logs(logs):
    return {k: float(v) for k, v in (logs or {}).items() if math.isfinite(float(v))}


class TemplateCheckpoint(keras.callbacks.Callback):
    """Saves ``body`` (never the training wrapper) and the training state at each epoch end.

    Args:
        directory: the checkpoint folder.
        body: the template model, ``trainer.body``.
        worker: this process's :class:`yolo3.distributed.strategy.WorkerInfo` (None: a
            single process).
        every: also keep ``epoch-NNNN.weights.h5`` every ``every`` epochs (None: never).
        monitor: the log that picks ``best.weights.h5``; an epoch without it is no candidate.
        mode: ``"min"`` (lower is better, a loss) or ``"max"`` (higher, the fitness).
        metadata: JSON-able dict stored in every file (classes, anchors, input size...).
        status: the trainer's :class:`TrainingStatus`; an epoch the job stopped in is not
            saved (None: the job never asks to stop).
        averaged: a function giving the context in which ``body`` holds the weights to
            save (the trainer's ``averaged_weights``: its moving average, with ``--ema``);
            the training state is saved outside it. None: the weights as they are.
    """

    def __init__(
        self,
        directory,
        body,
        *,
        worker=None,
        every=None,
        monitor="val_loss",
        mode="min",
        metadata=None,
        status=None,
        averaged=None,
    ):
        super().__init__()
        self.averaged = averaged or contextlib.nullcontext
        self.status = status or TrainingStatus()
        self.worker = worker or distribute.WorkerInfo(True, 0, 1, 1)
        self.directory = directory
        self.body = body
        self.every = every
        self.monitor = monitor
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode!r}: min or max")
        self.mode = mode
        self.metadata = dict(metadata or {})
        self.best = None  # the best monitored value so far

    def _better(self, value):
        if value is None:
            return False
        if self.best is None:
            return True
        # A tie in fitness (AP still 0 early on) goes to the later epoch, trained longer.
        return value < self.best if self.mode == "min" else value >= self.best

    def on_train_begin(self, logs=None):
        best = os.path.join(self.directory, BEST)
        if os.path.exists(best):  # a resumed run keeps the best it had found
            self.best = read_metadata(best).get("logs", {}).get(self.monitor)
        if self.worker.is_chief:
            os.makedirs(self.directory, exist_ok=True)
            remove_temporaries(self.directory)  # writes a killed run left unfinished

    def _where(self, name):
        """Where this worker writes ``name``: the checkpoint folder on the chief."""
        return distribute.chief_only_path(os.path.join(self.directory, name), self.worker)

    def _save_template(self, name, metadata):
        with self._where(name) as path, self.averaged():
            save_weights(self.body, path, metadata)

    def save_restored(self, trainer, epochs_done):
        """Writes the files of ``epochs_done`` finished epochs from ``trainer`` outside ``fit``:
        a run restored from a backup at its planned end. The epoch's logs are gone: no new
        best, and ``last`` records none."""
        self.set_model(trainer)
        self.on_train_begin()
        self.on_epoch_end(epochs_done - 1)

    def on_epoch_end(self, epoch, logs=None):
        finished = epoch + 1
        if self.status.stop_requested:
            return  # the epoch did not finish: the workers' backups hold the stopped step
        if not math.isfinite(float((logs or {}).get("loss", 0.0))):
            return  # weights after a non-finite loss are not worth keeping
        logs = _finite_logs(logs)
        metadata = {**self.metadata, "epoch": finished, "logs": logs}
        self._save_template(LAST, metadata)
        copies = []
        value = logs.get(self.monitor)
        if self._better(value):
            self.best = value
            copies.append(BEST)
        if self.every and finished % self.every == 0:
            copies.append(f"epoch-{finished:04d}.weights.h5")
        if self.worker.is_chief:
            # The same weights and metadata as last: a file copy, not another serialisation.
            last = os.path.join(self.directory, LAST)
            for name in copies:
                with atomic_write(os.path.join(self.directory, name)) as temp:
                    shutil.copyfile(last, temp)
        state = {**metadata, "best": self.best}
        with self._where(STATE) as path, atomic_write(path) as temp:
            write_weights_file(self.model, temp, state)
