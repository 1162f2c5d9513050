"""The training recipe, setting against setting: COCO AP of ``yolo3 train`` on the demo's task.

Each setting (a name and the ``yolo3 train`` flags it adds to the demo's recipe) trains once
per seed from scratch on the same record set, in a process of its own pinned to one core
(``os.sched_setaffinity`` before TensorFlow starts, so its thread pools have one core);
runs go to the given cores as they free up. Each run's ``last.weights.h5`` is scored by
``yolo3 evaluate --annotations`` on the original validation images (pycocotools' COCO AP,
AP50, AP75, and VOC mAP@0.5), the figures a user meets. Per setting: the mean over its seeds
and half their range, beside each seed's figures and training wall time, and each run's
curve: the COCO AP ``yolo3 train`` scored on the validation split after each epoch, with the
training seconds to then (its ``results.csv``), so that settings of different lengths (a
fine-tuning run against one from scratch) can be drawn against time.

The data (the demo's: ``yolo3 make-demo-dataset``, anchors by ``yolo3 kmeans``, a record set
by ``yolo3 preprocess``) is made in ``--work`` when absent, with the same commands the demo
runs. Training wall times compare only between runs made side by side on an idle machine;
the AP figures do not depend on the load.
"""

import contextlib
import csv
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The demo's recipe (yolo3/commands/demo.py): what every setting adds its flags to.
BASE_FLAGS = (
    "--batch-size", "16", "--lr", "0.008", "--lr-reference-batch", "16",
    "--warmup-epochs", "1", "--ignore-thresh", "0.5", "--gpus", "0", "--quiet",
)  # fmt: skip
METRICS = ("AP", "AP50", "AP75", "mAP50")


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """``settings``: ``(name, flags)`` pairs; the rest as ``tools/benchmark.py recipe``."""

    settings: tuple
    work: str
    seeds: tuple = (0, 1)
    epochs: int = 6
    train_images: int = 4000
    val_images: int = 300
    input_size: int = 96
    cores: tuple = (0,)
    timeout: float = 3600.0

    def __post_init__(self):
        names = [name for name, _ in self.settings]
        if len(set(names)) != len(names):
            raise ValueError(f"--settings names must differ: {names}")
        if not self.seeds or self.epochs < 1 or not self.cores:
            raise ValueError("give at least one seed, one epoch and one core")


def parse_setting(text):
    """``NAME=FLAGS`` -> ``(NAME, (flag, ...))``; ``recipe=`` (no flags) is the recipe as it is."""
    name, equals, flags = text.partition("=")
    if not equals or not name:
        raise ValueError(f"setting {text!r} is not NAME=FLAGS (e.g. ciou=--iou-loss ciou)")
    return name, tuple(flags.split())


def yolo3_process(*args, core=None, log=None, wrap=None):
    """Runs ``python -m yolo3 ARGS`` (this checkout's library), pinned to ``core``;
    ``wrap(argv)`` gives the command line that runs ``argv`` (e.g. in a network namespace)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    argv = [sys.executable, "-m", "yolo3", *map(str, args)]

    def pin():
        if core is not None:
            os.sched_setaffinity(0, {core})

    with open(log or os.devnull, "w") as out:
        return subprocess.Popen(
            wrap(argv) if wrap else argv,
            env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin,
            start_new_session=True,  # its own process group: stop() ends what it started
        )  # fmt: skip


def stop(process, grace=30.0):
    """Ends ``process`` and every process it started (its process group), if still running:
    SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def check_exit(process, what, timeout):
    if process.wait(timeout=timeout) != 0:
        raise RuntimeError(f"{what} failed (exit status {process.returncode})")


def data_folder(config):
    """The folder of ``config``'s annotation files (train.txt, val.txt, classes.txt)."""
    return Path(config.work) / "data"


def prepare(config):
    """The demo's data, anchors and record set in ``config.work``, made once."""
    work = Path(config.work)
    data, records = data_folder(config), work / "records"
    size = str(config.input_size)
    steps = [
        ("data", data / "val.txt", ("make-demo-dataset", "--output", data, "--train",
         config.train_images, "--val", config.val_images, "--size", size, "--seed", 0)),
        ("anchors", work / "anchors.txt", ("kmeans", "--annotations", data / "train.txt",
         "-k", 6, "--input-size", size, "--output", work / "anchors.txt")),
        ("records", records / "manifest.json", ("preprocess", "--annotations",
         data / "train.txt", "--val-annotations", data / "val.txt", "--classes",
         data / "classes.txt", "--output", records, "--input-size", size, "--copies", 0,
         "--overwrite", "--progress", "off")),
    ]  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    for what, done, args in steps:
        if not done.exists():
            check_exit(yolo3_process(*args, log=work / f"{what}.log"), f"making the {what}", None)
    return data, records, work / "anchors.txt"


def evaluate_run(run_dir, data, core=None):
    """Scores ``run_dir``'s ``last.weights.h5`` with ``yolo3 evaluate`` on the original
    validation images: :func:`score`'s figures."""
    evaluate = ("evaluate", "--weights", run_dir / "checkpoints" / "last.weights.h5",
                "--annotations", data / "val.txt", "--output", run_dir / "eval",
                "--gallery", 0, "--progress", "off")  # fmt: skip
    check_exit(yolo3_process(*evaluate, core=core, log=f"{run_dir}.eval.log"), "scoring", None)
    return score(run_dir)


