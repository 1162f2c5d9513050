"""Plots of the benchmark figures, drawn from the JSON that ``tools/benchmark.py ... --json``
writes (the files in ``docs/data/``).

    python docs/plots.py --output plots/        # one SVG per plot, outside a site build

The site build (docs/hooks.py) calls :func:`draw_all` and puts the SVGs on the Benchmarks
page, each with the command and machine recorded in its JSON, so a figure on the page is
always the one in the file. Every value drawn is read from a JSON file; nothing is typed in
here. A kind of benchmark with no JSON file in the folder is left out.

- ``scaling``: scaling efficiency by setting and link (one JSON file per ``--link``);
- ``detect``: median latency at batch 1 by engine, one core and all cores;
- ``prediction``: the link model's efficiency of the best setting by workers, link rate and
  round trip (``tools/benchmark.py predict``);
- ``accuracy``: mAP@0.5 against training wall time, one line per setting (the mean over the
  seeds, epoch by epoch), with the target (``tools/benchmark.py accuracy``), one panel per
  JSON file;
- ``matrix``: COCO AP against input size, ours and Ultralytics' YOLOv3-tiny, at equal epochs
  and (where run) ours at the peer's training time (``tools/benchmark.py matrix``);
- ``recipe``: COCO AP against training wall time, one line per setting (the mean over the
  seeds, epoch by epoch; ``tools/benchmark.py recipe``), such as fine-tuning from the COCO
  weights beside training from scratch; one panel per JSON file.
"""

import argparse
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
# The same bytes for the same JSON: SVG ids from a fixed salt, no date in the file.
plt.rcParams["svg.hashsalt"] = "keras-yolo3"
plt.rcParams["svg.fonttype"] = "none"

ENGINE_NAMES = {
    "keras": "Keras Detector",
    "saved_model": "SavedModel",
    "onnx": "ONNX (onnxruntime)",
    "tflite": "TFLite float32",
    "tflite-float16": "TFLite float16",
    "tflite-int8": "TFLite int8",
    "opencv": "OpenCV dnn",
}


@dataclass
class Figure:
    name: str
    title: str
    svg: bytes
    sources: list  # (json file name, command, machine text)

    def markdown(self, image_dir):
        lines = [f"### {self.title}", "", f"![{self.title}]({image_dir}/{self.name}.svg)", ""]
        for file_name, command, machine in self.sources:
            lines += [f"From `docs/data/{file_name}`, {machine}:", ""]
            lines += ["```bash", command, "```", ""]
        return "\n".join(lines)


def _machine(result):
    machine = result.get("machine", {})
    cpu = machine.get("cpu") or "unknown CPU"
    gpus = machine.get("gpus") or []
    where = f"{machine.get('cores', '?')} cores, {cpu}"
    if gpus:
        where += f", {len(gpus)} GPU(s)"
    load = result.get("load_average_start")
    if load:
        where += f", load average {load[0]:.1f} at the start"
    return where


