"""``yolo3 train --data``: from a dataset as exported to a scored detector in one command.

A Roboflow-style YOLO export (``data.yaml``, ``train/`` and ``valid/`` with ``images/`` and
``labels/``) trains in one command: anchors fitted, records preprocessed into the cache,
COCO AP each epoch picking ``best.weights.h5``, ``results.csv``/``results.png`` and the
validation report with its confusion matrix; the same command again preprocesses nothing,
and an edited label file builds the cache anew. The cache's records are those ``yolo3
preprocess`` writes with the same settings, byte for byte.
"""

import csv
import json

import keras
import numpy as np
from helpers import load_tool
from PIL import Image

from yolo3.callbacks import FITNESS_KEY, TemplateCheckpoint, read_history
from yolo3.callbacks.evaluation import MapEvaluation, fitness
from yolo3.checkpoint.weights import read_metadata
from yolo3.data import cache
from yolo3.data.preprocess import PreprocessConfig

train_tool = load_tool("train")
preprocess_tool = load_tool("preprocess")
SIZE = 64


def _export(root, counts=(10, 3), seed=0):
    """A Roboflow-style YOLO export of solid rectangles on gray: ``root/data.yaml``."""
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "valid"), counts):
        (root / split / "images").mkdir(parents=True)
        (root / split / "labels").mkdir(parents=True)
        for index in range(count):
            image = np.full((48, 64, 3), 90, np.uint8)
            lines = []
            for class_id in range(2):
                w, h = (int(v) for v in rng.integers(10, 24, size=2))
                x0, y0 = int(rng.integers(0, 64 - w)), int(rng.integers(0, 48 - h))
                image[y0 : y0 + h, x0 : x0 + w] = (255, 0, 0) if class_id else (0, 0, 255)
                lines.append(
                    f"{class_id} {(x0 + w / 2) / 64} {(y0 + h / 2) / 48} {w / 64} {h / 48}"
                )
            Image.fromarray(image).save(root / split / "images" / f"{split}{index}.png")
            (root / split / "labels" / f"{split}{index}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(
        "train: train/images\nval: valid/images\nnc: 2\nnames: ['blue', 'red']\n"
    )
    return root / "data.yaml"


