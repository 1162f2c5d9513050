"""Synchronises the replicas of a ``--local-steps`` run between train steps."""

import time

import keras

from yolo3.engine.status import TrainingStatus


class LocalSync(keras.callbacks.Callback):
    """Every ``H`` optimizer steps, the replicas average their weight changes
    (:meth:`yolo3.comm.local_steps.LocalStepsState.synchronize`); overlapped, the changes go out
    there and are applied ``T`` steps later (:meth:`~yolo3.comm.local_steps.LocalStepsState.land`).

    At the end of each epoch (before validation, mAP and the checkpoints) and after any
    step that ``backup`` saves, the synchronisation is a full one: nothing is left in
    flight, and the replicas of each process share the inner optimizer's state (each
    worker keeps its own: see :mod:`yolo3.comm.local_steps`), so that what a worker saves
    is its state and a run resumed from the backups continues as the uninterrupted one.
    Runs before the callbacks that save.

    Args:
        state: the trainer's :class:`yolo3.comm.local_steps.LocalStepsState`.
        backup: the run's :class:`WorkerBackup` (its saving steps), or None.
        epoch_ends: False: no synchronisation at epoch ends, only every H steps (a
            benchmark's epochs are timing windows; a training run's must synchronise).
        status: the trainer's :class:`TrainingStatus`: nothing to synchronise while its
            ``dense_phase`` lasts (None: no dense phase).
    """

    def __init__(self, state, backup=None, *, epoch_ends=True, status=None):
        super().__init__()
        self.state = state
        self.status = status or TrainingStatus()
        self.backup = backup
        self.epoch_ends = epoch_ends
        self.seconds = []  # the wall-clock time of each synchronisation

    @property
    def synchronisations(self):
        return len(self.seconds)

    def _strategy(self):
        return self.model.distribute_strategy

    def on_train_begin(self, logs=None):
        # At the start and after a restore the replicas hold the same weights.
        if self.epoch_ends or self.synchronisations == 0:
            self.state.reset(self._strategy())

    def on_train_batch_end(self, batch, logs=None):
        if self.status.dense_phase:
            return  # still all-reducing every step (--dense-steps): nothing to synchronise
        due = self.state.step_done()
        if self.state.landing_due():  # overlapped: the last period's change has arrived
            self.state.land(self._strategy())
        full = (self.epoch_ends and batch + 1 == self.params.get("steps")) or (
            self.backup is not None and self.backup.saves_after(batch)
        )
        if not (full or due):
            return
        start = time.perf_counter()
        if full:
            self.state.synchronize(self._strategy(), self.model.optimizer.variables)
        else:
            self.state.synchronize(self._strategy())
        self.seconds.append(time.perf_counter() - start)
