"""Runs ``yolo3 train`` jobs one after another in this process, on two logical CPUs: the
driver of tests/test_combinations.py (one process for all of them: TensorFlow starts once).

Usage: python combinations_run.py JOBS.json

JOBS.json: ``{"base": [flags every run gets], "jobs": [{"name", "flags", "replicas",
"train", "resume"}]}``. A job with ``resume`` runs one epoch, then ``--resume`` to a
second; one with ``train`` alone runs both epochs at once; one with neither runs once,
expecting a refusal. Prints one JSON line per job: its name, each run's
exit status and error lines, and the losses the checkpoint of its last epoch recorded.
"""

import contextlib
import io
import json
import math
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from yolo3.checkpoint.weights import read_metadata  # noqa: E402
from yolo3.distributed import strategy as distribute  # noqa: E402

REPLICAS = 2


def _train(argv):
    from yolo3.commands import train

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        status = train.main(argv)
    return status, [line for line in errors.getvalue().splitlines() if line.startswith("error")]


def run_job(base, job):
    log_dir = Path(job["log_dir"])
    flags = list(job["flags"])
    if job["replicas"] > 1:
        flags += ["--cpu-replicas", str(job["replicas"])]
    argv = [*base, "--log-dir", str(log_dir), *flags]
    started = time.perf_counter()
    if job["train"] and not job["resume"]:
        runs = [_train([*argv, "--epochs", "2"])]
    else:
        runs = [_train([*argv, "--epochs", "1"])]
    if job["resume"] and runs[0][0] == 0:
        runs.append(_train([*argv, "--epochs", "2", "--resume"]))
    losses = []
    last = log_dir / "checkpoints" / "last.weights.h5"
    if last.exists():
        logs = read_metadata(str(last)).get("logs", {})
        losses = [value for key, value in logs.items() if "loss" in key]
        epoch = read_metadata(str(last)).get("epoch")
    else:
        epoch = None
    return {
        "name": job["name"],
        "statuses": [status for status, _ in runs],
        "errors": [lines for _, lines in runs],
        "epoch": epoch,
        "finite": bool(losses) and all(math.isfinite(value) for value in losses),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(path):
    spec = json.loads(Path(path).read_text())
    distribute.configure_devices(gpus=0, cpu_replicas=REPLICAS)
    for job in spec["jobs"]:
        print(json.dumps(run_job(spec["base"], job)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
