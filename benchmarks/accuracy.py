"""Time to accuracy: how soon each setting trains a good detector, not how many images/s.

Each setting (a name and the ``yolo3 train`` flags it adds to the demo's recipe) trains the
demo's task once per seed with ``W`` replicas and the demo's global batch (``--batch-size
G/W`` each), scoring mAP@0.5 on the validation split at every epoch end (``--map-every
1``). The run's ``history.jsonl`` gives the curve: each epoch's mAP against the run's wall
time at that epoch's end, less the time spent scoring (the clock of training alone,
start-up, synchronisations and checkpoints included). ``last.weights.h5`` is then scored
by ``yolo3 evaluate`` on the original validation images (VOC mAP@0.5 and COCO AP), the
figures a user meets.

Two ways to run the ``W`` replicas:

- ``link="none"``: ``W`` replicas in one process (``--cpu-replicas W``) on one core, runs
  side by side on the given cores. The mAP is what ``W`` workers would reach (the same
  arithmetic); the clock is one core's, so only the mAP columns speak for a network.
- ``link=RATE``: ``W`` worker processes (``yolo3 launch --pin-cores``: worker ``i`` on core
  ``i``) in a private network namespace whose loopback carries ``RATE``
  (:class:`benchmarks.link.RateLimitedLoopback`), one run at a time: the clock is what a
  cluster on that link meets.

Beside the settings, **one worker alone** (``alone``: the recipe with ``--batch-size G`` on
one core, no replicas, no communication) trains the same seeds: the time every setting
must beat, and the accuracy of training on one device. It talks to no one, so one set of
its runs serves every link: they run side by side, one per core (the machine as loaded as
under ``W`` workers), in the folder of the runs without a link.

The **target** is the reference setting's mean final mAP (the curve's last point; the first
setting unless named) less ``margin``, or ``target`` if given. A run's **time to target**
is where its curve first reaches it, interpolated linearly between the two epoch ends
around it (None: never reached). Per setting: the mean over seeds and its standard error
(the sample standard deviation over the square root of the seeds), and the difference to
the reference paired by seed (the same seed draws the same data order and initial
weights), with its standard error: what tells a difference of 0.02 from the noise between
seeds.

Each finished run leaves its figures in its folder (``accuracy_run.json``); a later
invocation with the same ``--work`` takes them instead of training the run again when its
command line is the same, so a benchmark stopped part way, or given more seeds or settings,
trains only what is missing.
"""

import dataclasses
import json
import math
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.recipe import (
    BASE_FLAGS,
    check_exit,
    evaluate_run,
    prepare,
    side_by_side,
    stop,
    yolo3_process,
)
from yolo3 import fileio
from yolo3.callbacks.evaluation import MAP_KEY
from yolo3.callbacks.history import read_history

ALONE = "alone"
RECORD = "accuracy_run.json"  # a finished run's figures, in its folder
FINAL_METRICS = ("mAP50", "AP", "AP50", "AP75")


@dataclasses.dataclass(frozen=True)
class AccuracyConfig:
    """``settings``: ``(name, flags)`` pairs; the rest as ``tools/benchmark.py accuracy``."""

    settings: tuple
    work: str
    seeds: tuple = (0, 1, 2, 3)
    epochs: int = 6
    replicas: int = 2
    global_batch: int = 16
    link: str = "none"
    alone: bool = True
    reference: str | None = None
    margin: float = 0.02
    target: float | None = None
    train_images: int = 4000
    val_images: int = 300
    input_size: int = 96
    cores: tuple = (0,)
    timeout: float = 4 * 3600.0

    def __post_init__(self):
        names = [name for name, _ in self.settings]
        if len(set(names)) != len(names) or ALONE in names:
            raise ValueError(
                f"--settings names must differ, and {ALONE!r} names one worker alone: {names}"
            )
        if not self.settings or not self.seeds or self.epochs < 1 or not self.cores:
            raise ValueError("give at least one setting, one seed, one epoch and one core")
        if self.replicas < 2 or self.global_batch % self.replicas:
            raise ValueError(
                f"--replicas {self.replicas}: use 2 or more that divide the global batch "
                f"({self.global_batch})"
            )
        known = [*names, ALONE] if self.alone else names
        if self.reference is not None and self.reference not in known:
            raise ValueError(f"--reference {self.reference!r}: use one of {known}")
        if self.link != "none" and tuple(self.cores[: self.replicas]) != tuple(
            range(self.replicas)
        ):
            raise ValueError(
                f"--link {self.link} runs worker i on core i (yolo3 launch --pin-cores): give "
                f"--cores {' '.join(map(str, range(self.replicas)))}"
            )

    @property
    def reference_name(self):
        return self.reference or self.settings[0][0]


