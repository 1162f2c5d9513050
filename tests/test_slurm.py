"""train.py under a real single-node Slurm cluster (tests/slurm_cluster.py), and the
workers' ports: which base they use, what a taken one does, who can reach them.

The node claims 4 CPUs, so two 2-task jobs run side by side. Every client command is
bounded in time and its job cancelled past the bound. Skipped where the Slurm programs are
missing: Debian's ``apt-get install slurmctld slurmd slurm-client`` (.ci/run does it).
"""

import ast
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from slurm_cluster import SlurmCluster, missing_programs
from train_helpers import (
    frozen_heads,
    job_inputs,
    train_args,
)

from yolo3.checkpoint.weights import read_metadata
from yolo3.distributed import strategy as distribute
from yolo3.distributed.ports import free_port, free_ports

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("slurm_worker.py")
SBATCH_SCRIPT = ROOT / "examples" / "slurm" / "train.sbatch"
TIMEOUT = 420


def needs_slurm(test):
    """Slow, and skipped without the Slurm programs or root (the daemons run as root)."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.skipif(
            bool(missing_programs()),
            reason=f"Slurm programs missing ({', '.join(missing_programs())}): apt-get install "
            "slurmctld slurmd slurm-client",
        ),
        pytest.mark.skipif(os.geteuid() != 0, reason="the test cluster's daemons run as root"),
    ):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    started = SlurmCluster(folder, cpus=4).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return job_inputs(tmp_path_factory.mktemp("slurm-data"), train=16)


def _args(data, log_dir, *extra):
    records, anchors, initial = data
    return train_args(
        records, log_dir, anchors, "--weights", initial, "--optimizer", "sgd", "--lr", "0.01",
        "--flip", "0", *extra,
    )  # fmt: skip


def _srun(job_name):
    """srun for one 2-task step on one node; a failed task ends the step (-K)."""
    return ["srun", "-N1", "-n2", "-K", "--cpus-per-task=1", f"--job-name={job_name}"]


def _worker(dump, args):
    return [sys.executable, str(WORKER), str(dump), "--", *args]


def _environment():
    """The test's environment without TF_CONFIG: the cluster comes from Slurm alone."""
    return {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}


def _trained(completed):
    assert completed.returncode == 0, completed.stdout[-4000:]
    return completed.stdout


def _weights(path):
    data = np.load(path)
    return [data[f"w{i}"] for i in range(len([k for k in data.files if k.startswith("w")]))]


def _cluster_specs(log):
    """(cluster, task_id) of each MultiWorkerMirroredStrategy TensorFlow logged."""
    found = re.findall(
        r"MultiWorkerMirroredStrategy with cluster_spec = (\{.*?\}), task_type = 'worker', "
        r"task_id = (\d+), num_workers = 2",
        log,
    )
    return sorted((ast.literal_eval(spec)["worker"], int(task)) for spec, task in found)


@needs_slurm
def test_the_sbatch_script_trains(cluster, data, tmp_path):
    records, anchors, initial = data
    output = tmp_path / "job.out"
    env = _environment()
    env.pop("YOLO3_SLURM_PORT_BASE", None)  # the script's own, from the job id
    env.update(RECORDS=str(records), LOG_DIR=str(tmp_path / "job"), PYTHON=sys.executable)
    command = [
        "sbatch", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--job-name=script",
        f"--output={output}", str(SBATCH_SCRIPT),
        "--anchors", anchors, "--weights", initial, "--batch-size", "4", "--quiet",
        "--epochs", "1", "--steps-per-epoch", "1",
    ]  # fmt: skip
    job_id, state, status = cluster.batch(
        command, job_name="script", timeout=TIMEOUT, env=env, cwd=ROOT
    )
    log = output.read_text() if output.exists() else ""
    assert (state, status) == ("COMPLETED", 0), log[-4000:]
    assert f"2 tasks on localhost, ports from {10000 + job_id % 2000 * 10}" in log
    assert "worker 1/2" in log and "worker 2/2" in log
    job = tmp_path / "job"
    assert read_metadata(str(job / "checkpoints/last.weights.h5"))["epoch"] == 1
    assert json.loads((job / "config.json").read_text())["resolved"]["num_workers"] == 2


def _backup_steps(folder):
    return sorted(int(p.name.split("-")[1].split(".")[0]) for p in folder.glob("backup-*.h5"))


