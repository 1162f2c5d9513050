"""The steps of a training run, one builder each, as detectron2's ``DefaultTrainer`` has
``build_model``, ``build_optimizer``, ``build_train_loader`` and ``build_hooks``.

:func:`yolo3.training.job.run` calls them in order: :func:`build_strategy`,
:func:`read_data` (each input read once), :func:`resolve_setup` (the settings every later step
reads, one :class:`RunSetup`), :func:`build_trainer`, :func:`restore_state`,
:func:`build_datasets`, then the callbacks (:mod:`yolo3.training.hooks`). Each takes the config
and what the steps before it built; none reads a file that an earlier step already read.
"""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf

from yolo3 import faults
from yolo3.checkpoint.run_files import read_training_state
from yolo3.checkpoint.weights import check_model_type, load_weights, stored_metadata
from yolo3.comm.allreduce import communication_options
from yolo3.data import autotune, multiscale, records
from yolo3.data import pipeline as yolo_data
from yolo3.distributed import devices
from yolo3.distributed import strategy as distribute
from yolo3.engine.trainer import (
    WarmupSchedule,
    YoloTrainer,
    make_optimizer,
    scaled_learning_rate,
)
from yolo3.model.head import (
    HEAD_FLAG_FIELDS,
    HeadSpec,
    flags_given,
    head_from_flags,
    prior_biases,
)
from yolo3.model.network import build_head_model, set_head_biases
from yolo3.model.resources import (
    DEFAULT_ANCHOR_MASKS,
    model_type_for_anchors,
    read_anchors,
    shipped_anchors,
)
from yolo3.text import plural

# The model a run trains when no flag names one: the smallest, quickest to try.
DEFAULT_MODEL_TYPE = "tiny"
MODEL_NAMES = {"tiny": "tiny-YOLOv3", "yolov3": "YOLOv3"}


def anchors_file(config):
    """The run's anchors file: ``config.anchors``, else the shipped one of its model type."""
    return config.anchors or shipped_anchors(config.model or DEFAULT_MODEL_TYPE)


def default_model_note(config):
    """The line a run logs when it trains the shipped model and anchors because neither
    ``--anchors`` nor ``--weights`` chose, with the flags that choose another; None when
    one of them did."""
    if config.anchors or config.weights:
        return None
    model_type = config.model or DEFAULT_MODEL_TYPE
    if config.model:
        given = "--anchors or --weights"
        choose = "for anchors fitted to your boxes, give --anchors FILE (from yolo3 kmeans)"
    else:
        given = "--model-type, --anchors or --weights"
        choose = "for another, give --model-type yolov3 or --anchors FILE (from yolo3 kmeans)"
    return (
        f"no {given}: training {MODEL_NAMES[model_type]} from scratch with Darknet's COCO "
        f"anchors ({anchors_file(config)}); {choose}, or start from --weights FILE"
    )


def gpus_in_use(config):
    """The :class:`yolo3.distributed.devices.GpuInfo` of the GPUs this process trains on (empty:
    CPU)."""
    if config.cpu_replicas is not None or config.gpus == 0:
        return ()
    return devices.describe_gpus(config.gpus)


