"""A single-node Slurm cluster in a temporary folder, for tests of the Slurm path.

Both daemons run in the foreground as children of the test process, on free ports, with
their state, spool, logs and pid files in the folder, as root and without munge, systemd or
cgroups: ``auth/none`` and ``cred/none`` (Slurm 22.05; 23.11 dropped ``auth/none``, so
there a cluster needs munge). Every client command runs with ``SLURM_CONF`` pointing at
this cluster's configuration, through :meth:`SlurmCluster.run`, which bounds it in time and
cancels its job when the bound passes: a request that can never fit queues forever.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from yolo3.distributed.ports import free_ports

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scancel", "sinfo", "scontrol", "squeue")
NODE = "localhost"


def missing_programs():
    """The Slurm programs not on PATH (Debian: ``apt-get install slurmctld slurmd
    slurm-client``)."""
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]


def configuration(folder, *, cpus, controller_port, node_port):
    """The text of ``slurm.conf`` for one node of ``cpus`` CPUs, paths under ``folder``."""
    folder = Path(folder)
    lines = [
        "ClusterName=yolo3test",
        f"SlurmctldHost={NODE}(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={node_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/none",
        "CredType=cred/none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "ReturnToService=2",
        # The node may claim more CPUs than the machine has: two 2-task jobs side by side.
        "SlurmdParameters=config_overrides",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=600",  # finished jobs stay in scontrol for batch()
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """One controller and one node, started by :meth:`start` and stopped by :meth:`stop`."""

    def __init__(self, folder, *, cpus=4):
        self.folder = Path(folder)
        self.cpus = cpus
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons = []

    def start(self, timeout=60):
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        controller_port, node_port = free_ports(2, "127.0.0.1")
        self.conf.write_text(
            configuration(
                self.folder, cpus=self.cpus, controller_port=controller_port, node_port=node_port
            )
        )
        commands = [
            ["slurmctld", "-D", "-c", "-f", str(self.conf)],
            ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)],
        ]
        for command in commands:
            output = open(self.folder / f"{command[0]}.out", "w")
            self._daemons.append(
                subprocess.Popen(
                    command, env=self.env, stdout=output, stderr=subprocess.STDOUT, text=True
                )
            )
            output.close()
        try:
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self, timeout):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for daemon in self._daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(
                        f"{daemon.args[0]} exited with status {daemon.returncode}:\n" + self.logs()
                    )
            done = subprocess.run(
                ["sinfo", "-h", "-n", NODE, "-o", "%t"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            state = done.stdout.strip()
            if done.returncode == 0 and state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the Slurm node was not idle within {timeout} s (state {state!r}):\n" + self.logs()
        )

    def logs(self, tail=3000):
        """The end of each daemon's log, for failure messages."""
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = self.folder / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def popen(self, command, **kwargs):
        """Starts a client command against this cluster; output in ``stdout``, as text."""
        return subprocess.Popen(
            command,
            env={**self.env, **kwargs.pop("env", {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **kwargs,
        )

    def run(self, command, *, job_name, timeout, **kwargs):
        """Runs a client command (srun, sbatch --wait) for job ``job_name``, at most
        ``timeout`` s; past that its job is cancelled and the test fails.

        Returns the ``CompletedProcess``, its ``stdout`` holding stdout and stderr.
        """
        process = self.popen(command, **kwargs)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel(job_name)
            process.kill()
            output, _ = process.communicate()
            raise AssertionError(
                f"{command[0]} for job {job_name} took over {timeout} s and was cancelled:\n"
                f"{output[-3000:]}\n{self.queue()}"
            ) from None
        return subprocess.CompletedProcess(command, process.returncode, output)

    def batch(self, command, *, job_name, timeout, **kwargs):
        """Submits ``command`` (``sbatch`` and its arguments, without ``--wait``, which
        polls slowly) and waits at most ``timeout`` s for the job to end; past that it is
        cancelled and the test fails.

        Returns ``(job id, state, exit status)``, e.g. ``(2, "COMPLETED", 0)``.
        """
        submitted = self.run(
            [command[0], "--parsable", *command[1:]], job_name=job_name, timeout=60, **kwargs
        )
        assert submitted.returncode == 0, submitted.stdout
        job_id = int(submitted.stdout.strip().splitlines()[-1].split(";")[0])
        deadline = time.monotonic() + timeout
        while True:
            shown = subprocess.run(
                ["scontrol", "show", "job", "-o", str(job_id)],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            fields = dict(item.partition("=")[::2] for item in shown.split())
            state = fields.get("JobState", "")
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return job_id, state, int(fields["ExitCode"].split(":")[0])
            if time.monotonic() > deadline:
                self.cancel(job_name)
                raise AssertionError(
                    f"batch job {job_id} ({job_name}) took over {timeout} s and was "
                    f"cancelled:\n{self.queue()}"
                )
            time.sleep(0.5)

    def cancel(self, job_name):
        subprocess.run(
            ["scancel", "--name", job_name], env=self.env, capture_output=True, timeout=30
        )

    def queue(self):
        done = subprocess.run(
            ["squeue", "-o", "%i %j %T %R"], env=self.env, capture_output=True, text=True
        )
        return done.stdout

    def stop(self):
        subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True)
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self._daemons = []


def task_pids(job_name, task):
    """Process ids of the Python programs Slurm started as task ``task`` of job
    ``job_name`` (found by their environment)."""
    wanted = (f"SLURM_JOB_NAME={job_name}".encode(), f"SLURM_PROCID={task}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(item in environ for item in wanted) and b"python" in os.path.basename(command[0]):
            found.append(int(entry.name))
    return found
