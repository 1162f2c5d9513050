"""Watching a run: images/s and input wait, the learning rate, non-finite losses."""

import math
import time

import keras
import numpy as np

from yolo3.engine.step import INPUT_WAIT_KEY
from yolo3.model.loss import ALL_LOSS_TERMS, term_log_key
from yolo3.progress import DEFAULT_SECONDS, Interval, format_duration


class Throughput(keras.callbacks.Callback):
    """Images per second and the share of each step spent waiting for input.

    The trainer logs how long each step waited for its batch, measured in the graph
    (:meth:`yolo3.engine.step.StepFunctions.measure_input_wait`): the input pipeline's
    share alone, not the step's dispatch, its collectives or other workers. A large wait
    means the input pipeline cannot keep up: preprocess offline with more copies, use more
    reader cores, or a faster disk. Epoch logs gain ``images_per_second`` and
    ``input_wait_fraction``.

    Args:
        global_batch_size: images per step over all replicas and workers.
        skip_first: steps excluded from the figures (tracing and warm-up).
    """

    def __init__(self, global_batch_size, skip_first=1, log=None):
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.skip_first = skip_first
        self.log = log
        self.history = []

    def on_epoch_begin(self, epoch, logs=None):
        self.step_seconds, self.waits, self.steps = [], [], 0

    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        elapsed = time.perf_counter() - self.started
        wait = logs.pop(INPUT_WAIT_KEY, None) if logs is not None else None
        self.steps += 1
        if self.steps > self.skip_first:
            self.step_seconds.append(elapsed)
            if wait is not None:
                self.waits.append(min(max(float(wait), 0.0), elapsed))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.pop(INPUT_WAIT_KEY, None)
        if not self.step_seconds:
            return
        seconds = float(np.sum(self.step_seconds))
        rate = self.global_batch_size * len(self.step_seconds) / seconds
        figures = {"images_per_second": rate}
        if self.waits:
            figures["input_wait_fraction"] = float(np.sum(self.waits)) / seconds
        self.history.append(figures)
        if logs is not None:
            logs.update(figures)
        if self.log:
            wait = figures.get("input_wait_fraction")
            waited = "" if wait is None else f", {100 * wait:.1f}% of step time waiting for input"
            self.log(f"epoch {epoch + 1}: {rate:.1f} images/s{waited}")


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the optimizer's current learning rate to the epoch logs as ``learning_rate``."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = self.model.optimizer
        rate = optimizer.learning_rate
        if callable(rate):
            rate = rate(optimizer.iterations)
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))


class StopOnNonFinite(keras.callbacks.Callback):
    """Stops training when the loss or one of its terms becomes NaN or infinite.

    ``message`` names the epoch, the step and the terms that went bad (the logged values
    are running means over the epoch, so the step is the first one that was non-finite).
    """

    def __init__(self, terms=None):
        super().__init__()
        # Every logged loss term (yolo3.model.loss keeps the list), and the total.
        self.terms = terms or ("loss", *map(term_log_key, ALL_LOSS_TERMS))
        self.message = None
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        bad = {
            name: float(logs[name])
            for name in self.terms
            if logs and name in logs and not math.isfinite(float(logs[name]))
        }
        if bad and self.message is None:
            terms = ", ".join(f"{name}={value}" for name, value in bad.items())
            self.message = (
                f"non-finite loss at epoch {self.epoch + 1}, step {batch + 1}: {terms}. "
                "Lower --lr, lengthen the warmup, or check the data with "
                "yolo3 preprocess --verify"
            )
            self.model.stop_training = True


class ProgressLines(keras.callbacks.Callback):
    """Plain progress lines for a log file, in place of Keras's progress bar.

    Every ``every`` steps or ``seconds`` seconds (whichever comes first):
    ``epoch 2/6 step 150/250: loss 12.3456, 310.2 images/s, 4m10s left`` (the loss is the
    epoch's running mean, images/s since the previous line, the time left for the whole
    run at that pace). At each epoch's end one line with every logged value, so it must
    come after the callbacks that add to the logs. No carriage returns, no colour codes.

    With ``--time`` the run's length is the plan of ``budget`` (a
    :class:`yolo3.callbacks.TimeBudget`, whose ``plan`` is read here, never worked out
    again): the lines count its epochs. Before its first plan, made at the first epoch's
    end, the length is unknown: the lines say that ``--epochs`` is only a cap
    (``epoch 1/<=50``) and give the time left in this epoch alone.

    Args:
        global_batch_size: images per step over all replicas and workers.
        every: steps between lines (None: by time only).
        seconds: seconds between lines (0: by steps only).
        budget: the run's :class:`yolo3.callbacks.TimeBudget`, or None.
        clock: seconds, as ``time.monotonic``.
    """

    def __init__(self, global_batch_size, *, every=None, seconds=DEFAULT_SECONDS, log=print,
                 budget=None, clock=time.monotonic):  # fmt: skip
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.interval = Interval(every, seconds, clock)
        self.log = log
        self.budget = budget
        self.clock = clock

    def _epochs(self):
        """The run's epochs and whether they are only a cap: True while a time budget has
        yet to plan, when all that is known is ``--epochs``."""
        if self.budget is None or self.budget.plan is None:
            return self.params.get("epochs"), self.budget is not None
        return self.budget.plan, False

    def _of_epochs(self):
        epochs, capped = self._epochs()
        return f"/<={epochs}" if capped and epochs else _of(epochs)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.started = self.mark = self.clock()
        self.marked_step = 0
        self.interval.restart(0)

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if not self.interval.due(step):
            return
        now = self.clock()
        seconds_per_step = (now - self.mark) / max(step - self.marked_step, 1)
        self.mark, self.marked_step = now, step
        steps = self.params.get("steps")
        epochs, capped = self._epochs()
        parts = []
        if logs and "loss" in logs:
            parts.append(f"loss {float(logs['loss']):.4f}")
        if seconds_per_step > 0:
            parts.append(f"{self.global_batch_size / seconds_per_step:.1f} images/s")
        if steps and capped:
            left = format_duration((steps - step) * seconds_per_step)
            parts.append(f"{left} left in this epoch; --time plans the run after it")
        elif steps and epochs:
            left = (steps - step) + (epochs - self.epoch - 1) * steps
            parts.append(f"{format_duration(left * seconds_per_step)} left")
        where = f"epoch {self.epoch + 1}{self._of_epochs()} step {step}{_of(steps)}"
        self.log(f"{where}: {', '.join(parts)}")

    def on_epoch_end(self, epoch, logs=None):
        first = ("loss", "val_loss")  # then the rest by name
        names = sorted(
            logs or {}, key=lambda name: (first.index(name) if name in first else 2, name)
        )
        values = ", ".join(f"{name} {_figure(logs[name])}" for name in names)
        elapsed = format_duration(self.clock() - self.started)
        self.log(f"epoch {epoch + 1}{self._of_epochs()} done in {elapsed}: {values}")


def _of(total):
    return f"/{total}" if total else ""


def _figure(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.6g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.4f}"
