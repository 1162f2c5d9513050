"""Per-worker backups, so a job killed mid-training resumes when started again.

Like Keras's ``BackupAndRestore``, but the weights and the epoch they belong to live in
one file written under a temporary name and renamed: a worker killed while saving leaves
the previous backup intact, never a torn file or an epoch count that disagrees with the
weights. Every worker keeps its own folder (``backup/worker-N``), so workers never write
the same file; the folder is deleted when training finishes.
"""

import json
import os
import shutil

import h5py
import keras

from yolo3.fileio import atomic_write
from yolo3.weights import METADATA_KEY, read_metadata

BACKUP = "backup.weights.h5"


class WorkerBackup(keras.callbacks.Callback):
    """Saves the whole trainer (weights, optimizer, step) at each epoch end or every N steps.

    Args:
        directory: this worker's backup folder.
        every_steps: also back up every this many steps (None: at epoch ends only). A run
            restored from a mid-epoch backup starts that epoch again from its first step.
        log: a print-like function for the restore message.
    """

    def __init__(self, directory, every_steps=None, log=None):
        super().__init__()
        self.directory = directory
        self.path = os.path.join(directory, BACKUP)
        self.every_steps = every_steps
        self.log = log
        self.epoch = 0
        self.restored_epoch = None

    def on_train_begin(self, logs=None):
        if not os.path.exists(self.path):
            return
        self.model.load_weights(self.path)
        self.restored_epoch = int(read_metadata(self.path)["epoch"])
        # The same hook Keras's BackupAndRestore uses to make fit skip finished epochs.
        self.model._initial_epoch = self.restored_epoch
        if self.log:
            step = int(self.model.optimizer.iterations.value.numpy())
            self.log(f"restored backup {self.path}: epoch {self.restored_epoch}, step {step}")

    def _save(self, epoch):
        os.makedirs(self.directory, exist_ok=True)
        with atomic_write(self.path) as temp:
            self.model.save_weights(temp)
            with h5py.File(temp, "a") as f:
                f.attrs[METADATA_KEY] = json.dumps({"epoch": epoch})

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.every_steps and (batch + 1) % self.every_steps == 0:
            self._save(self.epoch)  # the epoch in progress: restoring repeats it

    def on_epoch_end(self, epoch, logs=None):
        self._save(epoch + 1)

    def on_train_end(self, logs=None):
        # Reached only when fit returns (finished, early-stopped or stopped on a non-finite
        # loss); a killed worker never gets here and keeps its backup.
        shutil.rmtree(self.directory, ignore_errors=True)
