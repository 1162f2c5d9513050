"""Changing what trains and how fast during ``model.fit``: freezing, plateau decay, a
time budget and the end of mosaics."""

import math
import time

import keras

from yolo3.engine.trainer import set_frozen


class FreezeSchedule(keras.callbacks.Callback):
    """Trains with ``names`` frozen for the first ``epochs`` epochs, then unfreezes them.

    The state follows from the epoch number alone, so a run restored from a backup in
    either stage freezes exactly what an uninterrupted run would. The train function is
    rebuilt when the state changes, because Keras fixes the trainable set when tracing.
    The optimizer must already be built for every variable (see ``yolo3.training.job``).
    """

    def __init__(self, body, names, epochs, log=None):
        super().__init__()
        self.body = body
        self.names = list(names)
        self.epochs = int(epochs)
        self.frozen = None
        self.log = log

    def _apply(self, epoch):
        frozen = epoch < self.epochs
        if frozen == self.frozen or not self.names:
            return
        set_frozen(self.body, self.names, frozen)
        self.frozen = frozen
        self.model.make_train_function(force=True)
        self.model.make_test_function(force=True)
        if self.log:
            state = "frozen" if frozen else "unfrozen: the whole network trains"
            self.log(f"epoch {epoch + 1}: {len(self.names)} layers {state}")

    def on_train_begin(self, logs=None):
        self._apply(self.params.get("initial_epoch", 0) if self.params else 0)

    def on_epoch_begin(self, epoch, logs=None):
        self._apply(epoch)


class PlateauScale(keras.callbacks.Callback):
    """Multiplies ``scale`` (the trainer's ``lr_scale``) by ``factor`` when ``monitor`` stalls.

    Keras's ReduceLROnPlateau cannot change a learning-rate schedule; this lowers a scale
    the schedule multiplies in, which is saved with the training state.
    """

    def __init__(
        self, scale, *, monitor="val_loss", factor=0.1, patience=3, min_scale=1e-3, log=None
    ):
        super().__init__()
        self.scale = scale
        self.monitor = monitor
        self.factor = factor
        self.patience = patience
        self.min_scale = min_scale
        self.best = math.inf
        self.wait = 0
        self.log = log

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        if value < self.best:
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            current = float(keras.ops.convert_to_numpy(self.scale))
            new = max(current * self.factor, self.min_scale)
            if new < current:
                self.scale.assign(new)
                if self.log:
                    self.log(f"epoch {epoch + 1}: {self.monitor} stalled; lr scale {new:g}")
            self.wait = 0


class TimeBudget(keras.callbacks.Callback):
    """Fits the run to ``seconds`` of wall time (``--time``): after each epoch, the plan is
    the epochs done plus as many more as the time left holds at the pace of the last epoch
    (from one epoch's start to the next's: its steps, validation, mAP and checkpoints), at
    most ``max_epochs``; the run ends when it has trained them.

    The learning-rate schedule and multi-scale's last steps follow the plan: ``planned``
    (a variable holding the run's planned optimizer steps, which the schedule reads) and
    ``scales`` (a :class:`yolo3.data.multiscale.ScaleSchedule`, or None) are set to it. The
    chief plans; every worker takes its plan (``broadcast``, a collective every worker
    joins at the same epoch end), so that all stop after the same epoch.

    Args:
        seconds: the budget, counted from ``started`` (``time.perf_counter()`` when the run
            began: its setup counts; None: from the start of ``fit``).
        steps_per_epoch: optimizer steps in an epoch.
        max_epochs: the most epochs the plan may hold (``--epochs``).
        planned: the schedule's variable of planned steps.
        broadcast: ``broadcast(variables)`` sets them on every worker to the chief's
            (:func:`yolo3.distributed.strategy.broadcast_from_chief`, bound to the strategy).
        scales: the run's multi-scale schedule, or None.
        log: a print-like function for the plan's changes, or None.
    """

    def __init__(self, seconds, *, started, steps_per_epoch, max_epochs, planned,
                 broadcast=None, scales=None, log=None):  # fmt: skip
        super().__init__()
        self.seconds = float(seconds)
        self.started = started
        self.steps_per_epoch = int(steps_per_epoch)
        self.max_epochs = int(max_epochs)
        self.planned = planned
        self.broadcast = broadcast
        self.scales = scales
        self.log = log
        self.epoch_starts = []
        self.epoch_ends = []  # when this callback saw each epoch end
        self.plan = None  # epochs

    def on_train_begin(self, logs=None):
        if self.started is None:  # no start given: the budget counts from here
            self.started = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_starts.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        done = epoch + 1
        # This epoch so far, and what the callbacks after this one did at the last epoch's
        # end (checkpoints): the time from one epoch's start to the next's.
        pace = now - self.epoch_starts[-1]
        if self.epoch_ends:
            pace += self.epoch_starts[-1] - self.epoch_ends[-1]
        self.epoch_ends.append(now)
        left = self.seconds - (now - self.started)
        plan = min(self.max_epochs, done + max(0, math.floor(left / max(pace, 1e-9))))
        self.planned.assign(plan * self.steps_per_epoch)
        if self.broadcast is not None:
            self.broadcast([self.planned])  # the chief's plan, on every worker
        plan = int(self.planned.numpy()) // self.steps_per_epoch
        if self.scales is not None:
            self.scales.set_total_steps(plan * self.steps_per_epoch)
        if self.log and plan != self.plan:
            capped = " (--epochs caps it)" if plan == self.max_epochs and plan > done else ""
            self.log(
                f"time budget: {plan} epochs planned{capped}, the last took {pace:.1f} s, "
                f"{max(left, 0.0) / 60:.1f} of {self.seconds / 60:g} min left"
            )
        self.plan = plan
        if done >= plan:
            self.model.stop_training = True


class CloseMosaic(keras.callbacks.Callback):
    """The last ``close`` epochs read no mosaic records (``--close-mosaic``, Ultralytics'
    ``close_mosaic``): the detector ends on images as it will see them.

    ``switch`` is the boolean variable the training split's filter reads
    (:func:`yolo3.data.pipeline.make_dataset`'s ``mosaic``). Its state follows from the epoch
    number and the run's length, ``epochs``, or the plan of ``budget`` (a :class:`TimeBudget`)
    once it has one: a resumed run reads what an uninterrupted one would, except under a
    time budget, which a resumed run plans again after its first epoch (that epoch counts
    with ``epochs``).
    """

    def __init__(self, switch, *, epochs, close, budget=None, log=None):
        super().__init__()
        self.switch = switch
        self.epochs = int(epochs)
        self.close = int(close)
        self.budget = budget
        self.log = log
        self.on = None

    def on_epoch_begin(self, epoch, logs=None):
        planned = self.budget.plan if self.budget is not None and self.budget.plan else None
        on = epoch < (planned or self.epochs) - self.close
        if on != self.on:
            self.switch.assign(on)
            if self.log and (self.on is not None or not on):
                state = "mosaic records in" if on else "no mosaic records from here on"
                self.log(f"epoch {epoch + 1}: {state} (--close-mosaic {self.close})")
            self.on = on
