"""The soak benchmark: its line, its samples of a real process, its log-folder check, and the
leak it found (every saved optimizer state built a new Keras optimizer)."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import load_tool

from benchmarks import soak
from yolo3.checkpoint.weights import write_weights_file


def test_the_line_through_a_known_series_has_its_hand_derived_slope_and_error():
    # x = 5, 6, 7, 8 (mean 6.5), y = 1, 3, 2, 4 (mean 2.5):
    # Sxy = (-1.5)(-1.5) + (-0.5)(0.5) + (0.5)(-0.5) + (1.5)(1.5) = 4, Sxx = 5: slope 0.8 a
    # epoch, 80 per 100. The line gives 1.3, 2.1, 2.9, 3.7: residuals -0.3, 0.9, -0.9, 0.3,
    # their squares sum to 1.8; s^2 = 1.8 / 2 = 0.9 and the error sqrt(0.9 / 5) = 0.4243 an
    # epoch, 42.43 per 100.
    slope, error = soak.fit_line([5, 6, 7, 8], [1, 3, 2, 4])
    assert slope == pytest.approx(80.0)
    assert error == pytest.approx(100 * np.sqrt(0.18))
    assert soak.fit_line([3, 3], [1, 2]) == (None, None)  # one epoch: no line
    assert soak.fit_line([3, 4], [1, 2]) == (pytest.approx(100.0), None)  # no error from 2


def _sample(epoch, rss, open_files=7, threads=25):
    return {"seconds": float(epoch), "epoch": epoch, "rss_mb": rss, "rss_anon_mb": rss / 2,
            "open_files": open_files, "threads": threads, "log_bytes": 0}  # fmt: skip


def test_the_summary_fits_the_second_half_and_leaves_out_the_process_end():
    # 20 epochs: the line from epoch 10 on. RSS 1000 + 0.25 MB an epoch there (25 per 100),
    # after a start-up that rose faster; the sample at epoch 20 (the process ending, its
    # backups deleted) would bend the line and is left out. One more thread in the last
    # quarter (epochs 15-19) is a rise.
    samples = [_sample(e, 900 + 10 * e) for e in range(10)]
    samples += [_sample(e, 1000 + 0.25 * e, threads=25 + (e >= 15)) for e in range(10, 20)]
    samples.append(_sample(20, 500.0, open_files=3, threads=2))
    summary = soak.summarize(samples, epochs=20)

    assert summary["from_epoch"] == 10 and summary["samples"] == 10
    assert summary["rss_mb_per_100_epochs"] == pytest.approx(25.0)
    assert summary["rss_mb_per_100_epochs_error"] == pytest.approx(0.0, abs=1e-9)
    assert summary["rss_anon_mb_per_100_epochs"] == pytest.approx(12.5)
    assert summary["rss_mb_range"] == [1002.5, pytest.approx(1004.75)]
    assert summary["open_files_peaks"] == [7, 7] and summary["threads_peaks"] == [25, 26]

    half = {kind: {"files": 1, "bytes": 1000} for kind in ("history", "events", "checkpoints")}
    half |= {"backups": {"files": 2, "bytes": 2000}, "other": {"files": 1, "bytes": 10}}
    last = json.loads(json.dumps(half))
    last["history"]["bytes"] += 500
    last["events"]["bytes"] += 700
    last["checkpoints"]["bytes"] += 5  # a checkpoint's metadata: within 1%
    goals = soak.goals(summary, soak.log_growth(half, last), half)
    assert [goal["passed"] for goal in goals] == [False, True, False, True]
    assert goals[3]["value"] == "history +500 B, events +700 B, checkpoints +5 B"

    last["checkpoints"]["files"] += 1  # a file more every epoch: a pile-up
    assert soak.goals(summary, soak.log_growth(half, last), half)[3]["passed"] is False


def test_the_log_folder_is_listed_by_kind_without_writes_under_way(tmp_path):
    files = {
        "history.jsonl": 3 * b'{"epoch": 1}\n',
        "tensorboard/train/events.out.tfevents.1.host.2.0.v2": b"e" * 40,
        "tensorboard/validation/events.out.tfevents.1.host.2.1.v2": b"e" * 30,
        "checkpoints/last.weights.h5": b"w" * 100,
        "checkpoints/.tmp-x1y2.weights.h5": b"w" * 50,  # atomic_write's, not yet renamed
        "backup/worker-0/backup-000000003.weights.h5": b"b" * 200,
        "config.json": b"{}",
        "results.csv": b"epoch\n1\n",
    }
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)

    assert soak.list_log_folder(tmp_path) == {
        "history": {"files": 1, "bytes": 39},
        "results": {"files": 1, "bytes": 8},
        "events": {"files": 2, "bytes": 70},
        "checkpoints": {"files": 1, "bytes": 100},
        "backups": {"files": 1, "bytes": 200},
        "other": {"files": 1, "bytes": 2},
    }
    assert soak.count_epochs(tmp_path) == 3
    assert soak.count_epochs(tmp_path / "checkpoints") == 0


# A process with a known load: N extra open files, K extra threads, M MB of touched memory.
_HOLDER = """
import sys, threading
files = [open("/dev/null") for _ in range({files})]
block = b"x" * ({megabytes} << 20)
done = threading.Event()
threads = [threading.Thread(target=done.wait) for _ in range({threads})]
for thread in threads:
    thread.start()