def _run_until(cluster, command, job_name, ready, act):
    """Starts ``command``; once ``ready()`` holds, calls ``act()`` and waits for the step
    to end. Returns (its exit status, its output, seconds from ``act`` to its end)."""
    step = cluster.popen(command, env=_environment())
    output = []
    reader = threading.Thread(target=lambda: output.extend(step.stdout))
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready():
            assert step.poll() is None, "".join(output)[-4000:]
            assert time.monotonic() < deadline, f"{job_name}: not ready in {TIMEOUT} s"
            time.sleep(0.5)
        acted_at = time.monotonic()
        act()
        step.wait(timeout=180)
    finally:
        if step.poll() is None:
            cluster.cancel(job_name)
            step.kill()
        reader.join()
    return step.returncode, "".join(output), time.monotonic() - acted_at


@needs_slurm
def test_scancel_stops_every_task_after_the_same_step_and_the_same_command_resumes(
    cluster, data, tmp_path
):
    # 16 records, 2 workers x 4: 2 steps an epoch, 6 in all, a backup after each step.
    # (A task killed mid-save ending the others: tests/test_eight_workers.py, on a step of
    # eight tasks; the rerun from the newest step all workers hold: tests/test_resume.py.)
    args = _args(data, tmp_path / "job", "--epochs", "3", "--backup-every", "1", *frozen_heads(3))
    command = _srun("resumed") + _worker(tmp_path / "dump", args)
    backups = tmp_path / "job/backup/worker-1"

    # scancel, as a time limit or preemption does: SIGTERM to every task at once. Both
    # workers stop after the same step, with backups there.
    status, log, _ = _run_until(
        cluster, command, "resumed", lambda: _backup_steps(backups),
        lambda: subprocess.run(
            ["scancel", "--signal=TERM", "--name=resumed"], env=cluster.env, timeout=30,
            check=True,
        ),
    )  # fmt: skip
    stops = re.findall(r"signal SIGTERM here\): stopping after optimizer step (\d+)", log)
    assert status != 0 and len(stops) == 2 and stops[0] == stops[1], log[-4000:]
    stopped = int(stops[0])

    # The same command resumes there on both tasks and trains the planned 6 steps in all.
    # (-K ends a task once another exits with 143: the workers wait for each other's stop
    # backups before exiting, or a task still writing its own would lose it, and the job
    # resume a step earlier.)
    log = _trained(cluster.run(command, job_name="resumed", timeout=TIMEOUT, env=_environment()))
    restored = [int(v) for v in re.findall(r"restored backup \S+: epoch \d+, step (\d+)", log)]
    assert restored == [stopped, stopped], (restored, stopped, log[-3000:])
    for task in (0, 1):
        assert int(np.load(tmp_path / f"dump/task-{task}/worker-0.npz")["step"]) == 6
    assert read_metadata(str(tmp_path / "job/checkpoints/last.weights.h5"))["epoch"] == 3


@needs_slurm
def test_two_jobs_share_the_node_with_different_port_bases(cluster, data, tmp_path):
    first = free_ports(4, consecutive=True)[0]
    second = first + 2
    steps = ["--epochs", "1", "--steps-per-epoch", "2", *frozen_heads(1)]
    runs = {
        # One base from the flag, the other from the environment.
        "side-a": (["--slurm-port-base", str(first)], {}),
        "side-b": ([], {"YOLO3_SLURM_PORT_BASE": str(second)}),
    }
    steps_started = {}
    for name, (flag, extra_env) in runs.items():
        args = _args(data, tmp_path / name, *steps, *flag)
        steps_started[name] = cluster.popen(
            _srun(name) + _worker(tmp_path / f"dump-{name}", args),
            env={**_environment(), **extra_env},
        )
    outputs = {}
    try:
        # Both jobs hold the node's 4 CPUs at once.
        deadline = time.monotonic() + 60
        while "side-a RUNNING" not in (queue := cluster.queue()) or "side-b RUNNING" not in queue:
            assert time.monotonic() < deadline, f"the two jobs did not run together:\n{queue}"
            time.sleep(0.5)
        for name, step in steps_started.items():
            outputs[name], _ = step.communicate(timeout=TIMEOUT)
    finally:
        for name, step in steps_started.items():
            if step.poll() is None:
                cluster.cancel(name)
                step.kill()
    for name, step in steps_started.items():
        assert step.returncode == 0, outputs.get(name, "")[-4000:]
    for name, base in (("side-a", first), ("side-b", second)):
        addresses = [f"localhost:{base}", f"localhost:{base + 1}"]
        assert _cluster_specs(outputs[name]) == [(addresses, 0), (addresses, 1)]
        assert read_metadata(str(tmp_path / name / "checkpoints/last.weights.h5"))["epoch"] == 1


