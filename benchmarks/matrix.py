"""The recipe over a matrix: COCO AP of ``yolo3 train`` and of a peer (Ultralytics'
YOLOv3-tiny, :mod:`benchmarks.peer`) at several input sizes and training-set sizes.

Each cell of the matrix (an input size and a count of training images) is the demo's task
made at that size (``yolo3 make-demo-dataset --size S``, its anchors and records as
:func:`benchmarks.recipe.prepare` makes them), and each side trains it from scratch once per
seed, in a process of its own pinned to one core; runs go to the given cores as they free
up, the cheapest cells first. Every run is scored by the same code on the original
validation images (pycocotools' COCO AP, AP50, AP75; VOC mAP@0.5).

The sides:

- ``ours``: ``yolo3 train`` with the demo's recipe (:data:`benchmarks.recipe.BASE_FLAGS`)
  plus ``--flags``, ``--epochs`` epochs;
- ``peer``: Ultralytics' YOLOv3-tiny with its own recipe, the same epochs and batch;
- ``ours-at-peer-time``: ``yolo3 train --time`` with the peer's training time of the same
  cell and seed (its epochs fitted to it, at most 100): the comparison at equal wall time.
  It needs the peer's run of that cell and seed in the results.

Each run records when it ``finished`` (UTC). An equal-time run is fair only beside its
peer's run: a shared machine's speed can drift by a fifth over hours (the same training at
96 px took 74-77 s an epoch one evening and 90-93 s six hours later on the 2-core machine of
the Benchmarks page), so the two belong in one invocation, and the log says when the peer's
run it is timed by finished.

A run's ``train_seconds`` is its epochs' wall time as each side counts it (ours: the epochs
of ``history.jsonl``; the peer: its ``train()``), each with its validation pass;
``process_seconds`` the whole process, start-up and last report included. Results are
written to ``WORK/matrix.json`` after every run; run again, the runs it holds are
kept and only the missing ones made (a stopped benchmark resumes). With ``rescore``
(``--rescore``) nothing trains: the runs it holds are scored again by today's scoring code
from what their folders keep (our last weights, the peer's detections), their training
figures kept. Training wall times
compare only between runs made side by side on an otherwise idle machine; the AP figures do
not depend on the load.
"""

import dataclasses
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks import peer
from benchmarks.recipe import (
    BASE_FLAGS,
    METRICS,
    RecipeConfig,
    check_exit,
    data_folder,
    evaluate_run,
    prepare,
    side_by_side,
    yolo3_process,
)
from yolo3.evaluation.metrics import AP_BY_IOU

SIDES = ("ours", "peer", "ours-at-peer-time")
# The cap of a run fitted to the peer's time: its epochs are as many as that time holds.
TIME_EPOCH_CAP = 100


@dataclasses.dataclass(frozen=True)
class MatrixConfig:
    """The matrix, as ``tools/benchmark.py matrix`` takes it (see the module docstring)."""

    work: str
    input_sizes: tuple = (96, 128, 192, 256)
    train_images: tuple = (1000, 4000)
    seeds: tuple = (0, 1)
    sides: tuple = ("ours", "peer")
    epochs: int = 6
    val_images: int = 300
    flags: tuple = ()
    cores: tuple = (0,)
    rescore: bool = False

    def __post_init__(self):
        unknown = sorted(set(self.sides) - set(SIDES))
        if unknown:
            raise ValueError(f"--sides {' '.join(unknown)}: use {', '.join(SIDES)}")
        if any(size % 32 or size < 32 for size in self.input_sizes):
            raise ValueError(f"--input-sizes {self.input_sizes}: multiples of 32")
        if not (self.seeds and self.cores and self.input_sizes and self.train_images):
            raise ValueError("give at least one seed, core, input size and image count")
        if self.epochs < 1 or min(self.train_images) < 1:
            raise ValueError("--epochs and --train-images must be at least 1")

    def cells(self):
        """``(input size, training images)`` of every cell, the cheapest first."""
        cells = [(size, count) for size in self.input_sizes for count in self.train_images]
        return sorted(cells, key=lambda cell: (cell[0] ** 2 * cell[1], cell))

    def cell_task(self, cell):
        """The :class:`benchmarks.recipe.RecipeConfig` that makes ``cell``'s data."""
        size, count = cell
        return RecipeConfig(
            settings=(("recipe", ()),),
            work=str(Path(self.work) / f"s{size}-n{count}"),
            train_images=count,
            val_images=self.val_images,
            input_size=size,
        )


