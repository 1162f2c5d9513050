"""The settings of a training run, each written once.

A field of :class:`TrainConfig` holds its type, its default and, in its metadata
(:func:`yolo3.flags.setting`), everything ``yolo3 train`` needs to offer it as a flag: the
group of :data:`GROUPS` it is listed in, its help, its choices, its metavar and how the text
is parsed. The parser is generated from the fields (:func:`add_arguments`) and read back by
:func:`from_args`, so a new setting is one field here; its checks are in
:meth:`TrainConfig.__post_init__` (the communication flags' in
:func:`yolo3.comm.schemes.communication_from`, which it calls), once, whether the run comes
from the command line, a notebook or a saved ``config.json``.
"""

import dataclasses

from yolo3 import flags
from yolo3.cli import add_progress_arguments, on_off, output_folder, progress_setting
from yolo3.comm.allreduce import ALLREDUCE_DTYPES
from yolo3.comm.local_steps import DEFAULT_MERGE, MERGES
from yolo3.comm.powersgd import COMPRESSIONS
from yolo3.comm.schemes import CommunicationFlags, communication_from
from yolo3.data.online import OnlineAugment
from yolo3.distributed.devices import JIT_COMPILE_CHOICES, MIXED_PRECISION_CHOICES
from yolo3.engine import averaging
from yolo3.engine.trainer import OPTIMIZERS
from yolo3.flags import flag_of, setting  # noqa: F401 - flag_of: callers read it from here
from yolo3.model.loss import (
    DEFAULT_IOU_NORMALIZER,
    IGNORE_THRESH,
    IOU_LOSSES,
    OBJECTNESS_IOU,
    LossOptions,
)
from yolo3.model.network import BN_MOMENTUM, MODEL_TYPES
from yolo3.model.remat import REMAT_CHOICES
from yolo3.model.resources import parse_scale_x_y
from yolo3.model.targets import IOU_THRESH, NEIGHBOUR_SCALE_X_Y
from yolo3.progress import DEFAULT_SECONDS, PROGRESS_CHOICES, check_interval

# The groups of ``yolo3 train --help``, in order: field metadata names them by key.
GROUPS = {
    "data": "data",
    "model": "model",
    "schedule": "schedule",
    "devices": "devices",
    "communication": "communication between replicas and workers",
    "checkpoints": "checkpoints",
    "logging": "logging and checks",
    "tracking": "experiment tracking (MLflow)",
}