def load_results(data_dir):
    """``{kind: [(path, result)]}`` of the benchmark JSON files in ``data_dir``, told apart by
    their contents."""
    found = {
        kind: [] for kind in ("scaling", "detect", "prediction", "accuracy", "matrix", "recipe")
    }
    for path in sorted(Path(data_dir).glob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        if "communication" in result:
            found["scaling"].append((path, result))
        elif "export_seconds" in result:
            found["detect"].append((path, result))
        elif "assumed" in result:
            found["prediction"].append((path, result))
        elif "target" in result:
            found["accuracy"].append((path, result))
        elif "cells" in result:
            found["matrix"].append((path, result))
        elif any(row.get("curve") for row in result.get("settings", ())):
            found["recipe"].append((path, result))
    return found


def _svg(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return buffer.getvalue()


def setting_label(setting):
    """The train flags of one ``--settings`` entry, ``[K, dtype, rank, local, overlap]``."""
    accumulate, dtype, rank, local, overlap = setting
    parts = []
    if accumulate > 1:
        parts.append(f"--accumulate {accumulate}")
    if rank:
        parts += ["--compress powersgd", f"--rank {rank}"]
    if local:
        parts.append(f"--local-steps {local}")
    if overlap:
        parts.append(f"--overlap-sync {overlap}")
    if not parts:
        parts.append("plain")
    return "\n".join(parts + [dtype])


def scaling_figure(results):
    """Scaling efficiency of each setting, one bar per link, with each run's ceiling."""
    links = []
    table = {}  # setting label -> {link: efficiency}
    ceilings = {}
    for _, result in results:
        link = result["config"]["link"]
        links.append(link)
        keys = [key for key in result["ratios"] if key != "ceiling"]
        for setting, key in zip(result["config"]["settings"], keys):
            table.setdefault(setting_label(setting), {})[link] = result["ratios"][key]["value"]
        ceilings[link] = result["ratios"]["ceiling"]["value"]
    labels = list(table)
    width = 0.8 / len(links)
    figure, axes = plt.subplots(figsize=(max(6, 2.0 * len(labels)), 4.5))
    for index, link in enumerate(links):
        xs = [i + (index - (len(links) - 1) / 2) * width for i in range(len(labels))]
        values = [table[label].get(link, float("nan")) for label in labels]
        bars = axes.bar(xs, values, width, label=f"link {link}")
        axes.bar_label(bars, fmt="%.2f", fontsize=8)
        axes.axhline(ceilings[link], linestyle="--", linewidth=1, color=bars[0].get_facecolor())
    axes.set_xticks(range(len(labels)), labels, fontsize=8)
    axes.set_ylabel("scaling efficiency, 2 workers")
    axes.set_ylim(0, 1.1)
    axes.legend(title="dashed: the run's ceiling", fontsize=8, title_fontsize=8)
    axes.set_title("Scaling efficiency by setting and link")
    return _svg(figure)


def detect_figure(results):
    """Median latency at batch 1 of each engine, on one core and on all cores."""
    rows = [row for _, result in results for row in result["rows"]]
    models = sorted({row["model"] for row in rows})
    figure, all_axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for axes, model in zip(all_axes[0], models):
        model_rows = [row for row in rows if row["model"] == model and "1" in row["batches"]]
        engines = list(dict.fromkeys(row["engine"] for row in model_rows))
        threads = sorted({row["threads"] for row in model_rows})
        height = 0.8 / len(threads)
        for index, thread_count in enumerate(threads):
            by_engine = {
                row["engine"]: row["batches"]["1"]["median_ms"]
                for row in model_rows
                if row["threads"] == thread_count
            }
            ys = [i + (index - (len(threads) - 1) / 2) * height for i in range(len(engines))]
            values = [by_engine.get(engine, float("nan")) for engine in engines]
            cores = "1 core" if thread_count == 1 else f"{thread_count} cores"
            bars = axes.barh(ys, values, height, label=cores)
            axes.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
        axes.set_yticks(range(len(engines)), [ENGINE_NAMES.get(e, e) for e in engines])
        axes.invert_yaxis()
        axes.set_xlabel("median ms per call, batch 1 (lower is faster)")
        axes.set_title(f"{model}: latency by engine")
        axes.legend(fontsize=8)
    return _svg(figure)


def prediction_figure(results):
    """Predicted efficiency of each cell's best setting against the workers, one line per
    link rate (solid: 0.1 ms round trip; dashed: 25 ms), one panel per model."""
    rows = [row for _, result in results for row in result["rows"]]
    models = list(dict.fromkeys(row["model"] for row in rows))
    figure, all_axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for axes, model in zip(all_axes[0], models):
        links = list(dict.fromkeys(row["link"] for row in rows))
        for index, link in enumerate(links):
            color = f"C{index}"
            for rtt, style in (("0.1 ms", "-"), ("25 ms", "--")):
                cells = [r for r in rows if (r["model"], r["link"], r["rtt"]) == (model, link, rtt)]
                workers = [r["workers"] for r in cells]
                best = [r["efficiency"][r["recommended"]] for r in cells]
                axes.plot(workers, best, style, color=color, marker="o",
                          label=f"{link}, {rtt}")  # fmt: skip
        axes.set_xscale("log", base=2)
        axes.set_xticks(
            sorted({r["workers"] for r in rows}),
            [str(w) for w in sorted({r["workers"] for r in rows})],
        )
        axes.set_ylim(0, 1.05)
        axes.set_xlabel("workers (one GPU each, a link each)")
        axes.set_ylabel("predicted efficiency, best setting")
        axes.set_title(f"{model}: predicted by the link model")
        axes.legend(fontsize=7, ncol=2)
    return _svg(figure)


def accuracy_figure(results):
    """mAP@0.5 against wall time of each setting (the mean over its seeds at each epoch
    end), the target dashed; one panel per run of the benchmark."""
    columns = min(len(results), 2)
    rows = math.ceil(len(results) / columns)
    figure, all_axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.5 * rows), squeeze=False)
    for axes in all_axes.flat[len(results) :]:
        axes.set_visible(False)
    for axes, (_, result) in zip(all_axes.flat, results):
        config = result["config"]
        for row in result["settings"]:
            curve = row["curve"]
            seconds = [point["seconds"] / 60 for point in curve]
            axes.plot(seconds, [point["mAP50"] for point in curve], marker="o",
                      markersize=3, label=f"{row['setting']} ({row['seeds']} seeds)")  # fmt: skip
        axes.axhline(result["target"], linestyle="--", linewidth=1, color="grey")
        where = (
            f"{config['replicas']} workers over {config['link']}"
            if config["link"] != "none"
            else f"{config['replicas']} replicas on one core"
        )
        axes.set_xlabel("training wall time, minutes (mAP scoring excluded)")
        axes.set_ylabel("mAP@0.5, validation split")
        axes.set_title(f"{where}, global batch {config['global_batch']}", fontsize=10)
        axes.legend(fontsize=7, title="dashed: the target", title_fontsize=7)
    return _svg(figure)