def run_key(run):
    return (run["input_size"], run["train_images"], run["side"], run["seed"])


class Results:
    """``WORK/matrix.json``: the runs made so far, rewritten whole after each one."""

    def __init__(self, path):
        self.path = Path(path)
        saved = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.runs = {run_key(run): run for run in saved.get("runs", [])}

    def add(self, run):
        self.runs[run_key(run)] = run
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps({"runs": sorted(self.runs.values(), key=run_key)}))
        os.replace(temporary, self.path)

    def peer_seconds(self, cell, seed):
        run = self.runs.get((*cell, "peer", seed))
        return run["train_seconds"] if run else None


def plan(config, results):
    """The runs still to make: ``(cell, side, seed)``, the cheapest cells first. ValueError
    when an equal-time run lacks the peer's run it is timed by."""
    jobs = []
    for cell in config.cells():
        for side in config.sides:
            for seed in config.seeds:
                if (*cell, side, seed) in results.runs:
                    continue
                needs_peer = side == "ours-at-peer-time" and "peer" not in config.sides
                if needs_peer and results.peer_seconds(cell, seed) is None:
                    raise ValueError(
                        f"ours-at-peer-time at {cell[0]} px, {cell[1]} images, seed {seed}: "
                        "no peer run of it yet; add --sides peer"
                    )
                jobs.append((cell, side, seed))
    # An equal-time run is timed by its peer's: it goes last (run_matrix: a phase of its own).
    return sorted(jobs, key=lambda job: job[1] == "ours-at-peer-time")


def phases(jobs):
    """``jobs`` (:func:`plan`'s) in the phases they run in, one after the other: an
    equal-time run is timed by its peer's, so every other run ends before the first starts
    (in one pass, a free core could start one while its peer still trains on another)."""
    timed = [job for job in jobs if job[1] == "ours-at-peer-time"]
    return [[job for job in jobs if job not in timed], timed]


def run_folder(config, cell, side, seed):
    """Where a run of ``cell`` keeps its weights (ours) or detections (the peer)."""
    return Path(config.cell_task(cell).work) / "runs" / f"{side}-seed{seed}"


