"""A training job killed with SIGKILL at seeded random moments, ten times, ends where an
uninterrupted run does.

The kills fall while the job starts, between steps, and while it writes a backup or an
epoch's checkpoints (the moment the write's temporary file appears). After each kill every
weights file left on disk loads, the newest backup is at most ``--backup-every`` steps behind
the last step the job reported, and the same command continues from it. The data is arranged
so that a step's batch cannot depend on where the input stream starts (one shard of eight
records read in file order as the batch of every step, no flips): the resumed job must then
end bit for bit where the uninterrupted one did, with no temporary file left behind.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from train_helpers import frozen_heads, small_record_set, train_args, write_anchors

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

STEPS_PER_EPOCH, EPOCHS, BACKUP_EVERY = 4, 6, 2
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
# Where each kill falls, in a seeded order: 2 while starting, 4 at a random moment after a
# new backup, 2 during a backup's write, 2 during a checkpoint's write.
KILLS = ["start"] * 2 + ["steps"] * 4 + ["backup write"] * 2 + ["checkpoint write"] * 2
TIMEOUT = 300


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kills")
    records = small_record_set(folder / "records", train=8, val=0, num_shards=1, noise=20)
    return records, write_anchors(folder / "anchors.txt")


def _command(job, log_dir):
    records, anchors = job
    args = train_args(
        records, log_dir, anchors, "--batch-size", "8", "--optimizer", "sgd", "--lr", "0.01",
        "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH), "--flip", "0",
        "--shuffle-buffer", "1", "--backup-every", str(BACKUP_EVERY),
        "--progress", "lines", "--log-every", "1", *frozen_heads(EPOCHS),
    )  # fmt: skip
    return [sys.executable, str(ROOT / "train.py"), *args]


def _start(command, output):
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}  # every step's line before a kill
    return subprocess.Popen(
        command, stdout=output, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
    )


def _backups(log_dir):
    """``{step: path}`` of the complete backups (not the hidden temporaries)."""
    folder = log_dir / "backup" / "worker-0"
    found = folder.glob("backup-*.weights.h5") if folder.exists() else []
    return {int(re.search(r"\d+", path.name)[0]): path for path in found}


def _temporaries(folder):
    return list(folder.glob(".tmp-*")) if folder.exists() else []


def _steps_reported(text):
    """The last step the job's progress lines reported (global, over epochs)."""
    steps = [
        (int(epoch) - 1) * STEPS_PER_EPOCH + int(step)
        for epoch, step in re.findall(r"epoch (\d+)/\d+ step (\d+)/\d+", text)
    ]
    return max(steps, default=0)


def _arrays(path):
    """Every array of a weights file by name (a torn file does not open or read)."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    assert arrays, path
    return arrays


def _wait_until(process, predicate):
    """Polls ``predicate`` until it holds or the process ends; whether it held."""
    deadline = time.monotonic() + TIMEOUT
    while process.poll() is None and time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return False


def _kill_at(process, where, log_dir, rng):
    """Kills the job at a moment of kind ``where``; whether it was still running then."""
    if where == "start":
        deadline = time.monotonic() + rng.uniform(0.5, 6.0)
        _wait_until(process, lambda: time.monotonic() > deadline)
    elif where == "steps":
        before = max(_backups(log_dir), default=-1)
        if _wait_until(process, lambda: max(_backups(log_dir), default=-1) > before):
            time.sleep(rng.uniform(0.0, 0.3))
    else:
        folder = log_dir / ("backup/worker-0" if where == "backup write" else "checkpoints")
        old = set(_temporaries(folder))  # left by an earlier kill, removed when it resumes
        _wait_until(process, lambda: set(_temporaries(folder)) - old)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    return True


def test_ten_random_kills_and_the_job_still_ends_where_an_uninterrupted_one_does(job, tmp_path):
    reference_dir = tmp_path / "reference"
    completed = subprocess.run(
        _command(job, reference_dir), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    reference = _arrays(reference_dir / "checkpoints" / "last.weights.h5")

    log_dir = tmp_path / "killed"
    command = _command(job, log_dir)
    rng = np.random.default_rng(11)
    plan = list(rng.permutation(KILLS))
    killed, lives, restore = [], 0, None
    while True:
        lives += 1
        log_path = tmp_path / f"life-{lives}.log"
        with open(log_path, "w") as output:
            process = _start(command, output)
            try:
                if plan and _kill_at(process, plan[0], log_dir, rng):
                    killed.append(plan.pop(0))
                else:
                    assert process.wait(timeout=TIMEOUT) == 0, log_path.read_text()[-3000:]
                    break
            finally:
                if process.poll() is None:
                    process.kill()
        text = log_path.read_text()
        # Every weights file left loads, and at most one backup interval is lost.
        for path in log_dir.rglob("*.weights.h5"):
            if not path.name.startswith(".tmp-"):
                _arrays(path)
        if restore is not None and "restored backup" in text:
            assert f"backup-{restore:09d}.weights.h5" in text, text[-2000:]  # the newest
        newest = max(_backups(log_dir), default=0)
        assert _steps_reported(text) - newest <= BACKUP_EVERY, (killed[-1], text[-2000:])
        restore = newest or None
        assert lives < len(KILLS) + 5, "the job makes no progress between kills"

    assert len(killed) == len(KILLS), (killed, plan)
    text = log_path.read_text()
    assert f"trained to epoch {EPOCHS}" in text
    final = _arrays(log_dir / "checkpoints" / "last.weights.h5")
    assert final.keys() == reference.keys()
    for name, array in reference.items():
        np.testing.assert_array_equal(final[name], array, err_msg=name)
    assert not (log_dir / "backup").exists() or not any((log_dir / "backup").iterdir())
    assert [str(p) for p in log_dir.rglob(".tmp-*")] == []
