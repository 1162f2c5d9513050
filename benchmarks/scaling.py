"""Scaling benchmark: one training process against two workers on 127.0.0.1.

:func:`run_scaling` runs the real training step (:class:`yolo3.engine.trainer.YoloTrainer` under
``model.fit``, targets built in the step, as ``train.py``) twice:

- one process, no ``TF_CONFIG`` (the default strategy);
- two worker processes with ``TF_CONFIG`` for 127.0.0.1, so that
  :func:`yolo3.distributed.strategy.make_strategy` builds a ``MultiWorkerMirroredStrategy`` and
  applies the Keras workaround; each worker feeds the same per-worker batch, so the global
  batch doubles. Batch normalization is synchronized across the workers when there is more
  than one replica, as ``train.py`` does by default (``sync_bn="auto"``).

Every process is pinned to a core of its own (``os.sched_setaffinity``) with one intra-op
and one inter-op thread. The data is synthetic and in memory: one batch of generated shapes
(uint8 images and padded boxes, what ``make_dataset(targets=False)`` yields) per worker,
repeated by ``tf.data`` through ``strategy.distribute_datasets_from_function``, so the
figures are of the step and its communication, not of reading. After the warm-up steps
(tracing), each repeat times a fixed number of steady steps.

Scaling efficiency = (two-worker images/s) / (2 x one-process images/s). Beside it, the
ceiling: two independent processes training at once, without communication (cores that
compute together share memory bandwidth and clock, so this is below 2 x one process).

Each timed epoch is ``steps`` optimizer steps and ends as a training run's does: with local
steps, a full synchronisation. Two figures come from it: by **step time**, the steps after
an epoch's first up to its last, the synchronisations every H steps among them, the epoch
end's not (the steady rate, as before); by **wall time**, whole epochs, from their start to
their end, the epoch end's synchronisation and whatever else runs between steps included:
what a user waits for.

``settings`` runs the workers once per (micro-batches per step, all-reduce dtype, PowerSGD
rank or 0 for none, local steps H or 0 for none, overlapped synchronisation) setting,
side by side with the same one-process baseline (one micro-batch, no all-reduce). ``link``
(a tc rate such as ``100mbit``, :mod:`benchmarks.link`) runs every process, the baseline
too, in a network namespace whose loopback carries that rate. Each worker setting reports
the bytes all-reduced per optimizer step and per image, and the step and epoch times a
simple model predicts (:func:`predicted_seconds`): the compute of the step's micro-batches
in a process beside the others (the independent processes', the ceiling's) plus the bytes
on the shaped link divided by its rate (a ring all-reduce: each of W workers sends
2 (W - 1) / W of the tensor, and all of it crosses the one shaped loopback), with the
excess of the measured time over it.

Each process runs this module: ``python -m benchmarks.scaling CONFIG.json RESULT.json``.
"""

import collections
import contextlib
import dataclasses
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import keras
import tensorflow as tf
from keras import ops

from benchmarks import harness
from benchmarks.cpu_limit import CpuLimit
from benchmarks.link import RateLimitedLoopback, parse_rate, parse_rtt
from benchmarks.train_step import TrainStepConfig, build_step
from yolo3 import fileio
from yolo3.comm.allreduce import BYTES_PER_ELEMENT, check_allreduce_dtype
from yolo3.comm.schemes import communication_from
from yolo3.data import autotune
from yolo3.distributed import strategy as distribute
from yolo3.model.layers import SyncBatchNormalization