def test_one_command_from_an_export_to_a_scored_run_and_the_cache_reused(tmp_path, capsys):
    data = _export(tmp_path / "rf")
    cache_dir = tmp_path / "cache"
    common = ["--data", str(data), "--input-size", str(SIZE), "--copies", "1", "--gpus", "0"]
    common += ["--cache-dir", str(cache_dir), "--batch-size", "4", "--progress", "off"]
    run = tmp_path / "run"
    assert train_tool.main([*common, "--epochs", "2", "--log-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "records: preprocessing into" in out and "anchors: 6 fitted to 20 boxes" in out
    assert "validation: 3 images, the val split of" in out
    assert "(picked by 0.9 AP + 0.1 AP50 on the validation images)" in out
    (folder,) = cache_dir.iterdir()
    assert (folder / "anchors-6.txt").exists()
    # Best by fitness, from the epochs' own logs.
    history = read_history(run)
    scored = [r for r in history if FITNESS_KEY in r]
    assert scored, history
    best = read_metadata(str(run / "checkpoints" / "best.weights.h5"))
    assert best["epoch"] == max(scored, key=lambda r: r[FITNESS_KEY])["epoch"]
    # results.csv holds the history, row for row.
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [r["epoch"] for r in history]
    for row, record in zip(rows, history):
        assert float(row["loss"]) == record["loss"]
        assert (row["val_AP"] and float(row["val_AP"])) == record.get("val_AP", "")
    assert Image.open(run / "results.png").size[0] > 200
    report = json.loads((run / "val" / "metrics.json").read_text())
    assert report["num_images"] == 3 and (run / "val" / "confusion_matrix.png").exists()
    assert len(report["confusion"]["matrix"]) == 3  # 2 classes and background

    # The same command again: nothing preprocessed, the same folder and anchors.
    again = tmp_path / "again"
    assert train_tool.main([*common, "--epochs", "1", "--log-dir", str(again)]) == 0
    out = capsys.readouterr().out
    assert "nothing to preprocess" in out and "fitted before" in out
    assert [p.name for p in cache_dir.iterdir()] == [folder.name]

    # The cache is what yolo3 preprocess writes with the same settings.
    manual = tmp_path / "manual"
    argv = ["--data", str(data), "--input-size", str(SIZE), "--copies", "1", "--quiet"]
    assert preprocess_tool.main([*argv, "--output", str(manual)]) == 0
    shards = sorted(p.name for p in manual.glob("*.tfrecord"))
    assert shards and shards == sorted(p.name for p in folder.glob("*.tfrecord"))
    assert all((manual / n).read_bytes() == (folder / n).read_bytes() for n in shards)

    # An edited label file is another dataset: another folder.
    label = tmp_path / "rf" / "train" / "labels" / "train0.txt"
    label.write_text(label.read_text().splitlines()[0] + "\n")
    config = PreprocessConfig(output=str(cache_dir), input_size=(SIZE, SIZE), data=str(data))
    prepared = cache.prepare(config, cache_dir=cache_dir, log=lambda line: None)
    assert prepared.built and prepared.records != str(folder)


def test_train_names_the_missing_data_and_several_workers_do_not_build(tmp_path, capsys):
    assert train_tool.main(["--log-dir", str(tmp_path / "r")]) == 2
    assert "error: give the data: --data PATH" in capsys.readouterr().err
    data = _export(tmp_path / "rf", counts=(3, 1))
    config = PreprocessConfig(output="", input_size=(SIZE, SIZE), data=str(data))
    try:
        cache.prepare(config, cache_dir=tmp_path / "c", num_workers=2, log=lambda line: None)
    except ValueError as error:
        assert "2 workers would all build it" in str(error) and "yolo3 preprocess" in str(error)
    else:
        raise AssertionError("several workers built the cache")


def test_best_weights_are_those_of_the_best_fitness_not_the_lowest_loss(tmp_path):
    body = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    checkpoint = TemplateCheckpoint(tmp_path, body, monitor=FITNESS_KEY, mode="max")
    checkpoint.set_model(body)
    checkpoint.on_train_begin()
    epochs = [
        {"loss": 2.0, "val_loss": 0.5, "val_AP": 0.10, "val_AP50": 0.30},  # lowest loss
        {"loss": 1.0, "val_loss": 0.9, "val_AP": 0.40, "val_AP50": 0.60},  # best AP
        {"loss": 0.5, "val_loss": 0.7},  # not scored: no candidate
        {"loss": 0.4, "val_loss": 0.8, "val_AP": 0.35, "val_AP50": 0.90},  # AP50 alone higher
    ]
    best_so_far = []
    for epoch, logs in enumerate(epochs):
        score = fitness(logs)
        if score is not None:
            logs[FITNESS_KEY] = score
        checkpoint.on_epoch_end(epoch, logs)
        best_so_far.append(read_metadata(str(tmp_path / "best.weights.h5"))["epoch"])
    assert fitness(epochs[3]) == 0.9 * 0.35 + 0.1 * 0.90
    assert best_so_far == [1, 2, 2, 2]
    assert read_metadata(str(tmp_path / "last.weights.h5"))["epoch"] == 4
    # A tie goes to the later epoch (early on, AP is 0 for several epochs).
    checkpoint.on_epoch_end(4, {"loss": 0.3, "val_loss": 0.9, FITNESS_KEY: fitness(epochs[1])})
    assert read_metadata(str(tmp_path / "best.weights.h5"))["epoch"] == 5


def test_the_ap_pass_runs_every_k_epochs_when_it_costs_over_a_tenth_of_one():
    lines = []
    evaluation = MapEvaluation(None, None, split="val", head=None, every=None, log=lines.append)
    evaluation.set_params({"epochs": 10})
    assert all(evaluation._due(epoch) for epoch in range(10))
    evaluation._pace(spent=1.0, epoch_seconds=20.0)  # 5%: each epoch
    assert evaluation.every is None and not lines
    evaluation._evaluated = 1
    evaluation._pace(spent=5.0, epoch_seconds=20.0)  # 25%: every 3 epochs
    assert evaluation.every == 3 and lines[-1].startswith("AP every 3 epochs and at the last")
    assert [evaluation._due(e) for e in (1, 2, 3)] == [False, False, True]  # epochs 2-4
    evaluation._pace(spent=1.0, epoch_seconds=20.0)  # cheaper once traced: each epoch again
    assert evaluation.every is None and lines[-1].startswith("AP each epoch")
    fixed = MapEvaluation(None, None, split="val", head=None, every=2)
    fixed.set_params({"epochs": 5})
    assert [e + 1 for e in range(5) if fixed._due(e)] == [2, 4, 5]
