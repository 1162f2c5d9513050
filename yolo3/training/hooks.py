"""The callbacks a training run is fitted with, built in the order they must run.

The last builders of :func:`yolo3.training.job.run` (see :mod:`yolo3.engine.builders`):
:func:`build_tracking` (the chief's MLflow run, opened before any work), :func:`build_backup`
(this worker's backups, restored from before the callbacks are built) and :func:`build_hooks`
(the stop flag, the preemption handler and every callback).
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
    callbacks, throughput, nonfinite, evaluation = build_callbacks(
        config,
        setup,
        progress=progress,
        trainer=trainer,
        monitor=loss_monitor(setup),
        backup=backup,
        preemption=preemption,
        log=log,
        tracking=tracking,
        started=started,
        mosaic=mosaic,
    )
    return Hooks(callbacks, throughput, nonfinite, preemption, backup, tracking, evaluation)


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


def build_callbacks(
    config,
    setup,
    *,
    progress,
    trainer,
    monitor,
    backup,
    preemption,
    log,
    tracking=None,
    started=None,
    mosaic=None,
):
    """The callbacks of a run, in the order they must see each epoch's logs, and those the
    run reads itself: ``(callbacks, throughput, nonfinite, evaluation)``.

    Loggers that add to the logs (throughput, learning rate, mAP) come before TensorBoard,
    MLflow (``tracking``) and the checkpoints, which record them.
    """
    body, info, metadata = trainer.body, setup.info, setup.metadata
    # Keras's progress bar is mid-line when epoch-end callbacks run: start a line of our own.
    # In lines mode the epoch's line carries images/s and the input wait already.
    epoch_log = {"bar": lambda message: log(f"\n{message}"), "off": log}.get(progress)
    throughput = yolo_callbacks.Throughput(
        setup.global_batch, log=epoch_log if info.is_chief else None
    )
    nonfinite = yolo_callbacks.StopOnNonFinite()
    # First: the communication's (local steps synchronise before anything reads or saves
    # the weights).
    advice = log if info.is_chief else None
    ordered = [*trainer.communication.callbacks(backup, log=advice), preemption]
    # Before the backup and the checkpoints: an epoch read from changed shards saves nothing.
    ordered.append(yolo_callbacks.RecordSetCheck(setup.data.record_sets))
    if config.freeze_body:
        names = frozen_layer_names(body, setup.head.model_type, config.freeze_body)
        ordered.append(yolo_callbacks.FreezeSchedule(body, names, config.freeze_epochs, log=log))
    ordered += [throughput, yolo_callbacks.LearningRateLogger(), nonfinite]
    map_source, map_evaluation = setup.data.val_source, None
    if config.map_every != 0 and map_source and info.is_chief:
        map_evaluation = yolo_callbacks.MapEvaluation(
            body,
            map_source[0],
            split=map_source[1],
            head=setup.head,
            every=config.map_every,
            tensorboard_dir=os.path.join(config.log_dir, "tensorboard"),
            log=log,
            status=trainer.status,
            averaged=trainer.averaged_weights,
        )
        ordered.append(map_evaluation)
    budget = None  # with --time: the plan, which the progress lines count too
    if config.time:
        strategy = trainer.distribute_strategy
        budget = yolo_callbacks.TimeBudget(
            config.time * 60.0,
            started=started,
            steps_per_epoch=setup.steps,
            max_epochs=config.epochs,
            planned=trainer.planned_steps,
            broadcast=lambda variables: distribute.broadcast_from_chief(strategy, variables),
            scales=setup.scales,
            log=log if info.is_chief else None,
        )
    if progress == "lines" and info.is_chief:
        ordered.append(
            yolo_callbacks.ProgressLines(
                setup.global_batch,
                every=config.log_every,
                seconds=config.log_seconds,
                log=log,
                budget=budget,
            )
        )
    if info.is_chief:
        ordered.append(
            keras.callbacks.TensorBoard(
                os.path.join(config.log_dir, "tensorboard"), update_freq="epoch"
            )
        )
    if tracking is not None:
        tracking.attach(trainer.status, map_evaluation)
        ordered.append(tracking)
    best_key, best_mode = best_monitor(config, setup)
    ordered += [
        backup,
        yolo_callbacks.TemplateCheckpoint(
            setup.checkpoint_dir,
            body,
            worker=info,
            every=config.checkpoint_every,
            monitor=best_key,
            mode=best_mode,
            metadata=metadata,
            status=trainer.status,
            averaged=trainer.averaged_weights,
        ),
    ]
    if info.is_chief:  # after the epoch's backup and checkpoints: its clock includes them
        history = yolo_callbacks.EpochHistory(
            config.log_dir, started=started, evaluation=map_evaluation
        )
        # results.csv and results.png from the history just written.
        ordered += [history, yolo_callbacks.ResultsFiles(config.log_dir, history=history)]
    if budget is not None:
        ordered.append(budget)
    if mosaic is not None:
        ordered.append(
            yolo_callbacks.CloseMosaic(
                mosaic,
                epochs=config.epochs,
                close=config.close_mosaic,
                budget=budget,
                log=log if info.is_chief else None,
            )
        )
    if config.reduce_lr_patience:
        ordered.append(
            yolo_callbacks.PlateauScale(
                trainer.lr_scale, monitor=monitor, patience=config.reduce_lr_patience, log=log
            )
        )
    if config.early_stopping_patience:
        ordered.append(
            keras.callbacks.EarlyStopping(
                monitor=monitor, patience=config.early_stopping_patience, verbose=1
            )
        )
    return ordered, throughput, nonfinite, map_evaluation
