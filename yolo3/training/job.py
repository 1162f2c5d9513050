"""The training job behind ``yolo3 train``: configuration, then the steps of a run.

One code path for every layout: a CPU, one GPU, ``--gpus N`` (MirroredStrategy),
``--cpu-replicas N`` (the same multi-device path on logical CPUs) and several machines
(MultiWorkerMirroredStrategy from ``TF_CONFIG`` or Slurm). Only the strategy differs.
:func:`run` lists the steps; each is a builder of :mod:`yolo3.engine.builders` (strategy,
data, resolved settings, trainer, datasets) or :mod:`yolo3.training.hooks` (the callbacks),
then :func:`fit`.

Folder layout under ``--log-dir``::

    config.json                the resolved configuration (written by the chief)
    mlflow_run.json            with --mlflow: the MLflow run a resumed run continues
    checkpoints/               template weights (last, best, every k) and the full state
    backup/worker-N/           each worker's two newest backups, deleted when training ends
    tensorboard/               loss terms, learning rate, images/s (chief only)
"""

import contextlib
import dataclasses
import json
import os
import time

import keras
import tensorflow as tf

from yolo3 import callbacks as yolo_callbacks
from yolo3 import faults, fileio
from yolo3.callbacks.evaluation import FITNESS_TEXT
from yolo3.checkpoint.weights import read_metadata
from yolo3.data import pipeline as yolo_data
from yolo3.data import records
from yolo3.distributed import devices
from yolo3.distributed import strategy as distribute
from yolo3.engine import builders, resume
from yolo3.engine.builders import anchors_file, gpus_in_use
from yolo3.engine.config import TrainConfig
from yolo3.model.resources import read_anchors
from yolo3.progress import resolve as resolve_progress
from yolo3.text import plural
from yolo3.training.hooks import build_backup, build_hooks, build_tracking

