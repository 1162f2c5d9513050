"""results.csv and results.png from a run's history.jsonl."""

import csv
import json

from PIL import Image

from yolo3.callbacks import EpochHistory, ResultsFiles, write_results
from yolo3.callbacks.results import PANEL_SIZE, result_columns

# Three epochs as EpochHistory writes them (keys sorted); the first without validation, the
# third evaluated, with an extra figure no group names.
HISTORY = [
    {"epoch": 1, "seconds": 12.5, "class_loss": 3.25, "images_per_second": 40.1,
     "learning_rate": 0.001, "loss": 20.75, "objectness_loss": 9.5, "wh_loss": 4.0,
     "xy_loss": 4.0},
    {"epoch": 2, "seconds": 24.875, "class_loss": 2.5, "images_per_second": 41.3,
     "learning_rate": 0.0009, "loss": 15.1, "objectness_loss": 7.0, "val_class_loss": 2.75,
     "val_loss": 16.2, "val_objectness_loss": 7.5, "val_wh_loss": 3.0, "val_xy_loss": 2.95,
     "wh_loss": 3.0, "xy_loss": 2.6},
    {"epoch": 3, "seconds": 37.0, "class_loss": 2.0, "images_per_second": 41.0,
     "learning_rate": 0.00081, "loss": 12.0, "objectness_loss": 6.0, "step_wait": 0.01,
     "val_AP": 0.125, "val_class_loss": 2.25, "val_loss": 13.5, "val_mAP50": 0.3,
     "val_objectness_loss": 6.5, "val_wh_loss": 2.5, "val_xy_loss": 2.25, "wh_loss": 2.0,
     "xy_loss": 2.0},
]  # fmt: skip
COLUMNS = [
    "epoch", "seconds",
    "loss", "xy_loss", "wh_loss", "objectness_loss", "class_loss",
    "val_loss", "val_xy_loss", "val_wh_loss", "val_objectness_loss", "val_class_loss",
    "learning_rate", "images_per_second",
    "val_AP", "val_mAP50",
    "step_wait",
]  # fmt: skip


def write_history(folder, records):
    (folder / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def read_csv(folder):
    with open(folder / "results.csv", newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_columns_are_grouped_in_order():
    assert result_columns(HISTORY) == COLUMNS
    # Terms of another box loss, and a loss no list names, keep to their groups.
    extra = [{"epoch": 1, "box_loss": 1.0, "loss": 2.0, "aux_loss": 0.5, "val_box_loss": 1.0}]
    assert result_columns(extra) == ["epoch", "loss", "box_loss", "aux_loss", "val_box_loss"]
    assert result_columns([]) == []


def test_csv_holds_the_history_exactly(tmp_path):
    write_history(tmp_path, HISTORY)
    write_results(tmp_path)
    rows = read_csv(tmp_path)
    assert rows[0] == COLUMNS and len(rows) == 1 + len(HISTORY)
    for record, row in zip(HISTORY, rows[1:]):
        cells = dict(zip(COLUMNS, row))
        assert {key for key, cell in cells.items() if cell} == set(record)
        for key, value in record.items():
            assert float(cells[key]) == value, key  # written as Python writes it: exact
    assert rows[1][COLUMNS.index("val_loss")] == ""  # epoch 1 was not validated
    assert rows[1][0] == "1" and rows[3][COLUMNS.index("val_mAP50")] == "0.3"


def test_picture_has_a_plot_per_column(tmp_path):
    write_history(tmp_path, HISTORY)
    write_results(tmp_path)
    with Image.open(tmp_path / "results.png") as image:
        image.load()
    # Every column but epoch and seconds: 15 plots, 5 a row.
    assert image.size == (5 * PANEL_SIZE[0], 3 * PANEL_SIZE[1])
    # Something is drawn in the last panel (step_wait), not only the background.
    last = image.crop((4 * PANEL_SIZE[0], 2 * PANEL_SIZE[1], *image.size))
    assert len(last.getcolors(maxcolors=10000) or range(10001)) > 2


def test_a_new_epoch_rewrites_the_files(tmp_path):
    write_history(tmp_path, HISTORY)
    write_results(tmp_path)
    fourth = {**HISTORY[2], "epoch": 4, "seconds": 50.0, "loss": 11.0}
    write_history(tmp_path, [*HISTORY, fourth])
    write_results(tmp_path)
    rows = read_csv(tmp_path)
    assert len(rows) == 5 and rows[4][:3] == ["4", "50.0", "11.0"]
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave nothing behind


def test_callback_writes_the_files_after_epoch_history(tmp_path):
    history = EpochHistory(tmp_path)
    results = ResultsFiles(tmp_path)
    for epoch, logs in enumerate([{"loss": 3.0, "xy_loss": 1.0}, {"loss": 2.0, "val_loss": 2.5}]):
        history.on_epoch_end(epoch, logs)
        results.on_epoch_end(epoch, logs)
    rows = read_csv(tmp_path)
    assert rows[0] == ["epoch", "seconds", "loss", "xy_loss", "val_loss"]
    assert [row[0] for row in rows[1:]] == ["1", "2"]
    assert [row[4] for row in rows[1:]] == ["", "2.5"]
    assert (tmp_path / "results.png").is_file()
    # Given the history callback, it takes its records without reading the file.
    (tmp_path / "history.jsonl").unlink()
    ResultsFiles(tmp_path, history=history).on_epoch_end(1)
    assert len(read_csv(tmp_path)) == 3


def test_no_history_writes_an_empty_table_and_an_empty_plot(tmp_path):
    write_results(tmp_path)
    assert read_csv(tmp_path) == [[]]
    with Image.open(tmp_path / "results.png") as image:
        assert image.size == PANEL_SIZE
