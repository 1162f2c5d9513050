"""Train YOLOv3 or tiny-YOLOv3 on a record set, on a CPU, one or several GPUs, or machines.

    yolo3 preprocess --annotations train.txt --classes classes.txt --output rec
    yolo3 train --records rec --anchors model_data/yolo_anchors.txt --gpus 4

``--batch-size`` is per replica; the learning rate scales linearly with the global batch.
With ``TF_CONFIG`` (or a multi-task Slurm step) in the environment, every worker runs this
same command and they train as one job (``yolo3 launch`` starts such jobs).
A job killed mid-training resumes from its last backup when started again with the same
command (the newest step every worker holds, also mid-epoch); ``--resume`` continues a
finished run from its saved state (e.g. more epochs). SIGTERM to any worker stops every
worker after the same step, with a backup there.

Exit status: 0 when training finished; 1 when it stopped on a non-finite loss or failed
under way (a lost worker, a full disk, a damaged record shard: one line says what to do);
2 on bad usage or input; 143 when stopped by SIGTERM (preempted) with backups written: run
the same command to resume.
"""

import argparse
import sys

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3.callbacks import PREEMPTED_STATUS
from yolo3.cli import (
    KNOWN_ERRORS,
    ArgumentParser,
    add_model_type_argument,
    add_progress_arguments,
    fail,
    output_folder,
    progress_setting,
    run_main,
)
from yolo3.engine import training
from yolo3.model.network import MODEL_TYPES


def _on_off(text):
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return text == "on"


