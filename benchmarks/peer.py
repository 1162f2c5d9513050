"""The recipe benchmark's peer: Ultralytics' YOLOv3-tiny on the same images, scored by our code.

Ultralytics is never a dependency of ``yolo3``: it lives in an environment of its own,
``.venv-ultralytics`` (``benchmarks/make_peer_env.sh``, pins in
``benchmarks/peer-requirements.txt``), and runs there as ``benchmarks/peer_train.py``. This
module runs in ours and imports neither torch nor Ultralytics. Three steps:

1. :func:`convert_dataset`: our annotation files (read by :mod:`yolo3.data.annotations`) as an
   Ultralytics YOLO layout: images symlinked, one label file per image, ``data.yaml``, and the
   list of the original validation images the peer predicts on.
2. :func:`start_training`: ``peer_train.py`` in a process of its own, pinned to one core with one
   thread, as :func:`benchmarks.recipe.yolo3_process` runs ours. It trains from scratch with
   Ultralytics' own recipe (augmentation, schedule, loss), then detects on the original
   validation images with our scoring thresholds and writes ``detections.json``.
3. :func:`score_detections`: that file against ``val.txt`` with :mod:`yolo3.evaluation.metrics`,
   the ground truth read as ``yolo3 evaluate --annotations`` reads it: the figures of
   :func:`benchmarks.recipe.score`.
"""

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from yolo3.data.annotations import parse_annotations
from yolo3.data.image import load_rgb
from yolo3.evaluation import metrics
from yolo3.model.resources import read_classes

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = ROOT / ".venv-ultralytics" / "bin" / "python"
PEER_TRAIN = ROOT / "benchmarks" / "peer_train.py"
SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class PeerDataset:
    """What :func:`convert_dataset` wrote: ``data_yaml`` for Ultralytics, ``val_images`` (the
    original validation images, one absolute path a line, in ``val.txt``'s order) for
    ``peer_train.py --val-images``, and per split the images kept and the lines skipped."""

    folder: Path
    data_yaml: Path
    val_images: Path
    class_names: tuple
    images: dict
    skipped: dict


def read_split(annotations, num_classes):
    """``(kept, skipped)`` of an annotation file, read as ``yolo3 evaluate --annotations`` reads
    it (:func:`yolo3.evaluation.validate.iterate_annotations`, whose module starts TensorFlow):
    :func:`~yolo3.data.annotations.parse_annotations`, then each image decoded by
    :func:`~yolo3.data.image.load_rgb` (EXIF-upright) for its size.

    ``kept``: ``(entry, (height, width))`` pairs in file order; ``skipped``: messages of the
    lines the parser rejected and of the images that could not be read.
    """
    entries, rejects, _ = parse_annotations(annotations, num_classes=num_classes)
    skipped = [reject.message for reject in rejects if reject.scope == "line"]
    kept = []
    for entry in entries:
        try:
            image_hw = load_rgb(entry.path).shape[:2]
        except (FileNotFoundError, ValueError) as err:
            skipped.append(f"{entry.source}:{entry.line}: {err}")
            continue
        kept.append((entry, image_hw))
    return kept, skipped


def yolo_labels(boxes, classes, image_hw):
    """Ultralytics label lines of one image: ``class cx cy w h``, normalised by the image's size.

    Args:
        boxes: ``(M, 4)`` ``x_min, y_min, x_max, y_max`` in original pixels.
        classes: ``(M,)`` int class ids.
        image_hw: ``(height, width)`` of the image in pixels.

    Boxes are clipped to the image first, as ``yolo3 preprocess`` clips them (Ultralytics drops
    a whole image whose label has a coordinate past 1); a box with nothing left inside is dropped.
    """
    height, width = image_hw
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    boxes = np.clip(boxes, 0.0, [width, height, width, height])
    lines = []
    for (x_min, y_min, x_max, y_max), class_id in zip(boxes, classes):
        if x_max <= x_min or y_max <= y_min:
            continue
        centre_x, centre_y = (x_min + x_max) / 2 / width, (y_min + y_max) / 2 / height
        box_w, box_h = (x_max - x_min) / width, (y_max - y_min) / height
        lines.append(f"{int(class_id)} {centre_x:.6f} {centre_y:.6f} {box_w:.6f} {box_h:.6f}")
    return lines


def convert_dataset(train_annotations, val_annotations, classes_path, folder):
    """Writes an Ultralytics YOLO layout of our dataset into ``folder``; a :class:`PeerDataset`.

    ``folder/images/<split>/<index><suffix>`` are symbolic links to the images (numbered in file
    order, so that names never collide), ``folder/labels/<split>/<index>.txt`` their
    :func:`yolo_labels` (empty for a background image), ``folder/data.yaml`` the dataset file.
    Training labels leave difficult boxes out, as our training does; validation labels (only
    Ultralytics' own per-epoch check reads them) keep every box. ``folder``'s ``images`` and
    ``labels`` are written anew, Ultralytics' label caches with them.
    """
    folder = Path(folder).resolve()
    class_names = tuple(read_classes(classes_path))
    for stale in ("images", "labels"):  # labels/ also holds Ultralytics' label caches
        shutil.rmtree(folder / stale, ignore_errors=True)
    images, skipped, val_paths = {}, {}, []
    for split, annotations in zip(SPLITS, (train_annotations, val_annotations)):
        kept, skipped[split] = read_split(annotations, len(class_names))
        image_dir, label_dir = folder / "images" / split, folder / "labels" / split
        image_dir.mkdir(parents=True)
        label_dir.mkdir(parents=True)
        for index, (entry, image_hw) in enumerate(kept):
            source = Path(entry.path).resolve()
            (image_dir / f"{index:06d}{source.suffix}").symlink_to(source)
            use = ~entry.difficult if split == "train" else np.ones(len(entry.classes), bool)
            lines = yolo_labels(entry.boxes[use], entry.classes[use], image_hw)
            (label_dir / f"{index:06d}.txt").write_text("".join(f"{line}\n" for line in lines))
            if split == "val":
                val_paths.append(str(source))
        images[split] = len(kept)
    # JSON is YAML: names of any spelling need no quoting rules of their own.
    dataset = {"path": str(folder), "train": "images/train", "val": "images/val",
               "names": list(class_names)}  # fmt: skip
    data_yaml, val_images = folder / "data.yaml", folder / "val_images.txt"
    data_yaml.write_text(json.dumps(dataset, indent=2) + "\n", encoding="utf-8")
    val_images.write_text("".join(f"{path}\n" for path in val_paths), encoding="utf-8")
    return PeerDataset(folder, data_yaml, val_images, class_names, images, skipped)


