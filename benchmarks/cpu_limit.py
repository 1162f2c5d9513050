"""A slow machine on this one: a cgroup that gives its processes a share of one core.

:class:`CpuLimit` makes a cgroup with a CPU quota (cgroup v2 ``cpu.max``, or v1
``cpu.cfs_quota_us``), processes join it with :meth:`CpuLimit.join` (from a ``preexec_fn``,
before they run anything), and it is removed on exit, also after a failure. A share of 0.5
is half a core: the group may run 50 ms of every 100 ms. Needs root and a writable cgroup
hierarchy.
"""

import os
import sys
from pathlib import Path

_PERIOD_US = 100_000
_ROOT = Path("/sys/fs/cgroup")


class CpuLimitUnavailable(ValueError):
    """No cgroup with a CPU controller can be made here."""


class CpuLimit:
    """Context manager: a cgroup limited to ``share`` of a core (0: no limit, no cgroup)."""

    def __init__(self, share):
        self.share = share
        self.path = None

    def __enter__(self):
        if not self.share:
            return self
        name = f"yolo3-straggler-{os.getpid()}"
        unified = (_ROOT / "cgroup.controllers").exists()
        parent = _ROOT if unified else _ROOT / "cpu"
        quota = round(self.share * _PERIOD_US)
        try:
            if unified and "cpu" not in (_ROOT / "cgroup.subtree_control").read_text().split():
                (_ROOT / "cgroup.subtree_control").write_text("+cpu")
            self.path = parent / name
            self.path.mkdir()
            if unified:
                (self.path / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as error:
            self.__exit__()
            raise CpuLimitUnavailable(
                f"--straggler {self.share:g} needs a cgroup with a CPU quota under {parent} "
                f"({error.strerror or error}); run as root where the cgroup hierarchy is "
                "writable, or leave --straggler out"
            ) from None
        return self

    def join(self):
        """Moves the calling process into the group (no-op without a limit)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def __exit__(self, *exc):
        if self.path is not None and self.path.exists():
            try:
                self.path.rmdir()  # its processes have ended: the group is empty
            except OSError as error:
                print(f"warning: cgroup {self.path} left in place ({error.strerror})",
                      file=sys.stderr)  # fmt: skip
            self.path = None
        return False