# The settings that differ between a run from scratch and one fine-tuning --weights: the
# defaults of yolo3 train by where its weights start. From scratch: the demo's, 8e-3 per
# 16 images with Adam, and an ignore threshold of .5, which scored mAP@0.5 0.927 and 0.935
# on its task against 0.894 and 0.902 for Darknet's .7 (seeds 0 and 1, YOLOv3's loss).
# Grid sensitivity from scratch: 1.1 raised COCO AP from 0.637 to 0.651 there (2 seeds;
# 2 gave 0.633); since the heads start at the data's priors (--prior-bias), YOLOv5's
# neighbour cells, which need 2, give 0.683 +- 0.005 against 0.647 +- 0.004 there and
# 0.689 +- 0.007 against 0.673 +- 0.005 at 256 px with 1,000 images (docs/benchmarks.md).
# Fine-tuning weights whose heads fit the data (its class count and anchors per head):
# Darknet's .7 and the original keras-yolo3's 1e-3, and the grid sensitivity left None: the
# weights decode as they were trained (what their file records, else YOLOv3's 1;
# yolo3.engine.builders).
# --weights whose heads do not fit (COCO's 80 classes for a data set's 4): the backbone
# loads, the heads start anew, and the values from scratch serve them: from the yolov3-tiny
# COCO weights on the demo's task, 3 epochs, COCO AP 0.540 against 0.363 with the
# fine-tuning values (2 seeds each; docs/benchmarks.md, "Fine-tuning from the COCO weights").
# The objectness target from scratch is the loss's recipe (yolo3.model.loss.OBJECTNESS_IOU);
# weights whose heads fit keep YOLOv3's target of 1, the one they were trained with.
RECIPES = {
    "scratch": {
        "lr": 3.2e-2,
        "ignore_thresh": 0.5,
        "scale_x_y": "2",
        "neighbour_cells": True,
        "objectness_iou": OBJECTNESS_IOU,
    },
    "fine-tune": {
        "lr": 1e-3,
        "ignore_thresh": IGNORE_THRESH,
        "scale_x_y": None,
        "neighbour_cells": False,
        "objectness_iou": 0.0,
    },
}
RECIPES["new-heads"] = RECIPES["scratch"]
# The online augmentation's settings (yolo3.data.online.OnlineAugment) and their fields here.
ONLINE_FIELDS = {
    "scale": "scale_jitter",
    "translate": "translate_jitter",
    "hue": "hue_jitter",
    "saturation": "saturation_jitter",
    "value": "value_jitter",
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run; saved as ``config.json`` beside the checkpoints."""

    records: str = setting(
        group="data",
        help="record set from yolo3 preprocess (or --data: a dataset, preprocessed here)",
        cli_default=None,
    )
    log_dir: str = setting(
        group="checkpoints",
        help="checkpoints, TensorBoard, config",
        cli_default="logs/run",
        parse=output_folder,
    )
    # data
    val_records: str | None = setting(
        None, group="data", help="validation record set (default: --records' val)"
    )
    flip: float = setting(0.5, group="data", help="online horizontal-flip probability")
    # Online scale, shift and colour (yolo3.data.online); off by default. Named apart from
    # yolo3 preprocess's --hue, --saturation and --value, which change the offline copies.
    scale_jitter: float = setting(
        0.0,
        group="data",
        metavar="S",
        help="each training image scaled by a factor in [1 - S, 1 + S] about its centre, with "
        "its boxes, every time it is read (0: off)",
    )
    translate_jitter: float = setting(
        0.0,
        group="data",
        metavar="T",
        help="each training image shifted by up to T of its width and height (0: off)",
    )
    hue_jitter: float = setting(
        0.0,
        group="data",
        help="online hue shift, as yolo3 preprocess --hue defines it (0: off)",
    )
    saturation_jitter: float = setting(
        1.0,
        group="data",
        help="online saturation factor, as yolo3 preprocess --saturation defines it (1: off)",
    )
    value_jitter: float = setting(
        1.0,
        group="data",
        help="online value factor, as yolo3 preprocess --value defines it (1: off)",
    )
    shuffle_buffer: int = setting(1024, group="data")
    close_mosaic: int = setting(
        0,
        group="data",
        metavar="EPOCHS",
        help="the last EPOCHS epochs (of --epochs, or of the --time plan) read no mosaic "
        "records (yolo3 preprocess --mosaic); 0: every epoch reads them",
    )
    # "auto" or "MIN:MAX": yolo3.data.multiscale
    multi_scale: str | None = setting(
        None,
        group="data",
        nargs="?",
        const="auto",
        metavar="MIN:MAX",
        help="change the square input size every 10 steps, as Darknet's random=1: alone, "
        "Darknet's sizes (320 to 608 for 416 px records); or MIN:MAX in pixels",
    )
    # model
    anchors: str | None = setting(
        None,
        group="model",
        help="anchors file: 9 pairs for yolov3, 6 for tiny (default: Darknet's COCO anchors "
        "of --model-type, shipped with the package; tiny when neither is given)",
    )
    model: str | None = setting(
        None,
        group="model",
        flag="--model-type",
        aliases=("--model",),
        choices=MODEL_TYPES,
        help="default: from the anchors",
    )
    weights: str | None = setting(
        None,
        group="model",
        help="initial weights: converted Darknet, our checkpoints or "
        "original keras-yolo3 .h5 (mismatched heads are skipped and reported)",
    )
    freeze_body: int = setting(
        0,
        group="model",
        choices=(0, 1, 2),
        help="1: freeze the backbone, 2: all but the heads, for --freeze-epochs",
    )
    freeze_epochs: int = setting(0, group="model")
    bn_momentum: float = setting(
        BN_MOMENTUM,
        group="model",
        help="the share of each batch-norm moving statistic kept at every training step "
        "(Keras's and Darknet's is .99, which lags the weights in runs of few steps)",
    )
    ignore_thresh: float | None = setting(
        None,
        group="model",
        help="IoU above which a prediction is not penalised as background (default: "
        f"{RECIPES['scratch']['ignore_thresh']} from scratch or where the heads of --weights "
        f"do not fit the data, Darknet's {RECIPES['fine-tune']['ignore_thresh']} where they do)",
    )
    iou_thresh: float = setting(
        IOU_THRESH,
        group="model",
        help="also assign a box to every anchor whose IoU with it is above this "
        "(AlexeyAB Darknet's iou_thresh; 1: the best anchor only, as YOLOv3)",
    )
    neighbour_cells: bool | None = setting(
        None,
        group="model",
        parse=on_off,
        metavar="on|off",
        cli_default=None,
        help="on: also assign a box to the two cells beside its centre's that lie nearest to "
        "the centre (YOLOv5's rule), so that more predictions learn each box; needs --scale-x-y "
        "2 or more, for those cells' predictions to reach the centre. Default: on from scratch "
        "or where the heads of --weights do not fit the data (off where --scale-x-y is given "
        "below 2), off where they do",
    )
    # On by default: at 256 px with 1,000 images COCO AP 0.673 +- 0.005 against 0.592 +-
    # 0.020, on the demo's task 0.647 +- 0.004 against 0.646 +- 0.003 (docs/benchmarks.md).
    prior_bias: bool = setting(
        True,
        group="model",
        parse=on_off,
        metavar="on|off",
        cli_default="on",
        help="on: heads that start anew (from scratch, or where those of --weights do not fit) "
        "start at the data's priors, each prediction's objectness at the training split's "
        "boxes per image over its level's predictions and each class at 1 / classes; off: "
        "at 0.5 (all biases 0)",
    )
    scale_x_y: str | None = setting(
        None,
        group="model",
        flag="--scale-x-y",
        metavar="S",
        help="grid sensitivity: a centre's offset in its cell is sigmoid(t) S - (S - 1) / 2, "
        "one value or one per head, largest stride first (AlexeyAB Darknet's scale_x_y; 1 is "
        f"YOLOv3's). Default: {RECIPES['scratch']['scale_x_y']} from scratch or where the heads "
        "of --weights do not fit the data; where they do, what the weights file records, else "
        "1. Checkpoints record it; detection follows",
    )
    # The loss's terms, named as AlexeyAB Darknet's [yolo] keys (yolo3.model.loss).
    iou_loss: str = setting(
        LossOptions.iou_loss,
        group="model",
        choices=IOU_LOSSES,
        help="box term: 1 - IoU, GIoU, DIoU or CIoU, or mse (YOLOv3's xy and wh terms)",
    )
    iou_normalizer: float | None = setting(
        None,
        group="model",
        help="weight of the box term(s) (default: "
        + ", ".join(f"{weight:g} for {kind}" for kind, weight in DEFAULT_IOU_NORMALIZER.items())
        + ")",
    )
    obj_normalizer: float = setting(1.0, group="model", help="weight of the objectness term")
    cls_normalizer: float = setting(1.0, group="model", help="weight of the class term")
    label_smoothing: float = setting(
        0.0, group="model", help="class targets 1 - eps/2 and eps/2 (Darknet's label_smooth_eps)"
    )
    objectness_iou: float | None = setting(
        None,
        group="model",
        metavar="R",
        help="objectness target of an assigned prediction 1 - R + R * (its box's IoU with the "
        "true box), so that scores rank how well boxes fit (YOLOv5's gr); 0 is YOLOv3's 1. "
        f"Default: {RECIPES['scratch']['objectness_iou']:g} from scratch or where the heads of "
        f"--weights do not fit the data, {RECIPES['fine-tune']['objectness_iou']:g} where they do",
    )
    # schedule
    epochs: int = setting(50, group="schedule")
    batch_size: int = setting(8, group="schedule", help="images per replica per step")
    lr: float | None = setting(
        None,
        group="schedule",
        help="learning rate for a global batch of --lr-reference-batch (default: "
        f"{RECIPES['scratch']['lr']:g} from scratch or where the heads of --weights do not fit "
        f"the data, {RECIPES['fine-tune']['lr']:g} where they do)",
    )
    lr_reference_batch: int = setting(64, group="schedule")
    lr_schedule: str = setting("cosine", group="schedule", choices=("cosine", "constant"))
    warmup_epochs: float = setting(1.0, group="schedule")
    optimizer: str = setting("adam", group="schedule", choices=OPTIMIZERS)
    momentum: float = setting(0.9, group="schedule")
    weight_decay: float = setting(5e-4, group="schedule")
    steps_per_epoch: int | None = setting(
        None, group="schedule", help="default: one pass over the records"
    )
    reduce_lr_patience: int | None = setting(
        None,
        group="schedule",
        flag="--reduce-lr-on-plateau",
        metavar="PATIENCE",
        help="divide the learning rate by 10 after PATIENCE epochs without progress",
    )
    early_stopping_patience: int | None = setting(
        None, group="schedule", flag="--early-stopping", metavar="PATIENCE"
    )
    seed: int = setting(0, group="schedule")
    time: float | None = setting(
        None,
        group="schedule",
        metavar="MINUTES",
        help="fit the run to MINUTES of wall time: after each epoch, as many more epochs as "
        "the time left holds at the last epoch's pace (at most --epochs), the learning-rate "
        "schedule stretched or shortened to match. A budget shorter than one epoch still "
        "trains one whole epoch: the plan starts after the first",
    )
    ema: float = setting(
        0.0,
        group="schedule",
        metavar="DECAY",
        help="keep an exponential moving average of the weights with this decay (0: off); "
        "checkpoints, validation and --map-every use it",
    )
    ema_warmup: float = setting(
        2000.0,
        group="schedule",
        metavar="STEPS",
        help="steps over which the average's decay ramps up from 0 (1 - exp(-step/STEPS))",
    )
    # devices
    gpus: int | None = setting(
        None, group="devices", help="GPUs to train on (0: CPU; default: all visible)"
    )
    cpu_replicas: int | None = setting(
        None,
        group="devices",
        help="split the CPU into N logical devices and train on all of them "
        "(the multi-GPU code path, without GPUs)",
    )
    sync_bn: bool | None = setting(
        None, group="devices", parse=on_off, help="on/off (default: on with >1 replica)"
    )
    mixed_precision: str = setting(
        "auto",
        group="devices",
        choices=MIXED_PRECISION_CHOICES,
        help="auto: bfloat16 on GPUs of compute capability >= 8.0, float16 with loss scaling "
        "on 7.x, off on older GPUs and the CPU",
    )
    jit_compile: str = setting(
        "auto",
        group="devices",
        choices=JIT_COMPILE_CHOICES,
        help="XLA; auto: on for one GPU with no strategy, off on the CPU and with replicas",
    )
    remat: str = setting(
        "off",
        group="devices",
        choices=REMAT_CHOICES,
        help="recompute activations in the backward pass to fit larger batches, for about one "
        "forward pass more per step: full (every Darknet unit), large (strides 1-8 only, "
        "where most activations are), off",
    )
    memory_growth: bool = setting(
        True,
        group="devices",
        flag="--no-memory-growth",
        action="store_false",
        help="let TensorFlow take all GPU memory up front",
    )
    # communication
    accumulate: int = setting(
        1,
        group="communication",
        metavar="K",
        help="micro-batches per optimizer step (Darknet's subdivisions): each replica runs K "
        "batches of --batch-size, sums their gradients and all-reduces once; the global batch "
        "is K x batch x replicas. Trains a batch too large for memory, and sends K times less "
        "over a slow network",
    )
    allreduce_dtype: str = setting(
        "float32",
        group="communication",
        choices=ALLREDUCE_DTYPES,
        help="dtype gradients travel in between replicas (bfloat16/float16 halve the bytes; "
        "float16 is scaled per tensor so that it neither overflows nor underflows). int8/int4: "
        "with --local-steps only, its weight changes travel as integers with stochastic "
        "rounding and a scale per block of 256 shared by the replicas (int4 about a third "
        "of bfloat16's bytes with 2 replicas, half with 8)",
    )
    compress: str = setting(
        "none",
        group="communication",
        choices=COMPRESSIONS,
        help="powersgd: all-reduce each large convolution's gradient as two rank-R factors, "
        "with error feedback (PowerSGD: about 100x fewer bytes for YOLOv3 at rank 4); other "
        "gradients travel in --allreduce-dtype. Not with float16 mixed precision",
    )
    rank: int = setting(
        4,
        group="communication",
        metavar="R",
        help="rank of the PowerSGD factors (higher: closer to the full gradient, more bytes)",
    )
    local_steps: int | None = setting(
        None,
        group="communication",
        metavar="H",
        help="no all-reduce in the step: each replica trains alone and every H optimizer "
        "steps they average their weight changes (in --allreduce-dtype), and fully at epoch "
        "ends and backups. Not with --compress or --sync-bn on",
    )
    outer_lr: float = setting(
        1.0,
        group="communication",
        help="learning rate of the outer step at each --local-steps synchronisation "
        "(1 with --outer-momentum 0: plain averaging; DiLoCo uses 0.7)",
    )
    outer_momentum: float = setting(
        0.0,
        group="communication",
        help="Nesterov momentum of the outer step, in [0, 1) (DiLoCo uses 0.9)",
    )
    overlap_sync: int | None = setting(
        None,
        group="communication",
        metavar="T",
        help="with --local-steps H: send each period's weight changes during the first T "
        "steps of the next period (1 <= T <= H), a chunk in each step while it computes, "
        "and apply them there, T steps late (no step waits for the link; with int8/int4 the "
        "period's end waits for the shared scales, a 256th of the change)",
    )
    overlap_merge: str | None = setting(
        None,
        group="communication",
        choices=MERGES,
        help="with --overlap-sync: where each replica goes on from while its change travels: "
        "own (its own weights, the others' changes T steps late) or eager (the anchor moved "
        "by an estimate of the mean: its own share plus the others' last one; Kale et al. "
        f"2025); default {DEFAULT_MERGE}",
    )
    dense_steps: int = setting(
        0,
        group="communication",
        metavar="N",
        help="with --compress or --local-steps: the first N optimizer steps all-reduce the "
        "whole gradient, as ordinary training does, before they take over (a warm-up that "
        "keeps the accuracy of the uncompressed run; about one epoch)",
    )
    collective_timeout: float | None = setting(
        None,
        group="communication",
        metavar="SECONDS",
        help="several machines: a collective that waits longer for a dead or unreachable "
        "worker fails the job instead of hanging (default: wait forever)",
    )
    bytes_per_pack: int = setting(
        0,
        group="communication",
        metavar="BYTES",
        help="several machines: split all-reduces into packs of this size (0: TensorFlow decides)",
    )
    slurm_port_base: int | None = setting(
        None,
        group="communication",
        metavar="PORT",
        help="under Slurm, task k of a node listens on PORT + k; two jobs sharing a node need "
        "bases at least their task count apart (default: $YOLO3_SLURM_PORT_BASE, else 8888)",
    )
    # checkpoints
    checkpoint_every: int | None = setting(
        None, group="checkpoints", metavar="K", help="keep every K-th epoch"
    )
    backup_every: int | None = setting(
        None,
        group="checkpoints",
        metavar="STEPS",
        help="back up every STEPS steps (default: each epoch)",
    )
    resume: bool = setting(
        False, group="checkpoints", action="store_true", help="continue the run in --log-dir"
    )
    # logging
    map_every: int | None = setting(
        None,
        group="logging",
        metavar="K",
        help="score COCO AP and AP50 on the validation split every K epochs and at the last "
        "(chief); the best weights are the epoch of the highest 0.9 AP + 0.1 AP50. Default: "
        "each epoch while a pass costs at most a tenth of an epoch's time, else every K "
        "chosen so; 0: never, and the best weights are those of the lowest validation loss",
    )
    benchmark: bool = setting(
        False,
        group="logging",
        action="store_true",
        help="train on synthetic in-memory data: speed without input cost",
    )
    progress: str = setting(
        "auto",
        group="logging",
        add=add_progress_arguments,  # --progress and --quiet
        read=progress_setting,
        choices=PROGRESS_CHOICES,
        help="auto: a progress bar on a terminal, plain lines when output goes to a file or "
        "pipe (a Slurm job, nohup, CI): one per epoch with every logged value, and one every "
        "--log-every steps or --log-seconds seconds",
    )
    log_every: int | None = setting(
        None,
        group="logging",
        metavar="STEPS",
        help="plain lines: one every STEPS steps (default: by time only)",
    )
    log_seconds: float = setting(
        DEFAULT_SECONDS,
        group="logging",
        metavar="SECONDS",
        help="plain lines: one every SECONDS seconds (0: by steps only)",
    )
    # tracking: yolo3.callbacks.mlflow_tracking, imported only when --mlflow asks for it
    mlflow: bool = setting(
        False,
        group="tracking",
        action="store_true",
        help="log the run to MLflow from the chief: the resolved settings as parameters, each "
        "epoch's losses, learning rate, images/s and mAP as metrics, and at the end the best "
        "and last weights, config.json and the last --map-every evaluation's gallery and PR "
        'curves. A resumed run continues its MLflow run. Needs pip install "keras-yolo3[mlflow]"',
    )
    mlflow_tracking_uri: str | None = setting(
        None,
        group="tracking",
        metavar="URI",
        help="with --mlflow: the tracking server, e.g. http://host:5000 (default: "
        "$MLFLOW_TRACKING_URI, else the URI a resumed run recorded, else MLflow's own: "
        "sqlite:///mlflow.db in the working folder)",
    )
    mlflow_experiment: str | None = setting(
        None,
        group="tracking",
        metavar="NAME",
        help="with --mlflow: the experiment a new run goes to, created if missing (default: "
        "$MLFLOW_EXPERIMENT_NAME, else MLflow's Default)",
    )

    def with_recipe(self, name):
        """A copy whose settings left unset take the values of ``RECIPES[name]``:
        ``"scratch"``, ``"fine-tune"`` or ``"new-heads"`` (:func:`yolo3.engine.builders.recipe_for`
        chooses by whether the heads of ``--weights`` fit the data)."""
        return dataclasses.replace(self, **self._recipe_values(name))

    def _recipe_values(self, name):
        """The values of ``RECIPES[name]`` that the settings left unset take; the neighbour
        cells stay off where ``--scale-x-y`` is given below the grid sensitivity they need."""
        unset = {key: value for key, value in RECIPES[name].items() if getattr(self, key) is None}
        if unset.get("neighbour_cells") and "scale_x_y" not in unset:
            try:
                given = parse_scale_x_y(self.scale_x_y) if self.scale_x_y is not None else None
            except ValueError:
                given = None  # the checks below name the flag
            if given and min(given) < NEIGHBOUR_SCALE_X_Y:
                unset["neighbour_cells"] = False
        return unset

    def __post_init__(self):
        if not self.weights:  # from scratch; with --weights, once the weights are read
            for name, value in self._recipe_values("scratch").items():
                object.__setattr__(self, name, value)
        flags.check_choices(self)
        checks = [
            (self.freeze_epochs >= 0, "--freeze-epochs must be >= 0"),
            (self.epochs >= 1, "--epochs must be >= 1"),
            (self.batch_size >= 1, "--batch-size must be >= 1"),
            (self.lr is None or self.lr > 0, "--lr must be > 0"),
            (self.time is None or self.time > 0, "--time must be > 0 minutes"),
            (0.0 < self.iou_thresh <= 1.0, "--iou-thresh must be in (0, 1] (1: off)"),
            (0.0 <= self.flip <= 1.0, "--flip must be a probability in [0, 1]"),
            (0.0 <= self.bn_momentum < 1.0, "--bn-momentum must be in [0, 1)"),
            *(
                (False, f"--{ONLINE_FIELDS[field].replace('_', '-')} {rule}")
                for field, rule in self.online_augment().problems()
            ),
            (self.close_mosaic >= 0, "--close-mosaic must be >= 0 epochs"),
            (
                self.map_every is None or self.map_every >= 0,
                "--map-every must be >= 0 epochs (0: never)",
            ),
            (self.accumulate >= 1, "--accumulate must be >= 1 (micro-batches per step)"),
            (
                self.collective_timeout is None or self.collective_timeout > 0,
                "--collective-timeout must be a positive number of seconds",
            ),
            (self.bytes_per_pack >= 0, "--bytes-per-pack must be >= 0 (0: automatic)"),
            (
                self.slurm_port_base is None or 1024 <= self.slurm_port_base <= 65535,
                "--slurm-port-base must be a TCP port in [1024, 65535]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        check_interval(self.log_every, self.log_seconds)
        for flag, value in (
            ("--mlflow-tracking-uri", self.mlflow_tracking_uri),
            ("--mlflow-experiment", self.mlflow_experiment),
        ):
            if value is not None and not self.mlflow:
                raise ValueError(f"{flag} needs --mlflow")
            if value is not None and not value.strip():
                raise ValueError(f"{flag}: give a non-empty value")
        if self.freeze_body and not self.freeze_epochs:
            raise ValueError("--freeze-body needs --freeze-epochs E (epochs before unfreezing)")
        # The communication flags, alone and together, and with --sync-bn and an explicit
        # --mixed-precision float16.
        self.communication(self.mixed_precision)
        self.loss_options()
        self.ema_settings()
        if self.scale_x_y is not None:
            parse_scale_x_y(self.scale_x_y)

    def ema_settings(self):
        """``(decay, warmup)`` of the weights' moving average, or None when ``--ema`` is 0
        (:func:`yolo3.engine.averaging.check` checks them)."""
        averaging.check(self.ema, self.ema_warmup)
        return (self.ema, self.ema_warmup) if self.ema else None

    def online_augment(self):
        """The :class:`yolo3.data.online.OnlineAugment` of the online-augmentation flags."""
        return OnlineAugment(**{key: getattr(self, field) for key, field in ONLINE_FIELDS.items()})

    def loss_options(self):
        """The loss's :class:`yolo3.model.loss.LossOptions` (which checks them); before
        ``--weights`` have chosen the recipe (:meth:`with_recipe`), an unset objectness
        target is checked as the loss's default."""
        share = {} if self.objectness_iou is None else {"objectness_iou": self.objectness_iou}
        return LossOptions(
            iou_loss=self.iou_loss,
            iou_normalizer=self.iou_normalizer,
            obj_normalizer=self.obj_normalizer,
            cls_normalizer=self.cls_normalizer,
            label_smoothing=self.label_smoothing,
            **share,
        )

    def communication(self, precision=None):
        """The run's :class:`yolo3.comm.schemes.Communication`, from the communication
        flags (:func:`yolo3.comm.schemes.communication_from`, which refuses what does not
        go together); ``precision``: the mixed precision in force, if known."""
        names = (field.name for field in dataclasses.fields(CommunicationFlags))
        given = {name: getattr(self, name) for name in names if name != "precision"}
        return communication_from(**given, precision=precision)


def add_arguments(parser):
    """Adds a flag for every :class:`TrainConfig` field to ``parser``, in the groups of
    :data:`GROUPS`; returns the groups by key, for flags of the command's own."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    flags.add_arguments(groups, TrainConfig)
    return groups


def from_args(args):
    """The :class:`TrainConfig` of arguments parsed with :func:`add_arguments`' flags."""
    return flags.from_args(TrainConfig, args)