def run_matrix(config, command=None, log=print):
    """Makes every missing run of the matrix (with ``rescore``, scores the runs made again
    instead); the result dict (see :func:`summarize`)."""
    work = Path(config.work)
    work.mkdir(parents=True, exist_ok=True)
    results = Results(work / "matrix.json")
    if config.rescore:
        rescore(config, results, log)
        return summarize(config, results, command)
    jobs = plan(config, results)
    data = {cell: prepare(config.cell_task(cell)) for cell in {job[0] for job in jobs}}
    peers = {}

    def folder(cell, side, seed):
        return run_folder(config, cell, side, seed)

    def start(job, core):
        cell, side, seed = job
        run_dir = folder(*job)
        shutil.rmtree(run_dir, ignore_errors=True)  # what a stopped run left: not in the results
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        (annotations, records, anchors) = data[cell]
        log(f"core {core}: {cell[0]} px, {cell[1]} images, {side}, seed {seed}")
        if side == "peer":
            if cell not in peers:
                peers[cell] = peer.convert_dataset(
                    annotations / "train.txt", annotations / "val.txt",
                    annotations / "classes.txt", Path(config.cell_task(cell).work) / "peer_data",
                )  # fmt: skip
            return peer.start_training(
                peers[cell], run_dir, imgsz=cell[0], epochs=config.epochs, seed=seed,
                core=core, log=f"{run_dir}.log",
            )  # fmt: skip
        schedule = ("--epochs", config.epochs)
        if side == "ours-at-peer-time":
            schedule = equal_time_schedule(results, cell, seed, log)
        train = ("train", "--records", records, "--anchors", anchors, "--log-dir", run_dir,
                 "--seed", seed, *schedule, *BASE_FLAGS, *config.flags)  # fmt: skip
        return yolo3_process(*train, core=core, log=f"{run_dir}.log")

    def finish(job, core, process, process_seconds):
        cell, side, seed = job
        run_dir = folder(*job)
        check_exit(process, f"{side} at {cell}, seed {seed} (log: {run_dir}.log)", 0)
        annotations = data[cell][0]
        if side == "peer":
            report = json.loads((run_dir / "detections.json").read_text())
            figures = peer.score_detections(
                run_dir / "detections.json", annotations / "val.txt",
                annotations / "classes.txt", report,
            )  # fmt: skip
            seconds, epochs = report["train_seconds"], report["epochs"]
        else:
            figures = evaluate_run(run_dir, annotations, core)
            epochs, seconds = _trained(run_dir)
        run = run_record(job, seconds, process_seconds, epochs, figures)
        results.add(run)
        log(f"{_run_name(run)}: " + ", ".join(f"{key} {run[key]:.3f}" for key in METRICS)
            + f"; {epochs} epochs in {seconds:.0f} s")  # fmt: skip

    for phase in phases(jobs):
        side_by_side(phase, config.cores, start, finish)
    return summarize(config, results, command)


def equal_time_schedule(results, cell, seed, log=print):
    """``yolo3 train``'s schedule flags for ``ours-at-peer-time`` of ``cell`` and ``seed``:
    the peer's training time of them as ``--time`` (minutes), epochs fitted to it (at most
    :data:`TIME_EPOCH_CAP`); the log names when that peer run finished."""
    minutes = results.peer_seconds(cell, seed) / 60
    made = results.runs[(*cell, "peer", seed)].get("finished", "at a time not recorded")
    log(f"  timed by the peer's run of {minutes:.1f} minutes, finished {made}")
    return ("--epochs", TIME_EPOCH_CAP, "--time", f"{minutes:.3f}")


def run_record(job, seconds, process_seconds, epochs, figures):
    """The results' entry of ``job`` (:func:`plan`'s), stamped with when it ``finished``
    (UTC, now)."""
    (size, count), side, seed = job
    return {"input_size": size, "train_images": count, "side": side, "seed": seed,
            "train_seconds": seconds, "process_seconds": process_seconds, "epochs": epochs,
            "finished": _utc_now(), **figures}  # fmt: skip


def rescore(config, results, log=print):
    """Scores every run of ``config``'s cells, sides and seeds in ``results`` again, from its
    folder (:func:`run_folder`), on the first of ``config.cores``; each is written back with
    its training figures as they were. A run whose folder no longer holds it (what it is
    scored from is gone, or another run, one stopped say, took the folder: its epochs and
    seconds differ from the record's) is named and left as it is."""
    for key in sorted(results.runs):
        size, count, side, seed = key
        cell = (size, count)
        if cell not in config.cells() or side not in config.sides or seed not in config.seeds:
            continue
        run, folder = results.runs[key], run_folder(config, cell, side, seed)
        annotations = data_folder(config.cell_task(cell))
        kept = folder / ("detections.json" if side == "peer" else "checkpoints/last.weights.h5")
        if not kept.exists():
            log(f"{_run_name(run)}: not scored again, {kept} is gone")
            continue
        report = json.loads(kept.read_text()) if side == "peer" else None
        held = (report["epochs"], report["train_seconds"]) if side == "peer" else _held_run(folder)
        if held != (run["epochs"], run["train_seconds"]):
            log(f"{_run_name(run)}: not scored again, {folder} holds another run "
                f"({held[0]} epochs in {held[1]:.1f} s; the record: {run['epochs']} in "
                f"{run['train_seconds']:.1f} s)")  # fmt: skip
            continue
        if side == "peer":
            figures = peer.score_detections(
                kept, annotations / "val.txt", annotations / "classes.txt", report
            )
        else:
            figures = evaluate_run(folder, annotations, config.cores[0])
        results.add({**run, **figures})
        changes = (f"{name} {run[name]:.3f} -> {figures[name]:.3f}" for name in METRICS)
        log(f"{_run_name(run)}: scored again, " + ", ".join(changes))