GOAL_EFFICIENCY = 0.90
SYNC_BN_CHOICES = ("auto", "on", "off")
_ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """Settings of :func:`run_scaling`: the step (per-worker batch) and the job."""

    step: TrainStepConfig
    workers: int = 2
    rounds: int = 1  # one-process run then the multi-worker run, this many times
    sync_bn: str = "auto"  # on with more than one replica, as train.py
    timeout: float = 900.0  # seconds for one run, start-up included
    link: str = "none"  # a tc rate for the loopback (benchmarks.link), or none
    rtt: str = "none"  # a round-trip time between the workers (benchmarks.link), or none
    straggler: float = 0.0  # the last worker's share of a core in the worker runs (0: whole)
    # (micro-batches per optimizer step, all-reduce dtype[, PowerSGD rank[, local steps[,
    # overlapped]]], 0: none) of each multi-worker run
    settings: tuple = ((1, "float32", 0, 0, False),)

    def __post_init__(self):
        parse_rate(self.link)
        parse_rtt(self.rtt)
        if not 0.0 <= self.straggler < 1.0:
            raise ValueError(
                f"--straggler {self.straggler:g}: give the last worker's share of a core, "
                "between 0 and 1 (0: no straggler)"
            )
        if not self.settings:
            raise ValueError("--settings: give at least one K:DTYPE")
        settings = tuple((*setting, 0, 0, False)[:5] for setting in self.settings)
        object.__setattr__(self, "settings", settings)  # each names its rank and local steps
        for accumulate, dtype, rank, local, overlap in settings:
            if accumulate < 1:
                raise ValueError(f"--settings {accumulate}:{dtype}: K must be >= 1")
            if rank < 0:
                raise ValueError(f"--settings {accumulate}:{dtype}:powersgd{rank}: rank >= 1")
            if local < 0 or (local and rank) or (overlap and not local):
                raise ValueError(f"--settings {accumulate}:{dtype}:local{local}: H >= 1")
            if local and self.step.steps % local:
                # Every epoch then ends at a period's end, as a run's epochs of a multiple
                # of H steps do.
                raise ValueError(
                    f"--settings {accumulate}:{dtype}:local{local}: --steps "
                    f"{self.step.steps} must be a multiple of H"
                )
            check_allreduce_dtype(dtype, local_steps=bool(local))
        if self.sync_bn not in SYNC_BN_CHOICES:
            raise ValueError(f"--sync-bn {self.sync_bn!r}: use one of {SYNC_BN_CHOICES}")
        if self.workers < 2:
            raise ValueError(f"--workers {self.workers}: compare at least 2 with 1 process")
        if self.step.steps < 2:
            raise ValueError(f"--steps {self.step.steps}: an epoch needs 2 steps or more")
        harness.check_counts({"--rounds": self.rounds})


class WindowTimer(keras.callbacks.Callback):
    """Wall-clock and CPU seconds of each epoch: of its steps after the first (``windows``)
    and of all of it (``epochs``), each ``{"steps", "seconds", "cpu_seconds"}``.

    The first step of an epoch carries the epoch's setup and is left out of its window, and
    the window closes before the callbacks after this one run at the epoch's last step (a
    full synchronisation): put it first. ``epochs`` runs from the epoch's start to its end.
    Before reading the clocks the timer waits for the step's loss, since an accelerator
    runs steps asynchronously.
    """

    def __init__(self):
        super().__init__()
        self.windows, self.epochs = [], []
        self._start = self._epoch_start = None

    @staticmethod
    def _since(start, steps):
        now = (time.perf_counter(), time.process_time())
        return {"steps": steps, "seconds": now[0] - start[0], "cpu_seconds": now[1] - start[1]}

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = (time.perf_counter(), time.process_time())

    def on_train_batch_end(self, batch, logs=None):
        last = self.params["steps"] - 1
        if batch not in (0, last) or last == 0:
            return
        ops.convert_to_numpy(logs["loss"])
        if batch == 0:
            self._start = (time.perf_counter(), time.process_time())
            return
        self.windows.append(self._since(self._start, last))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(self._since(self._epoch_start, self.params["steps"]))


def _cores(needed):
    """The core each of ``needed`` processes is pinned to: one each while there are enough,
    else in turn (``W`` workers on ``C`` cores share them, ``W / C`` to a core)."""
    cores = sorted(os.sched_getaffinity(0))
    return [cores[index % len(cores)] for index in range(needed)]


def _environment(tf_config):
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return env


