"""The recipe matrix benchmark's own logic (benchmarks/matrix.py), without training: which
runs it plans, what it keeps between invocations, and the table it prints."""

import json
import time

import pytest
from PIL import Image

from benchmarks.matrix import (
    MatrixConfig,
    Results,
    equal_time_schedule,
    format_matrix,
    phases,
    plan,
    run_folder,
    run_matrix,
    run_record,
    summarize,
)
from yolo3.evaluation.metrics import AP_BY_IOU


def figures(ap, seconds, epochs=6):
    return {"AP": ap, "AP50": ap + 0.3, "AP75": ap, "mAP50": ap + 0.3,
            "train_seconds": seconds, "epochs": epochs}  # fmt: skip


def run(size, images, side, seed, ap, seconds, epochs=6):
    return {"input_size": size, "train_images": images, "side": side, "seed": seed,
            **figures(ap, seconds, epochs)}  # fmt: skip


def test_plan_runs_cheapest_cells_first_and_equal_time_runs_last(tmp_path):
    config = MatrixConfig(
        work=str(tmp_path), input_sizes=(192, 96), train_images=(4000, 1000), seeds=(0, 1),
        sides=("ours", "peer", "ours-at-peer-time"),
    )  # fmt: skip
    jobs = plan(config, Results(tmp_path / "matrix.json"))
    assert [cell for cell, _, _ in jobs[:4]] == [(96, 1000)] * 4  # 96^2 x 1000 is the cheapest
    # 96 px x 4000 (36.9M pixels) costs less than 192 px x 1000 (36.9M: a tie, by size then)
    order = list(dict.fromkeys(cell for cell, side, _ in jobs if side != "ours-at-peer-time"))
    assert order == [(96, 1000), (96, 4000), (192, 1000), (192, 4000)]
    assert all(side == "ours-at-peer-time" for _, side, _ in jobs[16:])
    assert len(jobs) == 4 * 3 * 2
    # The equal-time runs start only once every peer run has ended: a phase of their own.
    first, timed = phases(jobs)
    assert {side for _, side, _ in first} == {"ours", "peer"} and len(first) == 16
    assert timed == jobs[16:]


def test_results_are_kept_and_only_missing_runs_are_planned(tmp_path):
    config = MatrixConfig(work=str(tmp_path), input_sizes=(96,), train_images=(100,))
    results = Results(tmp_path / "matrix.json")
    results.add(run(96, 100, "ours", 0, 0.5, 40.0))
    results.add(run(96, 100, "peer", 1, 0.4, 60.0))
    again = Results(tmp_path / "matrix.json")  # a new invocation reads what the last wrote
    assert sorted(plan(config, again)) == [((96, 100), "ours", 1), ((96, 100), "peer", 0)]
    assert again.peer_seconds((96, 100), 1) == 60.0 and again.peer_seconds((96, 100), 0) is None
    assert not list(tmp_path.glob("*.tmp"))


def test_an_equal_time_run_needs_its_peer_run(tmp_path):
    config = MatrixConfig(
        work=str(tmp_path), input_sizes=(96,), train_images=(100,), seeds=(0,),
        sides=("ours-at-peer-time",),
    )  # fmt: skip
    with pytest.raises(ValueError, match="96 px, 100 images, seed 0: no peer run"):
        plan(config, Results(tmp_path / "matrix.json"))
    results = Results(tmp_path / "matrix.json")
    results.add(run(96, 100, "peer", 0, 0.4, 60.0))
    assert plan(config, results) == [((96, 100), "ours-at-peer-time", 0)]


def test_an_equal_time_run_is_timed_by_its_peer_and_says_when_that_run_finished(tmp_path):
    results = Results(tmp_path / "matrix.json")
    before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    peer = run_record(((96, 100), "peer", 1), 754.2, 790.0, 6, {"AP": 0.4})
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results.add(peer)
    results.add(run(96, 100, "peer", 0, 0.4, 60.0))  # recorded before runs were stamped
    lines = []
    again = Results(tmp_path / "matrix.json")
    # 754.2 s is 12.57 minutes: --time is in minutes, and the epochs are capped, not set
    assert equal_time_schedule(again, (96, 100), 1, lines.append) == (
        "--epochs", 100, "--time", "12.570"
    )  # fmt: skip
    finished = again.runs[(96, 100, "peer", 1)]["finished"]
    assert before <= finished <= after  # UTC, ISO 8601: ordered as text
    assert lines == [f"  timed by the peer's run of 12.6 minutes, finished {finished}"]
    equal_time_schedule(again, (96, 100), 0, lines.append)
    assert lines[-1].endswith("1.0 minutes, finished at a time not recorded")


