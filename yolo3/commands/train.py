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
under way (a lost worker, a full disk, a record shard damaged under it: one line says what
to do); 2 on bad usage or input (a record that cannot be read or decoded: one line names
its shard and index); 143 when stopped by SIGTERM (preempted) with backups written: run
the same command to resume.
"""

import sys

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3 import faults
from yolo3.callbacks import PREEMPTED_STATUS
from yolo3.cli import (
    KNOWN_ERRORS,
    ArgumentParser,
    fail,
    run_main,
)
from yolo3.engine import config as run_config
from yolo3.training import job as training


def build_parser():
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    # One flag per TrainConfig field, generated from the field (yolo3.engine.config).
    groups = run_config.add_arguments(parser)
    groups["logging"].add_argument(
        "--test-io",
        type=float,
        metavar="SECONDS",
        help="only read the input pipeline for SECONDS and print images/s",
    )
    return parser


config_from_args = run_config.from_args


def _train(args):
    config = config_from_args(args)
    training.configure(config)
    # A record that does not decode stops the input pipeline: named, status 2 (bad input),
    # before the next checkpoint or backup is written.
    record_sets = [path for path in (config.records, config.val_records) if path]
    with faults.undecodable_records_named(record_sets):
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