def _run_job(
    config, workers, directory, log, *, link, setting=(1, "float32", 0, 0, False), independent=False
):
    """Starts ``workers`` pinned processes and returns their results.

    One process, or ``independent`` ones, get no TF_CONFIG: each trains alone. Workers of a
    job reach each other over ``link`` (its round-trip time included); with
    ``config.straggler`` the last is limited to that share of a core.
    """
    config_path = os.path.join(directory, "config.json")
    accumulate, dtype, rank, local, overlap = setting
    fileio.write_json(config_path, {**dataclasses.asdict(config), "job": _job(setting)})
    together = workers > 1 and not independent
    name = f"{workers}w-{accumulate}-{dtype}-{rank}-{local}-{overlap}-{independent}"
    processes, outputs = [], []
    with contextlib.ExitStack() as stack:
        addresses = stack.enter_context(link.cluster(workers)) if together else None
        slow = stack.enter_context(CpuLimit(config.straggler)) if together else None
        try:
            for index, core in enumerate(_cores(workers)):
                tf_config = distribute.tf_config(addresses[index], index) if together else None
                output = os.path.join(directory, f"{name}-{index}.log")
                outputs.append(output)
                limit = slow if index == workers - 1 else None
                with open(output, "w", encoding="utf-8") as log_file:
                    processes.append(
                        subprocess.Popen(
                            link.command(
                                [sys.executable, "-m", __name__, config_path, f"{output}.json"]
                            ),
                            env=_environment(tf_config),
                            cwd=_ROOT,
                            stdout=log_file,
                            stderr=subprocess.STDOUT,
                            preexec_fn=functools.partial(_pin, core, limit),
                        )
                    )
            _wait(processes, outputs, config.timeout)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    results = []
    for output in outputs:
        with open(f"{output}.json", encoding="utf-8") as f:
            results.append(json.load(f))
    label = f"{workers} process{'es' if workers > 1 else ''}"
    if independent:
        label += ", independent"
    elif workers > 1:
        label += f", {accumulate} micro-batch{'es' if accumulate > 1 else ''}, {dtype}"
        label += _setting_text(setting)
    log(f"  {label}: " + _describe(results, config))
    return results


def _pin(core, limit):
    """In a new process before it runs Python: its core, and its CPU limit if any."""
    os.sched_setaffinity(0, {core})
    if limit is not None:
        limit.join()