@pytest.mark.parametrize(
    "changes, message",
    [({"sides": ("ours", "theirs")}, "--sides theirs"), ({"input_sizes": (100,)}, "multiples")],
)
def test_bad_settings_are_refused(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        MatrixConfig(work=str(tmp_path), **changes)


def test_summary_means_over_seeds_and_table(tmp_path):
    config = MatrixConfig(work=str(tmp_path), input_sizes=(96,), train_images=(100,))
    results = Results(tmp_path / "matrix.json")
    for seed, (ours, theirs) in enumerate(((0.60, 0.55), (0.64, 0.57))):
        results.add(run(96, 100, "ours", seed, ours, 40.0 + seed))
        results.add(run(96, 100, "peer", seed, theirs, 60.0 + 3 * seed))
    summary = summarize(config, results, command="cmd")
    ours = next(row for row in summary["cells"] if row["side"] == "ours")
    assert ours["AP"] == pytest.approx(0.62) and ours["AP_half_range"] == pytest.approx(0.02)
    assert ours["train_seconds"] == pytest.approx(40.5) and ours["seeds"] == [0, 1]
    json.dumps(summary)  # what --json writes
    table = format_matrix(summary).splitlines()
    assert table[0].startswith("| input | train images | ours AP |")
    assert table[2] == (
        "| 96 px | 100 | 0.620 ± 0.020 | 0.920 | 6.0 | 40 | 0.560 ± 0.010 | 0.860 | 6.0 | 62 "
        "| +0.060 |"
    )


def test_rescore_scores_kept_runs_again_and_names_the_ones_it_cannot(tmp_path):
    """A peer run's detections, here its validation boxes themselves, scored again: AP 1 at
    every IoU threshold, its training figures as they were. Our run's folder is gone, and
    the peer's seed-1 folder holds another run than the one recorded (a run stopped after
    it took the folder): both are named and kept as they were. Nothing trains."""
    config = MatrixConfig(work=str(tmp_path), input_sizes=(96,), train_images=(100,),
                          seeds=(0, 1), rescore=True)  # fmt: skip
    data = tmp_path / "s96-n100" / "data"
    data.mkdir(parents=True)
    boxes = {"a.png": [[4, 6, 30, 40, 0]], "b.png": [[10, 10, 50, 30, 1], [60, 5, 90, 45, 0]]}
    lines, images = [], []
    for name, rows in boxes.items():
        Image.new("RGB", (96, 64), (90, 90, 90)).save(data / name)
        lines.append(" ".join([str(data / name)] + [",".join(map(str, row)) for row in rows]))
        found = {"boxes": [row[:4] for row in rows], "classes": [row[4] for row in rows]}
        images.append({"path": str(data / name), "scores": [0.9] * len(rows), **found})
    (data / "val.txt").write_text("\n".join(lines) + "\n")
    (data / "classes.txt").write_text("square\ncircle\n")
    for seed, seconds in ((0, 60.0), (1, 12.5)):
        peer_dir = run_folder(config, (96, 100), "peer", seed)
        peer_dir.mkdir(parents=True)
        report = {"epochs": 6, "train_seconds": seconds, "images": images}
        (peer_dir / "detections.json").write_text(json.dumps(report))
    results = Results(tmp_path / "matrix.json")
    results.add(run(96, 100, "peer", 0, 0.4, 60.0))
    results.add(run(96, 100, "peer", 1, 0.45, 61.0))
    results.add(run(96, 100, "ours", 0, 0.5, 40.0))
    logged = []
    summary = run_matrix(config, log=logged.append)
    saved = json.loads((tmp_path / "matrix.json").read_text())["runs"]
    runs = {(run["side"], run["seed"]): run for run in saved}
    peer = runs["peer", 0]
    assert peer["AP"] == pytest.approx(1.0) and peer["train_seconds"] == 60.0
    assert list(peer[AP_BY_IOU].values()) == pytest.approx([1.0] * 10)
    assert runs["peer", 1]["AP"] == 0.45 and AP_BY_IOU not in runs["peer", 1]
    assert runs["ours", 0]["AP"] == 0.5 and AP_BY_IOU not in runs["ours", 0]
    assert any("ours, seed 0: not scored again" in line for line in logged)
    assert any("peer, seed 1: not scored again" in line and "another run (6 epochs in 12.5 s"
               in line for line in logged)  # fmt: skip
    peer_row = next(row for row in summary["cells"] if row["side"] == "peer")
    assert peer_row[AP_BY_IOU] is None  # seed 1 has none: no mean of one seed
    rescored = Results(tmp_path / "rescored.json")
    rescored.add(peer)
    peer_row = next(row for row in summarize(config, rescored)["cells"] if row["side"] == "peer")
    assert peer_row[AP_BY_IOU]["0.95"] == pytest.approx(1.0)
