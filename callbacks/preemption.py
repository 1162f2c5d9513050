"""Clean preemption: SIGTERM makes the whole job stop after one step, at the same step.

Slurm (``scancel``, the end of a time limit with ``--signal``), Kubernetes (pod deletion)
and spot machines send SIGTERM and wait a grace period before SIGKILL. On SIGTERM this
callback asks the job to stop: the trainer carries the request through the next step's
collective logs (``YoloTrainer.attach_stop_flag``), so every worker, also those that got no
signal, sees it after the same step, writes its backup at that step (``WorkerBackup``) and
leaves ``fit``. ``yolo3 train`` then exits with :data:`PREEMPTED_STATUS`, and the same command
resumes from that step.

``tf.distribute.experimental.PreemptionCheckpointHandler`` does the agreement through the
coordination service, but it saves and restores ``tf.train.Checkpoint`` objects and wraps
the training loop itself; with Keras 3's ``fit`` and our per-worker weight files the
step-log route needs nothing more than the collective every step already makes.
"""

import contextlib
import signal
import threading

import keras
import tensorflow as tf

# 128 + SIGTERM, as a shell reports a process ended by it. Kubernetes' TFJob treats exit
# codes 128-255 as retryable, and Slurm requeues on any failure with --requeue.
PREEMPTED_STATUS = 143


class Preemption(keras.callbacks.Callback):
    """Turns SIGTERM (and any of ``signals``) into a stop after the next step, job-wide.

    Args:
        flag: the float32 ``tf.Variable`` given to ``YoloTrainer.attach_stop_flag``.
        signals: the signals that ask for a stop.
        log: a print-like function.
        status: the trainer's :class:`TrainingStatus`, whose ``stop_requested`` says that
            the job agreed to stop.

    Use :meth:`installed` around ``fit`` (signal handlers belong to the main thread; from
    another thread nothing is installed and only :meth:`request` asks for a stop).
    ``stopped_at`` is the epoch and step the job stopped after, or None.
    """

    def __init__(self, flag, signals=(signal.SIGTERM,), log=None, *, status):
        super().__init__()
        self.flag = flag
        self.status = status
        self.signals = tuple(signals)
        self.log = log
        self.received = None
        self.stopped_at = None
        self._epoch = 0

    def request(self, signum=signal.SIGTERM, frame=None):
        """Asks for a stop (the signal handler)."""
        del frame
        self.received = signum

    @contextlib.contextmanager
    def installed(self):
        """A context manager: the signal handlers in place while it is open."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {signum: signal.signal(signum, self.request) for signum in self.signals}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.received is not None and not float(self.flag.numpy()):
            self.flag.assign(1.0)

    def on_train_batch_end(self, batch, logs=None):
        if not self.status.stop_requested or self.stopped_at is not None:
            return
        self.model.stop_training = True
        step = int(self.model.optimizer.iterations.value.numpy())
        self.stopped_at = (self._epoch, step)
        if self.log:
            who = (
                f"signal {signal.Signals(self.received).name} here"
                if self.received is not None
                else "another worker"
            )
            self.log(
                f"stop requested ({who}): stopping after optimizer step {step} in epoch "
                f"{self._epoch + 1}, with a backup at that step"
            )


def make_stop_flag():
    """The per-worker request variable (outside any strategy scope: a local value)."""
    return tf.Variable(0.0, dtype=tf.float32, trainable=False, name="stop_request")
