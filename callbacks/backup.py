"""Per-worker backups, so a job killed or preempted mid-training resumes when started again.

Like Keras's ``BackupAndRestore``, but each backup holds the weights and the position they
belong to (epochs done, steps done in the epoch under way, the global step) in one file
written under a temporary name and renamed: a worker killed while saving leaves its earlier
backups intact, never a torn file or a position that disagrees with the weights. Every
worker keeps its own folder (``backup/worker-N``), so workers never write the same file.

Each folder keeps the two newest backups, ``backup-<step>.weights.h5``. Workers save at the
same steps, and no worker can get more than one save ahead of another (the next step's
all-reduce waits for all), so when a job dies during a save the step that every worker has
is among each one's two. :meth:`WorkerBackup.restore` finds that step with one collective,
loads it, and broadcasts the chief's weights and optimizer state (all the communication
scheme says the workers share), so that the workers start bit for bit alike;
``training.run`` then continues from that very step, also mid-epoch.
"""

import collections
import glob
import os
import re
import shutil

import keras

from yolo3.checkpoint.weights import read_metadata, write_weights_file
from yolo3.distributed import strategy as distribute
from yolo3.fileio import atomic_write, remove_temporaries
from yolo3.status import TrainingStatus

PATTERN = "backup-{step:09d}.weights.h5"
LEGACY = "backup.weights.h5"  # one file, epoch ends only (earlier versions)
KEEP = 2


# Where training stands: epochs done, steps done in the next epoch, global step.
Position = collections.namedtuple("Position", ["epoch", "batch", "step"])


class WorkerBackup(keras.callbacks.Callback):
    """Saves the whole trainer (weights, optimizer, step) at epoch ends, every N steps and
    when the job is asked to stop (``status.stop_requested``, see ``Preemption``).

    Args:
        directory: this worker's backup folder.
        steps_per_epoch: optimizer steps per epoch.
        every_steps: also back up every this many global steps (None: epoch ends only).
        log: a print-like function for the restore message.
        status: the trainer's :class:`TrainingStatus` (None: the job never asks to stop).
    """

    def __init__(self, directory, steps_per_epoch, every_steps=None, log=None, *, status=None):
        super().__init__()
        self.status = status or TrainingStatus()
        self.directory = directory
        self.steps_per_epoch = int(steps_per_epoch)
        self.every_steps = every_steps
        self.log = log
        self.epoch = 0
        self.restored = None  # the Position restored, if any

    # -- restoring ---------------------------------------------------------------------

    def available(self):
        """``{step: path}`` of this worker's backups."""
        found = {}
        for path in glob.glob(os.path.join(glob.escape(self.directory), "backup-*.weights.h5")):
            match = re.fullmatch(r"backup-(\d+)\.weights\.h5", os.path.basename(path))
            if match:
                found[int(match.group(1))] = path
        legacy = os.path.join(self.directory, LEGACY)
        if os.path.exists(legacy):
            found.setdefault(int(read_metadata(legacy)["epoch"]) * self.steps_per_epoch, legacy)
        return found

    def restore(self, trainer, strategy):
        """Loads the newest backup every worker has; returns its :class:`Position` or None.

        Every worker of the job must call it, before ``fit``. Backups newer than the agreed
        step are deleted: training from there will write them again.
        """
        remove_temporaries(self.directory)  # writes a killed run left unfinished
        found = self.available()
        step = distribute.common_newest(strategy, found, slots=KEEP)
        if step is None:
            if found and self.log:
                self.log(
                    f"backups in {self.directory} (steps {sorted(found)}) are not shared by "
                    "every worker: training starts afresh"
                )
            return None
        path = found[step]
        trainer.load_weights(path)
        # What the workers hold alike comes from the chief, bit for bit; what each holds on
        # its own (local steps' optimizer slots) from its own backup.
        distribute.broadcast_from_chief(strategy, trainer.communication.shared_variables(trainer))
        metadata = read_metadata(path)
        position = self._position(metadata, step)
        for newer, newer_path in found.items():
            if newer > step:
                os.remove(newer_path)
        self.restored = position
        if self.log:
            optimizer_step = int(trainer.optimizer.iterations.value.numpy())
            self.log(
                f"restored backup {path}: epoch {position.epoch}, step {optimizer_step} "
                f"(batch {position.batch} of the next epoch)"
            )
        return position

    def _position(self, metadata, step):
        epoch, batch = int(metadata["epoch"]), int(metadata.get("batch", 0))
        if batch >= self.steps_per_epoch:  # stopped after an epoch's last step
            epoch, batch = epoch + 1, 0
        return Position(epoch, batch, step)

    # -- saving ------------------------------------------------------------------------

    def _save(self, epoch, batch):
        step = epoch * self.steps_per_epoch + batch
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, PATTERN.format(step=step))
        with atomic_write(path) as temp:
            write_weights_file(self.model, temp, {"epoch": epoch, "batch": batch, "step": step})
        # Only once the new one is complete: the older ones beyond the newest KEEP go.
        found = self.available()
        for old in sorted(found)[:-KEEP]:
            os.remove(found[old])

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def _done(self, batch):
        """Steps of this epoch after ``batch``, those before a mid-epoch resume included."""
        done = batch + 1
        if self.restored is not None and self.epoch == self.restored.epoch:
            done += self.restored.batch
        return done

    def saves_after(self, batch):
        """Whether a backup is saved at the end of ``batch`` (of the epoch under way)."""
        step = self.epoch * self.steps_per_epoch + self._done(batch)
        return bool(
            self.status.stop_requested or (self.every_steps and step % self.every_steps == 0)
        )

    def on_train_batch_end(self, batch, logs=None):
        if self.saves_after(batch):
            self._save(self.epoch, self._done(batch))

    def on_epoch_end(self, epoch, logs=None):
        if self.status.stop_requested:
            return  # saved at the step the job stopped, mid-epoch
        self._save(epoch + 1, 0)

    def remove(self):
        """Deletes the folder: training finished (or stopped on its own, not killed)."""
        shutil.rmtree(self.directory, ignore_errors=True)