@dataclasses.dataclass(frozen=True)
class RunData:
    """What a run reads from disk, once, and hands down: its record sets, anchors and the
    metadata of the weights it starts from."""

    record_set: records.RecordSet
    val_source: tuple | None  # (RecordSet, split) to validate on, or None
    anchors: np.ndarray  # (num_anchors, 2) float32, width and height in input pixels
    # The metadata of --weights ({} without them, or for a file that records none).
    weights_metadata: dict = dataclasses.field(default_factory=dict)

    @property
    def classes(self):
        return self.record_set.classes

    @property
    def input_hw(self):
        """(height, width) in pixels, as the records were preprocessed."""
        return self.record_set.input_hw

    @property
    def record_sets(self):
        """Every record set the run reads: the training set, and the validation set when
        it is another."""
        val_set = self.val_source[0] if self.val_source else None
        return [self.record_set] + ([val_set] if val_set not in (None, self.record_set) else [])

    @property
    def boxes_per_image(self):
        """The training split's boxes per image, as ``yolo3 preprocess`` counts them in its
        manifest (None where it does not, or not as counts)."""
        train = self.record_set.manifest["splits"].get("train", {})
        images, boxes = train.get("images"), train.get("boxes")
        counts = all(type(value) is int for value in (images, boxes))
        return boxes / images if counts and images > 0 and boxes >= 0 else None


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What a run resolved from its flags, its data and its devices; the builders read it."""

    data: RunData
    info: distribute.WorkerInfo
    replicas: int
    gpus: tuple  # the GpuInfo of this process's GPUs (empty: the CPU)
    global_batch: int  # images per optimizer step: replicas x batch size x micro-batches
    head: HeadSpec  # the detector's head: classes, anchors per level, grid sensitivity
    precision: str  # the Keras policy name, e.g. "mixed_bfloat16"
    communication: object  # a yolo3.comm.schemes.Communication
    sync_bn: bool
    jit_compile: bool
    steps: int  # optimizer steps per epoch
    total_steps: int
    scales: multiscale.ScaleSchedule | None
    peak_lr: float
    checkpoint_dir: str
    backup_root: str

    @property
    def resolved(self):
        """What config.json records beside the flags; a resumed run is checked against it."""
        head = self.head.to_metadata()
        return {
            "model": head["model_type"],
            "classes": head["classes"],
            "anchors": head["anchors"],
            "input_size": head["input_size"],
            "num_replicas": self.replicas,
            "num_workers": self.info.num_workers,
            "global_batch_size": self.global_batch,
            "peak_lr": self.peak_lr,
            "steps_per_epoch": self.steps,
            "sync_bn": self.sync_bn,
            "jit_compile": self.jit_compile,
            "multi_scale_sizes": list(self.scales.sizes) if self.scales else None,
            "precision": self.precision,
            **{field: head[field] for field in HEAD_FLAG_FIELDS},
        }

    @property
    def metadata(self):
        """What every template checkpoint carries: enough to build the model and decode it."""
        return self.head.to_metadata()


@dataclasses.dataclass(frozen=True)
class Datasets:
    """The distributed datasets ``fit`` reads; ``val`` is None without a validation split."""

    train: object
    val: object
    val_steps: int | None  # validation steps per pass, the same on every worker
    mosaic: object = None  # with --close-mosaic: the switch the training split's filter reads


def build_strategy(config):
    """The distribution strategy of ``config``'s device layout, and this worker's place in it
    (a :class:`yolo3.distributed.strategy.WorkerInfo`)."""
    options = communication_options(config.bytes_per_pack, config.collective_timeout)
    strategy = distribute.make_strategy(
        gpus=config.gpus,
        cpu_replicas=config.cpu_replicas,
        slurm_port_base=config.slurm_port_base or distribute.default_slurm_port_base(),
        communication=options,
    )
    return strategy, distribute.worker_info(strategy)


def read_data(config):
    """The run's :class:`RunData`: each record set's manifest and the anchors file read once.

    Raises:
        DamagedRecord: a shard is missing or not the size its manifest says.
    """
    record_set = records.open_record_set(config.records)
    data = RunData(
        record_set,
        _validation_source(config, record_set),
        read_anchors(anchors_file(config)),
        stored_metadata(config.weights) if config.weights else {},
    )
    faults.check_record_sets(data.record_sets, since="it was written")
    return data


def recipe_for(config, data):
    """The :data:`yolo3.engine.config.RECIPES` entry whose values ``config``'s unset settings
    take, and the line that says why (None from scratch).

    ``"fine-tune"`` where the heads of ``--weights`` fit the data (the class count and the
    anchors per head the file records are the run's, so every layer loads), ``"new-heads"``
    where they do not (the backbone loads, the heads start anew, as from scratch), and
    ``"fine-tune"`` for a file that records no class count (a Keras 2 file, a ``.keras``
    archive), as before the weights said.
    """
    if not config.weights:
        return "scratch", None
    metadata = data.weights_metadata
    stored_classes = metadata.get("num_classes") or len(metadata.get("classes") or ())
    if not isinstance(stored_classes, int) or stored_classes < 1:
        return "fine-tune", (
            f"--weights {config.weights} records no class count: the fine-tuning defaults "
            "apply (set --lr, --ignore-thresh and --scale-x-y to choose others)"
        )
    stored_masks = metadata.get("anchor_masks")
    masks_now = DEFAULT_ANCHOR_MASKS.get(len(data.anchors))
    same_per_head = True  # what the file does not record, it is not compared on
    if isinstance(stored_masks, list) and stored_masks and isinstance(stored_masks[0], list):
        same_per_head = masks_now is None or len(stored_masks[0]) == len(masks_now[0])
    classes = plural(len(data.classes), "class", "classes")
    if stored_classes == len(data.classes) and same_per_head:
        return "fine-tune", f"--weights {config.weights}: its heads fit the {classes}; fine-tuning"
    return "new-heads", (
        f"--weights {config.weights}: its heads ({plural(stored_classes, 'class', 'classes')}) do "
        f"not fit the {classes}: they start anew, with the defaults from scratch"
    )


def with_recipe(config, data, log):
    """``config`` with its unset settings given the values of :func:`recipe_for`'s entry."""
    name, line = recipe_for(config, data)
    if line:
        log(line)
    return config.with_recipe(name)


def _head_settings(config):
    """The head's fields (:data:`yolo3.model.head.HEAD_FLAGS`) that ``config`` has flags of."""
    names = {field.name for field in dataclasses.fields(config)}
    return tuple(field for field in HEAD_FLAG_FIELDS if field in names)


def _validation_source(config, record_set):
    """``(RecordSet, split)`` to validate on, or None; each record set is opened once."""
    if config.val_records:
        val_set = records.open_record_set(config.val_records)
        return val_set, "val" if val_set.has_split("val") else "train"
    if record_set.has_split("val"):
        return record_set, "val"
    return None


def resolve_setup(config, strategy, info, data):
    """The :class:`RunSetup` of ``config`` on ``strategy``, its settings decided once.

    Raises:
        ValueError: the model type does not match the anchors or ``--weights``; the
            communication refuses the precision; a new run's ``--log-dir`` holds another run;
            ``--multi-scale`` does not fit the records.
    """
    replicas = strategy.num_replicas_in_sync
    global_batch = config.batch_size * replicas * config.accumulate
    anchors = data.anchors
    model_type = config.model or model_type_for_anchors(len(anchors))
    if model_type != model_type_for_anchors(len(anchors)):
        raise ValueError(
            f"--model-type {model_type} needs {'9' if model_type == 'yolov3' else '6'} anchors; "
            f"{anchors_file(config)} has {len(anchors)}"
        )
    if config.weights:  # before any model is built
        check_model_type(model_type, config.weights, data.weights_metadata)
    # A head field a run sets by flag: the flag, else (fine-tuning) as the weights were
    # trained, so that they decode as before; else the head's default.
    settable = _head_settings(config)
    head = head_from_flags(
        flags_given(config, fields=settable),
        anchors=anchors,
        class_names=data.classes,
        model_type=model_type,
        input_hw=data.input_hw,
        **{field: data.weights_metadata.get(field) for field in settable},
    )
    precision = keras.mixed_precision.global_policy().name
    # How gradients cross the network; refused here too when "auto" chose float16.
    communication = config.communication(precision)
    sync_bn = communication.default_sync_bn(replicas) if config.sync_bn is None else config.sync_bn
    gpus = gpus_in_use(config)
    jit_compile = devices.choose_jit_compile(config.jit_compile, num_replicas=replicas, gpus=gpus)
    checkpoint_dir = os.path.join(config.log_dir, "checkpoints")
    backup_root = os.path.join(config.log_dir, "backup")
    _check_fresh_log_dir(config, checkpoint_dir, backup_root)

    steps = config.steps_per_epoch or max(1, data.record_set.num_records("train") // global_batch)
    total_steps = steps * config.epochs
    scales = None
    if config.multi_scale:
        sizes = multiscale.parse_sizes(config.multi_scale, data.input_hw)
        scales = multiscale.ScaleSchedule(sizes, seed=config.seed, total_steps=total_steps)
    return RunSetup(
        data=data,
        info=info,
        replicas=replicas,
        gpus=gpus,
        global_batch=global_batch,
        head=head,
        precision=precision,
        communication=communication,
        sync_bn=sync_bn,
        jit_compile=jit_compile,
        steps=steps,
        total_steps=total_steps,
        scales=scales,
        peak_lr=scaled_learning_rate(config.lr, global_batch, config.lr_reference_batch),
        checkpoint_dir=checkpoint_dir,
        backup_root=backup_root,
    )


def _check_fresh_log_dir(config, checkpoint_dir, backup_root):
    """A new run refuses a log folder holding another run; ``--resume`` continues it."""
    if config.resume:
        return
    has_backup = os.path.isdir(backup_root) and any(os.scandir(backup_root))
    state = read_training_state(checkpoint_dir)
    if state is not None and not has_backup:
        raise ValueError(
            f"{config.log_dir} holds a finished or interrupted run (epoch "
            f"{state[1].get('epoch')}); pass --resume to continue it, or choose another --log-dir"
        )


def build_trainer(config, setup, strategy, log):
    """The :class:`YoloTrainer` of ``setup`` under ``strategy``: its body built and given
    ``--weights``, compiled with its schedule and optimizer, every variable built."""
    data = setup.data
    with strategy.scope():
        body = build_head_model(
            setup.head,
            input_size=(None, None) if setup.scales else None,  # multi-scale: any size
            weight_decay=config.weight_decay,
            synchronized_bn=setup.sync_bn,
            bn_momentum=config.bn_momentum,
        )
        # After the model is built: the line gives the bytes of its all-reduce.
        log(_describe(config, setup, body))
        note = default_model_note(config)
        if note:
            log(note)
        if config.prior_bias:  # heads that --weights fills overwrite it
            biases = prior_biases(setup.head, data.input_hw, data.boxes_per_image)
            set_head_biases(body, setup.head.model_type, biases)
        _load_initial_weights(body, config, log)
        trainer = YoloTrainer(
            body,
            head=setup.head,
            ignore_thresh=config.ignore_thresh,
            iou_thresh=config.iou_thresh,
            neighbour_cells=config.neighbour_cells,
            loss_options=config.loss_options(),
            remat=config.remat,
            multi_scale=setup.scales,
            accumulate=config.accumulate,
            communication=setup.communication,
            ema=config.ema_settings(),
        )
        total_steps = setup.total_steps
        if config.time:
            # The plan --time changes as the run goes (yolo3.callbacks.TimeBudget); not
            # saved: a resumed run plans again.
            total_steps = keras.Variable(
                setup.total_steps, dtype="int64", trainable=False, name="planned_steps"
            )
            object.__setattr__(trainer, "planned_steps", total_steps)  # untracked
        lr_schedule = WarmupSchedule(
            setup.peak_lr,
            warmup_steps=round(config.warmup_epochs * setup.steps),
            total_steps=total_steps,
            kind=config.lr_schedule,
            scale=trainer.lr_scale,
        )
        optimizer = make_optimizer(config.optimizer, lr_schedule, momentum=config.momentum)
        trainer.compile(optimizer=optimizer, jit_compile=setup.jit_compile)
        trainer.build((None, *data.input_hw, 3))
        # Built for every variable before any freezing, so unfreezing later and restoring
        # a backup find the slots they expect.
        trainer.optimizer.build(trainer.trainable_variables)
    return trainer


def _describe(config, setup, body):
    """The line that opens a run's log: the model, the devices, the batch and every resolved
    setting."""
    height, width = setup.data.input_hw
    accumulate = f" x {config.accumulate} micro-batches" if config.accumulate > 1 else ""
    scales = setup.scales
    sizes = f"{scales.sizes[0]}-{scales.sizes[-1]} ({len(scales.sizes)} sizes)" if scales else "off"
    info = setup.info
    where = devices.describe_devices(
        gpus=setup.gpus,
        cores=devices.available_cores(),
        cpu_replicas=config.cpu_replicas,
        num_workers=info.num_workers,
    )
    classes = plural(len(setup.data.classes), "class", "classes")
    return (
        f"{setup.head.model_type} {height}x{width}, {classes}; "
        f"{where}; {plural(setup.replicas, 'replica')} x {config.batch_size}{accumulate} = global "
        f"batch {setup.global_batch}; all-reduce {setup.communication.describe(body)}; "
        f"{plural(setup.steps, 'step')}/epoch; peak lr {setup.peak_lr:.3g} ({config.optimizer}); "
        f"sync BN {'on' if setup.sync_bn else 'off'}; XLA {'on' if setup.jit_compile else 'off'}; "
        f"precision {setup.precision}; remat {config.remat}; "
        f"multi-scale {sizes}; "
        f"worker {info.worker_index + 1}/{info.num_workers}"
    )


def _load_initial_weights(body, config, log):
    if not config.weights:
        return
    report = load_weights(body, config.weights, skip_mismatch=True)
    log(
        f"weights {config.weights}: {plural(len(report['loaded']), 'layer')} loaded, "
        f"{len(report['skipped'])} skipped, {len(report['missing'])} not in the file"
    )
    for name, reason in report["skipped"]:
        log(f"  skipped {name}: {reason}")


def restore_state(trainer, checkpoint_dir, log):
    """``--resume``: loads the full training state saved in ``checkpoint_dir`` into
    ``trainer``; returns the number of epochs it had done."""
    state = read_training_state(checkpoint_dir)
    if state is None:
        raise FileNotFoundError(
            f"--resume: no training state in {checkpoint_dir}; start without --resume"
        )
    path, metadata = state
    trainer.load_weights(path)
    epoch = int(metadata["epoch"])
    step = int(trainer.optimizer.iterations.value.numpy())
    log(f"resumed from {path}: {plural(epoch, 'epoch')} done, optimizer step {step}")
    return epoch


def build_datasets(config, setup, strategy, log):
    """The run's :class:`Datasets`, each replica reading its own share (synthetic batches
    with ``--benchmark``)."""
    data = setup.data
    options = dict(batch_size=config.batch_size, head=setup.head)

    mosaic = _mosaic_switch(config, data, log)

    def train_fn(context):
        if config.benchmark:
            return yolo_data.synthetic_dataset(
                input_hw=data.input_hw, seed=config.seed + context.input_pipeline_id, **options
            )
        return train_records(config, data, context, mosaic=mosaic)

    autotune.untune_device_datasets()
    train = strategy.distribute_datasets_from_function(train_fn)
    if not data.val_source:
        return Datasets(train, None, None, mosaic)
    val_steps = _validation_steps(config, setup, log)

    def val_fn(context):
        # Every record once a pass, padded with weightless images to the same fixed step
        # count on every worker: the collective ops of a multi-worker job wait forever for
        # a worker that stops early.
        val_set, val_split = data.val_source
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        return yolo_data.make_dataset(
            val_set,
            val_split,
            training=False,
            input_context=context,
            targets=False,
            pass_batches=val_steps * max(replicas_here, 1),
            **options,
        )

    val = strategy.distribute_datasets_from_function(val_fn)
    return Datasets(train, val, val_steps, mosaic)


def _mosaic_switch(config, data, log):
    """With ``--close-mosaic`` on a record set holding mosaics: the variable that lets them
    through (:class:`yolo3.callbacks.CloseMosaic` turns it off), else None."""
    if not config.close_mosaic or config.benchmark:
        return None
    if not data.record_set.num_mosaic_records("train"):
        log(
            f"--close-mosaic {config.close_mosaic}: {data.record_set} holds no mosaic records "
            "(yolo3 preprocess --mosaic); every epoch reads the same records"
        )
        return None
    # On the host: the input pipeline reads it, on every worker its own.
    with tf.device("/cpu:0"):
        return tf.Variable(True, trainable=False, name="mosaic")


def train_records(config, data, context=None, mosaic=None):
    """The training split as the trainer reads it: uint8 images and padded boxes (the
    targets are built in the train step); ``mosaic``: see
    :func:`yolo3.data.pipeline.make_dataset`."""
    return yolo_data.make_dataset(
        data.record_set,
        "train",
        batch_size=config.batch_size,
        training=True,
        seed=config.seed,
        flip=config.flip,
        shuffle_buffer=config.shuffle_buffer,
        input_context=context,
        targets=False,  # built in the train step, on the accelerator
        mosaic=mosaic,
        online=config.online_augment(),
    )


def _validation_steps(config, setup, log):
    """Steps per validation pass: every validation image once, the last global batch (and
    the batches of a worker with fewer images) filled with padding that carries no weight."""
    val_set, val_split = setup.data.val_source
    val_records = val_set.num_records(val_split)
    eval_batch = config.batch_size * setup.replicas  # no micro-batches in validation
    val_steps = yolo_data.padded_pass_steps(
        val_set,
        val_split,
        batch_size=config.batch_size,
        pipelines=setup.info.num_workers,
        replicas=setup.replicas,
    )
    padding = val_steps * eval_batch - val_records
    if padding:
        log(
            f"validation: {plural(val_records, 'image')} per pass in "
            f"{plural(val_steps, 'global batch', 'global batches')} of {eval_batch}, "
            f"{plural(padding, 'place')} padded (weight 0)"
        )
    return val_steps
