"""A soak run: many one-step epochs of ``yolo3 train``, the process's resources sampled.

A leak too slow for any ordinary run to show grows with the number of epochs, not of steps,
wherever it is per-epoch work that leaks (validation, checkpoints, backups, TensorBoard,
``history.jsonl``): one-step epochs on a tiny generated record set bring a week of short
epochs into minutes. ``yolo3 train`` runs with its defaults (validation, a checkpoint and a
backup every epoch, ``history.jsonl``, TensorBoard) plus the setting's own flags, as a
process of its own. At each epoch's end (the first look, every ``poll`` seconds, that finds
``history.jsonl`` written anew) the sampler reads from ``/proc/<pid>`` its resident memory
(``VmRSS``, and ``RssAnon``, its anonymous part: heap and mappings), its open files (the
entries of ``fd/``) and its threads, and lists its log folder by kind.

Over the second half of the epochs (the first half holds the start-up, which grows for
reasons of its own: TensorFlow's kernels, the first traces) a least-squares line through the
RSS samples gives the growth in MB per 100 epochs, with its standard error. Samples taken
at the same point of each epoch scatter by a few MB; samples once a second, anywhere in the
epoch, by tens (a checkpoint's buffers come and go). A leak shows in RSS only once it has
used up the heap's free space (glibc keeps up to its trim threshold of freed heap, which
grows to 64 MiB: :mod:`yolo3.distributed.malloc`), and glibc may hand some back meanwhile,
so a short run can miss one: a 200-epoch run of code that leaked 14 MB per 100 epochs read
-2.4 ± 4.3, a 1000-epoch run of it +16.25 ± 0.04. Open files and threads must not peak
higher in the last quarter than in the third. The log folder is compared between the
half-way epoch and the last sample: only ``history.jsonl``, ``results.csv`` and ``.png`` and
the TensorBoard event files may grow; the checkpoints and backups are rewritten in place,
the same files of (within 1%) the same size.
"""

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.recipe import stop, yolo3_process

# Goals of a run (issue 58): RSS growth over the second half, and flat files and threads.
RSS_GOAL_MB_PER_100 = 1.0
HISTORY = "history.jsonl"
# What ``yolo3 train`` writes under its log folder, by kind; the first that matches names it.
KINDS = (
    ("history", lambda parts: parts == (HISTORY,)),
    # results.csv grows a row an epoch, as the history; results.png is redrawn.
    ("results", lambda parts: parts in (("results.csv",), ("results.png",))),
    ("events", lambda parts: parts[0] == "tensorboard" and "tfevents" in parts[-1]),
    ("checkpoints", lambda parts: parts[0] == "checkpoints"),
    ("backups", lambda parts: parts[0] == "backup"),
)
GROWING_KINDS = ("history", "results", "events")


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    """As ``tools/benchmark.py soak``; ``flags``: ``yolo3 train`` flags added to the run."""

    epochs: int = 1000
    poll: float = 0.05
    train_images: int = 4
    val_images: int = 2
    input_size: int = 64
    batch_size: int = 2
    flags: tuple = ()
    work: str | None = None
    timeout: float | None = None

    def __post_init__(self):
        harness.check_input_size(self.input_size)
        harness.check_counts(
            {
                "--epochs": self.epochs,
                "--train-images": self.train_images,
                "--batch-size": self.batch_size,
            }
        )
        if self.poll <= 0:
            raise ValueError(f"--poll {self.poll} must be > 0 seconds")