MATRIX_SIDES = {
    "ours": ("yolo3 train (the recipe)", "-"),
    "peer": ("Ultralytics YOLOv3-tiny", "--"),
    "ours-at-peer-time": ("yolo3 train for the peer's time", ":"),
}


def matrix_figure(results):
    """COCO AP against input size: one line per side and training-set size (the mean over
    the seeds, half their range as the error bar), at equal epochs; one panel per file."""
    figure, all_axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axes, (_, result) in zip(all_axes.flat, results):
        counts = sorted({row["train_images"] for row in result["cells"]})
        for side, (label, style) in MATRIX_SIDES.items():
            for index, count in enumerate(counts):
                rows = sorted(
                    (row for row in result["cells"]
                     if row["side"] == side and row["train_images"] == count),
                    key=lambda row: row["input_size"],
                )  # fmt: skip
                if not rows:
                    continue
                axes.errorbar(
                    [row["input_size"] for row in rows], [row["AP"] for row in rows],
                    yerr=[row["AP_half_range"] for row in rows], linestyle=style, marker="o",
                    markersize=4, capsize=3, color=f"C{index}",
                    label=f"{label}, {count:,} images",
                )  # fmt: skip
        epochs = result["config"]["epochs"]
        axes.set_xlabel("input size (px; the images made at that size)")
        axes.set_ylabel("COCO AP@[.5:.95], original validation images")
        axes.set_title(
            f"{epochs} epochs each (dotted: the peer's time), batch 16, one core a run",
            fontsize=10,
        )
        axes.legend(fontsize=7)
    return _svg(figure)


def recipe_figure(results):
    """COCO AP on the validation split against training wall time, one line per setting (the
    mean over its seeds at each epoch end, each run with its own schedule); one panel per
    run of the benchmark."""
    figure, all_axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axes, (_, result) in zip(all_axes.flat, results):
        config = result["config"]
        for row in result["settings"]:
            curve = row.get("curve") or []
            axes.plot([point["seconds"] / 60 for point in curve],
                      [point["AP"] for point in curve], marker="o", markersize=3,
                      label=f"{row['setting']} ({row['seeds']} seeds)")  # fmt: skip
        axes.set_xlabel("training wall time, minutes (one core a run)")
        axes.set_ylabel("COCO AP@[.5:.95], validation split")
        axes.set_title(
            f"{config['input_size']} px, {config['train_images']:,} images, batch 16", fontsize=10
        )
        axes.legend(fontsize=7)
    return _svg(figure)


def draw_all(data_dir=HERE / "data"):
    """Every plot whose JSON is in ``data_dir``, as :class:`Figure` objects."""
    found = load_results(data_dir)
    figures = []
    for kind, title, draw in (
        ("scaling", "Scaling efficiency by link and setting", scaling_figure),
        ("detect", "Latency by engine", detect_figure),
        ("prediction", "Predicted efficiency at 16 to 256 workers", prediction_figure),
        ("accuracy", "Time to accuracy by setting", accuracy_figure),
        ("matrix", "The recipe against Ultralytics' YOLOv3-tiny by input size", matrix_figure),
        ("recipe", "Settings of the recipe against training time", recipe_figure),
    ):
        results = found[kind]
        if not results:
            continue
        sources = [(path.name, result["command"], _machine(result)) for path, result in results]
        figures.append(Figure(kind, title, draw(results), sources))
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(HERE / "data"), help="folder of benchmark JSON")
    parser.add_argument("--output", required=True, help="folder for the SVG files")
    args = parser.parse_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    for figure in draw_all(args.data):
        (output / f"{figure.name}.svg").write_bytes(figure.svg)
        print(output / f"{figure.name}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
