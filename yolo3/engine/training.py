"""The training job behind ``yolo3 train``: configuration, strategy, data, model, callbacks, fit.

One code path for every layout: a CPU, one GPU, ``--gpus N`` (MirroredStrategy),
``--cpu-replicas N`` (the same multi-device path on logical CPUs) and several machines
(MultiWorkerMirroredStrategy from ``TF_CONFIG`` or Slurm). Only the strategy differs.

Folder layout under ``--log-dir``::

    config.json                the resolved configuration (written by the chief)
    checkpoints/               template weights (last, best, every k) and the full state
    backup/worker-N/           each worker's two newest backups, deleted when training ends
    tensorboard/               loss terms, learning rate, images/s (chief only)
"""

import dataclasses
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from yolo3 import callbacks as yolo_callbacks
from yolo3 import fileio
from yolo3.checkpoint.weights import check_model_type, load_weights, read_metadata
from yolo3.comm.allreduce import communication_options
from yolo3.data import multiscale, records
from yolo3.data import pipeline as yolo_data
from yolo3.distributed import devices
from yolo3.distributed import strategy as distribute
from yolo3.engine import faults, resume
from yolo3.engine.config import TrainConfig
from yolo3.engine.trainer import (
    WarmupSchedule,
    YoloTrainer,
    frozen_layer_names,
    make_optimizer,
    scaled_learning_rate,
)
from yolo3.model.network import build_model
from yolo3.model.resources import (
    default_anchor_masks,
    model_type_for_anchors,
    read_anchors,
    shipped_anchors,
)
from yolo3.progress import resolve as resolve_progress

