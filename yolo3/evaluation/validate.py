"""Scoring a trained model on a validation set: detections, VOC and COCO mAP, pictures.

Sources of ground truth:

- a record set (``yolo3 preprocess`` output): its validation split, already letterboxed
  to the training size; boxes and detections are in that frame;
- an annotation file (keras-yolo3 lines): the original images at their own sizes; the
  detector letterboxes them and maps its boxes back to original pixels.

:func:`evaluate_model` runs the detector and scores it; :func:`write_report` writes the
per-class table, a JSON summary, one precision-recall curve per class, a gallery and the
confusion matrix.
"""

import contextlib
import dataclasses
import io
import json
import math
import os

import numpy as np

from yolo3 import fileio
from yolo3.data import annotations as annotations_io
from yolo3.data import records
from yolo3.data.image import load_rgb
from yolo3.evaluation import metrics as evaluate
from yolo3.evaluation import plots
from yolo3.evaluation.confusion import ConfusionMatrix
from yolo3.fileio import atomic_write
from yolo3.inference.detect import Detector
from yolo3.inference.detector_spec import BOX_MERGE, NMS_IOU_THRESHOLD

# Detections kept per image and the lowest score considered: mAP integrates precision over
# all recall levels, so low-scoring detections count (COCO and VOC practice).
MAP_SCORE_THRESHOLD = 0.01
MAP_MAX_DETECTIONS = 100


@dataclasses.dataclass
class Evaluation:
    """What :func:`evaluate_model` measured."""

    voc: evaluate.VocResult  # all-point AP at IoU 0.5
    voc07: evaluate.VocResult  # VOC2007 11-point AP at IoU 0.5
    coco: dict | None  # pycocotools metrics, or None when not asked for
    num_images: int
    class_names: list
    gallery: list = dataclasses.field(default_factory=list)  # (image, truth, detection)
    skipped: list = dataclasses.field(default_factory=list)  # messages of unusable inputs
    # Which class each true box was taken for (yolo3.evaluation.confusion); None only for an
    # Evaluation built by hand.
    confusion: ConfusionMatrix | None = None

    @property
    def map50(self):
        return self.voc.mean_ap

    def summary(self):
        """The headline numbers as a flat dict (for logs and TensorBoard)."""
        figures = {"mAP50": self.voc.mean_ap, "mAP50_voc07": self.voc07.mean_ap}
        for name, value in (self.coco or {}).items():
            if isinstance(value, float):
                figures[f"coco_{name}"] = value
        return figures


def iterate_annotations(path, num_classes, image_root=None, skipped=None):
    """Yields ``(image, truth)`` from an annotation file, boxes in original pixels.

    Lines the parser rejects and images that cannot be read are left out; their messages
    are appended to ``skipped`` when a list is given.
    """
    entries, rejects, _ = annotations_io.parse_annotations(
        path, num_classes=num_classes, image_root=image_root
    )
    if skipped is not None:
        skipped.extend(reject.message for reject in rejects if reject.scope == "line")
    for entry in entries:
        try:
            image = load_rgb(entry.path)
        except (FileNotFoundError, ValueError) as err:
            if skipped is not None:
                skipped.append(f"{entry.source}:{entry.line}: {err}")
            continue
        yield (
            image,
            {
                "boxes": entry.boxes,
                "classes": entry.classes,
                "difficult": entry.difficult,
                "image_hw": image.shape[:2],
            },
        )


def source_classes(source, classes_path=None):
    """Class names of a record set (its manifest) or of a classes file."""
    if records.is_record_set(source):
        return records.open_record_set(source).classes
    if classes_path is None:
        raise ValueError(f"{source} is an annotation file: give the classes file (--classes)")
    from yolo3.model.resources import read_classes  # noqa: PLC0415

    return read_classes(classes_path)


def evaluate_model(model, source, *, head, resampling="bicubic", **options):
    """Detects with a Keras model on every image of ``source`` and scores the detections.

    Args:
        model: a ``yolo_body`` / ``tiny_yolo_body`` with its weights.
        source: a :class:`yolo3.data.records.RecordSet`, a record-set folder or an annotation file.
        head: the :class:`yolo3.model.head.HeadSpec` the model was trained with (classes,
            anchors, levels, grid sensitivity). A record set's images are at its own input
            size; an annotation file's are letterboxed to the model's input size, else the
            head's.
        resampling: how images are letterboxed (see :class:`yolo3.inference.detect.Detector`); a
            record set's images are already at the input size.
        **options: the NMS of the detections scored (``iou_threshold``, ``box_merge``: see
            :func:`model_detector`) and :func:`evaluate_detector`'s keywords.
    """
    nms = {key: options.pop(key) for key in NMS_OPTIONS if key in options}
    detector, source = model_detector(model, source, head=head, resampling=resampling, **nms)
    return evaluate_detector(detector, source, **options)


# The keywords of model_detector that evaluate_model passes on to it.
NMS_OPTIONS = ("iou_threshold", "box_merge")