def build_parser():
    defaults = training.TrainConfig(records="", log_dir="")
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument("--records", required=True, help="record set from yolo3 preprocess")
    data.add_argument("--val-records", help="validation record set (default: --records' val)")
    data.add_argument(
        "--flip", type=float, default=defaults.flip, help="online horizontal-flip probability"
    )
    data.add_argument("--shuffle-buffer", type=int, default=defaults.shuffle_buffer)
    data.add_argument(
        "--multi-scale",
        nargs="?",
        const="auto",
        metavar="MIN:MAX",
        help="change the square input size every 10 steps, as Darknet's random=1: alone, "
        "Darknet's sizes (320 to 608 for 416 px records); or MIN:MAX in pixels",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--anchors",
        help="anchors file: 9 pairs for yolov3, 6 for tiny (default: Darknet's COCO anchors "
        "of --model-type, shipped with the package; tiny when neither is given)",
    )
    add_model_type_argument(model, help="default: from the anchors")
    # --model: the spelling of earlier releases, kept working for a release, out of --help.
    model.add_argument("--model", dest="model_type", choices=MODEL_TYPES, help=argparse.SUPPRESS)
    model.add_argument(
        "--weights",
        help="initial weights: converted Darknet, our checkpoints or "
        "original keras-yolo3 .h5 (mismatched heads are skipped and reported)",
    )
    model.add_argument(
        "--freeze-body",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="1: freeze the backbone, 2: all but the heads, for --freeze-epochs",
    )
    model.add_argument("--freeze-epochs", type=int, default=0)
    model.add_argument(
        "--ignore-thresh",
        type=float,
        default=defaults.ignore_thresh,
        help="IoU above which a prediction is not penalised as background (Darknet's .7)",
    )
    sched = parser.add_argument_group("schedule")
    sched.add_argument("--epochs", type=int, default=defaults.epochs)
    sched.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="images per replica per step"
    )
    sched.add_argument(
        "--lr",
        type=float,
        default=defaults.lr,
        help="learning rate for a global batch of --lr-reference-batch",
    )
    sched.add_argument("--lr-reference-batch", type=int, default=defaults.lr_reference_batch)
    sched.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine")
    sched.add_argument("--warmup-epochs", type=float, default=defaults.warmup_epochs)
    sched.add_argument("--optimizer", choices=("adam", "sgd"), default=defaults.optimizer)
    sched.add_argument("--momentum", type=float, default=defaults.momentum)
    sched.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    sched.add_argument("--steps-per-epoch", type=int, help="default: one pass over the records")
    sched.add_argument(
        "--reduce-lr-on-plateau",
        type=int,
        metavar="PATIENCE",
        help="divide the learning rate by 10 after PATIENCE epochs without progress",
    )
    sched.add_argument("--early-stopping", type=int, metavar="PATIENCE")
    sched.add_argument("--seed", type=int, default=defaults.seed)
    dev = parser.add_argument_group("devices")
    dev.add_argument("--gpus", type=int, help="GPUs to train on (0: CPU; default: all visible)")
    dev.add_argument(
        "--cpu-replicas",
        type=int,
        help="split the CPU into N logical devices and train on all of them "
        "(the multi-GPU code path, without GPUs)",
    )
    dev.add_argument("--sync-bn", type=_on_off, help="on/off (default: on with >1 replica)")
    dev.add_argument(
        "--mixed-precision",
        choices=("auto", "off", "float16", "bfloat16"),
        default=defaults.mixed_precision,
        help="auto: bfloat16 on GPUs of compute capability >= 8.0, float16 with loss scaling "
        "on 7.x, off on older GPUs and the CPU",
    )
    dev.add_argument(
        "--jit-compile",
        choices=("auto", "on", "off"),
        default=defaults.jit_compile,
        help="XLA; auto: on for one GPU with no strategy, off on the CPU and with replicas",
    )
    dev.add_argument(
        "--remat",
        choices=training.REMAT_CHOICES,
        default=defaults.remat,
        help="recompute activations in the backward pass to fit larger batches, for about one "
        "forward pass more per step: full (every Darknet unit), large (strides 1-8 only, "
        "where most activations are), off",
    )
    dev.add_argument(
        "--no-memory-growth",
        action="store_true",
        help="let TensorFlow take all GPU memory up front",
    )
    comm = parser.add_argument_group("communication between replicas and workers")
    comm.add_argument(
        "--accumulate",
        type=int,
        default=defaults.accumulate,
        metavar="K",
        help="micro-batches per optimizer step (Darknet's subdivisions): each replica runs K "
        "batches of --batch-size, sums their gradients and all-reduces once; the global batch "
        "is K x batch x replicas. Trains a batch too large for memory, and sends K times less "
        "over a slow network",
    )
    comm.add_argument(
        "--allreduce-dtype",
        choices=training.ALLREDUCE_DTYPES,
        default=defaults.allreduce_dtype,
        help="dtype gradients travel in between replicas (bfloat16/float16 halve the bytes; "
        "float16 is scaled per tensor so that it neither overflows nor underflows)",
    )
    comm.add_argument(
        "--compress",
        choices=training.COMPRESSIONS,
        default=defaults.compress,
        help="powersgd: all-reduce each large convolution's gradient as two rank-R factors, "
        "with error feedback (PowerSGD: about 100x fewer bytes for YOLOv3 at rank 4); other "
        "gradients travel in --allreduce-dtype. Not with float16 mixed precision",
    )
    comm.add_argument(
        "--rank",
        type=int,
        default=defaults.rank,
        metavar="R",
        help="rank of the PowerSGD factors (higher: closer to the full gradient, more bytes)",
    )
    comm.add_argument(
        "--local-steps",
        type=int,
        default=defaults.local_steps,
        metavar="H",
        help="no all-reduce in the step: each replica trains alone and every H optimizer "
        "steps they average their weight changes (in --allreduce-dtype), and fully at epoch "
        "ends and backups. Not with --compress or --sync-bn on",
    )
    comm.add_argument(
        "--outer-lr",
        type=float,
        default=defaults.outer_lr,
        help="learning rate of the outer step at each --local-steps synchronisation "
        "(1 with --outer-momentum 0: plain averaging; DiLoCo uses 0.7)",
    )
    comm.add_argument(
        "--outer-momentum",
        type=float,
        default=defaults.outer_momentum,
        help="Nesterov momentum of the outer step, in [0, 1) (DiLoCo uses 0.9)",
    )
    comm.add_argument(
        "--overlap-sync",
        type=int,
        default=defaults.overlap_sync,
        metavar="T",
        help="with --local-steps H: send each period's weight changes during the first T "
        "steps of the next period (1 <= T <= H), a chunk in each step while it computes, "
        "and apply them there, T steps late (no step waits for the link)",
    )
    comm.add_argument(
        "--dense-steps",
        type=int,
        default=defaults.dense_steps,
        metavar="N",
        help="with --compress or --local-steps: the first N optimizer steps all-reduce the "
        "whole gradient, as ordinary training does, before they take over (a warm-up that "
        "keeps the accuracy of the uncompressed run; about one epoch)",
    )
    comm.add_argument(
        "--collective-timeout",
        type=float,
        default=defaults.collective_timeout,
        metavar="SECONDS",
        help="several machines: a collective that waits longer for a dead or unreachable "
        "worker fails the job instead of hanging (default: wait forever)",
    )
    comm.add_argument(
        "--bytes-per-pack",
        type=int,
        default=defaults.bytes_per_pack,
        metavar="BYTES",
        help="several machines: split all-reduces into packs of this size (0: TensorFlow decides)",
    )
    comm.add_argument(
        "--slurm-port-base",
        type=int,
        metavar="PORT",
        help="under Slurm, task k of a node listens on PORT + k; two jobs sharing a node need "
        "bases at least their task count apart (default: $YOLO3_SLURM_PORT_BASE, else 8888)",
    )
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument(
        "--log-dir", type=output_folder, default="logs/run", help="checkpoints, TensorBoard, config"
    )
    ckpt.add_argument("--checkpoint-every", type=int, metavar="K", help="keep every K-th epoch")
    ckpt.add_argument(
        "--backup-every",
        type=int,
        metavar="STEPS",
        help="back up every STEPS steps (default: each epoch)",
    )
    ckpt.add_argument("--resume", action="store_true", help="continue the run in --log-dir")
    log = parser.add_argument_group("logging and checks")
    log.add_argument(
        "--map-every",
        type=int,
        metavar="K",
        help="evaluate mAP@0.5 on the validation split every K epochs (chief)",
    )
    log.add_argument(
        "--benchmark",
        action="store_true",
        help="train on synthetic in-memory data: speed without input cost",
    )
    log.add_argument(
        "--test-io",
        type=float,
        metavar="SECONDS",
        help="only read the input pipeline for SECONDS and print images/s",
    )
    add_progress_arguments(
        log,
        help="auto: a progress bar on a terminal, plain lines when output goes to a file or "
        "pipe (a Slurm job, nohup, CI): one per epoch with every logged value, and one every "
        "--log-every steps or --log-seconds seconds",
    )
    log.add_argument(
        "--log-every",
        type=int,
        default=defaults.log_every,
        metavar="STEPS",
        help="plain lines: one every STEPS steps (default: by time only)",
    )
    log.add_argument(
        "--log-seconds",
        type=float,
        default=defaults.log_seconds,
        metavar="SECONDS",
        help="plain lines: one every SECONDS seconds (0: by steps only)",
    )
    return parser