@needs_slurm
def test_a_taken_port_ends_the_job_naming_the_port_base(cluster, data, tmp_path):
    # The port base's first port is held, as a job sharing the node with the same base
    # holds it: task 0 cannot listen, says what to change, and -K ends task 1 too.
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        base = holder.getsockname()[1]
        args = _args(data, tmp_path / "job", "--epochs", "1", "--slurm-port-base", str(base))
        command = _srun("taken") + [sys.executable, str(ROOT / "train.py"), *args]
        started = time.monotonic()
        failed = cluster.run(command, job_name="taken", timeout=TIMEOUT, env=_environment())
    assert failed.returncode != 0
    assert time.monotonic() - started < 120
    assert f"Slurm task 0 could not listen on port {base} (localhost:{base})" in failed.stdout
    assert "--slurm-port-base or YOLO3_SLURM_PORT_BASE" in failed.stdout
    assert "Traceback" not in failed.stdout
    assert not (tmp_path / "job" / "checkpoints").exists()


@needs_slurm
def test_a_step_waits_while_the_node_is_full_and_immediate_bounds_it(cluster, tmp_path):
    holder = cluster.popen(["srun", "-n4", "--job-name=holder", "sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while "holder RUNNING" not in cluster.queue():
            assert time.monotonic() < deadline, cluster.queue()
            time.sleep(0.3)
        started = time.monotonic()
        refused = cluster.run(
            ["srun", "-n2", "--immediate=3", "--job-name=waiter", "true"],
            job_name="waiter",
            timeout=60,
        )
        assert refused.returncode != 0
        assert time.monotonic() - started < 30
        assert "Unable to allocate resources" in refused.stdout, refused.stdout
    finally:
        cluster.cancel("holder")
        holder.communicate(timeout=60)


def test_port_base_comes_from_the_environment_and_is_checked():
    assert distribute.default_slurm_port_base({}) == 8888
    assert distribute.default_slurm_port_base({"YOLO3_SLURM_PORT_BASE": " 12000 "}) == 12000
    for bad in ("80", "70000", "port", "-1"):
        with pytest.raises(ValueError, match=rf"YOLO3_SLURM_PORT_BASE='{bad}' is not a TCP port"):
            distribute.default_slurm_port_base({"YOLO3_SLURM_PORT_BASE": bad})


def test_the_sbatch_script_refuses_to_start_without_its_folders(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("RECORDS", "LOG_DIR")}
    done = subprocess.run(
        ["bash", str(SBATCH_SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "set RECORDS (the record set's folder) and LOG_DIR" in done.stderr


SERVER = """
import sys
import tensorflow as tf
server = tf.distribute.Server(
    {"worker": [sys.argv[1]]}, job_name="worker", task_index=0, protocol="grpc", start=True
)
print("listening", flush=True)
sys.stdin.read()
"""


def _listening_addresses(port):
    """Local addresses of the TCP sockets listening on ``port`` (/proc/net/tcp, tcp6)."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            # Each 32-bit word of the address is in the machine's byte order.
            raw = bytes.fromhex(address)
            words = [int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(0, len(raw), 4)]
            found.add(socket.inet_ntop(family, b"".join(w.to_bytes(4, "big") for w in words)))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net")
def test_a_worker_listens_on_every_interface_whatever_its_address():
    """What the docs' note on worker ports rests on: a worker named 127.0.0.1 in its
    cluster (as tools/launch.py -n names them) still listens on every interface.

    Should this fail, TensorFlow binds the address it is given: local workers then stay on
    127.0.0.1 and the note (docs/guides/distributed.md, tools/launch.py, make_strategy) can
    say so.
    """
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, f"127.0.0.1:{port}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "listening"
        addresses = _listening_addresses(port)
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    assert addresses and addresses <= {"0.0.0.0", "::"}, addresses


TAKEN = """
from yolo3.distributed import strategy as distribute
try:
    distribute.make_strategy(gpus=0)
except distribute.WorkerPortError as error:
    print(error)
"""


def test_a_tf_config_worker_whose_port_is_taken_says_so():
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {
            **_environment(),
            "TF_CONFIG": distribute.tf_config([("127.0.0.1", port), ("127.0.0.1", 1)], 0),
        }
        done = subprocess.run(
            [sys.executable, "-c", TAKEN], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert done.stdout.strip() == (
        f"worker worker:0 could not listen on port {port} (127.0.0.1:{port} in TF_CONFIG): the "
        "port is taken on this machine; give this worker a free port in TF_CONFIG "
        "(yolo3 launch -n picks free ones)"
    ), done.stdout + done.stderr[-2000:]
