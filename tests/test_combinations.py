"""Every pair of training options trains and resumes, or is refused before the first step
in one line naming both sides (:mod:`yolo3.engine.combinations`, the one table of refusals).

A pair at a time would be 78 trainings; rows of options that hold every pair not refused
(a pairwise covering array) are four, three run in one process (tests/combinations_run.py)
on 64 px records with one step an epoch: two rows on two replicas and one on one device with
XLA (which several replicas refuse); the fourth, XLA with local steps, is
tests/test_xla.py's run. The first row trains an epoch and is resumed with
``--resume`` to a second, which holds every option of the shared set and of its own row
resuming together; the others train two epochs in one run (local steps resume on their
own in tests/test_local_steps.py, PowerSGD in tests/test_compression.py, each bit for bit
against an uninterrupted run). A new trace of each run's step, and the XLA rows' compiles,
are what this test spends most on.
Each refusal of the table is met once, with flags that meet it, and its line must name what
the table says. The training guide prints the table (checked here too).
"""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import small_record_set, train_args, write_anchors

from yolo3.engine.combinations import OPTIONS, REFUSED, markdown_table

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SHARED = ("accumulation", "bfloat16 all-reduce", "dense warm-up", "multi-scale")
# Options that change nothing the communication sees: two rows hold all their pairs.
TRAINING = ("weight average", "several anchors per box")
ROWS = {  # name: (replicas, options)
    "PowerSGD": (
        2, (*SHARED, "PowerSGD", "remat", "mixed precision", "freezing", "sync BN off"),
    ),
    "local steps": (
        2, (*SHARED, *TRAINING, "local steps, overlapped", "remat", "mixed precision",
            "freezing", "sync BN off"),
    ),
    "XLA, PowerSGD": (
        1, (*SHARED, *TRAINING, "XLA", "PowerSGD", "remat", "mixed precision", "freezing",
            "sync BN off"),
    ),
}  # fmt: skip
# XLA with local steps is trained by tests/test_xla.py's train.py run, with these options'
# flags (and float16, as --mixed-precision auto gives on a 7.x GPU), which pays for an XLA
# compile anyway: a row of its own here would pay another.
ELSEWHERE = {"tests/test_xla.py": ("XLA", "local steps, overlapped")}
RESUMED = "PowerSGD"  # the row trained an epoch, then resumed to a second
# The one pair no row can hold: the table's first refusal.
APART = {frozenset({"PowerSGD", "local steps, overlapped"})}


def test_the_rows_hold_every_pair_that_is_not_refused():
    rows = [options for _, options in ROWS.values()] + list(ELSEWHERE.values())
    covered = {frozenset(pair) for options in rows for pair in itertools.combinations(options, 2)}
    every = {frozenset(pair) for pair in itertools.combinations(OPTIONS, 2)}
    assert every - APART <= covered, sorted(map(sorted, every - APART - covered))
    assert not covered & APART


def test_the_training_guide_prints_the_table():
    guide = (ROOT / "docs" / "guides" / "training.md").read_text(encoding="utf-8")
    assert markdown_table() in guide


def test_every_row_trains_one_resumes_and_every_refusal_is_one_line(tmp_path):
    records = small_record_set(tmp_path / "records", train=16, val=0, num_shards=2)
    anchors = write_anchors(tmp_path / "anchors.txt")
    base = train_args(records, tmp_path / "unused", anchors, "--steps-per-epoch", "1")
    base += ["--batch-size", "2"]
    jobs = [
        {
            "name": name,
            "flags": [flag for option in options for flag in OPTIONS[option]],
            "replicas": replicas,
            "train": True,
            "resume": name == RESUMED,
            "log_dir": str(tmp_path / f"row-{index}"),
        }
        for index, (name, (replicas, options)) in enumerate(ROWS.items())
    ]
    jobs += [
        {
            "name": f"{refusal.first} with {refusal.second}",
            "flags": list(refusal.example),
            "replicas": refusal.replicas,
            "train": False,
            "resume": False,
            "log_dir": str(tmp_path / f"refused-{index}"),
        }
        for index, refusal in enumerate(REFUSED)
    ]
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps({"base": base, "jobs": jobs}))
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "combinations_run.py"), str(spec)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [result["name"] for result in results] == [job["name"] for job in jobs]

    for result, job in zip(results, jobs[: len(ROWS)]):
        assert result["statuses"] == ([0, 0] if job["resume"] else [0]), result
        assert result["epoch"] == 2 and result["finite"], result
    for result, refusal in zip(results[len(ROWS) :], REFUSED):
        assert result["statuses"] == [2], result
        [[line]] = result["errors"]
        for named in refusal.named:
            assert named in line, (named, line)
