"""A two-worker job killed or preempted mid-training resumes where every worker can, alike.

Each worker keeps its two newest backups; a rerun agrees on the newest step all of them
hold, broadcasts the chief's state and continues from that very step, mid-epoch included.
(SIGTERM to one worker of eight stops all after the same step, with backups there, exit
status 143, and the rerun restores that step on all eight: tests/test_eight_workers.py.)

The data is arranged so that a step's batches cannot depend on the position in the input
stream (which starts afresh after a resume): each worker reads one shard of 4 records, in
file order (``--shuffle-buffer 1``), with no flips, as its batch of 4 every step. A resumed
run must then end bit for bit where an uninterrupted one does.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_train_distributed import (
    ROOT,
    TIMEOUT,
    _launch,
    _run,
    _sgd_args,
    _weights,
    _worker_pid,
)
from train_helpers import frozen_heads, job_inputs

from yolo3.callbacks import PREEMPTED_STATUS
from yolo3.checkpoint.weights import read_metadata

pytestmark = pytest.mark.slow
STEPS_PER_EPOCH, EPOCHS = 4, 3
FIXED_BATCHES = [
    "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH), "--flip", "0",
    "--shuffle-buffer", "1", "--backup-every", "2", *frozen_heads(EPOCHS),
]  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Eight records in two shards of four, anchors and seeded initial weights."""
    return job_inputs(tmp_path_factory.mktemp("resume"))


def _poll(predicate, what):
    """Like _wait_for, but looks often: a small job takes a step in a tenth of a second."""
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT} s waiting for {what}")
        time.sleep(0.02)


def _read(path):
    return Path(path).read_text(errors="replace") if Path(path).exists() else ""


def _command(setup, tmp_path, name):
    records, anchors, initial = setup
    return _launch(
        tmp_path / f"dump-{name}", tmp_path / "job", records, anchors, initial, *FIXED_BATCHES,
        grace=30,
    )  # fmt: skip


def _backups(tmp_path, worker):
    folder = tmp_path / "job" / "backup" / f"worker-{worker}"
    return sorted(folder.glob("backup-*.weights.h5"))


def _step(path):
    return int(re.search(r"backup-(\d+)", Path(path).name).group(1))


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    _run(_command(setup, tmp_path, "reference"))
    chief, dump = _weights(tmp_path / "dump-reference/worker-0.npz")
    assert int(dump["step"]) == STEPS_PER_EPOCH * EPOCHS
    return chief


def _finish_and_check(command, tmp_path, name, uninterrupted):
    log = _run(command)
    chief, chief_dump = _weights(tmp_path / f"dump-{name}/worker-0.npz")
    other, other_dump = _weights(tmp_path / f"dump-{name}/worker-1.npz")
    for dump in (chief_dump, other_dump):
        assert int(dump["step"]) == STEPS_PER_EPOCH * EPOCHS  # no step twice, none missed
    # The workers end bit for bit alike, and where the uninterrupted job ended.
    for mine, theirs, reference in zip(chief, other, uninterrupted):
        np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(mine, reference)
    assert not (tmp_path / "job" / "backup").exists() or not any(
        (tmp_path / "job" / "backup").iterdir()
    )
    return log


def test_killed_during_a_save_the_workers_resume_from_the_step_both_hold(
    setup,
    uninterrupted,
    tmp_path,
):
    command = _command(setup, tmp_path, "killed")
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Mid-epoch 2: backups at steps 4 and 6 on both workers.
        _poll(lambda: any(_step(p) >= 6 for p in _backups(tmp_path, 1)), "step 6's backup")
        pids = [_worker_pid(launcher.pid, index) for index in (0, 1)]
        for pid in pids:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    # Killed during a save, one worker is a backup ahead of the other: either so already,
    # or made so by removing worker 1's newest (a save that never completed).
    if _backups(tmp_path, 0)[-1].name == _backups(tmp_path, 1)[-1].name:
        _backups(tmp_path, 1)[-1].unlink()
    steps = [[_step(p) for p in _backups(tmp_path, worker)] for worker in (0, 1)]
    agreed = max(set(steps[0]) & set(steps[1]))
    assert max(steps[0] + steps[1]) > agreed  # the workers disagree on their newest step

    log = _finish_and_check(command, tmp_path, "killed", uninterrupted)
    restored = re.findall(r"\[worker (\d)\] restored backup \S+backup-(\d+)\.weights\.h5", log)
    assert sorted(restored) == [("0", f"{agreed:09d}"), ("1", f"{agreed:09d}")], log[-3000:]


def test_preemption_of_a_single_process(setup, tmp_path):
    records, anchors, initial = setup
    args = _sgd_args(records, tmp_path / "run", anchors, initial, "--batch-size", "8")
    command = [sys.executable, str(ROOT / "train.py"), *args, *FIXED_BATCHES]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    backups = tmp_path / "run/backup/worker-0"
    try:
        _poll(lambda: list(backups.glob("backup-*.weights.h5")), "a backup")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == PREEMPTED_STATUS, output[-3000:]
    assert "the same command resumes there" in output
    log = _run(command)
    assert "restored backup" in log
    state = tmp_path / "run/checkpoints/state.weights.h5"
    assert read_metadata(str(state))["epoch"] == EPOCHS
    assert not backups.exists()


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_lost_worker_ends_the_survivor_within_the_collective_timeout(setup, tmp_path, fault):
    """No launcher watching (Slurm, Kubernetes): the survivor must not wait forever.

    A killed worker's connections are reset; a frozen one (SIGSTOP: a hung machine, a
    partitioned network) keeps them open and answers nothing, which only the collective
    timeout bounds.
    """
    records, anchors, initial = setup
    args = _sgd_args(records, tmp_path / "job", anchors, initial, "--batch-size", "4")
    command = [
        sys.executable, str(ROOT / "tools" / "launch.py"), "-n", "2", "--grace", "600", "--",
        sys.executable, str(ROOT / "train.py"), *args, *FIXED_BATCHES, "--epochs", "50",
        "--collective-timeout", "10",
    ]  # fmt: skip
    launcher_log = tmp_path / "launcher.log"
    with open(launcher_log, "w") as sink:
        launcher = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        _poll(lambda: _backups(tmp_path, 1), "the first backup")
        victim = _worker_pid(launcher.pid, 1)
        os.kill(victim, getattr(signal, fault))
        lost = time.monotonic()
        _poll(lambda: "[worker 0] error:" in _read(launcher_log), "worker 0's error")
        waited = time.monotonic() - lost
        if fault == "SIGSTOP":
            os.kill(victim, signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    output = _read(launcher_log)
    print(f"\n{fault}: worker 0 ended {waited:.0f} s later")
    assert "[worker 0] error: worker 0: a collective with the other workers failed" in output, (
        output[-3000:]
    )
    assert waited < 120, waited  # the launcher's grace (600 s) did not end it
