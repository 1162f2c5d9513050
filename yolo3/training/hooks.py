"""The callbacks a training run is fitted with, built in the order they must run.

The last builders of :func:`yolo3.training.job.run` (see :mod:`yolo3.engine.builders`):
:func:`build_tracking` (the chief's MLflow run, opened before any work), :func:`build_backup`
(this worker's backups, restored from before the callbacks are built) and :func:`build_hooks`
(the stop flag, the preemption handler and every callback).

The callbacks are :data:`HOOKS`, a table of builders in the order the callbacks must see
each epoch's end; each builder reads the run (:class:`HookContext`) and the hooks built
before it, and gives a callback or None. A new hook or tracker is one builder and one entry.
"""

import dataclasses
import os

import keras

from yolo3 import callbacks as yolo_callbacks
from yolo3.distributed import strategy as distribute
from yolo3.engine.trainer import frozen_layer_names


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The callbacks of a run, and those of them the run reads itself, in ``fit`` and after."""

    callbacks: list  # in the order they must see each epoch's logs
    throughput: yolo_callbacks.Throughput
    nonfinite: yolo_callbacks.StopOnNonFinite
    preemption: yolo_callbacks.Preemption
    backup: yolo_callbacks.WorkerBackup
    tracking: object = None  # the chief's yolo3.callbacks.mlflow_tracking.MlflowTracking
    evaluation: object = None  # the chief's yolo3.callbacks.MapEvaluation, if AP is measured


def build_tracking(config, setup, log):
    """With ``--mlflow``, on the chief: its :class:`yolo3.callbacks.mlflow_tracking.MlflowTracking`,
    whose MLflow run is open (a new one, or the one the log folder records); else None.

    MLflow is imported here and nowhere else in a training run, only when asked for.

    Raises:
        ValueError: MLflow is not installed, or its server cannot be reached.
    """
    if not config.mlflow or not setup.info.is_chief:
        return None
    from yolo3.callbacks import mlflow_tracking  # noqa: PLC0415 - only runs that track import it

    return mlflow_tracking.MlflowTracking.start(
        config, setup.resolved, checkpoint_dir=setup.checkpoint_dir, log=log
    )


def build_backup(config, setup, trainer, log):
    """This worker's :class:`yolo3.callbacks.WorkerBackup` (``--backup-every``)."""
    return yolo_callbacks.WorkerBackup(
        os.path.join(setup.backup_root, f"worker-{setup.info.worker_index}"),
        steps_per_epoch=setup.steps,
        every_steps=config.backup_every,
        log=log,
        status=trainer.status,
    )


def build_hooks(
    config, setup, trainer, backup, *, progress, log, tracking=None, started=None, mosaic=None
):
    """The run's :class:`Hooks`; a stop request (a signal, a preemption notice) ends it at a
    step that every worker agrees on. ``tracking``: :func:`build_tracking`'s; ``started``:
    ``time.perf_counter()`` at the run's start (``--time`` counts from it); ``mosaic``: the
    datasets' switch of mosaic records (``--close-mosaic``), or None."""
    stop_flag = yolo_callbacks.make_stop_flag()
    trainer.attach_stop_flag(stop_flag)
    preemption = yolo_callbacks.Preemption(stop_flag, log=log, status=trainer.status)
    run = HookContext(
        config, setup, trainer, progress, backup, preemption, log, tracking, started, mosaic
    )
    callbacks = build_callbacks(run)
    made = run.made
    return Hooks(
        callbacks,
        made["throughput"],
        made["nonfinite"],
        preemption,
        backup,
        tracking,
        made.get("ap"),
    )


def loss_monitor(setup):
    """The loss the learning-rate plateau and early stopping watch: the validation loss,
    else the training loss."""
    return "val_loss" if setup.data.val_source else "loss"


def best_monitor(config, setup):
    """``(log key, mode)`` that picks ``best.weights.h5``: the fitness of COCO AP where AP is
    measured (a validation split, ``--map-every`` not 0), else :func:`loss_monitor`'s."""
    if config.map_every != 0 and setup.data.val_source:
        return yolo_callbacks.FITNESS_KEY, "max"
    return loss_monitor(setup), "min"


@dataclasses.dataclass
class HookContext:
    """What the hook builders of :data:`HOOKS` read: the run's settings and parts, and
    ``made``, the callbacks the builders before them made, by their :data:`HOOKS` name."""

    config: object
    setup: object
    trainer: object
    progress: str
    backup: object
    preemption: object
    log: object
    tracking: object = None
    started: float | None = None
    mosaic: object = None
    made: dict = dataclasses.field(default_factory=dict)

    @property
    def chief(self):
        return self.setup.info.is_chief

    @property
    def chief_log(self):
        """``log`` on the chief, None on the other workers (one worker says it)."""
        return self.log if self.chief else None

    def time_budget(self):
        """With ``--time``: the run's :class:`yolo3.callbacks.TimeBudget`, made once (the
        progress lines count with it before it runs, after the checkpoints); else None."""
        if not self.config.time:
            return None
        if "time_budget" not in self.made:
            strategy = self.trainer.distribute_strategy
            self.made["time_budget"] = yolo_callbacks.TimeBudget(
                self.config.time * 60.0,
                started=self.started,
                steps_per_epoch=self.setup.steps,
                max_epochs=self.config.epochs,
                planned=self.trainer.planned_steps,
                broadcast=lambda variables: distribute.broadcast_from_chief(strategy, variables),
                scales=self.setup.scales,
                log=self.chief_log,
            )
        return self.made["time_budget"]


def _communication(run):
    # The communication's callbacks first: local steps synchronise before anything reads or
    # saves the weights.
    return run.trainer.communication.callbacks(run.backup, log=run.chief_log)