def run_accuracy(config, command=None, log=print):
    """Trains every setting (and one worker alone) for every seed; the result dict."""
    from benchmarks.harness import load_average, machine_info  # noqa: PLC0415

    data, records, anchors = prepare(config)
    started_load = load_average()
    jobs = [(name, flags) for name, flags in config.settings]
    if config.alone:
        jobs.append((ALONE, ()))
    jobs = [(name, flags, seed) for seed in config.seeds for name, flags in jobs]
    runner = _run_linked if config.link != "none" else _run_side_by_side
    runs = runner(config, jobs, data, records, anchors, log)
    result = {
        "command": command,
        "machine": machine_info(),
        "load_average_start": started_load,
        "load_average_end": load_average(),
        "config": dataclasses.asdict(config),
        "runs": runs,
    }
    result.update(summarize(runs, config))
    return result


def _train_args(config, name, flags, seed, records, anchors, run_dir):
    shape = ("--batch-size", config.global_batch)
    if name != ALONE:
        shape = ("--batch-size", config.global_batch // config.replicas)
        if config.link == "none":
            shape += ("--cpu-replicas", config.replicas)
    at = BASE_FLAGS.index("--batch-size")
    base = BASE_FLAGS[:at] + BASE_FLAGS[at + 2 :]  # the shape sets the batch
    return ("train", "--records", records, "--anchors", anchors, "--log-dir", run_dir,
            "--epochs", config.epochs, "--seed", seed, "--map-every", 1, *base,
            *shape, *flags)  # fmt: skip


def _run_dir(config, name, seed):
    """Runs over a link apart from replicas in one process: their clocks differ. One worker
    alone has no link: its runs serve every one."""
    linked = config.link != "none" and name != ALONE
    folder = f"accuracy-{config.link}" if linked else "accuracy"
    return Path(config.work) / folder / f"{name}-seed{seed}"


def _shape(config, name):
    """What a run's command line does not say: how many take part, over which link."""
    if name == ALONE:
        return {"replicas": 1, "link": "none"}
    return {"replicas": config.replicas, "link": config.link}


def _reused(run_dir, train, log, shape=None):
    """The run recorded in ``run_dir`` by an earlier invocation with the same command line
    and ``shape`` (a benchmark stopped part way goes on from its finished runs), or None; an
    unfinished run's folder is removed, to train again."""
    record = run_dir / RECORD
    if record.exists():
        run = json.loads(record.read_text())
        if run["train"] != [str(a) for a in train] or run.get("shape") != shape:
            raise ValueError(
                f"{run_dir} holds a run of another command line: use another --work, or "
                "remove the folder"
            )
        log(f"{run['setting']}, seed {run['seed']}: finished before, in {run_dir}")
        return run
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return None


def _finish(config, name, seed, run_dir, data, core, seconds, log, train=()):
    curve = [
        {"epoch": r["epoch"], "seconds": r["seconds"], "mAP50": r[MAP_KEY]}
        for r in read_history(run_dir)
        if MAP_KEY in r
    ]
    if len(curve) != config.epochs:
        raise RuntimeError(
            f"{run_dir}/history.jsonl has mAP for {len(curve)} of {config.epochs} epochs"
        )
    run = {"setting": name, "seed": seed, "wall_seconds": seconds, "curve": curve}
    run["final"] = evaluate_run(run_dir, data, core)
    log(
        f"{name}, seed {seed}: mAP@0.5 by epoch "
        + " ".join(f"{p['mAP50']:.3f}" for p in curve)
        + f"; final mAP@0.5 {run['final']['mAP50']:.3f}, COCO AP {run['final']['AP']:.3f}, "
        f"{curve[-1]['seconds']:.0f} s"
    )
    run["train"] = [str(a) for a in train]
    run["shape"] = _shape(config, name)
    fileio.write_json(run_dir / RECORD, run)
    return run


def _start(config, job, records, anchors, log):
    """A job's folder and ``yolo3 train`` arguments, and its recorded run if an earlier
    invocation finished it (else None)."""
    name, flags, seed = job
    run_dir = _run_dir(config, name, seed)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    train = _train_args(config, name, flags, seed, records, anchors, run_dir)
    return run_dir, train, _reused(run_dir, train, log, _shape(config, name))


def _run_side_by_side(config, jobs, data, records, anchors, log):
    """One process per run, each on a core of its own, as many at once as cores."""
    runs, started = [], {}

    def start(job, core):
        run_dir, train, done = _start(config, job, records, anchors, log)
        if done:
            runs.append(done)
            return None
        name, _, seed = job
        log(f"core {core}: {name}, seed {seed}: yolo3 {' '.join(map(str, train))}")
        started[job] = (run_dir, train)
        return yolo3_process(*train, core=core, log=f"{run_dir}.log")

    def finish(job, core, process, seconds):
        (name, _, seed), (run_dir, train) = job, started.pop(job)
        check_exit(process, f"training {name}, seed {seed} (log: {run_dir}.log)", 0)
        runs.append(_finish(config, name, seed, run_dir, data, core, seconds, log, train))

    side_by_side(jobs, config.cores, start, finish)
    return runs


def _run_linked(config, jobs, data, records, anchors, log):
    """One worker alone first, side by side on the cores (see the module docstring); then
    the settings one at a time, as worker processes over the shaped loopback."""
    from benchmarks.link import RateLimitedLoopback  # noqa: PLC0415

    alone = [job for job in jobs if job[0] == ALONE]
    runs = _run_side_by_side(config, alone, data, records, anchors, log)

    def wrap(argv):
        launch = [*argv[:3], "launch", "-n", str(config.replicas), "--pin-cores"]
        return link.command([*launch, "--", *argv])

    with RateLimitedLoopback(config.link) as link:
        for job in jobs:
            if job[0] == ALONE:
                continue
            run_dir, train, done = _start(config, job, records, anchors, log)
            if done:
                runs.append(done)
                continue
            name, _, seed = job
            log(f"{config.link}: {name}, seed {seed}: yolo3 {' '.join(map(str, train))}")
            started = time.perf_counter()
            process = yolo3_process(*train, log=f"{run_dir}.log", wrap=wrap)
            what = f"training {name}, seed {seed} (log: {run_dir}.log)"
            try:
                check_exit(process, what, config.timeout)
            finally:  # a run past --timeout, or Ctrl-C: its workers go too
                stop(process)
            seconds = time.perf_counter() - started
            core = config.cores[0]
            runs.append(_finish(config, name, seed, run_dir, data, core, seconds, log, train))
    return runs


# -- the figures ---------------------------------------------------------------------------


def time_to_target(curve, target):
    """Seconds at which ``curve`` (points with ``seconds`` and ``mAP50``, in order) first
    reaches ``target``, interpolated linearly from the point before (from the first point
    itself when it reaches it); None when it never does."""
    previous = None
    for point in curve:
        if point["mAP50"] >= target:
            if previous is None or point["mAP50"] == previous["mAP50"]:
                return point["seconds"]
            share = (target - previous["mAP50"]) / (point["mAP50"] - previous["mAP50"])
            return previous["seconds"] + share * (point["seconds"] - previous["seconds"])
        previous = point
    return None


def mean_and_error(values):
    """``(mean, standard error)`` of ``values`` (error None with fewer than two)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def summarize(runs, config):
    """The target and one row per setting (``alone`` last): the means over seeds with their
    standard errors, the paired difference to the reference, and the time to target."""
    names = [name for name, _ in config.settings] + ([ALONE] if config.alone else [])
    own = {name: [r for r in runs if r["setting"] == name] for name in names}
    reference = config.reference_name
    reached = mean_and_error([r["curve"][-1]["mAP50"] for r in own[reference]])[0]
    target = config.target if config.target is not None else reached - config.margin
    by_seed = {r["seed"]: r for r in own[reference]}
    alone_time = None
    rows = []
    for name in names:
        seeds = own[name]
        row = {"setting": name, "seeds": len(seeds)}
        for key in FINAL_METRICS:
            row[key], row[f"{key}_error"] = mean_and_error([r["final"][key] for r in seeds])
        row["curve_mAP50"], row["curve_mAP50_error"] = mean_and_error(
            [r["curve"][-1]["mAP50"] for r in seeds]
        )
        paired = [
            r["final"]["mAP50"] - by_seed[r["seed"]]["final"]["mAP50"]
            for r in seeds
            if r["seed"] in by_seed
        ]
        row["mAP50_vs_reference"], row["mAP50_vs_reference_error"] = mean_and_error(paired)
        times = [time_to_target(r["curve"], target) for r in seeds]
        row["times_to_target"] = times
        row["reached"] = sum(t is not None for t in times)
        # A seed that never reached the target has no time: no mean either (it would be
        # the mean of the lucky seeds).
        row["time_to_target"], row["time_to_target_error"] = (
            mean_and_error(times) if row["reached"] == len(seeds) else (None, None)
        )
        row["seconds"], _ = mean_and_error([r["curve"][-1]["seconds"] for r in seeds])
        row["curve"] = mean_curve(seeds)
        if name == ALONE:
            alone_time = row["time_to_target"]
        rows.append(row)
    for row in rows:
        ok = alone_time and row["time_to_target"] is not None
        row["time_vs_alone"] = row["time_to_target"] / alone_time if ok else None
    return {"reference": reference, "target": target, "settings": rows}


def mean_curve(seeds):
    """The seeds' curves averaged epoch by epoch: mean seconds and mean mAP@0.5."""
    epochs = min(len(r["curve"]) for r in seeds) if seeds else 0
    return [
        {
            "epoch": index + 1,
            "seconds": statistics.fmean(r["curve"][index]["seconds"] for r in seeds),
            "mAP50": statistics.fmean(r["curve"][index]["mAP50"] for r in seeds),
        }
        for index in range(epochs)
    ]


def _cell(value, error, digits=3):
    if value is None:
        return "-"
    if error is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ± {error:.{digits}f}"


def format_accuracy(result):
    """The result as a Markdown table, one row a setting, and a line on the target."""
    config = result["config"]
    where = (
        f"{config['replicas']} workers over {config['link']}"
        if config["link"] != "none"
        else f"{config['replicas']} replicas in one process on one core (the clock is not a link's)"
    )
    lines = [
        f"{where}; global batch {config['global_batch']}, {config['epochs']} epochs; target "
        f"mAP@0.5 {result['target']:.3f} (on the validation records, during training); "
        f"± one standard error over the seeds",
        "",
        f"| setting | seeds | mAP@0.5 | vs {result['reference']} (paired) | COCO AP | "
        "time to target (s) | vs one worker alone |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["settings"]:
        reached = ""
        if row["reached"] < row["seeds"]:
            reached = f"{row['reached']} of {row['seeds']} seeds reached it"
        ratio = "-" if row["time_vs_alone"] is None else f"{row['time_vs_alone']:.2f}"
        lines.append(
            f"| {row['setting']} | {row['seeds']} | {_cell(row['mAP50'], row['mAP50_error'])} | "
            f"{_cell(row['mAP50_vs_reference'], row['mAP50_vs_reference_error'])} | "
            f"{_cell(row['AP'], row['AP_error'])} | "
            f"{reached or _cell(row['time_to_target'], row['time_to_target_error'], 0)} | "
            f"{ratio} |"
        )
    return "\n".join(lines)
