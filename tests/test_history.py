"""``history.jsonl``: one line per epoch, the training clock without mAP scoring, resumes."""

import json
import types

from test_progress import FakeClock

from yolo3.callbacks import history as history_module
from yolo3.callbacks.history import HISTORY_FILE, EpochHistory, read_history


def test_each_epoch_is_a_line_with_the_clock_less_evaluation(tmp_path, monkeypatch):
    clock = FakeClock()
    clock.now = 100.0
    monkeypatch.setattr(history_module.time, "perf_counter", clock)
    evaluation = types.SimpleNamespace(seconds=0.0)
    callback = EpochHistory(tmp_path, started=90.0, evaluation=evaluation)
    callback.on_epoch_begin(0)
    clock.now = 130.0  # 40 s since the start, none of it scoring
    callback.on_epoch_end(0, {"loss": 5.0, "val_loss": float("nan"), "note": "text"})
    clock.now = 200.0
    evaluation.seconds = 12.5  # epoch 2 was scored, for 12.5 s of its 70
    callback.on_epoch_end(1, {"loss": 4.0, "val_mAP50": 0.25})
    assert read_history(tmp_path) == [
        # NaN and text are left out: every value is a finite number.
        {"epoch": 1, "seconds": 40.0, "loss": 5.0},
        {"epoch": 2, "seconds": 97.5, "loss": 4.0, "val_mAP50": 0.25},
    ]
    lines = (tmp_path / HISTORY_FILE).read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_resumed_run_keeps_the_epochs_before_it_and_counts_on(tmp_path, monkeypatch):
    clock = FakeClock()
    clock.now = 100.0
    monkeypatch.setattr(history_module.time, "perf_counter", clock)
    (tmp_path / HISTORY_FILE).write_text(
        "".join(json.dumps({"epoch": e, "seconds": 10.0 * e}) + "\n" for e in (1, 2, 3))
    )
    # Resumed after epoch 2 (a backup taken before epoch 3 ended): epoch 3 is trained again.
    callback = EpochHistory(tmp_path, started=clock.now)
    callback.on_epoch_begin(2)
    clock.now += 7.0
    callback.on_epoch_end(2, {"loss": 1.0})
    assert read_history(tmp_path) == [
        {"epoch": 1, "seconds": 10.0},
        {"epoch": 2, "seconds": 20.0},
        {"epoch": 3, "seconds": 27.0, "loss": 1.0},
    ]
    assert read_history(tmp_path / "absent") == []
