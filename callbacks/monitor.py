"""Watching a run: images/s and input wait, the learning rate, non-finite losses."""

import math
import time

import keras
import numpy as np

from yolo3.engine.step import INPUT_WAIT_KEY
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

    def __init__(
        self, terms=("loss", "xy_loss", "wh_loss", "box_loss", "objectness_loss", "class_loss")
    ):
        super().__init__()
        self.terms = terms
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

    Args:
        global_batch_size: images per step over all replicas and workers.
        every: steps between lines (None: by time only).
        seconds: seconds between lines (0: by steps only).
    """

    def __init__(self, global_batch_size, *, every=None, seconds=DEFAULT_SECONDS, log=print):
        super().__init__()
        self.global_batch_size = int(global_batch_size)
        self.interval = Interval(every, seconds)
        self.log = log

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.started = self.mark = time.monotonic()
        self.marked_step = 0
        self.interval.restart(0)

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if not self.interval.due(step):
            return
        now = time.monotonic()
        seconds_per_step = (now - self.mark) / max(step - self.marked_step, 1)
        self.mark, self.marked_step = now, step
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        parts = []
        if logs and "loss" in logs:
            parts.append(f"loss {float(logs['loss']):.4f}")
        if seconds_per_step > 0:
            parts.append(f"{self.global_batch_size / seconds_per_step:.1f} images/s")
        if steps and epochs:
            left = (steps - step) + (epochs - self.epoch - 1) * steps
            parts.append(f"{format_duration(left * seconds_per_step)} left")
        self.log(f"epoch {self.epoch + 1}{_of(epochs)} step {step}{_of(steps)}: {', '.join(parts)}")

    def on_epoch_end(self, epoch, logs=None):
        first = ("loss", "val_loss")  # then the rest by name
        names = sorted(
            logs or {}, key=lambda name: (first.index(name) if name in first else 2, name)
        )
        values = ", ".join(f"{name} {_figure(logs[name])}" for name in names)
        elapsed = format_duration(time.monotonic() - self.started)
        epochs = self.params.get("epochs")
        self.log(f"epoch {epoch + 1}{_of(epochs)} done in {elapsed}: {values}")


def _of(total):
    return f"/{total}" if total else ""


def _figure(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.6g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.4f}"
