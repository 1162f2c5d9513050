"""Train YOLOv3 or tiny-YOLOv3 on a dataset or a record set, on a CPU, GPUs, or machines.

    yolo3 train --data datasets/parts/data.yaml --epochs 50
    yolo3 preprocess --annotations train.txt --classes classes.txt --output rec
    yolo3 train --records rec --anchors model_data/yolo_anchors.txt --gpus 4

``--data`` (or ``--annotations`` with ``--classes``) takes a dataset as ``yolo3 preprocess``
reads it, with preprocessing's ``--input-size``, ``--copies`` and validation flags: without
``--anchors`` or ``--weights`` it fits anchors to the boxes (as ``yolo3 kmeans``), then
preprocesses into a record cache keyed by the dataset's content and the settings (the same
command again preprocesses nothing; :mod:`yolo3.data.cache`) and trains on it. ``--time``
counts the preprocessing.

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

import os
import sys
import time

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3 import faults
from yolo3.callbacks import PREEMPTED_STATUS
from yolo3.cli import (
    KNOWN_ERRORS,
    ArgumentParser,
    fail,
    progress_setting,
    run_main,
)
from yolo3.commands.preprocess import add_dataset_arguments, dataset_config
from yolo3.data import cache
from yolo3.distributed.strategy import num_tasks
from yolo3.engine import config as run_config
from yolo3.engine.builders import DEFAULT_MODEL_TYPE
from yolo3.model.resources import anchors_of_model
from yolo3.training import job as training


def build_parser():
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    # One flag per TrainConfig field, generated from the field (yolo3.engine.config).
    groups = run_config.add_arguments(parser)
    dataset = parser.add_argument_group(
        "dataset, instead of --records (preprocessed into the record cache)"
    )
    add_dataset_arguments(parser, group=dataset)
    dataset.add_argument(
        "--cache-dir",
        help=f"the record cache (default: ${cache.CACHE_ENV}, else $XDG_CACHE_HOME/yolo3, "
        "else ~/.cache/yolo3)",
    )
    groups["logging"].add_argument(
        "--test-io",
        type=float,
        metavar="SECONDS",
        help="only read the input pipeline for SECONDS and print images/s",
    )
    return parser


config_from_args = run_config.from_args


def _with_records(args):
    """``args`` with ``records`` (and ``anchors``, when neither they nor ``--weights`` were
    given) from the record cache of ``--data``/``--annotations``; as they are with
    ``--records``. Raises ValueError when neither or both are given."""
    from_dataset = bool(args.data or args.annotations)
    if from_dataset == bool(args.records):
        raise ValueError(
            "give the data: --data PATH (or --annotations FILE --classes FILE), which "
            "preprocesses it, or --records DIR from yolo3 preprocess; not both"
            if from_dataset
            else "give the data: --data PATH (a data.yaml, .data file, COCO JSON or VOC "
            "folder), --annotations FILE with --classes FILE, or --records DIR"
        )
    if not from_dataset:
        return args
    fit = not (args.anchors or args.weights)
    cache_dir = args.cache_dir or cache.default_cache_dir()
    prepared = cache.prepare(
        dataset_config(args, output=cache_dir),  # the cache chooses the folder under it
        cache_dir=cache_dir,
        num_anchors=anchors_of_model(args.model or DEFAULT_MODEL_TYPE) if fit else None,
        num_workers=num_tasks(os.environ),
        progress=progress_setting(args),
    )
    args.records = prepared.records
    if fit:
        args.anchors = prepared.anchors
    return args


def _train(args):
    started = time.perf_counter()  # --time counts preprocessing too
    config = config_from_args(_with_records(args))
    training.configure(config)
    # A record that does not decode stops the input pipeline: named, status 2 (bad input),
    # before the next checkpoint or backup is written.
    record_sets = [path for path in (config.records, config.val_records) if path]
    with faults.undecodable_records_named(record_sets):
        if args.test_io:
            return training.test_io(config, seconds=args.test_io)
        result = training.run(config, started=started)
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