def start_training(dataset, output, *, imgsz, epochs, batch=16, seed=0, core=None,
                   time_seconds=None, log=None, python=PEER_PYTHON):  # fmt: skip
    """Starts ``peer_train.py`` on ``dataset`` (a :class:`PeerDataset`) under ``python`` (the peer
    environment's) and returns the ``Popen``; it writes ``output/detections.json``.

    Pinned to ``core`` (``os.sched_setaffinity`` before torch starts) with one OpenMP/MKL thread
    (``peer_train.py`` also holds torch to one thread, which Ultralytics resets); in a process
    group of its own, so :func:`benchmarks.recipe.stop` ends all of it. ``time_seconds``: train
    for that long instead (Ultralytics' ``time``, its schedule fitted to the budget), for a
    comparison at equal wall time. Ultralytics' network checks are off (``YOLO_OFFLINE``), its
    settings file is kept in ``output``. Detections keep what ``yolo3 evaluate`` keeps for
    scoring (:data:`yolo3.evaluation.validate.MAP_SCORE_THRESHOLD` and ``MAP_MAX_DETECTIONS``).
    """
    # The thresholds' one home starts TensorFlow: read only where a run starts.
    from yolo3.evaluation.validate import (  # noqa: PLC0415
        MAP_MAX_DETECTIONS,
        MAP_SCORE_THRESHOLD,
    )

    output = Path(output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    argv = [str(python), str(PEER_TRAIN), "--data", dataset.data_yaml,
            "--val-images", dataset.val_images, "--imgsz", imgsz, "--epochs", epochs,
            "--batch", batch, "--seed", seed, "--output", output,
            "--conf", MAP_SCORE_THRESHOLD, "--max-det", MAP_MAX_DETECTIONS]  # fmt: skip
    if time_seconds is not None:
        argv += ["--time-seconds", time_seconds]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "YOLO_OFFLINE": "1",
           "YOLO_CONFIG_DIR": str(output / "ultralytics-settings")}  # fmt: skip

    def pin():
        if core is not None:
            os.sched_setaffinity(0, {core})

    with open(log or os.devnull, "w") as out:
        return subprocess.Popen(
            [str(arg) for arg in argv], env=env, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=pin, start_new_session=True,
        )  # fmt: skip


def score_detections(detections_path, val_annotations, classes_path, report=None):
    """Scores ``peer_train.py``'s ``detections.json`` against ``val_annotations`` with our code:
    ``{AP, AP50, AP75, mAP50, AP_by_iou}`` (pycocotools' COCO AP, AP50, AP75 and AP at each
    IoU threshold through :func:`~yolo3.evaluation.metrics.evaluate_coco`; all-point VOC
    mAP@0.5 through :func:`~yolo3.evaluation.metrics.evaluate_voc`), as
    :func:`benchmarks.recipe.score` reads them.

    ``report``: the file's content, when the caller has read it already. The file's images
    must be exactly the validation images :func:`read_split` keeps (matched
    by resolved path): a missing or extra image is a ValueError, since either would change the
    score without saying so.
    """
    class_names = read_classes(classes_path)
    kept, _ = read_split(val_annotations, len(class_names))
    found = {
        os.path.realpath(image["path"]): image
        for image in (report or json.loads(Path(detections_path).read_text()))["images"]
    }
    truths, detections = [], []
    for entry, image_hw in kept:
        path = os.path.realpath(entry.path)
        truths.append({"boxes": entry.boxes, "classes": entry.classes,
                       "difficult": entry.difficult, "image_hw": image_hw})  # fmt: skip
        image = found.pop(path, None)
        if image is None:
            raise ValueError(f"{detections_path} has no detections entry for {path}")
        detections.append({
            "boxes": np.asarray(image["boxes"], np.float64).reshape(-1, 4),
            "scores": np.asarray(image["scores"], np.float64),
            "classes": np.asarray(image["classes"], np.int64),
        })  # fmt: skip
    if found:
        raise ValueError(
            f"{detections_path} has {len(found)} images that {val_annotations} does not keep "
            f"(first: {next(iter(found))})"
        )
    num_classes = len(class_names)
    coco = metrics.evaluate_coco(truths, detections, num_classes=num_classes,
                                 class_names=class_names)  # fmt: skip
    voc = metrics.evaluate_voc(truths, detections, num_classes=num_classes)
    return {"AP": coco["AP"], "AP50": coco["AP50"], "AP75": coco["AP75"], "mAP50": voc.mean_ap,
            metrics.AP_BY_IOU: coco[metrics.AP_BY_IOU]}  # fmt: skip
