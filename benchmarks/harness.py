"""What the benchmarks of ``tools/harness.py`` share: processes, timing and the report.

Subcommands, one module each: :mod:`benchmarks.io_pipeline` (input pipeline),
:mod:`benchmarks.train_step` (train step against the bare network) and
:mod:`benchmarks.scaling` (one process against two workers).

Measurements run in spawned processes (:func:`run_round_robin`, :func:`run_spawned`), so
thread limits set there take effect before TensorFlow starts and nothing else runs in them;
repeats go round-robin over the measurements, so a change in machine load falls on all of
them alike. Besides images/s, each figure comes with the CPU milliseconds per image of every
thread of its process(es), which shows how many cores a measurement really used and is
steadier than wall-clock time on a shared machine.

A result is a JSON-able dict with ``command``, ``machine``, ``load_average_start`` and
``load_average_end``, ``rows`` (:func:`summarize`) and ``ratios`` (:func:`make_ratio`);
:func:`format_report` prints it.
"""

import concurrent.futures
import multiprocessing
import os
import platform
import statistics

import numpy as np

# How a ratio is judged and printed: a speed-up (x), a fraction or an overhead (percent).
SPEEDUP, FRACTION, OVERHEAD = "speedup", "fraction", "overhead"


def check_input_size(input_size):
    """ValueError naming ``--input-size`` unless it is a positive multiple of 32."""
    if input_size % 32 or input_size <= 0:
        raise ValueError(f"--input-size {input_size} is not a positive multiple of 32")


def check_counts(counts):
    """ValueError naming the first flag of ``counts`` (flag -> value) whose value is below 1."""
    for flag, value in counts.items():
        if value < 1:
            raise ValueError(f"{flag} {value} must be >= 1")


def machine_info():
    """Cores, CPU model (from /proc/cpuinfo where there is one) and library versions."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    import keras  # noqa: PLC0415 - TensorFlow starts only when a benchmark runs
    import PIL  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "gpus": [device.name for device in tf.config.list_physical_devices("GPU")],
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
    }


def load_average():
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def init_process(threads, uses_tensorflow):
    """Runs first in a measurement process: ``threads`` threads for NumPy and TensorFlow.

    ``threads`` None leaves every library its default (all cores).
    """
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(threads)
    if uses_tensorflow:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf  # noqa: PLC0415

        if threads is not None:
            # Must happen before the runtime starts, hence in a fresh process.
            tf.config.threading.set_inter_op_parallelism_threads(threads)
            tf.config.threading.set_intra_op_parallelism_threads(threads)


def run_spawned(function, /, *, threads=None, uses_tensorflow=True, **kwargs):
    """``function(**kwargs)`` in a fresh spawned process (see :func:`init_process`)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=context, initializer=init_process, initargs=(threads, uses_tensorflow)
    ) as pool:
        return pool.submit(function, **kwargs).result()


def run_round_robin(measurements, *, repeats, log):
    """``{key: [figures of each repeat]}``, repeats going round-robin over the measurements.

    Args:
        measurements: ``{key: (threads or None for all, uses TensorFlow, function, kwargs)}``;
            ``function(**kwargs, repeat=r)`` runs in the key's own spawned process and
            returns a dict with at least ``images_per_second`` and ``cpu_ms_per_image``.
            The process lives through all repeats, so a function may keep state there
            (a built model) from one repeat to the next.
        repeats: calls of each function.
        log: a function taking one line of progress.
    """
    runs = {key: [] for key in measurements}
    context = multiprocessing.get_context("spawn")
    pools = {
        key: concurrent.futures.ProcessPoolExecutor(
            1, mp_context=context, initializer=init_process, initargs=(threads, uses_tf)
        )
        for key, (threads, uses_tf, _, _) in measurements.items()
    }
    try:
        # Start every process (and its TensorFlow import) before any timing.
        concurrent.futures.wait([pool.submit(os.getpid) for pool in pools.values()])
        for repeat in range(repeats):
            for key, (_, _, function, kwargs) in measurements.items():
                figures = pools[key].submit(function, **kwargs, repeat=repeat).result()
                runs[key].append(figures)
                log(
                    f"  repeat {repeat + 1}/{repeats} {key}: "
                    f"{figures['images_per_second']:.1f} images/s, "
                    f"{figures['cpu_ms_per_image']:.2f} CPU ms per image"
                )
    finally:
        for pool in pools.values():
            pool.shutdown(cancel_futures=True)
    return runs


