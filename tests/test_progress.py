"""Progress for files: plain lines when output is not a terminal, the bar when it is."""

import io
import os
import pty
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from train_helpers import small_record_set, write_anchors

from yolo3 import progress

ROOT = Path(__file__).resolve().parents[1]
TERMINAL_CODES = re.compile(rb"[\r\b\x1b]")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_auto_is_a_bar_on_a_terminal_and_lines_in_a_file(tmp_path):
    with open(tmp_path / "log", "w") as file:
        assert progress.resolve("auto", file) == "lines"
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            assert progress.resolve("auto", terminal) == "bar"
    finally:
        os.close(leader)
        os.close(follower)
    assert progress.resolve("auto", io.StringIO()) == "lines"
    assert progress.resolve("lines", None) == "lines" and progress.resolve("off") == "off"
    with pytest.raises(ValueError, match="--progress"):
        progress.resolve("fancy")


def test_a_line_counter_reports_every_n_items_or_t_seconds_and_at_the_end():
    clock, lines = FakeClock(), []
    with progress.LineCounter(
        100, what="preprocess", unit="images", every=40, seconds=10, log=lines.append, clock=clock
    ) as bar:
        for _ in range(30):  # 30 items in 3 s: neither 40 items nor 10 s yet
            clock.now += 0.1
            bar.update()
        assert lines == []
        clock.now += 7.5  # 10.5 s: due by time
        bar.update()
        assert lines == ["preprocess: 31/100 images (31%), 3.0 images/s, 23s left"]
        for _ in range(40):  # due by count after 40 more
            bar.update()
        assert len(lines) == 2 and lines[1].startswith("preprocess: 71/100 images (71%)")
        clock.now += 20
        bar.update(29)  # the last item prints no line: the tool reports its own total
    assert len(lines) == 2


def test_durations_read_as_people_write_them():
    assert progress.format_duration(7.4) == "7s"
    assert progress.format_duration(725) == "12m05s"
    assert progress.format_duration(3 * 3600 + 7 * 60 + 59) == "3h07m"


@pytest.mark.parametrize(
    "every, seconds, named", [(0, 30.0, "--log-every"), (None, -1.0, "--log-seconds")]
)
def test_bad_intervals_name_their_flag(every, seconds, named):
    with pytest.raises(ValueError, match=named):
        progress.Interval(every, seconds)


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress")
    return small_record_set(folder / "set", train=32, val=8), write_anchors(folder / "anchors.txt")


def _train_to_file(record_set, log_dir, log_file, *extra):
    records, anchors = record_set
    command = [
        sys.executable, str(ROOT / "train.py"), "--records", str(records), "--anchors", anchors,
        "--log-dir", str(log_dir), "--batch-size", "4", "--epochs", "2", "--gpus", "0",
        "--warmup-epochs", "0", *extra,
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with open(log_file, "wb") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, env=env, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return Path(log_file).read_bytes()


@pytest.mark.slow
def test_training_into_a_file_writes_plain_lines_within_a_bound_per_step(record_set, tmp_path):
    # Without the AP pass, whose lines and report are the run's, not the steps'.
    flags = ("--log-every", "3", "--map-every", "0")
    log = _train_to_file(record_set, tmp_path / "run", tmp_path / "train.log", *flags)
    assert not TERMINAL_CODES.search(log), "carriage returns, backspaces or colour codes"
    text = log.decode()
    steps = 2 * 32 // 4
    # One line every 3 steps plus one per epoch (and the run's own few lines): Keras's bar
    # wrote about 360 bytes per step into a file.
    assert len(log) / steps < 150, text
    progress_lines = re.findall(r"^epoch (\d)/2 step (\d+)/8: loss ([\d.]+), [\d.]+ images/s, "
                                r"(\S+) left$", text, re.MULTILINE)  # fmt: skip
    assert [(int(e), int(s)) for e, s, *_ in progress_lines] == [(1, 3), (1, 6), (2, 3), (2, 6)]
    epoch_lines = re.findall(r"^epoch (\d)/2 done in \S+: (.*)$", text, re.MULTILINE)
    assert [epoch for epoch, _ in epoch_lines] == ["1", "2"]
    for _, values in epoch_lines:
        named = dict(item.rsplit(" ", 1) for item in values.split(", "))
        for name in ("loss", "val_loss", "class_loss", "images_per_second", "learning_rate"):
            assert float(named[name]) == float(named[name]), name  # a number, not NaN


def test_quiet_turns_progress_off_and_tools_count_in_lines_off_a_terminal():
    from yolo3.commands import train  # noqa: PLC0415

    args = ["--records", "r", "--quiet", "--progress", "lines"]
    assert train.config_from_args(train.build_parser().parse_args(args)).progress == "off"
    # pytest captures standard error, where a tqdm bar would draw: not a terminal.
    lines = []
    with progress.counter(4, what="evaluate", unit="images", every=2, log=lines.append) as bar:
        assert isinstance(bar, progress.LineCounter)
        for _ in range(4):
            bar.update()
    assert len(lines) == 1 and lines[0].startswith("evaluate: 2/4 images (50%), ")


def test_progress_lines_under_a_time_budget_count_its_plan_not_the_epochs_flag(monkeypatch):
    import keras  # noqa: PLC0415

    from yolo3.callbacks import ProgressLines, TimeBudget, schedule  # noqa: PLC0415

    clock, lines = FakeClock(), []
    monkeypatch.setattr(schedule.time, "perf_counter", clock)
    budget = TimeBudget(
        100.0, started=0.0, steps_per_epoch=10, max_epochs=50,
        planned=keras.Variable(500, dtype="int64"),
    )  # fmt: skip
    progress_lines = ProgressLines(
        4, every=6, seconds=0, log=lines.append, budget=budget, clock=clock
    )
    model = types.SimpleNamespace(stop_training=False)
    for callback in (progress_lines, budget):  # in the run's order
        callback.set_params({"epochs": 50, "steps": 10})
        callback.set_model(model)
    budget.on_train_begin()
    for epoch in range(2):  # 2 s a step
        for callback in (progress_lines, budget):
            callback.on_epoch_begin(epoch)
        for batch in range(10):
            clock.now += 2.0
            progress_lines.on_train_batch_end(batch, {"loss": 1.0})
        for callback in (progress_lines, budget):
            callback.on_epoch_end(epoch, {"loss": 1.0})
    # Before the first plan --epochs is only a cap, and only this epoch's time is known.
    # After epoch 1 (20 s of 100): 4 more epochs fit, 5 planned; 34 steps of 2 s are left
    # at epoch 2's step 6 (--epochs would say 16m08s).
    assert budget.plan == 5
    assert lines == [
        "epoch 1/<=50 step 6/10: loss 1.0000, 2.0 images/s, "
        "8s left in this epoch; --time plans the run after it",
        "epoch 1/<=50 done in 20s: loss 1.0000",
        "epoch 2/5 step 6/10: loss 1.0000, 2.0 images/s, 1m08s left",
        "epoch 2/5 done in 20s: loss 1.0000",
    ]
