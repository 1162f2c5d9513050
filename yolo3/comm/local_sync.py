"""Synchronises the replicas of a ``--local-steps`` run between train steps."""

import math
import statistics
import time

import keras

from yolo3.status import TrainingStatus


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
        backup: the run's :class:`yolo3.callbacks.WorkerBackup` (its saving steps), or None.
        epoch_ends: False: no synchronisation at epoch ends, only every H steps (a
            benchmark's epochs are timing windows; a training run's must synchronise).
        status: the trainer's :class:`TrainingStatus`: nothing to synchronise while its
            ``dense_phase`` lasts (None: no dense phase).
        log: a print-like function for the advice on ``--overlap-sync`` (see
            :func:`overlap_advice`), given once, at the end of the first epoch with enough
            steps of both kinds; None: no advice.
    """

    def __init__(self, state, backup=None, *, epoch_ends=True, status=None, log=None):
        super().__init__()
        self.state = state
        self.status = status or TrainingStatus()
        self.backup = backup
        self.epoch_ends = epoch_ends
        self.log = log
        self.seconds = []  # the wall-clock time of each synchronisation
        # Overlapped: the time of each step that carried a chunk, and of each that did not.
        self.step_seconds = {True: [], False: []}
        self._step = None  # (start time, carries a chunk) of the step under way
        self._advised = False

    @property
    def synchronisations(self):
        return len(self.seconds)

    def _strategy(self):
        return self.model.distribute_strategy

    def on_train_begin(self, logs=None):
        # At the start and after a restore the replicas hold the same weights.
        if self.epoch_ends or self.synchronisations == 0:
            self.state.reset(self._strategy())

    def on_train_batch_begin(self, batch, logs=None):
        state = self.state
        # An epoch's first step carries its setup (a new size's tracing, the iterator).
        if state.overlap and batch > 0 and not (self._advised or self.status.dense_phase):
            chunk = state.in_flight and state.steps_since_sync < state.overlap_steps
            self._step = (time.perf_counter(), chunk)

    def on_train_batch_end(self, batch, logs=None):
        if self._step is not None:
            started, chunk = self._step
            self.step_seconds[chunk].append(time.perf_counter() - started)
            self._step = None
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
        step = self.model.optimizer.iterations  # int8/int4 seed their roundings with it
        if full:
            self.state.synchronize(self._strategy(), self.model.optimizer.variables, step=step)
        else:
            self.state.synchronize(self._strategy(), step=step)
        self.seconds.append(time.perf_counter() - start)

    def on_epoch_end(self, epoch, logs=None):
        steps = self.state.overlap_steps
        chunks, plain = self.step_seconds[True], self.step_seconds[False]
        if self.log is None:
            self._advised = True  # nobody to advise: the steps need no more timing
        if self._advised or min(len(chunks), len(plain)) < (steps or 1):
            return
        self._advised = True
        advice = overlap_advice(
            steps, self.state.local_steps, statistics.median(chunks), statistics.median(plain)
        )
        if advice:
            self.log(advice)


def overlap_advice(overlap, local_steps, chunk_seconds, plain_seconds, margin=1.1):
    """A line of advice when the steps that carry a chunk of the overlapped synchronisation
    take longer than the others (more than ``margin`` times), or None.

    Such a step takes about its chunk's link time (the chunk travels beside the step's
    computation, and the step ends when both have), so the link needs about ``overlap x
    chunk_seconds`` for a change, and chunks spread over ``overlap x chunk / plain`` steps
    would hide behind the computation: ``--overlap-sync`` that many, up to ``local_steps``.
    """
    if chunk_seconds <= margin * plain_seconds:
        return None
    link = overlap * chunk_seconds
    spread = math.ceil(overlap * chunk_seconds / plain_seconds)
    slow = (
        f"the steps that carry the overlapped synchronisation took {chunk_seconds:.2f} s "
        f"against {plain_seconds:.2f} s for the others: the link needs about {link:.1f} s "
        "for a change"
    )
    if spread <= local_steps:
        return f"{slow}; --overlap-sync {spread} would send it behind the computation"
    return (
        f"{slow}, more than {local_steps} steps compute; a larger --local-steps (at least "
        f"{spread}) with --overlap-sync {spread} would send it behind the computation"
    )
