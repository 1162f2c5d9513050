"""A slow network on one machine: a private network namespace with a rate-limited loopback,
and a round-trip time.

Processes started with :meth:`RateLimitedLoopback.command` run in a network namespace of
their own whose only interface is a loopback shaped by ``tc``'s token bucket filter, so
workers that talk over 127.0.0.1 see, say, 100 Mbit/s instead of several Gbit/s, and
nothing leaves the machine. Every byte any worker sends crosses that one shaped device, so
the workers share the rate (on real machines each would have its own link, each way).

With a round-trip time, the workers reach each other through a delay line
(:mod:`benchmarks.relay`): :meth:`RateLimitedLoopback.cluster` gives each worker a
``TF_CONFIG`` address list in which its own entry is the port its server binds and every
other worker's is a relay port that holds each byte ``rtt / 2`` before passing it on, each
way. (TensorFlow connects to a peer at the address its own ``TF_CONFIG`` names; it does not
compare the lists.) The kernel's ``netem`` would do the same inside ``tc``; where it is
missing (as on this project's test machines) the relay stands in. Every byte then crosses
the shaped loopback twice, to the relay and from it, so the loopback is shaped to twice
the rate.

Needs root and iproute2 (``ip``, ``tc``) to shape; the namespace is removed on exit, also
after a failure. A round-trip time alone needs neither.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from yolo3.distributed.ports import free_ports

# tc's units for bits per second (tc reads "kbps" as kilobytes: not accepted here).
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
# Larger than the loopback's MTU below: a bucket smaller than one packet drops every large
# packet and TCP connections hang.
_MTU = 9000
_BURST = "128kb"
_ROOT = Path(__file__).resolve().parents[1]
_TIME_UNITS = {"ms": 1e-3, "us": 1e-6, "s": 1.0}


class LinkUnavailable(ValueError):
    """This machine cannot shape a loopback (not root, or no ``ip``/``tc``)."""


def _amount(text, units, flag, what):
    """``"25ms"`` with ``units`` ``{"ms": 1e-3, ...}`` -> 0.025; ``what`` and ``flag`` name
    it in the error."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not match or match.group(2) not in units or float(match.group(1)) <= 0:
        raise ValueError(f"{flag} {text!r}: use {what} ({', '.join(units)}), or none")
    return float(match.group(1)) * units[match.group(2)]


def parse_rate(text):
    """``"100mbit"`` -> 1e8 bits per second; ``"none"`` -> None (no shaping)."""
    text = text.strip().lower()
    if text == "none":
        return None
    return _amount(text, _RATE_UNITS, "--link", "a rate in tc's units, e.g. 100mbit or 1gbit")


def parse_rtt(text):
    """``"25ms"`` -> 0.025 seconds of round trip; ``"none"`` or ``"0"`` -> 0.0."""
    text = text.strip().lower()
    if text in ("none", "0"):
        return 0.0
    return _amount(text, _TIME_UNITS, "--rtt", "a round-trip time, e.g. 25ms or 0.1ms")


class RateLimitedLoopback:
    """Context manager: a namespace whose loopback carries ``rate`` (a tc rate string),
    and workers that reach each other ``rtt`` (a time such as ``"25ms"``) apart.

    With ``rate`` ``"none"`` it makes no namespace and commands run as they are.
    """

    def __init__(self, rate, rtt="none"):
        self.rate = rate
        self.bits_per_second = parse_rate(rate)
        self.rtt_seconds = parse_rtt(rtt)
        self.name = f"yolo3-link-{os.getpid()}"

    def __enter__(self):
        if self.bits_per_second is None:
            return self
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            raise LinkUnavailable(
                f"--link {self.rate} needs iproute2 ({' and '.join(missing)} not found); "
                "install it (apt-get install iproute2) or use --link none"
            )
        if os.geteuid() != 0:
            raise LinkUnavailable(
                f"--link {self.rate} creates a network namespace, which needs root; run as "
                "root or use --link none"
            )
        self._run("ip", "netns", "add", self.name)
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            # SIGTERM would end Python without unwinding: make it an exit that runs
            # __exit__, so the namespace goes with the run.
            self._previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._run(*self.command(["ip", "link", "set", "lo", "mtu", str(_MTU), "up"]))
            # Through the relay every byte crosses the loopback twice.
            rate = f"{self.bits_per_second * (2 if self.rtt_seconds else 1):.0f}bit"
            self._run(
                *self.command(
                    ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
                     "burst", _BURST, "latency", "100ms"]
                )
            )  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.bits_per_second is not None:
            self._delete()
            if self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous)
        return False

    def command(self, argv):
        """``argv`` run inside the namespace."""
        if self.bits_per_second is None:
            return list(argv)
        return ["ip", "netns", "exec", self.name, *argv]

    @contextlib.contextmanager
    def cluster(self, workers):
        """Yields, for each of ``workers`` workers, the ``host:port`` list of its
        ``TF_CONFIG`` (:func:`yolo3.distributed.strategy.tf_config`); with a round-trip time,
        runs the relay between them until the block ends."""
        relayed = workers * (workers - 1) if self.rtt_seconds else 0
        ports = free_ports(workers + relayed)
        servers, relays = ports[:workers], iter(ports[workers:])
        if not self.rtt_seconds:
            yield [[f"127.0.0.1:{port}" for port in servers]] * workers
            return
        lists, pairs = [], []
        for me in range(workers):
            addresses = []
            for peer, port in enumerate(servers):
                if peer != me:
                    relay_port = next(relays)
                    pairs.append(f"{relay_port}:{port}")
                    port = relay_port
                addresses.append(f"127.0.0.1:{port}")
            lists.append(addresses)
        relay = subprocess.Popen(
            self.command(
                [sys.executable, "-m", "benchmarks.relay", repr(self.rtt_seconds / 2), *pairs]
            ),
            cwd=_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            if relay.stdout.readline().strip() != "ready":
                raise LinkUnavailable(f"the relay for --rtt ended with status {relay.wait()}")
            yield lists
        finally:
            relay.terminate()
            try:
                relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()

    def _delete(self):
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)

    @staticmethod
    def _run(*argv):
        completed = subprocess.run(argv, capture_output=True, text=True, check=False)
        if completed.returncode:
            raise LinkUnavailable(
                f"{' '.join(argv)} failed ({completed.stderr.strip() or completed.returncode})"
            )


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)