def _wait(processes, outputs, timeout):
    deadline = time.monotonic() + timeout
    while any(process.poll() is None for process in processes):
        for process, output in zip(processes, outputs):
            if process.poll() not in (None, 0):
                raise RuntimeError(
                    f"benchmark process {output} ended with status {process.returncode}:\n"
                    + _tail(output)
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark processes still running after {timeout:g} s")
        time.sleep(0.2)
    for process, output in zip(processes, outputs):
        if process.returncode:
            raise RuntimeError(f"{output} ended with status {process.returncode}:\n{_tail(output)}")


def _tail(path, lines=30):
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def _windows(results, batch_size, kind="windows"):
    """Per timed window (``kind`` "epochs": per whole epoch) of a job:
    ``{"images_per_second", "cpu_ms_per_image", "step_seconds"}``.

    Workers step in lockstep; a window lasts as long as its slowest worker's, and the CPU
    time is that of every worker together. A step of a worker is ``accumulate`` batches.
    """
    figures = []
    per_step = batch_size * results[0]["accumulate"]
    for windows in zip(*(result[kind] for result in results)):
        images = sum(window["steps"] for window in windows) * per_step
        seconds = max(window["seconds"] for window in windows)
        cpu = sum(window["cpu_seconds"] for window in windows)
        figures.append(
            {
                "images_per_second": images / seconds,
                "cpu_ms_per_image": 1000 * cpu / images,
                "step_seconds": seconds / windows[0]["steps"],
            }
        )
    return figures


def _describe(results, config):
    figures = _windows(results, config.step.batch_size)
    speeds = ", ".join(f"{figure['images_per_second']:.1f}" for figure in figures)
    return f"{speeds} images/s (sync BN {'on' if results[0]['sync_bn'] else 'off'})"


def _setting_key(setting):
    accumulate, dtype, rank, local, overlap = setting
    key = f"workers_{accumulate}_{dtype}" + (f"_powersgd{rank}" if rank else "")
    key += f"_local{local}" if local and not overlap else ""
    return key + (f"_overlap{local}t{overlap}" if overlap else "")


def _setting_text(setting):
    _, _, rank, local, overlap = setting
    text = f", PowerSGD rank {rank}" if rank else ""
    text += f", local steps H={local}" if local else ""
    return text + (
        f", overlapped over {overlap} step{'s' if overlap > 1 else ''}" if overlap else ""
    )


def run_scaling(config, *, command="", log=print):
    """Runs the scaling benchmark.

    Returns:
        A JSON-able dict (printed by :func:`format_scaling`): ``rows`` for one process and
        for the workers of each setting (median, min, max images/s over the timed windows
        of every round), ``ratios`` the scaling efficiency of each setting and
        ``communication`` its bytes per step and measured against predicted step time.
    """
    result = {
        "command": command,
        "machine": harness.machine_info(),
        "load_average_start": harness.load_average(),
        "config": dataclasses.asdict(config),
    }
    runs = {"single": [], "independent": []}
    runs.update({_setting_key(setting): [] for setting in config.settings})
    epochs = {key: [] for key in runs}  # the same jobs, by whole epochs
    traffic = {}
    sync_seconds = collections.defaultdict(list)  # local steps: every synchronisation's time
    collectives, peak_rss = {}, {}  # a step's collectives; each worker's peak RSS (MiB)
    with tempfile.TemporaryDirectory(prefix="yolo3-scaling-") as directory:
        with RateLimitedLoopback(config.link, config.rtt) as link:
            for round_index in range(config.rounds):
                log(f"round {round_index + 1}/{config.rounds} (link {config.link})")

                def record(key, results):
                    runs[key] += _windows(results, config.step.batch_size)
                    epochs[key] += _windows(results, config.step.batch_size, "epochs")

                results = _run_job(config, 1, directory, log, link=link)
                record("single", results)
                result["sync_bn_single"] = results[0]["sync_bn"]
                results = _run_job(
                    config, config.workers, directory, log, link=link, independent=True
                )
                record("independent", results)
                for setting in config.settings:
                    key = _setting_key(setting)
                    results = _run_job(
                        config, config.workers, directory, log, link=link, setting=setting
                    )
                    record(key, results)
                    traffic[key] = {**results[0]["traffic"], "sync_bn": results[0]["sync_bn"]}
                    sync_seconds[key] += [t for r in results for t in r["sync_seconds"]]
                    collectives[key] = results[0]["collectives_per_step"]
                    rss = [r["peak_rss_mib"] for r in results]
                    peak_rss[key] = [max(pair) for pair in zip(rss, peak_rss.get(key, rss))]
                    # The report's line: local steps never synchronise batch norm.
                    if not setting[3] or "sync_bn_workers" not in result:
                        result["sync_bn_workers"] = results[0]["sync_bn"]
    batch, workers = config.step.batch_size, config.workers
    rows = {
        "single": harness.summarize(
            f"1 process, 1 core, 1 thread, batch {batch}", runs["single"], 1
        ),
        "independent": harness.summarize(
            f"{workers} independent processes at once (no communication)",
            runs["independent"],
            workers,
        ),
    }
    single = rows["single"]

    def by_wall(key, figure="images_per_second"):  # whole epochs: the median over them
        return statistics.median(epoch[figure] for epoch in epochs[key])

    def cpu_by_wall(key):  # the CPU-time ratio of whole epochs, against one process's
        return by_wall("single", "cpu_ms_per_image") / by_wall(key, "cpu_ms_per_image")

    # What the machine allows before any communication: cores that compute at the same
    # time share memory bandwidth and clock.
    ceiling_wall = by_wall("independent") / (workers * by_wall("single"))
    ratios = {
        "ceiling": harness.make_ratio(
            f"ceiling, {workers} independent processes / ({workers} x 1 process)",
            rows["independent"]["images_per_second"] / (workers * single["images_per_second"]),
            single["cpu_ms_per_image"] / rows["independent"]["cpu_ms_per_image"],
            None,
            harness.FRACTION,
        ),
        "ceiling_wall": harness.make_ratio(
            "ceiling by wall time (whole epochs)",
            ceiling_wall,
            cpu_by_wall("independent"),
            None,
            harness.FRACTION,
        ),
    }
    communication = {}
    bits_per_second = parse_rate(config.link)
    for setting in config.settings:
        accumulate, dtype = setting[:2]
        key = _setting_key(setting)
        name = f"{workers} workers (MultiWorkerMirroredStrategy), K={accumulate}, {dtype}"
        name += _setting_text(setting)
        rows[key] = harness.summarize(
            f"{name} (batch {batch} x {accumulate} each)", runs[key], workers
        )
        multi = rows[key]
        ratios[key] = harness.make_ratio(
            f"scaling efficiency, {name}",
            multi["images_per_second"] / (workers * single["images_per_second"]),
            single["cpu_ms_per_image"] / multi["cpu_ms_per_image"],
            GOAL_EFFICIENCY,
            harness.FRACTION,
        )
        wall = by_wall(key) / (workers * by_wall("single"))
        ratios[f"{key}_wall"] = harness.make_ratio(
            f"by wall time, {name}", wall, cpu_by_wall(key), GOAL_EFFICIENCY, harness.FRACTION
        )
        communication[key] = _communication(
            traffic[key],
            workers=workers,
            images_per_step=workers * batch * accumulate,
            # A worker computes beside the others: the independent processes' step.
            compute_seconds=accumulate * batch * workers / rows["independent"]["images_per_second"],
            measured_seconds=statistics.median(run["step_seconds"] for run in runs[key]),
            bits_per_second=bits_per_second,
            rtt=parse_rtt(config.rtt),
            collectives=collectives[key],
            local_steps=setting[3],
            overlap=setting[4],
            sync_seconds=sync_seconds[key],
            steps=config.step.steps,
            epoch_compute_seconds=accumulate * batch * workers / by_wall("independent"),
            measured_epoch_seconds=statistics.median(e["step_seconds"] for e in epochs[key])
            * config.step.steps,
        )
        communication[key]["label"] = name
        communication[key]["peak_rss_mib"] = peak_rss[key]
        communication[key]["wall_of_ceiling"] = wall / ceiling_wall
    result["rows"] = rows
    result["ratios"] = ratios
    result["communication"] = communication
    result["load_average_end"] = harness.load_average()
    return result


def predicted_seconds(
    *, steps, compute, epoch_compute, link, local_steps=0, overlap=0, latency=0.0
):
    """``(step, epoch)``: the seconds the link model predicts for a step of an epoch's
    window (its steps after the first, the last one's synchronisation left out) and for a
    whole epoch of ``steps`` optimizer steps.

    Args:
        compute, epoch_compute: seconds of one step's computation alone: in the window, and
            a whole epoch's per step (its first step's setup included).
        link: seconds the link needs for one step's collectives (their bytes and their
            round trips), or with ``local_steps`` for one synchronisation's bytes.
        local_steps, overlap: ``H`` (a multiple of ``steps``) and ``T``, or 0.
        latency: with ``local_steps``, the round trips of one collective: a blocking
            synchronisation is one, and so is each of the ``T`` chunks of an overlapped one.

    All-reduce: every step computes, then sends. Local steps: an epoch starts with nothing
    in flight and ends with a full synchronisation; blocking, every period ends with one;
    overlapped, each period after an epoch's first carries the previous period's change in
    its first ``T`` steps, each taking the longer of its computation and its chunk's link
    time.
    """
    if not local_steps:
        return compute + link, steps * (epoch_compute + link)
    periods = steps // local_steps
    if overlap:
        waits = (periods - 1) * overlap * max(0.0, link / overlap + latency - compute)
    else:
        waits = (periods - 1) * (link + latency)
    return compute + waits / (steps - 1), steps * epoch_compute + waits + link + latency


def round_trips(workers, collectives):
    """Round trips on the critical path of ``collectives`` ring collectives among
    ``workers``: each passes its data on in 2 (W - 1) steps, and in each a worker asks its
    neighbour for the next part and waits for it (TensorFlow's ``RecvBuf``), one round trip."""
    return 2 * (workers - 1) * collectives


def _communication(
    traffic,
    *,
    workers,
    images_per_step,
    compute_seconds,
    measured_seconds,
    bits_per_second,
    rtt=0.0,
    collectives=0,
    local_steps=0,
    overlap=False,
    sync_seconds=(),
    steps=2,
    epoch_compute_seconds=None,
    measured_epoch_seconds=None,
):
    """Bytes all-reduced per step and per image; the step and epoch times the link model
    predicts (:func:`predicted_seconds`) beside the measured ones.

    ``rtt``: the workers' round-trip time; ``collectives``: those a step holds (with local
    steps: its own, not the synchronisation's, which is one collective). With local steps
    also one synchronisation's time: the median of every worker's ``sync_seconds``, and the
    link model's figure for its bytes.
    """
    per_step = traffic["gradient_bytes"] + traffic["batch_norm_bytes"]
    # A ring all-reduce: each worker sends 2 (W - 1) / W of the tensor; on the shaped
    # loopback every worker's bytes cross the same device.
    on_link = 2 * (workers - 1) * per_step
    predicted = predicted_epoch = None
    latency = rtt * round_trips(workers, 1)
    if bits_per_second or rtt:
        seconds_per_byte = 8 / bits_per_second if bits_per_second else 0.0
        step_latency = collectives * latency
        # Local steps wait for the step's own collectives beside its computation; the
        # all-reduce's are part of its link time.
        waited = step_latency if local_steps else 0.0
        link = on_link * (local_steps or 1) * seconds_per_byte + step_latency - waited
        predicted, predicted_epoch = predicted_seconds(
            steps=steps,
            compute=compute_seconds + waited,
            epoch_compute=(epoch_compute_seconds or compute_seconds) + waited,
            link=link,
            local_steps=local_steps,
            overlap=overlap or 0,
            latency=latency,
        )
    sync = None
    if local_steps and sync_seconds:
        sync = {"measured_seconds": statistics.median(sync_seconds), "predicted_seconds": None}
        if (bits_per_second or rtt) and not overlap:
            link_bytes = 2 * (workers - 1) * traffic["gradient_bytes"] * local_steps
            sync["predicted_seconds"] = (
                8 * link_bytes / bits_per_second if bits_per_second else 0.0
            ) + latency
    return {
        "synchronisation": sync,
        "bytes_per_step": per_step,
        "bytes_per_image": per_step / images_per_step,
        "gradient_bytes": traffic["gradient_bytes"],
        "batch_norm_bytes": traffic["batch_norm_bytes"],
        "sync_bn": traffic.get("sync_bn"),
        "bytes_on_link_per_step": on_link,
        "collectives_per_step": collectives,
        "round_trip_seconds": rtt,
        "compute_seconds": compute_seconds,
        "epoch_compute_seconds": epoch_compute_seconds,
        "measured_step_seconds": measured_seconds,
        "predicted_step_seconds": predicted,
        "measured_epoch_seconds": measured_epoch_seconds,
        "predicted_epoch_seconds": predicted_epoch,
    }


def format_scaling(result):
    """The figures of :func:`run_scaling` as a plain-text report."""
    config = result["config"]
    step = config["step"]
    sync = "on" if result["sync_bn_workers"] else "off"
    details = [
        (
            "model",
            f"{step['model']} at {step['input_size']}x{step['input_size']}, "
            f"{step['num_classes']} classes, batch {step['batch_size']} per process and "
            f"micro-batch; {step['optimizer']}; the full YoloTrainer step through model.fit; "
            f"sync BN {sync} with {config['workers']} workers ({config['sync_bn']})",
        ),
        (
            "link",
            (
                "unshaped loopback"
                if parse_rate(config["link"]) is None
                else f"loopback limited to {config['link']} in a private network namespace "
                "(all processes, the baseline too; the workers share the rate)"
            )
            + (
                f"; workers {config['rtt']} apart (round trip, through a delay line)"
                if parse_rtt(config["rtt"])
                else ""
            )
            + (
                f"; the last worker limited to {config['straggler']:g} of a core"
                if config["straggler"]
                else ""
            ),
        ),
        (
            "data",
            "synthetic, in memory: one generated batch of uint8 images and boxes per "
            "process, repeated by tf.data",
        ),
        (
            "timing",
            f"median, min, max over {config['rounds']} round(s) x {step['repeats']} windows "
            f"of {step['steps']} steady optimizer steps, after {step['warmup_steps']} warm-up "
            "steps; 1 process first, then the workers of each setting, each a fresh set of "
            "processes",
        ),
    ]
    text = harness.format_report(result, details)
    lines = ["", "communication per optimizer step (K micro-batches per worker):"]
    width = max(len(figures["label"]) for figures in result["communication"].values()) + 2
    columns = (
        "MB/step", "KB/image", "collectives", "peak MiB", "compute s", "measured s",
        "predicted s", "excess ms",
    )  # fmt: skip
    header = f"{'':<{width}}" + "".join(f"{c:>12}" for c in columns)
    lines += [header, "-" * len(header)]

    def cells(measured, predicted, scale=1):
        if predicted is None:
            return f"{measured:>12.2f}{'-':>12}{'-':>12}"
        excess = 1000 * (measured - predicted) / scale
        return f"{measured:>12.2f}{predicted:>12.2f}{excess:>12.0f}"

    for figures in result["communication"].values():
        lines.append(
            f"{figures['label']:<{width}}{figures['bytes_per_step'] / 1e6:>12.2f}"
            f"{figures['bytes_per_image'] / 1e3:>12.1f}{figures['collectives_per_step']:>12d}"
            f"{max(figures['peak_rss_mib']):>12.0f}{figures['compute_seconds']:>12.2f}"
            + cells(figures["measured_step_seconds"], figures["predicted_step_seconds"])
        )
    lines.append(
        "collectives: in the compiled step; peak MiB: the largest worker's peak RSS; "
        "predicted: compute (a step of the independent processes, same images) + bytes on "
        "the link x 8 / rate, a ring "
        "all-reduce sending 2 (W - 1) x the bytes per step over the one shaped loopback, + "
        "2 (W - 1) round trips per collective "
        "(local steps: the synchronisations within the window, one collective each; "
        "overlapped, a chunk step takes the longer of the two); excess: measured - predicted"
    )
    steps = step["steps"]
    lines += ["", f"whole epochs of {steps} steps, by wall time (the epoch end included):"]
    columns = ("of ceiling", "measured s", "predicted s", "excess ms")
    header = f"{'':<{width}}" + "".join(f"{c:>12}" for c in columns)
    lines += [header, "-" * len(header)]
    for figures in result["communication"].values():
        lines.append(
            f"{figures['label']:<{width}}{figures['wall_of_ceiling']:>12.2f}"
            + cells(figures["measured_epoch_seconds"], figures["predicted_epoch_seconds"], steps)
        )
    lines.append(
        "of ceiling: images/s by wall time over the independent processes' by wall time; "
        "excess: per step; "
        "predicted: the independent processes' whole epochs' compute, the link's time for "
        "the step's bytes, local steps' synchronisations (the epoch end's full one included)"
    )
    for figures in result["communication"].values():
        sync = figures.get("synchronisation")
        if sync is None:
            continue
        predicted = sync["predicted_seconds"]
        lines.append(
            f"{figures['label']}: one synchronisation {sync['measured_seconds']:.2f} s "
            f"(median), predicted {'-' if predicted is None else f'{predicted:.2f}'} s"
        )
    return text + "\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------
# One process of a run.


def _sync_bn_channels(body):
    """Channels of ``body``'s synchronised batch norms (0: none)."""
    return sum(
        int(layer.gamma.shape[0])
        for layer in body.layers
        if isinstance(layer, SyncBatchNormalization)
    )


def _traffic(trainer, job, replicas):
    """Bytes one worker contributes to the collectives of one optimizer step.

    The gradient all-reduce once per step (the communication's ``bytes_per_step``: with
    PowerSGD, its factors and the gradients it leaves uncompressed; with local steps, the
    weight changes once per H steps, as an average per step); each synchronised batch norm
    once per
    micro-batch: a float32 all-gather of 4 statistics per channel forward and, backward,
    an all-reduce of the gathered ``replicas x 4`` per channel.
    """
    per_channel = 4 * BYTES_PER_ELEMENT["float32"] * (1 + replicas)
    per_micro_batch = _sync_bn_channels(trainer.body) * per_channel
    return {
        "gradient_bytes": trainer.communication.bytes_per_step(trainer.body),
        "batch_norm_bytes": per_micro_batch * job["accumulate"],
    }


def _traced(function, depth=4):
    """The ``tf.function`` objects ``function`` holds (Keras wraps its compiled step in plain
    functions): ``function`` itself or those in its closures, ``depth`` deep."""
    if hasattr(function, "_list_all_concrete_functions"):
        return [function]
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        if depth and callable(cell.cell_contents):
            found += _traced(cell.cell_contents, depth - 1)
    return found


def _collectives(function):
    """Collective ops one call of the compiled ``function`` runs (a train step: its
    all-reduces and gathers), counted in its graphs and the functions they call."""
    counts = []
    for traced in _traced(function):
        for concrete in traced._list_all_concrete_functions():  # noqa: SLF001
            graph = concrete.graph.as_graph_def()
            nodes = list(graph.node)
            for library_function in graph.library.function:
                nodes += library_function.node_def
            counts.append(sum(node.op.startswith("Collective") for node in nodes))
    return max(counts, default=0)


def _build_worker_step(config, job, replicas, worker_index=0):
    """A worker's compiled trainer for ``job``'s setting, and its input batch
    (:func:`benchmarks.train_step.build_step`), under the caller's strategy scope."""
    communication = communication_from(
        allreduce_dtype=job["allreduce_dtype"],
        compress="powersgd" if job["rank"] else "none",
        rank=job["rank"] or 4,
        local_steps=job["local_steps"] or None,
        overlap_sync=job["overlap_sync"] or None,
    )
    sync_bn = communication.default_sync_bn(replicas)
    if config.sync_bn != "auto":  # "on" is refused with local steps in train.py: off here
        sync_bn = config.sync_bn == "on" and communication.all_reduces_in_step
    return build_step(
        config.step,
        synchronized_bn=sync_bn,
        data_seed=config.step.seed + worker_index,
        accumulate=job["accumulate"],
        communication=communication,
    )


def _job(setting):
    """The settings one job's processes read, from a ``--settings`` entry."""
    accumulate, dtype, rank, local, overlap = setting
    return {
        "accumulate": accumulate,
        "allreduce_dtype": dtype,
        "rank": rank,
        "local_steps": local,
        "overlap_sync": overlap,
    }


def worker_main(argv):
    """Trains as one process of a run and writes its timed windows to ``argv[1]``."""
    config_path, result_path = argv
    with open(config_path, encoding="utf-8") as f:
        data = json.load(f)
    step_data = data.pop("step")
    job = data.pop("job")
    step_data["anchors"] = tuple(map(tuple, step_data["anchors"]))
    data["settings"] = tuple(map(tuple, data["settings"]))
    config = ScalingConfig(step=TrainStepConfig(**step_data), **data)

    # Before the runtime starts: one thread for ops, one for scheduling them.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    distribute.configure_devices(gpus=0)
    strategy = distribute.make_strategy(gpus=0)
    info = distribute.worker_info(strategy)
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        trainer, images, boxes = _build_worker_step(config, job, replicas, info.worker_index)
    communication = trainer.communication
    # Synchronisations every H steps and a full one at every epoch end, as in a run.
    callbacks = communication.callbacks()
    sync = callbacks[0] if callbacks else None  # a LocalSync, with local steps

    def dataset_fn(context):
        del context  # one in-memory batch per process, nothing to split
        dataset = tf.data.Dataset.from_tensors((images, boxes)).repeat()
        options = autotune.untuned_options()  # as the trainer's pipelines
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
        return dataset.with_options(options)

    autotune.untune_device_datasets()
    data = strategy.distribute_datasets_from_function(dataset_fn)
    step = config.step
    trainer.fit(
        data,
        epochs=1,
        steps_per_epoch=step.warmup_steps,
        verbose=0,
        shuffle=False,
        callbacks=callbacks,
    )
    if sync is not None:
        # The synchronisation's first call would trace it: here, before the timed windows.
        sync.state.trace(strategy)
    timer = WindowTimer()
    trainer.fit(
        data,
        epochs=step.repeats,
        steps_per_epoch=step.steps,
        verbose=0,
        shuffle=False,
        callbacks=[timer, *callbacks],  # its windows close before the epoch end's sync
    )
    fileio.write_json(
        result_path,
        {
            "windows": timer.windows,
            "epochs": timer.epochs,
            "sync_bn": _sync_bn_channels(trainer.body) > 0,
            "replicas": replicas,
            "worker_index": info.worker_index,
            "affinity": sorted(os.sched_getaffinity(0)),
            "accumulate": job["accumulate"],
            "traffic": _traffic(trainer, job, replicas) if replicas > 1 else None,
            # Each synchronisation of local steps, waits for the other workers included.
            "sync_seconds": [] if sync is None else sync.seconds,
            "collectives_per_step": _collectives(trainer.train_function) if replicas > 1 else 0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
