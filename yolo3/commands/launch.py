"""Start one training job as several worker processes, each with its own ``TF_CONFIG``.

    yolo3 launch -n 2 -- yolo3 train --records rec --log-dir logs/job
    yolo3 launch -H hosts.txt -- yolo3 train --records /shared/rec ...

``-n N`` starts N workers on this machine (127.0.0.1, free ports). ``-H FILE`` starts one
worker per line of FILE (``host`` or ``host:port``) over ``ssh``, in the same directory as
here, so the code and data paths must exist on every host (a shared filesystem). Worker 0
is the chief: it writes checkpoints and logs.

Each worker's output is printed with a ``[worker i]`` prefix. When one worker fails, the
others are stopped after ``--grace`` seconds, so a dead machine ends the job with an error
instead of a hang; start the same command again to resume from the workers' backups.
SIGTERM to the launcher is passed on to its workers, which then stop after the same step
with a backup there (``yolo3 train`` exits with 143); the same command resumes.

Who can reach a worker's port can run operations in it: TensorFlow's server has no
authentication, and it listens on every interface of its machine whatever address TF_CONFIG
names (127.0.0.1 with ``-n`` included; TensorFlow has no option for another). Run workers on
a private network or behind firewall rules; to train on one machine alone, ``yolo3 train
--gpus N`` or ``--cpu-replicas N`` uses one process and opens no port.

Exit status: 0 when every worker succeeded, else the first failing worker's status.
"""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from yolo3.cli import ArgumentParser, run_main
from yolo3.distributed.ports import free_ports


def build_parser():
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--num-workers", type=int, help="local worker processes")
    where.add_argument("-H", "--hosts", help="file with one host (or host:port) per line")
    parser.add_argument("--port", type=int, default=23456, help="port for hosts without one")
    parser.add_argument(
        "--gpus-per-worker",
        type=int,
        help="local workers: give worker i GPUs [i*K, (i+1)*K) via CUDA_VISIBLE_DEVICES",
    )
    parser.add_argument(
        "--pin-cores",
        action="store_true",
        help="local workers: pin worker i to CPU core i (benchmarks)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds the other workers get to finish after one fails",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    return parser


def cluster_addresses(args):
    """``host:port`` of every worker, chief first."""
    if args.num_workers is not None:
        if args.num_workers < 1:
            raise ValueError(f"-n {args.num_workers}: need at least one worker")
        return [f"127.0.0.1:{port}" for port in free_ports(args.num_workers)]
    addresses = []
    with open(args.hosts, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            host = line.split("#")[0].strip()
            if not host:
                continue
            if host.count(":") > 1:
                raise ValueError(f"{args.hosts}:{number}: {host!r} is not host or host:port")
            addresses.append(host if ":" in host else f"{host}:{args.port}")
    if not addresses:
        raise ValueError(f"{args.hosts} lists no hosts")
    return addresses


def worker_environment(addresses, index, *, gpus_per_worker=None):
    """The environment additions of worker ``index``: TF_CONFIG, and its GPUs if asked."""
    env = {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        )
    }
    if gpus_per_worker is not None:
        first = index * gpus_per_worker
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + k) for k in range(gpus_per_worker))
    return env


def _ssh_command(address, env, command):
    host = address.rsplit(":", 1)[0]
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    remote = f"cd {shlex.quote(os.getcwd())} && env {exports} {shlex.join(command)}"
    return ["ssh", "-o", "BatchMode=yes", host, remote]


def _pump(stream, prefix):
    for line in iter(stream.readline, ""):
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()
    stream.close()


def _pin(core):
    return lambda: os.sched_setaffinity(0, {core})


def launch(args):
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("no command: give it after --, e.g. -- yolo3 train ...")
    addresses = cluster_addresses(args)
    local = args.num_workers is not None
    processes, threads = [], []
    for index, address in enumerate(addresses):
        extra = worker_environment(
            addresses, index, gpus_per_worker=args.gpus_per_worker if local else None
        )
        argv = command if local else _ssh_command(address, extra, command)
        if args.dry_run:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()), shlex.join(argv))
            continue
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        pin = _pin(sorted(cores)[index % len(cores)]) if args.pin_cores and cores else None
        process = subprocess.Popen(
            argv,
            env={**os.environ, **extra} if local else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=pin,
        )
        processes.append(process)
        thread = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] "))
        thread.start()
        threads.append(thread)
    if args.dry_run:
        return 0
    # SIGTERM to the launcher (Slurm, Kubernetes, a spot machine going away) goes on to
    # every local worker: they stop together after one step, with backups there.
    previous = signal.signal(signal.SIGTERM, lambda *_: _forward(processes, signal.SIGTERM))
    try:
        status = _wait(processes, args.grace)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for thread in threads:
        thread.join()
    return status


def _forward(processes, signum):
    for process in processes:
        if process.poll() is None:
            process.send_signal(signum)


def _wait(processes, grace):
    """Waits for every worker; after the first failure, stops the rest after ``grace`` s."""
    failed_at, status = None, 0
    while True:
        codes = [process.poll() for process in processes]
        for index, code in enumerate(codes):
            if code not in (None, 0) and status == 0:
                status, failed_at = code, time.monotonic()
                reason = f"signal {-code}" if code < 0 else f"status {code}"
                print(
                    f"launch: worker {index} ended with {reason}; stopping the others in "
                    f"{grace:g} s unless they finish",
                    file=sys.stderr,
                )
        if all(code is not None for code in codes):
            break
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            time.sleep(5)
            for process in processes:
                if process.poll() is None:
                    process.kill()
        time.sleep(0.2)
    if status:
        return status if status > 0 else 128 - status
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, launch, errors=(OSError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