def summarize(label, runs, threads):
    """A table row: median, min and max images/s of ``runs`` and their median CPU ms/image.

    ``threads`` is the cores the measurement may use; the row's images/s per core divides
    by it.
    """
    speeds = [run["images_per_second"] for run in runs]
    cpu = [run.get("cpu_ms_per_image") for run in runs]
    return {
        "label": label,
        "threads": threads,
        "images_per_second": statistics.median(speeds),
        "min": min(speeds),
        "max": max(speeds),
        "cpu_ms_per_image": None if None in cpu else statistics.median(cpu),
        "runs": runs,
    }


def make_ratio(label, value, cpu_value, goal, kind):
    """A goal line. ``kind`` SPEEDUP and FRACTION pass at ``value >= goal``, OVERHEAD at
    ``value <= goal``; ``cpu_value`` is the same ratio in CPU time, or None. A line with
    ``goal`` None informs only: ``passed`` is None."""
    if goal is None:
        passed = None
    else:
        passed = value <= goal if kind == OVERHEAD else value >= goal
    return {
        "label": label,
        "value": value,
        "cpu_value": cpu_value,
        "goal": goal,
        "kind": kind,
        "passed": passed if passed is None else bool(passed),
    }


def speed_ratio(label, faster, slower, goal, kind=SPEEDUP):
    """``faster / slower`` in images/s, and in CPU time per image, of two rows."""
    cpu_value = None
    if faster["cpu_ms_per_image"] and slower["cpu_ms_per_image"]:
        cpu_value = slower["cpu_ms_per_image"] / faster["cpu_ms_per_image"]
    value = faster["images_per_second"] / slower["images_per_second"]
    return make_ratio(label, value, cpu_value, goal, kind)


def format_load(values):
    return "unknown" if values is None else " ".join(f"{v:.2f}" for v in values)


def format_report(result, details):
    """The plain-text report of a benchmark result, with aligned columns.

    ``details`` are ``(name, text)`` lines printed after the machine lines (data, timing).
    """
    machine = result["machine"]
    gpus = ", ".join(machine["gpus"]) or "no GPU"
    lines = [
        f"command:  {result['command']}",
        f"machine:  {machine['cores']} cores, {machine['cpu']}, {gpus}; load average "
        f"{format_load(result['load_average_start'])} at start, "
        f"{format_load(result['load_average_end'])} at end",
        f"software: python {machine['python']}, tensorflow {machine['tensorflow']}, "
        f"keras {machine['keras']}, numpy {machine['numpy']}, pillow {machine['pillow']}",
    ]
    lines += [f"{name + ':':<9} {text}" for name, text in details]
    lines.append("")
    width = max(len(row["label"]) for row in result["rows"].values())
    width = max([width] + [len(ratio["label"]) for ratio in result["ratios"].values()])
    columns = ("images/s", "min", "max", "per core", "CPU ms/img")
    header = f"{'':<{width}}" + "".join(f"  {c:>10}" for c in columns)
    lines += [header, "-" * len(header)]
    for row in result["rows"].values():
        many = len(row["runs"]) > 1
        cells = [
            f"{row['images_per_second']:.1f}",
            f"{row['min']:.1f}" if many else "-",
            f"{row['max']:.1f}" if many else "-",
            f"{row['images_per_second'] / row['threads']:.1f}",
            "-" if row["cpu_ms_per_image"] is None else f"{row['cpu_ms_per_image']:.2f}",
        ]
        lines.append(f"{row['label']:<{width}}" + "".join(f"  {c:>10}" for c in cells))
    lines += ["", f"{'':<{width}}  {'images/s':>10}  {'CPU time':>10}  {'goal':>10}"]
    for ratio in result["ratios"].values():
        lines.append(f"{ratio['label']:<{width}}" + "".join(f"  {c:>10}" for c in _cells(ratio)))
    return "\n".join(lines)


def _cells(ratio):
    def show(value):
        if value is None:
            return "-"
        if ratio["kind"] == SPEEDUP:
            return f"{value:.1f}x"
        return f"{value:+.1%}" if ratio["kind"] == OVERHEAD else f"{value:.0%}"

    goal = ratio["goal"]
    if goal is None:
        return [show(ratio["value"]), show(ratio["cpu_value"]), "-", "info"]
    if ratio["kind"] == SPEEDUP:
        goal_text = f">= {goal:g}x"
    else:
        goal_text = f"<= {goal:.0%}" if ratio["kind"] == OVERHEAD else f">= {goal:.0%}"
    verdict = "PASS" if ratio["passed"] else "MISS"
    return [show(ratio["value"]), show(ratio["cpu_value"]), goal_text, verdict]
