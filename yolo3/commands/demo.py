"""The main job end to end on built-in data: generate, preprocess, train, evaluate.

    yolo3 demo [--output demo_run]

1. generates a data set of shapes on textured backgrounds (``yolo3 make-demo-dataset``),
2. fits anchors to it (``yolo3 kmeans``),
3. packs it into letterboxed and augmented record shards (``yolo3 preprocess``),
4. trains tiny-YOLOv3 from scratch on the CPU (``yolo3 train``),
5. measures mAP on the held-out split and draws a gallery (``yolo3 evaluate``).

It scores ``last.weights.h5``, the weights after the final epoch. ``best.weights.h5`` is
chosen by COCO AP on the same held-out images, so its mAP there would be biased upwards by
that choice.

Each step runs the real tool in its own process, and its command line is printed so that
it can be rerun by hand. Needs no data and no network. Exit status: 0 on success, 1 when a
step fails, 2 on bad usage.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from yolo3.cli import ArgumentParser, add_progress_arguments, run_main

PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def build_parser():
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="demo_run", help="folder for everything it writes")
    # Fresh generated images teach more than augmented copies of fewer ones, and cost the
    # same to train on: the demo generates many and packs no extra copies.
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--val-images", type=int, default=300)
    parser.add_argument("--input-size", type=int, default=96)
    parser.add_argument("--copies", type=int, default=0, help="augmented copies per image")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    # The learning rate and ignore threshold are yolo3 train's own from-scratch defaults
    # (yolo3.engine.config.RECIPES), measured on this task.
    parser.add_argument("--lr", type=float, help="default: yolo3 train's from scratch")
    parser.add_argument("--ignore-thresh", type=float, help="default: yolo3 train's from scratch")
    parser.add_argument(
        "--multi-scale",
        nargs="?",
        const="auto",
        metavar="MIN:MAX",
        help="train multi-scale (yolo3 train --multi-scale; alone: 64 to 128 px here)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_progress_arguments(parser, help="passed to the tools that show progress")
    return parser


def _progress_flags(args):
    """``--progress`` and ``--quiet`` as the tools take them, left out where they are the
    default (the commands printed stay short)."""
    if args.quiet:
        return ["--quiet"]
    return [] if args.progress == "auto" else ["--progress", args.progress]


def _run(title, name, argv, timings):
    """Runs ``yolo3 NAME`` in a process of its own, as a user would type it."""
    command = f"yolo3 {name}"
    print(f"\n== {title}\n$ {command} {shlex.join(argv)}", flush=True)
    started = time.perf_counter()
    # The same library in the child, installed or not: its folder leads the import path.
    path = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"),
    }
    code = subprocess.run([sys.executable, "-m", "yolo3", name, *argv], env=env).returncode
    timings[title] = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"step '{title}' failed ({command} exited with {code})")


def run(args):
    out = Path(args.output)
    data, records, log_dir = out / "data", out / "records", out / "train"
    anchors, report = out / "anchors.txt", out / "eval"
    size = str(args.input_size)
    progress = _progress_flags(args)
    timings = {}
    _run("generate the data set", "make-demo-dataset", [
        "--output", str(data), "--train", str(args.train_images),
        "--val", str(args.val_images), "--size", size, "--seed", str(args.seed),
    ], timings)  # fmt: skip
    _run("fit anchors", "kmeans", [
        "--annotations", str(data / "train.txt"), "-k", "6", "--input-size", size,
        "--output", str(anchors),
    ], timings)  # fmt: skip
    _run("preprocess into record shards", "preprocess", [
        "--annotations", str(data / "train.txt"), "--val-annotations", str(data / "val.txt"),
        "--classes", str(data / "classes.txt"), "--output", str(records),
        "--input-size", size, "--copies", str(args.copies), "--seed", str(args.seed),
        "--overwrite", *progress,
    ], timings)  # fmt: skip
    _run("train tiny-YOLOv3 from scratch", "train", [
        "--records", str(records), "--anchors", str(anchors), "--log-dir", str(log_dir),
        "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
        *(["--lr", str(args.lr), "--lr-reference-batch", str(args.batch_size)]
          if args.lr is not None else []),
        *(["--ignore-thresh", str(args.ignore_thresh)] if args.ignore_thresh is not None else []),
        "--warmup-epochs", "1", "--seed", str(args.seed), "--gpus", "0", *progress,
        *(["--multi-scale", args.multi_scale] if args.multi_scale else []),
        *(["--resume"] if (log_dir / "checkpoints" / "state.weights.h5").exists() else []),
    ], timings)  # fmt: skip
    _run("evaluate on the held-out images", "evaluate", [
        "--weights", str(log_dir / "checkpoints" / "last.weights.h5"),
        "--records", str(records), "--output", str(report), *progress,
    ], timings)  # fmt: skip
    metrics = json.loads((report / "metrics.json").read_text())
    print("\n== done")
    for title, seconds in timings.items():
        print(f"  {title:<34} {seconds:7.1f} s")
    print(f"  {'total':<34} {sum(timings.values()):7.1f} s")
    print(f"mAP@0.5 on {metrics['num_images']} held-out images: {metrics['voc']['mAP']:.3f}")
    print(
        f"gallery: {report / 'gallery.png'}; curves: {report / 'pr'}; TensorBoard: "
        f"tensorboard --logdir {log_dir}"
    )
    return metrics


def _demo(args):
    run(args)
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, _demo, errors=(), failures=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