def model_detector(
    model,
    source,
    *,
    head,
    resampling="bicubic",
    iou_threshold=NMS_IOU_THRESHOLD,
    box_merge=BOX_MERGE,
):
    """``(detector, source)``: :func:`evaluate_model`'s detector of ``model`` for ``source``
    (a record set opened once), for scoring the same model again and again without building
    and tracing a detector each time (the training's AP pass): the detector reads the
    model's variables as they are at each call. ``iou_threshold`` and ``box_merge``: its NMS
    (:func:`yolo3.inference.postprocess.batched_nms`)."""
    if records.is_record_set(source):
        source = records.open_record_set(source)
        input_hw = source.input_hw
    else:
        input_hw = None
    detector = Detector.from_model(
        model,
        head,
        input_size=input_hw,
        score_threshold=MAP_SCORE_THRESHOLD,
        iou_threshold=iou_threshold,
        max_detections=MAP_MAX_DETECTIONS,
        box_merge=box_merge,
        resampling=resampling,
    )
    return detector, source


def evaluate_detector(
    detector,
    source,
    *,
    split="val",
    batch_size=16,
    coco=True,
    gallery_size=16,
    limit=None,
    image_root=None,
    progress=None,
):
    """Detects on every image of ``source`` and scores the detections.

    Args:
        detector: anything with ``detect(images)`` and ``class_names``: a
            :class:`yolo3.inference.detect.Detector` or an exported artifact
            (:func:`yolo3.inference.runtime.load_detector`). For figures comparable with
            :func:`evaluate_model`, its score threshold and detection cap should be
            :data:`MAP_SCORE_THRESHOLD` and :data:`MAP_MAX_DETECTIONS`.
        source: a :class:`yolo3.data.records.RecordSet`, a record-set folder or an annotation file.
        split: which split of a record set.
        batch_size: images per ``detect`` call.
        coco: also compute COCO metrics with pycocotools.
        gallery_size: images (with truth and detections) kept for :func:`write_report`.
        limit: evaluate only the first ``limit`` images.
        image_root: the folder relative paths of an annotation file start from.
        progress: a callable given the number of images done after each batch.
    """
    class_names = detector.class_names
    skipped = []
    if records.is_record_set(source):
        pairs = records.iterate_records(records.open_record_set(source), split)
    else:
        pairs = iterate_annotations(source, len(class_names), image_root, skipped)
    truths, detections, gallery, batch = [], [], [], []

    def flush():
        found = detector.detect([image for image, _ in batch])
        for (image, truth), detection in zip(batch, found):
            truths.append(truth)
            detections.append(detection)
            if len(gallery) < gallery_size:
                gallery.append((image, truth, detection))
        batch.clear()
        if progress:
            progress(len(truths))

    for index, pair in enumerate(pairs):
        if limit is not None and index >= limit:
            break
        batch.append(pair)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    if not truths:
        raise ValueError(f"{source} ({split}) has no images to evaluate")
    num_classes = len(class_names)
    voc = evaluate.evaluate_voc(truths, detections, num_classes=num_classes)
    voc07 = evaluate.evaluate_voc(truths, detections, num_classes=num_classes, use_11_point=True)
    coco_metrics = None
    if coco:
        coco_metrics = evaluate.evaluate_coco(
            truths, detections, num_classes=num_classes, class_names=class_names
        )
    confusion = ConfusionMatrix.count(truths, detections, num_classes)
    return Evaluation(
        voc, voc07, coco_metrics, len(truths), list(class_names), gallery, skipped, confusion
    )


def evaluate_coco_json(
    model,
    annotation_file,
    images_dir,
    *,
    head,
    resampling="bicubic",
    iou_threshold=NMS_IOU_THRESHOLD,
    box_merge=BOX_MERGE,
    batch_size=16,
    limit=None,
    progress=None,
    data=None,
):
    """Detects on the images of a COCO annotation file and scores against the file itself.

    The file is what pycocotools scores against, unmodified: crowd regions stay crowd
    regions (detections on them are ignored, not false positives), object sizes are the
    file's segmentation areas, and boxes are not rounded. Detections are in original pixels
    with the file's image and category ids (:func:`yolo3.evaluation.metrics.coco_category_ids`).

    Args:
        model: a ``yolo_body`` / ``tiny_yolo_body`` with its weights.
        head: the :class:`yolo3.model.head.HeadSpec` it was trained with; its class names
            are matched to the file's categories.
        annotation_file: e.g. ``instances_val2017.json``.
        images_dir: the folder its ``file_name`` entries are in.
        iou_threshold, box_merge: the NMS of the detections scored
            (:func:`yolo3.inference.postprocess.batched_nms`).
        limit: only the first ``limit`` images in order of id (and only they are scored).
        data: the file's contents when already read (:func:`read_coco_file`).

    Returns:
        ``(results, metrics, num_images)``: the results entries (a results file for the
        evaluation server), :func:`yolo3.evaluation.metrics.score_coco`'s metrics (None for a file
        without annotations, such as test-dev's image info), the image count.
    """
    from pycocotools.coco import COCO  # noqa: PLC0415 - COCO scoring only

    data = read_coco_file(annotation_file) if data is None else data
    # An image-info file (test-dev) lists images without annotations: nothing to score.
    scored = "annotations" in data
    data = {**data, "annotations": data.get("annotations", [])}
    coco_truth = COCO()
    coco_truth.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco_truth.createIndex()
    category_ids = evaluate.coco_category_ids(data["categories"], list(head.class_names))
    detector = Detector.from_model(
        model,
        head,
        score_threshold=MAP_SCORE_THRESHOLD,
        iou_threshold=iou_threshold,
        max_detections=MAP_MAX_DETECTIONS,
        box_merge=box_merge,
        resampling=resampling,
    )
    image_ids = sorted(coco_truth.getImgIds())[:limit]
    if not image_ids:
        raise ValueError(f"{annotation_file} lists no images")
    results = []
    for start in range(0, len(image_ids), batch_size):
        chunk = image_ids[start : start + batch_size]
        images = [_coco_image(coco_truth.imgs[i], images_dir, annotation_file) for i in chunk]
        for image_id, detection in zip(chunk, detector.detect(images)):
            results.extend(evaluate.to_coco_results(image_id, detection, category_ids))
        if progress:
            progress(start + len(chunk))
    metrics = evaluate.score_coco(coco_truth, results, image_ids=image_ids) if scored else None
    return results, metrics, len(image_ids)