def config_from_args(args):
    return training.TrainConfig(
        records=args.records,
        log_dir=args.log_dir,
        val_records=args.val_records,
        anchors=args.anchors,
        model=args.model_type,
        weights=args.weights,
        freeze_body=args.freeze_body,
        freeze_epochs=args.freeze_epochs,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        lr_reference_batch=args.lr_reference_batch,
        lr_schedule=args.lr_schedule,
        warmup_epochs=args.warmup_epochs,
        optimizer=args.optimizer,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        mixed_precision=args.mixed_precision,
        sync_bn=args.sync_bn,
        seed=args.seed,
        flip=args.flip,
        shuffle_buffer=args.shuffle_buffer,
        ignore_thresh=args.ignore_thresh,
        steps_per_epoch=args.steps_per_epoch,
        checkpoint_every=args.checkpoint_every,
        map_every=args.map_every,
        backup_every=args.backup_every,
        reduce_lr_patience=args.reduce_lr_on_plateau,
        early_stopping_patience=args.early_stopping,
        jit_compile=args.jit_compile,
        remat=args.remat,
        multi_scale=args.multi_scale,
        accumulate=args.accumulate,
        allreduce_dtype=args.allreduce_dtype,
        compress=args.compress,
        rank=args.rank,
        local_steps=args.local_steps,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        overlap_sync=args.overlap_sync,
        dense_steps=args.dense_steps,
        collective_timeout=args.collective_timeout,
        bytes_per_pack=args.bytes_per_pack,
        slurm_port_base=args.slurm_port_base,
        gpus=args.gpus,
        cpu_replicas=args.cpu_replicas,
        memory_growth=not args.no_memory_growth,
        resume=args.resume,
        benchmark=args.benchmark,
        progress=progress_setting(args),
        log_every=args.log_every,
        log_seconds=args.log_seconds,
    )


def _train(args):
    config = config_from_args(args)
    training.configure(config)
    if args.test_io:
        return training.test_io(config, seconds=args.test_io)
    result = training.run(config)
    if result.preempted_at is not None:
        epoch, step = result.preempted_at
        print(
            f"stopped on request after optimizer step {step} (epoch {epoch + 1}), backups "
            f"written; the same command resumes there (exit status {PREEMPTED_STATUS})",
            file=sys.stderr,
        )
        return PREEMPTED_STATUS
    return fail(result.stopped_reason, status=1) if result.stopped_reason else 0


def main(argv=None):
    errors = (*KNOWN_ERRORS, training.XlaCompileError)
    # training.CollectiveError, like every fault under way, is a RunFailed: status 1.
    return run_main(build_parser(), argv, _train, errors=errors)


if __name__ == "__main__":
    sys.exit(main())