PRECISIONS = {"off": None, "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


def anchors_file(config):
    """The run's anchors file: ``config.anchors``, else the shipped one of its model type."""
    return config.anchors or shipped_anchors(config.model or "tiny")


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


def gpus_in_use(config):
    """The :class:`yolo3.distributed.devices.GpuInfo` of the GPUs this process trains on (empty:
    CPU)."""
    if config.cpu_replicas is not None or config.gpus == 0:
        return ()
    return devices.describe_gpus(config.gpus)


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


def _load_initial_weights(body, config, log):
    if not config.weights:
        return
    report = load_weights(body, config.weights, skip_mismatch=True)
    log(
        f"weights {config.weights}: {len(report['loaded'])} layers loaded, "
        f"{len(report['skipped'])} skipped, {len(report['missing'])} not in the file"
    )
    for name, reason in report["skipped"]:
        log(f"  skipped {name}: {reason}")


def _datasets(config, strategy, record_set, val_source, anchors, anchor_masks, num_classes):
    def train_fn(context):
        if config.benchmark:
            return yolo_data.synthetic_dataset(
                batch_size=config.batch_size,
                input_hw=record_set.input_hw,
                anchors=anchors,
                num_classes=num_classes,
                anchor_masks=anchor_masks,
                seed=config.seed + context.input_pipeline_id,
            )
        return _train_records(config, record_set, anchors, num_classes, anchor_masks, context)

    def val_fn(context):
        # Repeated, with a fixed step count: every worker must run the same number of
        # steps, or the collective ops of a multi-worker job wait forever.
        val_set, val_split = val_source
        return yolo_data.make_dataset(
            val_set,
            val_split,
            batch_size=config.batch_size,
            anchors=anchors,
            num_classes=num_classes,
            anchor_masks=anchor_masks,
            training=False,
            repeat=True,
            drop_remainder=True,
            input_context=context,
            targets=False,
        )

    train = strategy.distribute_datasets_from_function(train_fn)
    val = strategy.distribute_datasets_from_function(val_fn) if val_source else None
    return train, val


def _train_records(config, record_set, anchors, num_classes, anchor_masks=None, context=None):
    """The training split as the trainer reads it: uint8 images and padded boxes."""
    return yolo_data.make_dataset(
        record_set,
        "train",
        batch_size=config.batch_size,
        anchors=anchors,
        num_classes=num_classes,
        anchor_masks=anchor_masks,
        training=True,
        seed=config.seed,
        flip=config.flip,
        shuffle_buffer=config.shuffle_buffer,
        input_context=context,
        targets=False,  # built in the train step, on the accelerator
    )


def _validation_source(config, record_set):
    """``(RecordSet, split)`` to validate on, or None; each record set is opened once."""
    if config.val_records:
        val_set = records.open_record_set(config.val_records)
        return val_set, "val" if val_set.has_split("val") else "train"
    if record_set.has_split("val"):
        return record_set, "val"
    return None


def _accumulate_text(config):
    return f" x {config.accumulate} micro-batches" if config.accumulate > 1 else ""


def _sizes_text(scales):
    if scales is None:
        return "off"
    return f"{scales.sizes[0]}-{scales.sizes[-1]} ({len(scales.sizes)} sizes)"


def _check_fresh_log_dir(config, info, checkpoint_dir, backup_root):
    """A new run refuses a log folder holding another run; ``--resume`` continues it."""
    if config.resume:
        return
    has_backup = os.path.isdir(backup_root) and any(os.scandir(backup_root))
    state = yolo_callbacks.read_training_state(checkpoint_dir)
    if state is not None and not has_backup:
        raise ValueError(
            f"{config.log_dir} holds a finished or interrupted run (epoch "
            f"{state[1].get('epoch')}); pass --resume to continue it, or choose another --log-dir"
        )


def run(config, *, log=print):
    """Trains as ``config`` says. :func:`configure` must have run first.

    Returns:
        A :class:`TrainResult`.

    Raises:
        RunFailed: the run started and could not go on (a full disk, a damaged record
            shard, a lost worker: :mod:`yolo3.engine.faults`); the backups written so far
            stay for the same command to continue from.
    """
    # Any write may find the disk full (config, TensorBoard, checkpoints, backups).
    with faults.out_of_space_fails(config.log_dir):
        return _run(config, log=log)


def _run(config, *, log):
    started = time.perf_counter()
    progress = resolve_progress(config.progress)
    keras.utils.set_random_seed(config.seed)
    strategy = distribute.make_strategy(
        gpus=config.gpus,
        cpu_replicas=config.cpu_replicas,
        slurm_port_base=config.slurm_port_base or distribute.default_slurm_port_base(),
        communication=communication_options(config.bytes_per_pack, config.collective_timeout),
    )
    info = distribute.worker_info(strategy)
    replicas = strategy.num_replicas_in_sync
    # Images per optimizer step: the learning rate, steps per epoch and images/s use it.
    global_batch = config.batch_size * replicas * config.accumulate
    # Each record set's manifest is read once, here, and handed on as a RecordSet.
    record_set = records.open_record_set(config.records)
    val_source = _validation_source(config, record_set)
    classes = record_set.classes
    num_classes = len(classes)
    input_hw = record_set.input_hw
    anchors = read_anchors(anchors_file(config))
    model_type = config.model or model_type_for_anchors(len(anchors))
    if model_type != model_type_for_anchors(len(anchors)):
        raise ValueError(
            f"--model-type {model_type} needs {'9' if model_type == 'yolov3' else '6'} anchors; "
            f"{anchors_file(config)} has {len(anchors)}"
        )
    if config.weights:
        check_model_type(model_type, config.weights)  # before any model is built
    anchor_masks = default_anchor_masks(len(anchors))
    precision = keras.mixed_precision.global_policy().name
    # How gradients cross the network; refused here too when "auto" chose float16.
    communication = config.communication(precision)
    sync_bn = config.sync_bn
    if sync_bn is None:  # on where it adds no collective to a step that has none
        sync_bn = replicas > 1 and communication.all_reduces_in_step
    jit_compile = devices.choose_jit_compile(
        config.jit_compile, num_replicas=replicas, gpus=gpus_in_use(config)
    )

    checkpoint_dir = os.path.join(config.log_dir, "checkpoints")
    backup_root = os.path.join(config.log_dir, "backup")
    _check_fresh_log_dir(config, info, checkpoint_dir, backup_root)

    steps = config.steps_per_epoch or max(1, record_set.num_records("train") // global_batch)
    total_steps = steps * config.epochs
    scales = None
    if config.multi_scale:
        sizes = multiscale.parse_sizes(config.multi_scale, input_hw)
        scales = multiscale.ScaleSchedule(sizes, seed=config.seed, total_steps=total_steps)
    peak_lr = scaled_learning_rate(config.lr, global_batch, config.lr_reference_batch)
    # What config.json records beside the flags; a resumed run is checked against it.
    resolved = {
        "model": model_type,
        "classes": classes,
        "anchors": np.asarray(anchors).tolist(),
        "input_size": list(input_hw),
        "num_replicas": replicas,
        "num_workers": info.num_workers,
        "global_batch_size": global_batch,
        "peak_lr": peak_lr,
        "steps_per_epoch": steps,
        "sync_bn": sync_bn,
        "jit_compile": jit_compile,
        "multi_scale_sizes": list(scales.sizes) if scales else None,
        "precision": precision,
    }
    if config.resume:
        resume.check_resumed(
            resume.read_saved(config.log_dir), dataclasses.asdict(config), resolved, log=log
        )

    with strategy.scope():
        body = build_model(
            model_type,
            num_classes,
            input_size=None if scales else input_hw,  # multi-scale: any size
            weight_decay=config.weight_decay,
            synchronized_bn=sync_bn,
        )
        # After the model is built: the line gives the bytes of its all-reduce.
        log(
            f"{model_type} {input_hw[0]}x{input_hw[1]}, {num_classes} classes; "
            f"{replicas} replicas x {config.batch_size}{_accumulate_text(config)} = global "
            f"batch {global_batch}; all-reduce {communication.describe(body)}; "
            f"{steps} steps/epoch; peak lr {peak_lr:.3g} ({config.optimizer}); "
            f"sync BN {'on' if sync_bn else 'off'}; XLA {'on' if jit_compile else 'off'}; "
            f"precision {precision}; remat {config.remat}; "
            f"multi-scale {_sizes_text(scales)}; "
            f"worker {info.worker_index + 1}/{info.num_workers}"
        )
        _load_initial_weights(body, config, log)
        trainer = YoloTrainer(
            body,
            anchors=anchors,
            num_classes=num_classes,
            anchor_masks=anchor_masks,
            ignore_thresh=config.ignore_thresh,
            remat=config.remat,
            multi_scale=scales,
            accumulate=config.accumulate,
            communication=communication,
        )
        lr_schedule = WarmupSchedule(
            peak_lr,
            warmup_steps=round(config.warmup_epochs * steps),
            total_steps=total_steps,
            kind=config.lr_schedule,
            scale=trainer.lr_scale,
        )
        optimizer = make_optimizer(config.optimizer, lr_schedule, momentum=config.momentum)
        trainer.compile(optimizer=optimizer, jit_compile=jit_compile)
        trainer.build((None, *input_hw, 3))
        # Built for every variable before any freezing, so unfreezing later and restoring
        # a backup find the slots they expect.
        trainer.optimizer.build(trainer.trainable_variables)

    initial_epoch = 0
    if config.resume:
        initial_epoch = _restore_state(trainer, checkpoint_dir, log)

    train_data, val_data = _datasets(
        config, strategy, record_set, val_source, anchors, anchor_masks, num_classes
    )
    val_steps = None
    if val_data is not None:
        val_records = val_source[0].num_records(val_source[1])
        eval_batch = config.batch_size * replicas  # no micro-batches in validation
        val_steps = max(1, val_records // eval_batch)
        if val_records < eval_batch:
            log(
                f"validation: {val_records} images, under one global batch of {eval_batch}; "
                "each pass repeats some of them"
            )
        elif val_records % eval_batch:
            log(
                f"validation: {val_steps * eval_batch} of {val_records} images per pass "
                f"(whole global batches of {eval_batch})"
            )

    clock = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    trainer.attach_input_clock(clock)
    metadata = {
        "model_type": model_type,
        "num_classes": num_classes,
        "classes": classes,
        "anchors": np.asarray(anchors).tolist(),
        "anchor_masks": [list(mask) for mask in anchor_masks],
        "input_size": list(input_hw),
    }
    if info.is_chief:
        os.makedirs(config.log_dir, exist_ok=True)
        fileio.write_json(
            os.path.join(config.log_dir, "config.json"),
            {**dataclasses.asdict(config), "resolved": resolved},
        )
    monitor = "val_loss" if val_data is not None else "loss"
    backup = yolo_callbacks.WorkerBackup(
        os.path.join(backup_root, f"worker-{info.worker_index}"),
        steps_per_epoch=steps,
        every_steps=config.backup_every,
        log=log,
        status=trainer.status,
    )
    # Every worker takes part, with or without backups of its own: they agree on a step.
    position = backup.restore(trainer, strategy)
    if position is not None:
        initial_epoch = position.epoch
    stop_flag = yolo_callbacks.make_stop_flag()
    trainer.attach_stop_flag(stop_flag)
    preemption = yolo_callbacks.Preemption(stop_flag, log=log, status=trainer.status)
    callback_list, throughput, nonfinite = _callbacks(
        config,
        progress=progress,
        trainer=trainer,
        info=info,
        model_type=model_type,
        metadata=metadata,
        clock=clock,
        global_batch=global_batch,
        monitor=monitor,
        checkpoint_dir=checkpoint_dir,
        map_source=val_source,
        backup=backup,
        preemption=preemption,
        log=log,
    )
    if position is not None and position.epoch >= config.epochs and not position.batch:
        # A backup at the planned end: the run stopped after it, before or while writing
        # that epoch's checkpoints (a full disk, a kill, a stop request at the last step).
        # Nothing is left to train and the end of this run deletes the backup: write them
        # from it first.
        checkpoint = next(
            c for c in callback_list if isinstance(c, yolo_callbacks.TemplateCheckpoint)
        )
        checkpoint.save_restored(trainer, position.epoch)
        log(f"checkpoints of epoch {position.epoch} written from its backup")

    def fit(first_epoch, last_epoch, steps_per_epoch):
        return trainer.fit(
            train_data,
            epochs=last_epoch,
            initial_epoch=first_epoch,
            steps_per_epoch=steps_per_epoch,
            validation_data=val_data,
            validation_steps=val_steps,
            callbacks=callback_list,
            shuffle=False,  # the pipeline shuffles; Keras cannot shuffle a dataset
            verbose=1 if progress == "bar" and info.is_chief else 0,
        ).history

    history = {}
    try:
        with preemption.installed():
            first = initial_epoch
            if position is not None and position.batch and first < config.epochs:
                # A mid-epoch backup: the rest of that epoch first, then whole epochs.
                _extend(history, fit(first, first + 1, steps - position.batch))
                first += 1
            if first < config.epochs and not trainer.stop_training:
                _extend(history, fit(first, config.epochs, steps))
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
        sources = [record_set]
        if val_source and val_source[0] is not record_set:
            sources.append(val_source[0])
        for source in sources:
            damage = records.find_damage(source)
            if damage:
                raise faults.damaged_record(damage, source.directory) from error
        raise
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        if not jit_compile or "XLA" not in str(error):
            raise
        first_line = next((line for line in str(error).splitlines() if "XLA" in line), "")
        raise XlaCompileError(
            f"XLA could not compile the train step ({first_line.strip()}); rerun with "
            "--jit-compile off"
        ) from error
    epochs_done = initial_epoch + len(history.get("loss", []))
    if preemption.stopped_at is not None:
        epochs_done = preemption.stopped_at[0]  # the epoch under way did not finish
    else:
        # Finished, or stopped on its own (early stopping, a non-finite loss): nothing
        # to resume from.
        backup.remove()
    log(f"trained to epoch {epochs_done} in {time.perf_counter() - started:.1f} s")
    if info.is_chief and preemption.stopped_at is None:
        for line in _summary(config, checkpoint_dir):
            log(line)
    return TrainResult(
        history=history,
        epochs_done=epochs_done,
        checkpoint_dir=checkpoint_dir,
        global_batch_size=global_batch,
        num_replicas=replicas,
        is_chief=info.is_chief,
        stopped_reason=nonfinite.message,
        throughput=throughput.history,
        trainer=trainer,
        preempted_at=preemption.stopped_at,
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
        figures = [f"{key} {logs[key]:.4g}" for key in ("val_loss", "val_mAP50") if key in logs]
        if not validated and "loss" in logs:
            figures = [f"training loss {logs['loss']:.4g} (no validation split)"]
        lines.append(f"best epoch {saved.get('epoch')}: {', '.join(figures)}")
        lines.append(f"weights: {best} (best), {last} (last)")
        chosen = best
    else:
        lines.append(f"weights: {last}")
    output = os.path.join(config.log_dir, "detect")
    lines.append(f"next: yolo3 detect --weights {chosen} --output {output} IMAGES_OR_FOLDERS")
    if validated:
        lines.append(f"      yolo3 evaluate --weights {chosen} --records {config.records}")
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
    """The line of a collective's error that says what happened (not the traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        lowered = line.lower()
        if any(word in lowered for word in ("heartbeat", "deadline", "timed out", "unhealthy")):
            return line[:300]
    return lines[0][:300] if lines else "no message"


def _callbacks(
    config, *, progress, trainer, info, model_type, metadata, clock, global_batch, monitor,
    checkpoint_dir, map_source, backup, preemption, log,
):  # fmt: skip
    """The callbacks of a run, in the order they must see each epoch's logs.

    Loggers that add to the logs (throughput, learning rate, mAP) come before TensorBoard
    and the checkpoints, which record them.
    """
    body = trainer.body
    # Keras's progress bar is mid-line when epoch-end callbacks run: start a line of our own.
    # In lines mode the epoch's line carries images/s and the input wait already.
    epoch_log = {"bar": lambda message: log(f"\n{message}"), "off": log}.get(progress)
    throughput = yolo_callbacks.Throughput(
        global_batch, clock, log=epoch_log if info.is_chief else None
    )
    nonfinite = yolo_callbacks.StopOnNonFinite()
    # First: the communication's (local steps synchronise before anything reads or saves
    # the weights).
    ordered = [*trainer.communication.callbacks(backup), preemption]
    if config.freeze_body:
        names = frozen_layer_names(body, model_type, config.freeze_body)
        ordered.append(yolo_callbacks.FreezeSchedule(body, names, config.freeze_epochs, log=log))
    ordered += [throughput, yolo_callbacks.LearningRateLogger(), nonfinite]
    if config.map_every and map_source and info.is_chief:
        ordered.append(
            yolo_callbacks.MapEvaluation(
                body,
                map_source[0],
                split=map_source[1],
                anchors=metadata["anchors"],
                class_names=metadata["classes"],
                every=config.map_every,
                tensorboard_dir=os.path.join(config.log_dir, "tensorboard"),
                log=log,
                status=trainer.status,
            )
        )
    if progress == "lines" and info.is_chief:
        ordered.append(
            yolo_callbacks.ProgressLines(
                global_batch, every=config.log_every, seconds=config.log_seconds, log=log
            )
        )
    if info.is_chief:
        ordered.append(
            keras.callbacks.TensorBoard(
                os.path.join(config.log_dir, "tensorboard"), update_freq="epoch"
            )
        )
    ordered += [
        backup,
        yolo_callbacks.TemplateCheckpoint(
            checkpoint_dir,
            body,
            worker=info,
            every=config.checkpoint_every,
            monitor=monitor,
            metadata=metadata,
            status=trainer.status,
        ),
    ]
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
    return ordered, throughput, nonfinite


def _restore_state(trainer, checkpoint_dir, log):
    state = yolo_callbacks.read_training_state(checkpoint_dir)
    if state is None:
        raise FileNotFoundError(
            f"--resume: no training state in {checkpoint_dir}; start without --resume"
        )
    path, metadata = state
    trainer.load_weights(path)
    epoch = int(metadata["epoch"])
    step = int(trainer.optimizer.iterations.value.numpy())
    log(f"resumed from {path}: {epoch} epochs done, optimizer step {step}")
    return epoch


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
    record_set = records.open_record_set(config.records)
    anchors = read_anchors(anchors_file(config))
    dataset = _train_records(config, record_set, anchors, len(record_set.classes))
    figures = yolo_data.measure_throughput(dataset, seconds=seconds)
    log(
        f"input pipeline alone: {figures['images_per_second']:.1f} images/s "
        f"({figures['batches']} batches of {config.batch_size} in {figures['seconds']:.1f} s)"
    )
    return 0