def score(run_dir):
    """``{AP, AP50, AP75, mAP50, AP_by_iou}`` of ``yolo3 evaluate``'s report in ``run_dir``."""
    from yolo3.evaluation.metrics import AP_BY_IOU  # noqa: PLC0415 - pycocotools, when scoring

    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    coco = metrics.get("coco") or {}
    return {
        "AP": coco.get("AP"),
        "AP50": coco.get("AP50"),
        "AP75": coco.get("AP75"),
        "mAP50": metrics["voc"]["mAP"],
        AP_BY_IOU: coco.get(AP_BY_IOU),
    }


def curve(run_dir):
    """``[{epoch, seconds, AP}]`` from ``run_dir``'s ``results.csv``: the validation split's
    COCO AP after each epoch and the training seconds to then (empty where the file is
    missing; an epoch not scored has AP None)."""
    path = Path(run_dir) / "results.csv"
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return [
        {
            "epoch": int(row["epoch"]),
            "seconds": float(row["seconds"]),
            "AP": float(row["val_AP"]) if row.get("val_AP") else None,
        }
        for row in rows
    ]


def side_by_side(jobs, cores, start, finish):
    """Runs ``jobs`` as processes, one per core at a time, each on the next core to free up.

    ``start(job, core)`` starts a job's process and returns it, or None when the job needs
    none; ``finish(job, core, process, seconds)`` is called once its process has ended,
    ``seconds`` after it started. When either raises, the runs still going are stopped.
    """
    pending, running, free = list(jobs), {}, list(cores)
    try:
        while pending or running:
            while pending and free:
                job, core = pending.pop(0), free.pop(0)
                process = start(job, core)
                if process is None:
                    free.append(core)
                    continue
                running[process] = (job, core, time.perf_counter())
            if running:
                time.sleep(1.0)
            for process in [p for p in running if p.poll() is not None]:
                job, core, started = running.pop(process)
                finish(job, core, process, time.perf_counter() - started)
                free.append(core)
    finally:  # a failed run (or Ctrl-C) leaves none of the others running
        for process in running:
            stop(process)


def run_recipe(config, command=None, log=print):
    """Trains and scores every setting and seed; the result dict (see the module docstring)."""
    data, records, anchors = prepare(config)
    jobs = [(name, flags, seed) for name, flags in config.settings for seed in config.seeds]
    runs = []

    def run_dir(name, seed):
        return Path(config.work) / "runs" / f"{name}-seed{seed}"

    def start(job, core):
        name, flags, seed = job
        folder = run_dir(name, seed)
        folder.parent.mkdir(parents=True, exist_ok=True)
        train = ("train", "--records", records, "--anchors", anchors, "--log-dir", folder,
                 "--epochs", config.epochs, "--seed", seed, *BASE_FLAGS, *flags)  # fmt: skip
        log(f"core {core}: {name}, seed {seed}: yolo3 {' '.join(map(str, train))}")
        return yolo3_process(*train, core=core, log=f"{folder}.log")

    def finish(job, core, process, seconds):
        name, _, seed = job
        folder = run_dir(name, seed)
        check_exit(process, f"training {name}, seed {seed} (log: {folder}.log)", 0)
        runs.append({"setting": name, "seed": seed, "train_seconds": seconds,
                     **evaluate_run(folder, data, core), "curve": curve(folder)})  # fmt: skip
        log(f"{name}, seed {seed}: " + ", ".join(f"{k} {runs[-1][k]:.3f}" for k in METRICS))

    side_by_side(jobs, config.cores, start, finish)
    return {
        "command": command,
        "config": dataclasses.asdict(config),
        "runs": runs,
        "settings": [summarize(name, runs) for name, _ in config.settings],
    }


def summarize(name, runs):
    """A setting's mean of each metric over its seeds and half their range."""
    own = [run for run in runs if run["setting"] == name]
    row = {"setting": name, "seeds": len(own)}
    for key in (*METRICS, "train_seconds"):
        values = [run[key] for run in own if run[key] is not None]
        row[key] = statistics.fmean(values) if values else None
        row[f"{key}_half_range"] = (max(values) - min(values)) / 2 if values else None
    row["curve"] = mean_curve([run.get("curve") or [] for run in own])
    return row


def mean_curve(curves):
    """The seeds' mean seconds and AP at each epoch that every curve scored."""
    scored = [{point["epoch"]: point for point in c if point["AP"] is not None} for c in curves]
    epochs = sorted(set.intersection(*(set(c) for c in scored))) if scored else []
    return [
        {
            "epoch": epoch,
            "seconds": statistics.fmean(c[epoch]["seconds"] for c in scored),
            "AP": statistics.fmean(c[epoch]["AP"] for c in scored),
        }
        for epoch in epochs
    ]


def format_recipe(result):
    """The result as a Markdown table, one row a setting."""
    lines = [
        "| setting | seeds | AP | AP50 | AP75 | mAP@0.5 (VOC) | training s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["settings"]:
        cells = [
            f"{row[key]:.3f} ± {row[key + '_half_range']:.3f}" if row[key] is not None else "-"
            for key in METRICS
        ]
        lines.append(
            f"| {row['setting']} | {row['seeds']} | {' | '.join(cells)} | "
            f"{row['train_seconds']:.0f} |"
        )
    return "\n".join(lines)