def read_coco_file(path):
    """The contents of a COCO annotation (or image-info) file, checked for its keys."""
    try:
        data = json.loads(fileio.read_bytes(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    for key in ("images", "categories"):
        if key not in data:
            raise ValueError(f"{path} has no {key!r}: not a COCO annotation file")
    return data


def _coco_image(info, images_dir, annotation_file):
    """The image of a COCO ``images`` entry; a missing or resized file is an error, since
    leaving an image out would change the score."""
    path = fileio.join(images_dir, info["file_name"])
    image = load_rgb(path)
    expected = (info.get("height"), info.get("width"))
    if None not in expected and tuple(image.shape[:2]) != expected:
        raise ValueError(
            f"{path} is {image.shape[1]}x{image.shape[0]} px but {annotation_file} says "
            f"{expected[1]}x{expected[0]} (image id {info['id']}); use the original images"
        )
    return image


def write_report(evaluation, output_dir, *, curves=True, gallery=True):
    """Writes ``metrics.json``, ``table.txt``, ``pr/<class>.png`` and ``gallery.png``, and for
    an evaluation with a confusion matrix ``confusion_matrix.csv`` and ``confusion_matrix.png``
    (its counts are also in ``metrics.json`` under ``"confusion"``).

    Returns:
        The per-class table as text.
    """
    os.makedirs(output_dir, exist_ok=True)
    names = evaluation.class_names
    table = evaluate.format_table(evaluation.voc, names)
    summary = evaluate.result_to_json(evaluation.voc, names, coco_metrics=evaluation.coco)
    summary["mAP50_voc07"] = evaluation.voc07.mean_ap
    summary["num_images"] = evaluation.num_images
    summary["skipped"] = list(evaluation.skipped)
    confusion = evaluation.confusion
    if confusion is not None:
        summary["confusion"] = confusion.to_json(names)
    fileio.write_json(os.path.join(output_dir, "metrics.json"), json_safe(summary))
    with atomic_write(os.path.join(output_dir, "table.txt")) as temp:
        with open(temp, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    if curves:
        curve_dir = os.path.join(output_dir, "pr")
        os.makedirs(curve_dir, exist_ok=True)
        for class_id, name in enumerate(names):
            ap = evaluation.voc.ap[class_id]
            if not np.isfinite(ap):
                continue
            plots.plot_pr_curve(
                evaluation.voc.recall[class_id],
                evaluation.voc.precision[class_id],
                ap,
                name,
                os.path.join(curve_dir, f"{class_id:03d}-{_file_safe(name)}.png"),
            )
    if confusion is not None:
        fileio.write_text(os.path.join(output_dir, "confusion_matrix.csv"), confusion.to_csv(names))
        plots.plot_confusion_matrix(
            confusion.matrix,
            confusion.labels(names),
            os.path.join(output_dir, "confusion_matrix.png"),
            title=f"rows predicted, columns true; IoU >= {confusion.iou_threshold:g}, "
            f"score >= {confusion.score_threshold:g}; colour: share of the column",
        )
    if gallery and evaluation.gallery:
        images, truths, found = zip(*evaluation.gallery)
        plots.draw_gallery(images, truths, found, names, os.path.join(output_dir, "gallery.png"))
    return table


def _file_safe(name):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def json_safe(value):
    """``value`` with NumPy numbers as Python ones and NaN or infinities as None.

    JSON has no non-finite numbers (``json.dumps`` would write the non-standard ``NaN``);
    an AP is NaN for a class with no ground truth.
    """
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [json_safe(item) for item in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value