def write_records(directory, *, train, val, size, seed=0):
    """A raw record set of ``train`` and ``val`` grey ``size`` px images, each with one to
    three filled boxes of two classes, one shard a split; returns ``directory``."""
    from yolo3 import fileio  # noqa: PLC0415 - TensorFlow starts only when a benchmark runs
    from yolo3.data import records  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    splits = {}
    for split, count in (("train", train), ("val", val)):
        serialized = []
        for index in range(count):
            image = np.full((size, size, 3), 100, np.uint8)
            boxes, classes = [], []
            for _ in range(rng.integers(1, 4)):
                w, h = rng.integers(4, size // 2, size=2)
                x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
                image[y0 : y0 + h, x0 : x0 + w] = rng.integers(0, 256, 3)
                boxes.append([x0, y0, x0 + w, y0 + h])
                classes.append(int(rng.integers(2)))
            record = {"image": image.tobytes(), "format": "raw", "height": size, "width": size,
                      "boxes": np.asarray(boxes, np.float32), "classes": classes,
                      "source": f"{split}/{index}.png", "line": index + 1, "copy": 0}  # fmt: skip
            serialized.append(records.serialize_example(record))
        if serialized:
            path = os.path.join(directory, records.shard_name(split, 0, 1))
            splits[split] = [records.write_shard(path, serialized)]
    manifest = records.make_manifest(
        classes=["a", "b"], input_size=(size, size), image_format="raw", splits=splits
    )
    fileio.write_json(os.path.join(directory, records.MANIFEST), manifest)
    return directory


def read_process(pid):
    """``{rss_mb, rss_anon_mb, open_files, threads}`` of process ``pid``, from ``/proc``.

    Raises:
        OSError: the process is gone (or this system has no ``/proc``).
    """
    fields = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value.split()
    return {
        "rss_mb": int(fields["VmRSS"][0]) / 1024,
        "rss_anon_mb": int(fields["RssAnon"][0]) / 1024,
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"][0]),
    }


def count_epochs(log_dir):
    """The epochs ``history.jsonl`` records (one line each), 0 before the first."""
    try:
        with open(os.path.join(log_dir, HISTORY), "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def history_version(log_dir):
    """What changes whenever ``history.jsonl`` is written (it is replaced whole, by a rename:
    a new inode), None before it exists."""
    try:
        found = os.stat(os.path.join(log_dir, HISTORY))
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def list_log_folder(log_dir):
    """``{kind: {"files", "bytes"}}`` of the files under ``log_dir``; kinds as :data:`KINDS`,
    plus ``other``."""
    listing = {kind: {"files": 0, "bytes": 0} for kind, _ in KINDS}
    listing["other"] = {"files": 0, "bytes": 0}
    root = Path(log_dir)
    for path in root.rglob("*"):
        try:
            if not path.is_file():
                continue
            size = path.stat().st_size
        except FileNotFoundError:  # replaced between the listing and the look (a rename)
            continue
        parts = path.relative_to(root).parts
        if parts[-1].startswith(".tmp-") or parts[-1].endswith(".tmp"):
            continue  # a write under way (yolo3.fileio.atomic_write), renamed when done
        kind = next((name for name, matches in KINDS if matches(parts)), "other")
        listing[kind]["files"] += 1
        listing[kind]["bytes"] += size
    return listing


def fit_line(epochs, values):
    """``(slope, standard error)`` of the least-squares line through ``values`` against
    ``epochs``, both per 100 epochs; ``(None, None)`` with fewer than two distinct epochs,
    and no error with fewer than three samples."""
    x, y = np.asarray(epochs, float), np.asarray(values, float)
    if len(np.unique(x)) < 2:
        return None, None
    dx = x - x.mean()
    sxx = np.sum(dx * dx)
    slope = np.sum(dx * (y - y.mean())) / sxx
    if len(x) < 3:
        return float(100.0 * slope), None
    residuals = y - y.mean() - slope * dx
    error = np.sqrt(np.sum(residuals**2) / (len(x) - 2) / sxx)
    return float(100.0 * slope), float(100.0 * error)


def summarize(samples, *, epochs):
    """The second half's figures: ``rss_mb_per_100_epochs`` and its ``_error`` (the line
    through the samples of ``rss_mb``), the same of ``rss_anon``, the range of each, and the
    peaks of open files and threads in its first and second halves. Samples taken once the
    last epoch is recorded (the process ending: backups deleted, threads stopping) are left
    out."""
    half = epochs // 2
    late = [s for s in samples if half <= s["epoch"] < epochs]
    summary = {"from_epoch": half, "samples": len(late)}
    for key in ("rss_mb", "rss_anon_mb"):
        name = key.removesuffix("_mb")
        slope, error = fit_line([s["epoch"] for s in late], [s[key] for s in late])
        summary[f"{name}_mb_per_100_epochs"] = slope
        summary[f"{name}_mb_per_100_epochs_error"] = error
        summary[f"{name}_mb_range"] = _range(late, key)
    quarter = half + (epochs - half) // 2
    for key in ("open_files", "threads"):
        summary[f"{key}_range"] = _range(late, key)
        summary[f"{key}_peaks"] = [  # the third quarter's, the fourth's
            max((s[key] for s in late if s["epoch"] < quarter), default=None),
            max((s[key] for s in late if s["epoch"] >= quarter), default=None),
        ]
    return summary


def _range(samples, key):
    values = [s[key] for s in samples]
    return [min(values), max(values)] if values else None


def log_growth(before, after):
    """``{kind: {"files", "bytes"}}``: what each kind gained from ``before`` to ``after``."""
    return {
        kind: {key: after[kind][key] - before[kind][key] for key in ("files", "bytes")}
        for kind in after
    }


def goals(summary, growth, half_listing):
    """The pass lines of a run: RSS growth, flat files and threads, what the folder grew by.

    The files of a kind that should not grow pass with the same count and their bytes
    within 1% (a checkpoint's metadata holds the epoch's losses: a few bytes either way)."""
    slope = summary["rss_mb_per_100_epochs"]
    lines = [
        _goal("RSS, MB per 100 epochs", slope, f"< {RSS_GOAL_MB_PER_100:g}",
              None if slope is None else slope < RSS_GOAL_MB_PER_100),
    ]  # fmt: skip
    for key, label in (("open_files", "open files"), ("threads", "threads")):
        third, fourth = summary[f"{key}_peaks"]
        flat = None if None in (third, fourth) else fourth <= third
        lines.append(_goal(f"{label}, peaks", f"{third} -> {fourth}", "no rise", flat))
    others = [k for k in growth if k not in GROWING_KINDS]
    steady = all(
        growth[k]["files"] == 0 and abs(growth[k]["bytes"]) <= 0.01 * half_listing[k]["bytes"]
        for k in others
    )
    grown = ", ".join(f"{k} {growth[k]['bytes']:+d} B" for k in growth if growth[k]["bytes"])
    lines.append(_goal("log folder grew by", grown or "nothing", "history, events", steady))
    return lines


def _goal(label, value, goal, passed):
    return {"label": label, "value": value, "goal": goal, "passed": passed}


def train_command(records, log_dir, config):
    """The ``yolo3 train`` arguments of a soak run."""
    return ("train", "--records", records, "--log-dir", log_dir, "--epochs", config.epochs,
            "--steps-per-epoch", 1, "--batch-size", config.batch_size, "--gpus", 0,
            "--progress", "off", "--seed", 0, *config.flags)  # fmt: skip


def sample_run(process, log_dir, *, poll=0.05, timeout=None):
    """Samples ``process`` at each epoch's end until it ends: a list of ``{seconds, epoch,
    rss_mb, rss_anon_mb, open_files, threads, log_bytes}``, and the listing of the log
    folder at each sample (``{epoch: listing}``).

    A sample is taken at the first look (every ``poll`` seconds) that finds ``history.jsonl``
    written anew: every sample at the same point of its epoch, after its checkpoints and
    backup, where samples once a second would fall anywhere in it, on the heap's high
    water of a checkpoint being written as well as on its low.
    """
    samples, listings, started, seen = [], {}, time.perf_counter(), None
    while process.poll() is None:
        seconds = time.perf_counter() - started
        if timeout is not None and seconds > timeout:
            stop(process)
            raise RuntimeError(f"the soak run took more than {timeout:g} s")
        version = history_version(log_dir)
        if version is None or version == seen:
            time.sleep(poll)
            continue
        seen = version
        try:
            figures = read_process(process.pid)
        except OSError:  # it ended between the poll and the read
            break
        epoch = count_epochs(log_dir)
        listing = list_log_folder(log_dir)
        listings[epoch] = listing
        log_bytes = sum(kind["bytes"] for kind in listing.values())
        samples.append({"seconds": round(seconds, 2), "epoch": epoch, **figures,
                        "log_bytes": log_bytes})  # fmt: skip
    return samples, listings


def run_soak(config, command=None, log=print):
    """Trains ``config.epochs`` one-step epochs and samples them; the result dict (see the
    module docstring): ``samples``, ``summary``, ``log_folder`` and ``goals``."""
    temporary = None if config.work else tempfile.mkdtemp(prefix="soak-")
    work = Path(config.work or temporary)
    try:
        records = write_records(work / "records", train=config.train_images,
                                val=config.val_images, size=config.input_size)  # fmt: skip
        log_dir = work / "run"
        shutil.rmtree(log_dir, ignore_errors=True)
        arguments = train_command(records, log_dir, config)
        log(f"yolo3 {' '.join(map(str, arguments))}")
        load_start = harness.load_average()
        process = yolo3_process(*arguments, log=work / "train.log")
        try:
            samples, listings = sample_run(
                process, log_dir, poll=config.poll, timeout=config.timeout
            )
        finally:
            stop(process)
        if process.returncode != 0:
            raise RuntimeError(
                f"the soak run failed (exit status {process.returncode}; log: {work}/train.log)"
            )
        during = [e for e in listings if e < config.epochs]  # not the process's end
        half = min((e for e in during if e >= config.epochs // 2), default=None)
        last = max(during, default=None)
        if half is None or last == half:
            raise RuntimeError(
                f"no sample in the second half of {config.epochs} epochs: more epochs, or a "
                "shorter --poll"
            )
        growth = log_growth(listings[half], listings[last])
        summary = summarize(samples, epochs=config.epochs)
        return {
            "command": command,
            "train_command": "yolo3 " + " ".join(map(str, arguments)),
            "machine": harness.machine_info(),
            "load_average_start": load_start,
            "load_average_end": harness.load_average(),
            "config": dataclasses.asdict(config),
            "summary": summary,
            "log_folder": {
                "half": {"epoch": half, "kinds": listings[half]},
                "last": {"epoch": last, "kinds": listings[last]},
                "growth": growth,
            },  # fmt: skip
            "goals": goals(summary, growth, listings[half]),
            "samples": samples,
        }
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)


def format_soak(result):
    """The plain-text report of :func:`run_soak`'s result."""
    machine, summary = result["machine"], result["summary"]
    samples = result["samples"]
    lines = [
        f"command:  {result['command']}",
        f"training: {result['train_command']}",
        f"machine:  {machine['cores']} cores, {machine['cpu']}; load average "
        f"{harness.format_load(result['load_average_start'])} at start, "
        f"{harness.format_load(result['load_average_end'])} at end",
        f"software: python {machine['python']}, tensorflow {machine['tensorflow']}, "
        f"keras {machine['keras']}",
        f"samples:  {len(samples)} epoch ends in {samples[-1]['seconds']:.0f} s, "
        f"{summary['samples']} from epoch {summary['from_epoch']} on",
        "",
        f"{'second half':<24}{'MB per 100 epochs':>22}  {'range, MB':>16}",
    ]
    for name, label in (("rss", "RSS"), ("rss_anon", "RSS, anonymous")):
        slope = summary[f"{name}_mb_per_100_epochs"]
        error = summary[f"{name}_mb_per_100_epochs_error"]
        shown = (
            "-" if slope is None else f"{slope:+.2f}" + ("" if error is None else f" ± {error:.2f}")
        )
        low, high = summary[f"{name}_mb_range"]
        lines.append(f"{label:<24}{shown:>22}  {f'{low:.1f}-{high:.1f}':>16}")
    for key, label in (("open_files", "open files"), ("threads", "threads")):
        low, high = summary[f"{key}_range"]
        lines.append(f"{label:<24}{'':>22}  {f'{low}-{high}':>16}")
    folder = result["log_folder"]
    lines += ["", f"log folder, epoch {folder['half']['epoch']} -> {folder['last']['epoch']}"]
    for kind, grown in folder["growth"].items():
        at_end = folder["last"]["kinds"][kind]
        lines.append(f"  {kind:<12} {at_end['files']:>4} files {at_end['bytes']:>13,d} B"
                     f"   {grown['files']:+d} files {grown['bytes']:+,d} B")  # fmt: skip
    lines.append("")
    for goal in result["goals"]:
        value = goal["value"]
        shown = f"{value:+.2f}" if isinstance(value, float) else str(value)
        verdict = {True: "PASS", False: "MISS", None: "-"}[goal["passed"]]
        lines.append(f"{goal['label']:<24}{shown:>40}  {goal['goal']:>16}  {verdict}")
    return "\n".join(lines)