def _throughput(run):
    # Keras's progress bar is mid-line when epoch-end callbacks run: start a line of our own.
    # In lines mode the epoch's line carries images/s and the input wait already.
    epoch_log = {"bar": lambda message: run.log(f"\n{message}"), "off": run.log}.get(run.progress)
    return yolo_callbacks.Throughput(run.setup.global_batch, log=epoch_log if run.chief else None)


def _freeze(run):
    config = run.config
    if not config.freeze_body:
        return None
    body = run.trainer.body
    names = frozen_layer_names(body, run.setup.head.model_type, config.freeze_body)
    return yolo_callbacks.FreezeSchedule(body, names, config.freeze_epochs, log=run.log)


def _ap_pass(run):
    config, setup, trainer = run.config, run.setup, run.trainer
    source = setup.data.val_source
    if config.map_every == 0 or not source or not run.chief:
        return None
    return yolo_callbacks.MapEvaluation(
        trainer.body,
        source[0],
        split=source[1],
        head=setup.head,
        every=config.map_every,
        tensorboard_dir=os.path.join(config.log_dir, "tensorboard"),
        log=run.log,
        status=trainer.status,
        averaged=trainer.averaged_weights,
    )


def _progress_lines(run):
    if run.progress != "lines" or not run.chief:
        return None
    config = run.config
    return yolo_callbacks.ProgressLines(
        run.setup.global_batch,
        every=config.log_every,
        seconds=config.log_seconds,
        log=run.log,
        budget=run.time_budget(),
    )


def _tensorboard(run):
    if not run.chief:
        return None
    return keras.callbacks.TensorBoard(
        os.path.join(run.config.log_dir, "tensorboard"), update_freq="epoch"
    )


def _mlflow(run):
    if run.tracking is None:
        return None
    run.tracking.attach(run.trainer.status, run.made.get("ap"))
    return run.tracking


def _checkpoint(run):
    config, setup, trainer = run.config, run.setup, run.trainer
    key, mode = best_monitor(config, setup)
    return yolo_callbacks.TemplateCheckpoint(
        setup.checkpoint_dir,
        trainer.body,
        worker=setup.info,
        every=config.checkpoint_every,
        monitor=key,
        mode=mode,
        metadata=setup.metadata,
        status=trainer.status,
        averaged=trainer.averaged_weights,
    )


def _history(run):
    if not run.chief:  # after the epoch's backup and checkpoints: its clock includes them
        return None
    return yolo_callbacks.EpochHistory(
        run.config.log_dir, started=run.started, evaluation=run.made.get("ap")
    )


def _results(run):
    history = run.made.get("history")
    if history is None:
        return None
    return yolo_callbacks.ResultsFiles(run.config.log_dir, history=history)


def _close_mosaic(run):
    if run.mosaic is None:
        return None
    return yolo_callbacks.CloseMosaic(
        run.mosaic,
        epochs=run.config.epochs,
        close=run.config.close_mosaic,
        budget=run.time_budget(),
        log=run.chief_log,
    )


def _plateau(run):
    if not run.config.reduce_lr_patience:
        return None
    return yolo_callbacks.PlateauScale(
        run.trainer.lr_scale,
        monitor=loss_monitor(run.setup),
        patience=run.config.reduce_lr_patience,
        log=run.log,
    )


def _early_stopping(run):
    if not run.config.early_stopping_patience:
        return None
    return keras.callbacks.EarlyStopping(
        monitor=loss_monitor(run.setup), patience=run.config.early_stopping_patience, verbose=1
    )


@dataclasses.dataclass(frozen=True)
class HookEntry:
    """One hook of :data:`HOOKS`: its ``name`` (its key in :attr:`HookContext.made`) and
    ``build(run)``, giving a callback, a list of them, or None where the run has none."""

    name: str
    build: object


# Every hook of a run, in the order they see each epoch's end: loggers that add to the logs
# (throughput, learning rate, AP) before the trackers that record them (TensorBoard, MLflow,
# the checkpoints, history.jsonl, then results.csv and .png from it), the schedule last. A
# new hook or tracker is a builder and one entry here.
HOOKS = (
    HookEntry("communication", _communication),
    HookEntry("preemption", lambda run: run.preemption),
    # Before the backup and the checkpoints: an epoch read from changed shards saves nothing.
    HookEntry(
        "record_check", lambda run: yolo_callbacks.RecordSetCheck(run.setup.data.record_sets)
    ),
    HookEntry("freeze", _freeze),
    HookEntry("throughput", _throughput),
    HookEntry("learning_rate", lambda run: yolo_callbacks.LearningRateLogger()),
    HookEntry("nonfinite", lambda run: yolo_callbacks.StopOnNonFinite()),
    HookEntry("ap", _ap_pass),
    HookEntry("progress_lines", _progress_lines),
    HookEntry("tensorboard", _tensorboard),
    HookEntry("mlflow", _mlflow),
    HookEntry("backup", lambda run: run.backup),
    HookEntry("checkpoint", _checkpoint),
    HookEntry("history", _history),
    HookEntry("results", _results),
    HookEntry("time_budget", lambda run: run.time_budget()),
    HookEntry("close_mosaic", _close_mosaic),
    HookEntry("plateau", _plateau),
    HookEntry("early_stopping", _early_stopping),
)


def build_callbacks(run, hooks=HOOKS):
    """The callbacks of ``run`` (a :class:`HookContext`), each entry of ``hooks`` built in
    turn into ``run.made``, in the order they must see each epoch's logs."""
    ordered = []
    for entry in hooks:
        made = entry.build(run)
        if made is None:
            continue
        run.made[entry.name] = made
        ordered += made if isinstance(made, list) else [made]
    return ordered
