"""The run's history as a table and a picture: ``results.csv`` and ``results.png`` in the log
folder, rewritten from ``history.jsonl`` after every epoch."""

import csv
import io
import math
import os
import re

import keras
from PIL import Image, ImageDraw, ImageFont

from yolo3 import fileio
from yolo3.model.loss import ALL_LOSS_TERMS, term_log_key

from .history import read_history

RESULTS_CSV = "results.csv"
RESULTS_PNG = "results.png"
# Leading columns in this order when present; the x axis of every plot is the epoch.
LEADING = ("epoch", "seconds")
TRAINING_LOSSES = ("loss", *map(term_log_key, ALL_LOSS_TERMS))
VALIDATION_LOSSES = tuple(f"val_{key}" for key in TRAINING_LOSSES)
RATES = ("learning_rate", "images_per_second")
# mAP and AP figures (val_mAP50, val_AP, coco_AP_small), grouped after the rates.
_AP_KEY = re.compile(r"(^|_)m?AP")

PANEL_SIZE = (260, 190)  # width, height of one plot, pixels
PANEL_COLUMNS = 5
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 52, 12, 24, 22
_AXIS, _GRID, _BACKGROUND = (0, 0, 0), (228, 228, 228), (255, 255, 255)
_LINE_COLORS = {"training": (31, 119, 180), "validation": (214, 95, 14), "other": (44, 140, 44)}


def result_columns(records):
    """The columns of ``results.csv`` for ``records`` (dicts of one epoch each).

    ``epoch``, ``seconds``; the training loss and its terms (in :data:`ALL_LOSS_TERMS`'s
    order, then any other ``*_loss`` sorted); the validation losses likewise; the learning
    rate and images/s; mAP and AP figures sorted; anything else sorted. A key any record has
    is a column.
    """
    keys = {key for record in records for key in record}
    columns = [key for key in LEADING if key in keys]

    def take(known, belongs):
        chosen = [key for key in known if key in keys]
        chosen += sorted(k for k in keys if belongs(k) and k not in chosen and k not in columns)
        columns.extend(chosen)

    take(TRAINING_LOSSES, lambda k: k.endswith("_loss") and not k.startswith("val_"))
    take(VALIDATION_LOSSES, lambda k: k.endswith("_loss") and k.startswith("val_"))
    take(RATES, lambda k: False)
    take((), lambda k: bool(_AP_KEY.search(k)))
    take((), lambda k: True)
    return columns


def write_results(log_dir, records=None):
    """Writes ``<log_dir>/results.csv`` and ``<log_dir>/results.png`` (each atomically).

    Args:
        log_dir: the run's folder.
        records: one dict per epoch, oldest first; default ``history.jsonl``'s
            (:func:`yolo3.callbacks.read_history`).

    The CSV has a header row of :func:`result_columns` and one row per record, each number
    written as Python writes it (``float(cell)`` gives it back exactly), an empty cell where
    an epoch lacks a key (validation or mAP on some epochs only). The PNG has one line plot
    per column after ``epoch`` and ``seconds``, against the epoch, :data:`PANEL_COLUMNS`
    plots of :data:`PANEL_SIZE` pixels a row.

    Returns:
        ``(csv path, png path)``.
    """
    log_dir = os.fspath(log_dir)
    records = read_history(log_dir) if records is None else list(records)
    columns = result_columns(records)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([record.get(key, "") for key in columns])
    csv_path = os.path.join(log_dir, RESULTS_CSV)
    fileio.write_text(csv_path, text.getvalue())
    png_path = os.path.join(log_dir, RESULTS_PNG)
    image = results_image(records, [key for key in columns if key not in LEADING])
    with fileio.atomic_write(png_path) as temp:
        image.save(temp, format="PNG")
    return csv_path, png_path


