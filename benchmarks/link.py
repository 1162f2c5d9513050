"""A slow network on one machine: a private network namespace with a rate-limited loopback.

Processes started with :meth:`RateLimitedLoopback.command` run in a network namespace of
their own whose only interface is a loopback shaped by ``tc``'s token bucket filter, so
workers that talk over 127.0.0.1 see, say, 100 Mbit/s instead of several Gbit/s, and
nothing leaves the machine. Every byte any worker sends crosses that one shaped device, so
the workers share the rate (on real machines each would have its own link, each way).

Needs root and iproute2 (``ip``, ``tc``); the namespace is removed on exit, also after a
failure.
"""

import os
import re
import shutil
import signal
import subprocess
import threading

# tc's units for bits per second (tc reads "kbps" as kilobytes: not accepted here).
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
# Larger than the loopback's MTU below: a bucket smaller than one packet drops every large
# packet and TCP connections hang.
_MTU = 9000
_BURST = "128kb"


class LinkUnavailable(ValueError):
    """This machine cannot shape a loopback (not root, or no ``ip``/``tc``)."""


def parse_rate(text):
    """``"100mbit"`` -> 1e8 bits per second; ``"none"`` -> None (no shaping)."""
    text = text.strip().lower()
    if text == "none":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not match or match.group(2) not in _RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"--link {text!r}: use a rate in tc's units ({', '.join(_RATE_UNITS)}), e.g. "
            "100mbit or 1gbit, or none"
        )
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


class RateLimitedLoopback:
    """Context manager: a namespace whose loopback carries ``rate`` (a tc rate string).

    With ``rate`` ``"none"`` it does nothing and commands run as they are.
    """

    def __init__(self, rate):
        self.rate = rate
        self.bits_per_second = parse_rate(rate)
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
            self._run(
                *self.command(
                    ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.rate,
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
