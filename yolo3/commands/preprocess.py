"""Pre-resize and pre-augment a dataset offline into TFRecord shards that keep GPUs fed.

    yolo3 preprocess --annotations train.txt --classes model_data/voc_classes.txt \\
        --output records/voc416 --input-size 416 --copies 4 --val-fraction 0.05

    yolo3 preprocess --data datasets/parts/data.yaml --output records/parts --input-size 416

``--data`` reads a dataset where it lies, in the layout it came in: an Ultralytics
``data.yaml``, a Darknet ``.data`` file, a COCO instances JSON or a VOCdevkit folder
(:mod:`yolo3.data.formats`); its class names and validation split come with it.

Each image yields one clean letterboxed copy and ``--copies`` augmented ones (the original
keras-yolo3 augmentation: aspect jitter, scale, placement on gray, flip, HSV); with
``--mosaic P`` each augmented copy is, with probability P, a mosaic of the image and 3
others instead (:mod:`yolo3.data.mosaic`). The validation split is written clean only.
Bad lines, boxes and images are skipped, counted in ``manifest.json`` and listed in
``rejects.txt``; ``--strict`` makes any of them an error.

A killed run is resumed by running the same command again. ``--verify DIR`` checks a
finished record set. Paths may be local or any filesystem TensorFlow reads (``gs://``).

Exit status: 0 on success, 1 when ``--verify`` finds problems, 2 on bad usage or input.
"""

import argparse
import sys

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3 import flags
from yolo3.cli import (
    ArgumentParser,
    add_progress_arguments,
    fail,
    output_folder,
    progress_setting,
    run_main,
)
from yolo3.data import preprocess
from yolo3.data.augment import AugmentConfig
from yolo3.data.preprocess import PreprocessConfig
from yolo3.distributed.devices import available_cores
from yolo3.text import plural


def add_dataset_arguments(parser, group=None):
    """The flags that name a dataset, its split and its records' size, on ``parser`` (in
    ``group`` when given): ``yolo3 preprocess`` and ``yolo3 train --data`` take them alike,
    the settings of :class:`yolo3.data.preprocess.PreprocessConfig`'s groups ``"dataset"``
    and ``"validation"``. Returns the group of the validation split's flags."""
    split = group or parser.add_argument_group("validation split and class filter")
    flags.add_arguments({"dataset": group or parser, "validation": split}, PreprocessConfig)
    return split


def dataset_config(args, **settings):
    """The :class:`yolo3.data.preprocess.PreprocessConfig` of :func:`add_dataset_arguments`'
    flags (and those of ``yolo3 preprocess`` alone, where ``args`` has them); ``settings``:
    fields given otherwise. Raises ValueError naming the flag a dataset lacks (the config's
    checks)."""
    return flags.from_args(PreprocessConfig, args, **settings)


def _add_running_arguments(run):
    """The flags of how a run goes, which leave its output as it is."""
    run.add_argument(
        "--workers",
        type=int,
        default=available_cores(),
        help="worker processes (default: all cores); the output does not depend on it",
    )
    run.add_argument("--strict", action="store_true", help="any rejected input is an error")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the record set in --output (its files only) first, whatever its settings",
    )
    add_progress_arguments(run)
    # --no-progress: the spelling of earlier releases (--quiet), kept working for a release,
    # out of --help.
    run.add_argument("--no-progress", action="store_true", dest="quiet", help=argparse.SUPPRESS)
    run.add_argument("--verify", metavar="DIR", help="check a record set and exit")


def build_parser():
    parser = ArgumentParser(
        description="Pack annotated images into letterboxed and augmented TFRecord shards."
    )
    split = add_dataset_arguments(parser)
    parser.add_argument("--output", type=output_folder, help="output folder of the record set")
    # The other settings of PreprocessConfig, one flag per field (yolo3.flags).
    groups = {
        "per_class": split,
        "format": parser.add_argument_group("output format"),
        "augmentation": parser.add_argument_group(
            "augmentation (defaults: the original keras-yolo3)"
        ),
        "running": parser.add_argument_group("running"),
    }
    flags.add_arguments(groups, PreprocessConfig)
    _add_running_arguments(groups["running"])
    return parser


def _verify(directory):
    from yolo3.data import records  # noqa: PLC0415 - imports TensorFlow

    problems, counts = records.verify(directory)
    for problem in problems:
        print(problem, file=sys.stderr)
    status = "OK" if not problems else f"{len(problems)} problems"
    print(
        f"{directory}: {counts['shards']} shards, {counts['records']} records, "
        f"{counts['boxes']} boxes: {status}"
    )
    return 0 if not problems else 1


def _summary(manifest, output):
    lines = [
        f"record set {output}: {manifest['input_size'][0]}x{manifest['input_size'][1]}, "
        f"{manifest['image_format']}, {len(manifest['classes'])} classes"
    ]
    for split, info in manifest["splits"].items():
        stored = f" ({info['image_format']})" if "image_format" in info else ""
        mosaics = f" ({info['mosaic_records']} mosaics)" if "mosaic_records" in info else ""
        lines.append(
            f"  {split}: {plural(info['images'], 'image')} -> "
            f"{plural(info['records'], 'record')}{mosaics}{stored}, "
            f"{plural(info['boxes'], 'box', 'boxes')}, {plural(len(info['shards']), 'shard')}"
        )
    validation = manifest.get("validation", {})
    if "text" in validation:
        lines.append(f"  validation: {validation['text']}")
    counts = {k: v for k, v in manifest["counts"].items() if v}
    if counts:
        lines.append("  counts: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return "\n".join(lines)


def _rejected_warning(manifest, output):
    """The closing line when input was rejected (None when nothing was): how much, where
    the list is, and ``--strict``. Rejected boxes are a share of the boxes read."""
    if not manifest["rejects"]:
        return None
    rejected = ", ".join(f"{k}={v}" for k, v in manifest["rejects"].items())
    counts = manifest["counts"]
    boxes = counts.get("rejected_boxes", 0)
    share = ""
    if boxes:
        read = boxes + sum(info["boxes"] for info in manifest["splits"].values())
        share = f" ({boxes} of {read} boxes, {boxes / read:.0%}, were dropped)"
    return (
        f"warning: input was rejected{share}: {rejected}; each is listed with its file and "
        f"line in {output}/rejects.txt. Fix them and run the same command again, or pass "
        "--strict to make any rejected input an error"
    )


def _preprocess(args, parser):
    if args.verify:
        return _verify(args.verify)
    if not args.output:
        parser.print_usage(sys.stderr)
        return fail("--output required: the folder the record set is written to")
    config = dataset_config(args, augment=flags.from_args(AugmentConfig, args))
    manifest = preprocess.run(
        config,
        workers=args.workers,
        overwrite=args.overwrite,
        strict=args.strict,
        progress=progress_setting(args),
    )
    print(_summary(manifest, args.output))
    warning = _rejected_warning(manifest, args.output)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def main(argv=None):
    parser = build_parser()
    return run_main(parser, argv, lambda args: _preprocess(args, parser))


if __name__ == "__main__":
    sys.exit(main())
