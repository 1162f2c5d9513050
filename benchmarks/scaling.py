"""Scaling benchmark: one training process against two workers on 127.0.0.1.

:func:`run_scaling` runs the real training step (:class:`yolo3.trainer.YoloTrainer` under
``model.fit``, targets built in the step, as ``train.py``) twice:

- one process, no ``TF_CONFIG`` (the default strategy);
- two worker processes with ``TF_CONFIG`` for 127.0.0.1, so that
  :func:`yolo3.distribute.make_strategy` builds a ``MultiWorkerMirroredStrategy`` and
  applies the Keras workaround; each worker feeds the same per-worker batch, so the global
  batch doubles. Batch normalization is synchronized across the workers when there is more
  than one replica, as ``train.py`` does by default (``sync_bn="auto"``).

Every process is pinned to a core of its own (``os.sched_setaffinity``) with one intra-op
and one inter-op thread. The data is synthetic and in memory: one batch of generated shapes
(uint8 images and padded boxes, what ``make_dataset(targets=False)`` yields) per worker,
repeated by ``tf.data`` through ``strategy.distribute_datasets_from_function``, so the
figures are of the step and its communication, not of reading. After the warm-up steps
(tracing), each repeat times a fixed number of steady steps.

Scaling efficiency = (two-worker images/s) / (2 x one-process images/s).

Each process runs this module: ``python -m benchmarks.scaling CONFIG.json RESULT.json``.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import keras
import tensorflow as tf
from keras import ops

from benchmarks import harness
from benchmarks.train_step import TrainStepConfig, build_step
from yolo3 import distribute, fileio

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

    def __post_init__(self):
        if self.sync_bn not in SYNC_BN_CHOICES:
            raise ValueError(f"--sync-bn {self.sync_bn!r}: use one of {SYNC_BN_CHOICES}")
        if self.workers < 2:
            raise ValueError(f"--workers {self.workers}: compare at least 2 with 1 process")
        if self.rounds < 1:
            raise ValueError(f"--rounds {self.rounds} must be >= 1")


class WindowTimer(keras.callbacks.Callback):
    """Wall-clock and CPU seconds of each epoch's steps after its first.

    The first step of an epoch carries the epoch's setup and is left out. Before reading the
    clocks the timer waits for the step's loss, since an accelerator runs steps
    asynchronously. ``windows`` gets ``{"steps", "seconds", "cpu_seconds"}`` per epoch.
    """

    def __init__(self):
        super().__init__()
        self.windows = []
        self._start = None

    def on_train_batch_end(self, batch, logs=None):
        last = self.params["steps"] - 1
        if batch not in (0, last) or last == 0:
            return
        ops.convert_to_numpy(logs["loss"])
        now = (time.perf_counter(), time.process_time())
        if batch == 0:
            self._start = now
            return
        self.windows.append(
            {
                "steps": last,
                "seconds": now[0] - self._start[0],
                "cpu_seconds": now[1] - self._start[1],
            }
        )


def _cores(needed):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < needed:
        raise ValueError(
            f"{needed} workers need {needed} cores to pin to; this process may use "
            f"{len(cores)} ({cores})"
        )
    return cores[:needed]


def _environment(tf_config):
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return env


def _run_job(config, workers, directory, log):
    """Starts ``workers`` pinned processes (one: no TF_CONFIG) and returns their results."""
    cores = _cores(workers)
    config_path = os.path.join(directory, "config.json")
    fileio.write_json(config_path, dataclasses.asdict(config))
    addresses = [f"127.0.0.1:{port}" for port in distribute.free_ports(workers)]
    processes, outputs = [], []
    try:
        for index, core in enumerate(cores):
            tf_config = distribute.tf_config(addresses, index) if workers > 1 else None
            output = os.path.join(directory, f"{workers}w-{index}.log")
            outputs.append(output)
            with open(output, "w", encoding="utf-8") as log_file:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", __name__, config_path, f"{output}.json"],
                        env=_environment(tf_config),
                        cwd=_ROOT,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}),
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
    log(f"  {workers} process{'es' if workers > 1 else ''}: " + _describe(results, config))
    return results


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


def _windows(results, batch_size):
    """Per timed window of a job: ``{"images_per_second", "cpu_ms_per_image"}``.

    Workers step in lockstep; a window lasts as long as its slowest worker's, and the CPU
    time is that of every worker together.
    """
    figures = []
    for windows in zip(*(result["windows"] for result in results)):
        images = sum(window["steps"] for window in windows) * batch_size
        seconds = max(window["seconds"] for window in windows)
        cpu = sum(window["cpu_seconds"] for window in windows)
        figures.append(
            {"images_per_second": images / seconds, "cpu_ms_per_image": 1000 * cpu / images}
        )
    return figures


def _describe(results, config):
    figures = _windows(results, config.step.batch_size)
    speeds = ", ".join(f"{figure['images_per_second']:.1f}" for figure in figures)
    return f"{speeds} images/s (sync BN {'on' if results[0]['sync_bn'] else 'off'})"


def run_scaling(config, *, command="", log=print):
    """Runs the scaling benchmark.

    Returns:
        A JSON-able dict (printed by :func:`format_scaling`): ``rows`` for one process and
        for the workers (median, min, max images/s over the timed windows of every round)
        and ``ratios`` the scaling efficiency.
    """
    result = {
        "command": command,
        "machine": harness.machine_info(),
        "load_average_start": harness.load_average(),
        "config": dataclasses.asdict(config),
    }
    _cores(config.workers)
    runs = {"single": [], "workers": []}
    with tempfile.TemporaryDirectory(prefix="yolo3-scaling-") as directory:
        for round_index in range(config.rounds):
            log(f"round {round_index + 1}/{config.rounds}")
            for key, workers in (("single", 1), ("workers", config.workers)):
                results = _run_job(config, workers, directory, log)
                runs[key] += _windows(results, config.step.batch_size)
                result[f"sync_bn_{key}"] = results[0]["sync_bn"]
    batch, workers = config.step.batch_size, config.workers
    rows = {
        "single": harness.summarize(
            f"1 process, 1 core, 1 thread, batch {batch}", runs["single"], 1
        ),
        "workers": harness.summarize(
            f"{workers} workers (MultiWorkerMirroredStrategy), 1 core and 1 thread each, "
            f"batch {batch} each",
            runs["workers"],
            workers,
        ),
    }
    result["rows"] = rows
    single, multi = rows["single"], rows["workers"]
    result["ratios"] = {
        "efficiency": harness.make_ratio(
            f"scaling efficiency, {workers} workers / ({workers} x 1 process)",
            multi["images_per_second"] / (workers * single["images_per_second"]),
            single["cpu_ms_per_image"] / multi["cpu_ms_per_image"],
            GOAL_EFFICIENCY,
            harness.FRACTION,
        )
    }
    result["load_average_end"] = harness.load_average()
    return result


def format_scaling(result):
    """The figures of :func:`run_scaling` as a plain-text report."""
    config = result["config"]
    step = config["step"]
    sync = "on" if result["sync_bn_workers"] else "off"
    details = [
        (
            "model",
            f"{step['model']} at {step['input_size']}x{step['input_size']}, "
            f"{step['num_classes']} classes, batch {step['batch_size']} per process; "
            f"{step['optimizer']}; the full YoloTrainer step through model.fit; sync BN "
            f"{sync} with {config['workers']} workers ({config['sync_bn']})",
        ),
        (
            "data",
            "synthetic, in memory: one generated batch of uint8 images and boxes per "
            "process, repeated by tf.data",
        ),
        (
            "timing",
            f"median, min, max over {config['rounds']} round(s) x {step['repeats']} windows "
            f"of {step['steps']} steady steps, after {step['warmup_steps']} warm-up steps; "
            "1 process first, then the workers, each a fresh set of processes",
        ),
    ]
    return harness.format_report(result, details)


# ---------------------------------------------------------------------------------------
# One process of a run.


def worker_main(argv):
    """Trains as one process of a run and writes its timed windows to ``argv[1]``."""
    config_path, result_path = argv
    with open(config_path, encoding="utf-8") as f:
        data = json.load(f)
    step_data = data.pop("step")
    step_data["anchors"] = tuple(map(tuple, step_data["anchors"]))
    config = ScalingConfig(step=TrainStepConfig(**step_data), **data)

    # Before the runtime starts: one thread for ops, one for scheduling them.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    distribute.configure_devices(gpus=0)
    strategy = distribute.make_strategy(gpus=0)
    info = distribute.worker_info(strategy)
    replicas = strategy.num_replicas_in_sync
    sync_bn = replicas > 1 if config.sync_bn == "auto" else config.sync_bn == "on"
    with strategy.scope():
        trainer, images, boxes = build_step(
            config.step, synchronized_bn=sync_bn, data_seed=config.step.seed + info.worker_index
        )

    def dataset_fn(context):
        del context  # one in-memory batch per process, nothing to split
        dataset = tf.data.Dataset.from_tensors((images, boxes)).repeat()
        options = tf.data.Options()
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
        return dataset.with_options(options)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    step = config.step
    trainer.fit(data, epochs=1, steps_per_epoch=step.warmup_steps, verbose=0, shuffle=False)
    timer = WindowTimer()
    trainer.fit(
        data,
        epochs=step.repeats,
        steps_per_epoch=step.steps + 1,
        verbose=0,
        shuffle=False,
        callbacks=[timer],
    )
    fileio.write_json(
        result_path,
        {
            "windows": timer.windows,
            "sync_bn": sync_bn,
            "replicas": replicas,
            "worker_index": info.worker_index,
            "affinity": sorted(os.sched_getaffinity(0)),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