print("ready", flush=True)
sys.stdin.read()
done.set()
"""


def _read_holder(files, threads, megabytes):
    code = _HOLDER.format(files=files, threads=threads, megabytes=megabytes)
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline() == "ready\n"
        return soak.read_process(process.pid)
    finally:
        process.communicate("")


def test_samples_are_read_from_the_process_itself():
    bare = _read_holder(files=0, threads=0, megabytes=0)
    loaded = _read_holder(files=5, threads=3, megabytes=64)

    assert loaded["open_files"] - bare["open_files"] == 5
    assert loaded["threads"] - bare["threads"] == 3
    assert 64 <= loaded["rss_mb"] - bare["rss_mb"] < 80
    assert 64 <= loaded["rss_anon_mb"] - bare["rss_anon_mb"] < 80
    with pytest.raises(OSError):
        soak.read_process(2**22 + 1)  # above the kernel's largest process id


def test_flags_a_soak_cannot_run_are_refused():
    with pytest.raises(ValueError, match="--epochs 0 must be >= 1"):
        soak.SoakConfig(epochs=0)
    with pytest.raises(ValueError, match="--input-size 50"):
        soak.SoakConfig(input_size=50)
    with pytest.raises(ValueError, match="--poll 0"):
        soak.SoakConfig(poll=0)


def test_saving_a_trainer_again_builds_no_new_optimizer(tmp_path, monkeypatch):
    # The leak the soak found: Keras's saving walk cached the attribute skip-set of each
    # object type under a key it never read, so every save of a model with an optimizer
    # built a reference Optimizer(1.0) -- two variables of a new name, and TensorFlow kept
    # an eager kernel (about 36 KB) for each new variable name until the process ended.
    from keras.src.optimizers import optimizer as optimizer_module  # noqa: PLC0415

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    model.optimizer.build(model.trainable_variables)
    write_weights_file(model, str(tmp_path / "first.weights.h5"), {"epoch": 1})

    built = []
    original_init = optimizer_module.Optimizer.__init__

    def counting_init(self, *args, **kwargs):
        built.append(type(self).__name__)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(optimizer_module.Optimizer, "__init__", counting_init)
    for epoch in range(2, 5):
        write_weights_file(model, str(tmp_path / f"{epoch}.weights.h5"), {"epoch": epoch})
    assert built == []

    restored = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    restored.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(str(tmp_path / "4.weights.h5"))
    for saved, loaded in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))


@pytest.mark.slow
def test_a_short_soak_samples_a_real_training_run(tmp_path, capsys):
    json_path = tmp_path / "soak.json"
    argv = ["soak", "--epochs", "6", "--work", str(tmp_path / "work"), "--json", str(json_path)]
    assert load_tool("benchmark").main(argv) == 0

    output = capsys.readouterr().out
    assert "training: yolo3 train --records" in output and "--steps-per-epoch 1" in output
    result = json.loads(json_path.read_text())
    samples = result["samples"]
    epochs = [sample["epoch"] for sample in samples]
    # One sample at each epoch's end that the sampler saw, in order; a TensorFlow process.
    assert epochs == sorted(set(epochs)) and set(epochs) <= set(range(1, 7)) and 6 in epochs
    assert all(s["rss_mb"] > 200 and s["threads"] > 1 and s["open_files"] >= 3 for s in samples)
    summary = result["summary"]
    assert summary["from_epoch"] == 3
    assert summary["samples"] == len([e for e in epochs if 3 <= e < 6])
    assert summary["threads_range"][0] > 1
    history = (tmp_path / "work" / "run" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in history] == [1, 2, 3, 4, 5, 6]
    # The folder at the last sample before the end: one history, the three event files
    # (training, validation, the AP pass's), the checkpoints; the growth between it and the
    # half-way sample is the difference.
    folder = result["log_folder"]
    last, half = folder["last"]["kinds"], folder["half"]["kinds"]
    assert last["history"]["files"] == 1 and last["events"]["files"] == 3
    assert last["checkpoints"]["files"] >= 1
    assert (
        folder["growth"]["history"]["bytes"] == last["history"]["bytes"] - half["history"]["bytes"]
    )
    assert folder["growth"]["history"]["bytes"] > 0
    assert [goal["label"] for goal in result["goals"]] == [
        "RSS, MB per 100 epochs", "open files, peaks", "threads, peaks", "log folder grew by",
    ]  # fmt: skip
    assert "RSS, MB per 100 epochs" in output and "figures written to" in output