PRECISIONS = {"off": None, "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


class XlaCompileError(RuntimeError):
    """The train step did not compile with XLA; ``--jit-compile off`` avoids it."""


class CollectiveError(faults.RunFailed):
    """A multi-worker collective failed or timed out: a worker died or is unreachable."""


@dataclasses.dataclass
class TrainResult:
    history: dict
    epochs_done: int
    checkpoint_dir: str
    global_batch_size: int
    num_replicas: int
    is_chief: bool
    stopped_reason: str | None = None
    throughput: list = dataclasses.field(default_factory=list)
    trainer: object = None  # the YoloTrainer; trainer.body is the template model
    preempted_at: tuple | None = None  # (epoch, optimizer step) a stop request ended it at


def configure(config):
    """Device layout and precision; must run before TensorFlow initialises its devices.

    Returns the precision in force: ``"off"``, ``"float16"`` or ``"bfloat16"``.
    """
    distribute.configure_devices(
        gpus=config.gpus, cpu_replicas=config.cpu_replicas, memory_growth=config.memory_growth
    )
    precision = devices.choose_precision(config.mixed_precision, gpus_in_use(config))
    keras.mixed_precision.set_global_policy(PRECISIONS[precision] or "float32")
    return precision


def run(config, *, log=print, started=None):
    """Trains as ``config`` says. :func:`configure` must have run first.

    ``started``: ``time.perf_counter()`` when the command began (``--time`` counts from it;
    default: now).

    Returns:
        A :class:`TrainResult`.

    Raises:
        RunFailed: the run started and could not go on (a full disk, a damaged record
            shard, a lost worker: :mod:`yolo3.faults`); the backups written so far
            stay for the same command to continue from.
    """
    # Any write may find the disk full (config, TensorBoard, checkpoints, backups).
    with faults.out_of_space_fails(config.log_dir):
        return _run(config, log=log, started=started)


def _run(config, *, log, started=None):
    started = time.perf_counter() if started is None else started
    keras.utils.set_random_seed(config.seed)
    strategy, info = builders.build_strategy(config)
    data = builders.read_data(config)
    # With --weights, the defaults follow whether their heads fit the data.
    config = builders.with_recipe(config, data, log)
    setup = builders.resolve_setup(config, strategy, info, data)
    if config.resume:
        saved = resume.read_saved(config.log_dir)
        resume.check_resumed(saved, dataclasses.asdict(config), setup.resolved, log=log)
    # The chief's MLflow run (--mlflow), opened before any work: MLflow missing or its server
    # unreachable ends the run here, in one line. A failure after this ends the MLflow run too.
    tracking = build_tracking(config, setup, log)
    with tracking if tracking is not None else contextlib.nullcontext():
        return _train(config, strategy, setup, tracking, started, log)


def _train(config, strategy, setup, tracking, started, log):
    """The steps of :func:`run` after the settings: the trainer, its state, the data, the
    callbacks, ``fit`` and the end."""
    info = setup.info
    if info.is_chief:  # after the MLflow run's line, which opens the log when there is one
        log(validation_line(setup.data))
    trainer = builders.build_trainer(config, setup, strategy, log)
    initial_epoch = 0
    if config.resume:
        initial_epoch = builders.restore_state(trainer, setup.checkpoint_dir, log)
    datasets = builders.build_datasets(config, setup, strategy, log)
    trainer.measure_input_wait()
    progress = resolve_progress(config.progress)
    if info.is_chief:
        _write_config(config, setup)
    backup = build_backup(config, setup, trainer, log)
    # Every worker takes part, with or without backups of its own: they agree on a step.
    position = backup.restore(trainer, strategy)
    if position is not None:
        initial_epoch = position.epoch
    hooks = build_hooks(
        config,
        setup,
        trainer,
        backup,
        progress=progress,
        log=log,
        tracking=tracking,
        started=started,
        mosaic=datasets.mosaic,
    )
    if position is not None and position.epoch >= config.epochs and not position.batch:
        _checkpoints_from_backup(hooks, trainer, position.epoch, log)
    skip_steps = position.batch if position is not None else 0
    verbose = progress == "bar" and info.is_chief
    history = fit(config, setup, trainer, datasets, hooks, initial_epoch, skip_steps, verbose)
    return _finish(config, setup, trainer, hooks, history, initial_epoch, started, log)


def validation_line(data):
    """Where a run's validation images come from and how many (:class:`RunData` ``data``)."""
    if data.val_source is None:
        return (
            f"validation: none; {data.record_set} has no validation split (yolo3 preprocess "
            "--val-fraction F holds one out) and no --val-records was given: the best weights "
            "are picked by the training loss"
        )
    record_set, split = data.val_source
    counts = record_set.manifest["splits"][split]
    images = counts.get("images", counts.get("records", "?"))  # a set older than the count
    origin = record_set.manifest.get("validation", {}).get("text")
    images = plural(images, "image") if isinstance(images, int) else f"{images} images"
    return f"validation: {images}, the {split} split of {record_set}" + (
        f" ({origin})" if origin else ""
    )


def _write_config(config, setup):
    """``config.json``: the flags and the settings the run resolved (the chief writes it)."""
    os.makedirs(config.log_dir, exist_ok=True)
    fileio.remove_temporaries(config.log_dir)  # a killed run's unfinished write
    fileio.write_json(
        os.path.join(config.log_dir, "config.json"),
        {**dataclasses.asdict(config), "resolved": setup.resolved},
    )


def _checkpoints_from_backup(hooks, trainer, epoch, log):
    """A backup at the planned end: the run stopped after it, before or while writing that
    epoch's checkpoints (a full disk, a kill, a stop request at the last step). Nothing is
    left to train and the end of this run deletes the backup: write them from it first."""
    checkpoint = next(
        c for c in hooks.callbacks if isinstance(c, yolo_callbacks.TemplateCheckpoint)
    )
    checkpoint.save_restored(trainer, epoch)
    log(f"checkpoints of epoch {epoch} written from its backup")


def fit(config, setup, trainer, datasets, hooks, first_epoch, skip_steps, verbose):
    """Trains from ``first_epoch`` to ``config.epochs``; returns the Keras history.

    ``skip_steps``: the steps of ``first_epoch`` a mid-epoch backup has done; the rest of that
    epoch is trained first, then whole epochs.

    Raises:
        CollectiveError: a collective with the other workers failed (multi-worker only).
        RunFailed: a record shard is damaged (:func:`yolo3.faults.damaged_record`).
        XlaCompileError: the train step did not compile with XLA.
    """

    def fit_epochs(first, last, steps_per_epoch):
        return trainer.fit(
            datasets.train,
            epochs=last,
            initial_epoch=first,
            steps_per_epoch=steps_per_epoch,
            validation_data=datasets.val,
            validation_steps=datasets.val_steps,
            callbacks=hooks.callbacks,
            shuffle=False,  # the pipeline shuffles; Keras cannot shuffle a dataset
            verbose=1 if verbose else 0,
        ).history

    history = {}
    with _faults_named(setup), hooks.preemption.installed():
        first = first_epoch
        if skip_steps and first < config.epochs:
            _extend(history, fit_epochs(first, first + 1, setup.steps - skip_steps))
            first += 1
        if first < config.epochs and not trainer.stop_training:
            _extend(history, fit_epochs(first, config.epochs, setup.steps))
        if hooks.preemption.stopped_at is not None:
            # Each worker wrote its backup of the stop step before leaving fit; none exits
            # before all have, or a scheduler that ends a job's tasks once one exits
            # (srun -K) could end another mid-write, and the job resume a step earlier.
            distribute.barrier(trainer.distribute_strategy)
    return history


@contextlib.contextmanager
def _faults_named(setup):
    """Raises TensorFlow's errors under way as errors that say what failed and what to do."""
    info = setup.info
    try:
        yield
    except _COLLECTIVE_FAILURES as error:
        if info.num_workers == 1:
            raise
        raise CollectiveError(
            f"worker {info.worker_index}: a collective with the other workers failed "
            f"({type(error).__name__}: {_cause(error)}); a worker died or cannot be reached. "
            "Each worker's backups hold its last saved steps: start the same command on every "
            "worker again to resume"
        ) from error
    except (tf.errors.DataLossError, tf.errors.NotFoundError) as error:
        # TensorFlow names neither the shard nor the record: reading the sets again does.
        for source in setup.data.record_sets:
            damage = records.find_damage(source)
            if damage:
                raise faults.damaged_record(damage, source.directory) from error
        raise
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        if not setup.jit_compile or "XLA" not in str(error):
            raise
        first_line = next((line for line in str(error).splitlines() if "XLA" in line), "")
        raise XlaCompileError(
            f"XLA could not compile the train step ({first_line.strip()}); rerun with "
            "--jit-compile off"
        ) from error


def _finish(config, setup, trainer, hooks, history, initial_epoch, started, log):
    """Ends a run: its backup deleted unless a stop request ended it, the closing lines
    logged; returns its :class:`TrainResult`."""
    preemption, info = hooks.preemption, setup.info
    epochs_done = initial_epoch + len(history.get("loss", []))
    if preemption.stopped_at is not None:
        epochs_done = preemption.stopped_at[0]  # the epoch under way did not finish
    else:
        # Finished, or stopped on its own (early stopping, a non-finite loss): nothing
        # to resume from.
        hooks.backup.remove()
    log(f"trained to epoch {epochs_done} in {time.perf_counter() - started:.1f} s")
    if info.is_chief and preemption.stopped_at is None:
        _final_report(config, hooks.evaluation, log)
        for line in _summary(config, setup.checkpoint_dir):
            log(line)
    if hooks.tracking is not None:
        # KILLED: stopped on request, and the same command continues the MLflow run.
        status = "KILLED" if preemption.stopped_at is not None else "FINISHED"
        hooks.tracking.finish("FAILED" if hooks.nonfinite.message else status)
    return TrainResult(
        history=history,
        epochs_done=epochs_done,
        checkpoint_dir=setup.checkpoint_dir,
        global_batch_size=setup.global_batch,
        num_replicas=setup.replicas,
        is_chief=info.is_chief,
        stopped_reason=hooks.nonfinite.message,
        throughput=hooks.throughput.history,
        trainer=trainer,
        preempted_at=preemption.stopped_at,
    )


def _final_report(config, evaluation, log):
    """The last AP pass's report in ``<log_dir>/val``: metrics, per-class PR curves, the
    gallery and the confusion matrix (:func:`yolo3.evaluation.validate.write_report`)."""
    if evaluation is None or evaluation.latest is None:
        return
    from yolo3.evaluation import validate  # noqa: PLC0415 - pulls in pycocotools and plots

    folder = os.path.join(config.log_dir, "val")
    validate.write_report(evaluation.latest, folder)
    epoch = evaluation.history[-1][0]
    log(
        f"validation report of epoch {epoch}: {folder} (metrics.json, confusion_matrix.png, "
        "pr/, gallery.png); results.csv and results.png in " + config.log_dir
    )


def _summary(config, checkpoint_dir):
    """The lines that end a run: the best epoch, where the weights are, what to run next."""
    last = os.path.join(checkpoint_dir, yolo_callbacks.LAST)
    best = os.path.join(checkpoint_dir, yolo_callbacks.BEST)
    if not os.path.exists(last):
        return []  # no epoch finished with a finite loss
    chosen, validated, lines = last, False, []
    if os.path.exists(best):
        saved = read_metadata(best) or {}
        logs = saved.get("logs", {})
        validated = "val_loss" in logs
        keys = (yolo_callbacks.AP_KEY, yolo_callbacks.AP50_KEY, "val_loss")
        figures = [f"{key} {logs[key]:.4g}" for key in keys if key in logs]
        if yolo_callbacks.FITNESS_KEY in logs:
            how = f"picked by {FITNESS_TEXT} on the validation images"
        elif validated:
            how = "picked by the validation loss (no AP measured: --map-every 0)"
        else:
            how = "picked by the training loss: no validation split"
            figures = [f"training loss {logs['loss']:.4g}"] if "loss" in logs else []
        lines.append(f"best epoch {saved.get('epoch')}: {', '.join(figures)} ({how})")
        lines.append(f"weights: {best} (best), {last} (last)")
        chosen = best
    else:
        lines.append(f"weights: {last}")
    output = os.path.join(config.log_dir, "detect")
    lines.append(f"next: yolo3 detect --weights {chosen} --output {output} IMAGES_OR_FOLDERS")
    if validated:
        # The best epoch was picked by its loss on the validation images: its mAP there
        # would read high. The last epoch's weights were picked by nothing.
        lines.append(f"      yolo3 evaluate --weights {last} --records {config.records}")
        lines.append(f"      (the last weights: {yolo_callbacks.BEST} was picked on these images)")
    return lines


def _extend(history, more):
    for key, values in more.items():
        history.setdefault(key, []).extend(values)


# What a collective raises when another worker died, froze or cannot be reached.
_COLLECTIVE_FAILURES = (
    tf.errors.DeadlineExceededError,
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


def _cause(error):
    """The line of a collective's error that says what happened, not TensorFlow's header
    ("Graph execution error:") or the trace of where the op was defined."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        lowered = line.lower()
        if any(word in lowered for word in ("heartbeat", "deadline", "timed out", "unhealthy")):
            return line[:300]
    for line in lines:
        # "Collective ops is aborted by: " once for every worker the failure passed through;
        # what is left is where it started.
        started = line.rpartition("aborted by:")[2].strip()
        if "aborted by:" in line and started:
            return started[:300]
    generic = ("Graph execution error:", "Detected at node", "File ", "Collective ops is aborted")
    meaningful = [line for line in lines if not line.startswith(generic)]
    return (meaningful or lines or ["no message"])[0][:300]


def read_config(path):
    """The TrainConfig saved in ``config.json`` (its ``resolved`` part dropped)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data.pop("resolved", None)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in data.items() if k in fields})


def test_io(config, *, seconds, log=print):
    """Reads the training pipeline alone for ``seconds`` and prints images/s (``--test-io``).

    Compare with the images/s of ``--benchmark`` (training without input cost): when the
    pipeline alone is not well above it, training is input-bound.
    """
    data = builders.RunData(
        records.open_record_set(config.records), None, read_anchors(anchors_file(config))
    )
    dataset = builders.train_records(config, data)
    figures = yolo_data.measure_throughput(dataset, seconds=seconds)
    log(
        f"input pipeline alone: {figures['images_per_second']:.1f} images/s "
        f"({figures['batches']} batches of {config.batch_size} in {figures['seconds']:.1f} s)"
    )
    return 0