def _held_run(folder):
    """``(epochs, training seconds)`` of our run ``folder`` holds, as :func:`run_matrix`
    recorded them when it ended; ``(0, 0.0)`` when its record of them is gone."""
    try:
        return _trained(folder)
    except (OSError, IndexError, ValueError):  # no history, an empty one, a line cut short
        return 0, 0.0


def _utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _run_name(run):
    return (
        f"{run['input_size']} px, {run['train_images']} images, {run['side']}, seed {run['seed']}"
    )


def _trained(run_dir):
    """``(epochs, seconds)`` of a run's ``history.jsonl``: its epochs, and the wall time from
    the start of training to the end of the last (each line's ``seconds`` counts from the
    start): what the peer's ``train_seconds`` counts, the epochs with their validation, not
    the process's start."""
    lines = (Path(run_dir) / "history.jsonl").read_text().splitlines()
    epochs = [json.loads(line) for line in lines if line.strip()]
    return len(epochs), epochs[-1]["seconds"]


def summarize(config, results, command=None):
    """``{"command", "config", "runs", "cells"}``: per cell and side the mean of each metric,
    of the training seconds and of the epochs over its seeds, and half their range."""
    cells = []
    for cell in config.cells():
        for side in config.sides:
            own = [results.runs[key] for key in sorted(results.runs) if key[:3] == (*cell, side)]
            if not own:
                continue
            row = {"input_size": cell[0], "train_images": cell[1], "side": side,
                   "seeds": [run["seed"] for run in own]}  # fmt: skip
            for key in (*METRICS, "train_seconds", "epochs"):
                values = [run[key] for run in own if run.get(key) is not None]
                row[key] = statistics.fmean(values) if values else None
                row[f"{key}_half_range"] = (max(values) - min(values)) / 2 if values else None
            row[AP_BY_IOU] = _mean_by_iou([run.get(AP_BY_IOU) for run in own])
            cells.append(row)
    return {
        "command": command,
        "config": dataclasses.asdict(config),
        "runs": sorted(results.runs.values(), key=run_key),
        "cells": cells,
    }


def _mean_by_iou(per_run):
    """The mean over seeds of each IoU threshold's AP; None unless every run has them all."""
    if not per_run or any(not by_iou or None in by_iou.values() for by_iou in per_run):
        return None
    return {t: statistics.fmean(by_iou[t] for by_iou in per_run) for t in per_run[0]}


def format_matrix(result):
    """The result as a Markdown table: one row a cell, each side's AP and time beside."""
    rows = {}
    for row in result["cells"]:
        rows.setdefault((row["input_size"], row["train_images"]), {})[row["side"]] = row
    sides = [side for side in SIDES if any(side in by_side for by_side in rows.values())]
    header = ["input", "train images"]
    for side in sides:
        header += [f"{side} AP", f"{side} AP50", f"{side} epochs", f"{side} s"]
    if {"ours", "peer"} <= set(sides):
        header.append("AP ours - peer")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (size, count), by_side in sorted(rows.items()):
        cells = [f"{size} px", str(count)]
        for side in sides:
            row = by_side.get(side)
            cells += _side_cells(row)
        if {"ours", "peer"} <= set(sides):
            ours, other = by_side.get("ours"), by_side.get("peer")
            gap = ours["AP"] - other["AP"] if ours and other else None
            cells.append("-" if gap is None else f"{gap:+.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _side_cells(row):
    if row is None:
        return ["-"] * 4
    return [
        f"{row['AP']:.3f} ± {row['AP_half_range']:.3f}",
        f"{row['AP50']:.3f}",
        f"{row['epochs']:.1f}",
        f"{row['train_seconds']:.0f}",
    ]
