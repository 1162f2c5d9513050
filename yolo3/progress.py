"""Progress on a terminal and in a file.

Keras's progress bar and tqdm redraw one line with carriage returns, backspaces and colour
codes. On a terminal that is right; in a file (a Slurm job's output, ``nohup``, CI) it is
hundreds of bytes of unreadable noise per step, and Keras cannot tell the two apart (its
progress bar takes any POSIX stream for a terminal). So the tools decide here: a bar when
the stream is a terminal, else plain lines, one every few seconds or steps and one at the
end of each epoch or job.
"""

import math
import sys
import time

PROGRESS_CHOICES = ("auto", "bar", "lines", "off")
DEFAULT_SECONDS = 30.0


def is_terminal(stream):
    """Whether ``stream`` is an interactive terminal (False for files, pipes, closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def resolve(progress, stream=None):
    """``"bar"``, ``"lines"`` or ``"off"`` for a progress setting.

    ``"auto"`` is a bar when ``stream`` (default: standard output) is a terminal, else lines.
    """
    if progress not in PROGRESS_CHOICES:
        raise ValueError(f"--progress: one of {PROGRESS_CHOICES}, not {progress!r}")
    if progress != "auto":
        return progress
    return "bar" if is_terminal(sys.stdout if stream is None else stream) else "lines"


def check_interval(every, seconds):
    """Validates a line interval: ``every`` steps (None: off) and ``seconds`` (0: off)."""
    if every is not None and every < 1:
        raise ValueError("--log-every must be >= 1 (steps between progress lines)")
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError("--log-seconds must be >= 0 (seconds between progress lines; 0: off)")


def format_duration(seconds):
    """``"45s"``, ``"12m05s"``, ``"3h07m"``: a duration as people read it in a log."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Interval:
    """Says when the next line is due: after ``every`` steps or ``seconds`` seconds since the
    last one, whichever comes first (None and 0 turn either off)."""

    def __init__(self, every=None, seconds=DEFAULT_SECONDS, clock=time.monotonic):
        check_interval(every, seconds)
        self.every = every
        self.seconds = seconds
        self.clock = clock
        self.restart(0)

    def restart(self, step):
        self.step, self.time = step, self.clock()

    def due(self, step):
        """True (and restarts) when a line is due at ``step``."""
        now = self.clock()
        if (self.every and step - self.step >= self.every) or (
            self.seconds and now - self.time >= self.seconds
        ):
            self.step, self.time = step, now
            return True
        return False


class LineCounter:
    """A counter that prints ``what: done/total unit (pct), rate unit/s, time left`` lines.

    The plain-line counterpart of a tqdm bar, with its ``update`` and ``close`` and use as a
    context manager. A job shorter than the interval prints nothing.
    """

    def __init__(self, total, *, what, unit, every=None, seconds=DEFAULT_SECONDS, log=print,
                 clock=time.monotonic):  # fmt: skip
        self.total = total
        self.what = what
        self.unit = unit
        self.log = log
        self.clock = clock
        self.done = 0
        self.started = clock()
        self.interval = Interval(every, seconds, clock)

    def update(self, count=1):
        self.done += count
        if self.interval.due(self.done) and self.done < (self.total or math.inf):
            self.log(self._line())

    def close(self):
        """Nothing to print: the tools report their own totals."""

    def _line(self):
        elapsed = self.clock() - self.started
        rate = self.done / elapsed if elapsed > 0 else math.inf
        if not self.total:
            return f"{self.what}: {self.done} {self.unit}, {rate:.1f} {self.unit}/s"
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        return (
            f"{self.what}: {self.done}/{self.total} {self.unit} "
            f"({100 * self.done / self.total:.0f}%), {rate:.1f} {self.unit}/s, "
            f"{format_duration(left) if math.isfinite(left) else '?'} left"
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


class _Silent:
    def update(self, count=1):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass


def counter(total, *, what, unit, progress="auto", every=None, seconds=DEFAULT_SECONDS,
            log=print):  # fmt: skip
    """A progress counter for ``total`` items: a tqdm bar on a terminal (on standard error,
    where tqdm draws), a :class:`LineCounter` writing to ``log`` otherwise, or nothing."""
    mode = resolve(progress, sys.stderr)
    if mode == "off":
        return _Silent()
    if mode == "lines":
        return LineCounter(total, what=what, unit=unit, every=every, seconds=seconds, log=log)
    from tqdm import tqdm  # noqa: PLC0415 - only terminals draw bars

    return tqdm(total=total, unit=unit, desc=what, smoothing=0.1)