def results_image(records, columns):
    """One line plot per column of ``records`` against their ``epoch``, as an RGB PIL image
    ``min(len(columns), PANEL_COLUMNS) * PANEL_SIZE[0]`` wide (one empty panel for none)."""
    columns = list(columns) or [""]
    per_row = min(len(columns), PANEL_COLUMNS)
    rows = math.ceil(len(columns) / per_row)
    width, height = PANEL_SIZE
    image = Image.new("RGB", (per_row * width, rows * height), _BACKGROUND)
    for index, key in enumerate(columns):
        points = [
            (float(record["epoch"]), value)
            for record in records
            if "epoch" in record and (value := _finite(record.get(key))) is not None
        ]
        panel = _panel(key, points)
        image.paste(panel, (index % per_row * width, index // per_row * height))
    return image


def _panel(title, points):
    """A :data:`PANEL_SIZE` plot of ``points`` ``[(epoch, value)]``: titled, framed, with
    the lowest, middle and highest values and up to five epochs marked."""
    width, height = PANEL_SIZE
    panel = Image.new("RGB", PANEL_SIZE, _BACKGROUND)
    draw = ImageDraw.Draw(panel)
    font = ImageFont.load_default()
    left, top = _MARGIN_LEFT, _MARGIN_TOP
    right, bottom = width - _MARGIN_RIGHT, height - _MARGIN_BOTTOM
    draw.text((width / 2, 4), title, fill=_AXIS, font=font, anchor="ma")
    draw.rectangle((left, top, right, bottom), outline=_AXIS)
    if not points:
        draw.text(((left + right) / 2, (top + bottom) / 2), "no values", fill=_AXIS,
                  font=font, anchor="mm")  # fmt: skip
        return panel
    epochs = [epoch for epoch, _ in points]
    values = [value for _, value in points]
    x_low, x_high = _span(min(epochs), max(epochs))
    y_low, y_high = _span(min(values), max(values))

    def to_pixels(epoch, value):
        x = left + (epoch - x_low) / (x_high - x_low) * (right - left)
        return x, bottom - (value - y_low) / (y_high - y_low) * (bottom - top)

    for value in sorted({min(values), (min(values) + max(values)) / 2, max(values)}):
        y = to_pixels(x_low, value)[1]
        draw.line((left + 1, y, right - 1, y), fill=_GRID)
        draw.line((left - 3, y, left, y), fill=_AXIS)
        draw.text((left - 5, y), f"{value:.3g}", fill=_AXIS, font=font, anchor="rm")
    # Up to five whole epochs, evenly spread, the first and the last among them.
    count = min(5, int(max(epochs) - min(epochs)) + 1)
    step = (max(epochs) - min(epochs)) / max(count - 1, 1)
    for epoch in sorted({round(min(epochs) + i * step) for i in range(count)}):
        x = to_pixels(epoch, y_low)[0]
        draw.line((x, bottom, x, bottom + 3), fill=_AXIS)
        draw.text((x, bottom + 5), f"{epoch:g}", fill=_AXIS, font=font, anchor="ma")
    color = _LINE_COLORS[_kind(title)]
    pixels = [to_pixels(epoch, value) for epoch, value in points]
    if len(pixels) > 1:
        draw.line(pixels, fill=color, width=2, joint="curve")
    # A dot per epoch while they stand apart; a long run's line alone reads better.
    for x, y in pixels if len(pixels) <= 50 else ():
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=color)
    return panel


def _kind(key):
    if key.startswith("val_"):
        return "validation"
    return "training" if key in TRAINING_LOSSES or key.endswith("_loss") else "other"


def _span(low, high):
    """An axis range around ``low .. high`` with a margin of 5 %, and a width for one value."""
    margin = (high - low) * 0.05 or abs(high) * 0.1 or 1.0
    return low - margin, high + margin


def _finite(value):
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class ResultsFiles(keras.callbacks.Callback):
    """Rewrites ``results.csv`` and ``results.png`` (:func:`write_results`) after every epoch.

    It reads the run's records, so it must come after :class:`yolo3.callbacks.EpochHistory`
    in the callback list (Keras calls callbacks in list order), and on the chief only, as
    that one is. A resumed run's files therefore continue the earlier epochs' rows, with the
    epochs trained again replaced, as ``history.jsonl`` keeps them.

    Args:
        log_dir: the run's folder.
        history: the run's :class:`yolo3.callbacks.EpochHistory`, whose records are taken
            as they are; without it, ``history.jsonl`` is read after each epoch.
    """

    def __init__(self, log_dir, *, history=None):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self.history = history

    def on_epoch_end(self, epoch, logs=None):
        records = self.history.records if self.history is not None else None
        write_results(self.log_dir, records)
