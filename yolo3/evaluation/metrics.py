"""Detection accuracy: PASCAL VOC mAP in NumPy, COCO metrics through pycocotools.

Data contract. Images are a sequence (the image id is the position) or a mapping from image id
to entry; detections use the same ids (a sequence of the same length, or a mapping whose keys
are ground-truth ids; a missing id means no detections).

- ground truth, per image: ``{"boxes": (M, 4) float, "classes": (M,) int}`` plus optional
  ``"difficult": (M,) bool`` and, for COCO only, ``"image_hw": (height, width)``.
- detections, per image: ``{"boxes": (K, 4) float, "scores": (K,) float, "classes": (K,) int}``;
  the dicts :meth:`yolo3.inference.detect.Detector.detect` returns fit as they are (other keys are
  ignored).

Boxes are ``x_min, y_min, x_max, y_max`` in original image pixels; class ids are ``0 ..
num_classes - 1``.

IoU is computed on continuous coordinates, ``area = (x_max - x_min) * (y_max - y_min)``. The
VOC devkit treated coordinates as inclusive pixel indices and added 1 to every width and
height; that convention is not used here (as in COCO and modern VOC evaluators), so small boxes
score slightly lower IoUs than under the devkit and numbers can differ from it in the third
decimal. A detection matches a ground-truth box when IoU >= ``iou_threshold`` (the devkit
used ``>``; the two differ only at exact equality).

Nothing here imports TensorFlow.
"""

import contextlib
import copy
import dataclasses
import io
from collections.abc import Mapping

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

TRUE_POSITIVE, FALSE_POSITIVE, IGNORED = 1, 0, -1

# Order of COCOeval.stats for iouType "bbox": AP over IoU .50:.05:.95 unless named, AR at
# 1, 10 and 100 detections per image; small < 32^2 <= medium < 96^2 <= large (box area, px^2).
COCO_METRICS = tuple(
    "AP AP50 AP75 AP_small AP_medium AP_large AR1 AR10 AR100 AR_small AR_medium AR_large".split()
)

# score_coco's key for AP at each of COCOeval's ten IoU thresholds (all areas, 100 detections
# an image): {"0.50": AP, ..., "0.95": AP}, the figures AP averages. Where a detector's AP
# falls off says how tight its boxes are: at 0.90 and 0.95 an edge a pixel or two off fails.
AP_BY_IOU = "AP_by_iou"

NO_GROUND_TRUTH_NOTE = "AP n/a: the class has no (non-difficult) ground truth; excluded from mAP"


def box_iou(boxes_a, boxes_b):
    """IoU of every pair of ``(K, 4)`` and ``(M, 4)`` x_min, y_min, x_max, y_max boxes: ``(K, M)``.

    Continuous coordinates (no +1). Pairs whose union is empty (two zero-area boxes) have IoU 0.
    """
    a = np.asarray(boxes_a, np.float64).reshape(-1, 4)[:, None, :]
    b = np.asarray(boxes_b, np.float64).reshape(-1, 4)[None, :, :]
    inter_w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    inter_h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = inter_w * inter_h
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    union = area_a + area_b - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match_detections(det_boxes, det_scores, gt_boxes, gt_difficult=None, *, iou_threshold=0.5):
    """Labels one image's detections of one class as true positive, false positive or ignored.

    VOC rules: detections are taken by score, highest first (ties in input order); each is
    compared with the ground-truth box it overlaps most. IoU below ``iou_threshold`` -> false
    positive. That box ``difficult`` -> ignored (neither true nor false positive). That box
    already matched by a higher-scored detection -> false positive (a duplicate). Otherwise a
    true positive, and the box is matched. As in the devkit, a detection whose best box is
    taken does not fall back to its second-best box.

    Args:
        det_boxes: ``(K, 4)`` detection boxes. det_scores: ``(K,)`` scores.
        gt_boxes: ``(M, 4)`` ground-truth boxes of the same class and image.
        gt_difficult: ``(M,)`` bool, or None for all False.

    Returns:
        ``(K,)`` int8 in input order: ``TRUE_POSITIVE`` (1), ``FALSE_POSITIVE`` (0) or
        ``IGNORED`` (-1). :func:`match_boxes` also gives the boxes matched.
    """
    labels, _ = match_boxes(
        det_boxes, det_scores, gt_boxes, gt_difficult, iou_threshold=iou_threshold
    )
    return labels


def match_boxes(det_boxes, det_scores, gt_boxes, gt_difficult=None, *, iou_threshold=0.5):
    """:func:`match_detections`'s labels and the ``(M,)`` bool mask of the ground-truth boxes
    a true positive matched."""
    det_boxes = np.asarray(det_boxes, np.float64).reshape(-1, 4)
    gt_boxes = np.asarray(gt_boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(det_scores, np.float64).reshape(-1)
    if gt_difficult is None:
        gt_difficult = np.zeros(len(gt_boxes), bool)
    gt_difficult = np.asarray(gt_difficult, bool).reshape(-1)
    labels = np.full(len(det_boxes), FALSE_POSITIVE, np.int8)
    matched = np.zeros(len(gt_boxes), bool)
    if len(gt_boxes) == 0 or len(det_boxes) == 0:
        return labels, matched
    ious = box_iou(det_boxes, gt_boxes)
    for index in np.argsort(-scores, kind="stable"):
        best = int(np.argmax(ious[index]))
        if ious[index, best] < iou_threshold:
            continue
        if gt_difficult[best]:
            labels[index] = IGNORED
        elif not matched[best]:
            matched[best] = True
            labels[index] = TRUE_POSITIVE
    return labels, matched


def voc_ap(recall, precision, *, use_11_point=False):
    """Average precision from a precision/recall curve (points in detection-rank order).

    ``use_11_point=False``: VOC2010+ all-point area. Precision is replaced by its running
    maximum from the right (monotonically non-increasing in recall) and summed over the recall
    steps: ``sum((r[i] - r[i-1]) * p_interp[i])``, with recall starting at 0.

    ``use_11_point=True``: VOC2007. The mean over ``t = 0, 0.1, ..., 1`` of the largest
    precision at recall >= t (0 when recall never reaches t). The thresholds are ``k / 10``
    so that a recall of exactly 3/10 reaches the threshold 0.3.

    Empty curves (no detections) give 0.
    """
    recall = np.asarray(recall, np.float64).reshape(-1)
    precision = np.asarray(precision, np.float64).reshape(-1)
    if recall.shape != precision.shape:
        raise ValueError(f"recall has {recall.size} points and precision {precision.size}")
    if use_11_point:
        total = 0.0
        for threshold in np.arange(11) / 10:
            reached = precision[recall >= threshold]
            total += reached.max() if reached.size else 0.0
        return float(total / 11)
    recall = np.concatenate([[0.0], recall, [1.0]])
    precision = np.concatenate([[0.0], precision, [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1])
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


@dataclasses.dataclass(frozen=True)
class VocResult:
    """Per-class VOC results; index ``c`` is class id ``c``.

    Attributes:
        ap: ``(C,)`` float64; NaN for a class without positives (AP undefined).
        recall, precision: per class, ``(n,)`` float64 curves over that class's counted
            detections in score order (ignored ones left out); empty when it has none or
            no positives.
        num_positives: ``(C,)`` non-difficult ground-truth boxes.
        num_detections: ``(C,)`` all detections, ignored ones included.
    """

    ap: np.ndarray
    recall: tuple
    precision: tuple
    num_positives: np.ndarray
    num_detections: np.ndarray
    iou_threshold: float
    use_11_point: bool

    @property
    def num_classes(self):
        return len(self.ap)

    @property
    def mean_ap(self):
        """Mean AP over the classes that have positives; NaN when none has."""
        defined = self.ap[np.isfinite(self.ap)]
        return float(defined.mean()) if defined.size else float("nan")

    @property
    def method(self):
        return "11-point" if self.use_11_point else "all-point"


def evaluate_voc(ground_truth, detections, *, num_classes, iou_threshold=0.5, use_11_point=False):
    """PASCAL VOC mAP at one IoU threshold (see the module docstring for the inputs).

    Each class's detections from all images are ranked by score (stable), matched per image by
    :func:`match_detections`, and turned into a precision/recall curve and :func:`voc_ap`.

    Returns:
        :class:`VocResult`; ``result.mean_ap`` is the mAP.
    """
    scores = [[] for _ in range(num_classes)]
    labels = [[] for _ in range(num_classes)]
    num_positives = np.zeros(num_classes, np.int64)
    num_detections = np.zeros(num_classes, np.int64)
    for _, truth_arrays, detection_arrays in image_arrays(ground_truth, detections, num_classes):
        gt_boxes, gt_classes, gt_difficult = truth_arrays
        det_boxes, det_scores, det_classes = detection_arrays
        np.add.at(num_positives, gt_classes[~gt_difficult], 1)
        np.add.at(num_detections, det_classes, 1)
        for class_id in np.unique(det_classes):
            in_class, gt_in_class = det_classes == class_id, gt_classes == class_id
            scores[class_id].append(det_scores[in_class])
            labels[class_id].append(
                match_detections(
                    det_boxes[in_class],
                    det_scores[in_class],
                    gt_boxes[gt_in_class],
                    gt_difficult[gt_in_class],
                    iou_threshold=iou_threshold,
                )
            )
    ap = np.full(num_classes, np.nan)
    recalls, precisions = [], []
    for class_id in range(num_classes):
        recall = precision = np.zeros(0)
        if num_positives[class_id] > 0:
            class_scores = np.concatenate(scores[class_id] or [np.zeros(0)])
            class_labels = np.concatenate(labels[class_id] or [np.zeros(0, np.int8)])
            ranked = class_labels[np.argsort(-class_scores, kind="stable")]
            ranked = ranked[ranked != IGNORED]
            true_positives = np.cumsum(ranked == TRUE_POSITIVE)
            recall = true_positives / num_positives[class_id]
            precision = true_positives / np.arange(1, len(ranked) + 1)
            ap[class_id] = voc_ap(recall, precision, use_11_point=use_11_point)
        recalls.append(recall)
        precisions.append(precision)
    return VocResult(
        ap=ap,
        recall=tuple(recalls),
        precision=tuple(precisions),
        num_positives=num_positives,
        num_detections=num_detections,
        iou_threshold=float(iou_threshold),
        use_11_point=bool(use_11_point),
    )


def format_table(result, class_names):
    """A plain-text table: class, positives, detections, AP per class; the mAP on the last line."""
    _check_names(class_names, result.num_classes)
    width = max([len("class"), len("mAP")] + [len(str(name)) for name in class_names])
    lines = [f"{'class':<{width}}  {'positives':>9}  {'detections':>10}  {'AP':>6}"]
    for class_id, name in enumerate(class_names):
        ap = result.ap[class_id]
        lines.append(
            f"{name!s:<{width}}  {result.num_positives[class_id]:>9d}  "
            f"{result.num_detections[class_id]:>10d}  {_format_ap(ap):>6}"
        )
    defined = int(np.isfinite(result.ap).sum())
    if defined < result.num_classes:
        lines.append(NO_GROUND_TRUTH_NOTE)
    lines.append(
        f"{'mAP':<{width}}  {_format_ap(result.mean_ap):>29}  ({result.method}, IoU "
        f"{result.iou_threshold:.2f}, {defined} of {result.num_classes} classes)"
    )
    return "\n".join(lines)


def result_to_json(result, class_names, coco_metrics=None):
    """A JSON-ready dict of a :class:`VocResult` (and optionally :func:`evaluate_coco`'s dict).

    Undefined values (NaN) become None, so ``json.dump`` writes strict JSON.
    """
    _check_names(class_names, result.num_classes)
    per_class = [
        {
            "class_id": class_id,
            "class": str(name),
            "positives": int(result.num_positives[class_id]),
            "detections": int(result.num_detections[class_id]),
            "AP": _json_float(result.ap[class_id]),
        }
        for class_id, name in enumerate(class_names)
    ]
    output = {
        "voc": {
            "iou_threshold": result.iou_threshold,
            "method": result.method,
            "mAP": _json_float(result.mean_ap),
            "classes_in_mean": int(np.isfinite(result.ap).sum()),
            "per_class": per_class,
            "notes": [NO_GROUND_TRUTH_NOTE] if not np.isfinite(result.ap).all() else [],
        }
    }
    if coco_metrics is not None:
        output["coco"] = {key: _json_value(key, value) for key, value in coco_metrics.items()}
    return output


def to_coco(ground_truth, detections, *, num_classes, class_names=None):
    """Our inputs as COCO structures: ``(dataset dict, list of result dicts)``.

    Boxes become ``[x, y, w, h]`` with ``area = w * h`` and ``iscrowd = 0``; category id is
    class id + 1. Image ids are the given ids when they are all integers, otherwise positions
    (with the given id as ``file_name``). Every ground-truth entry needs ``image_hw``.
    Difficult boxes are ordinary ground truth here: COCO has no such flag, and its only ignore
    mechanism (``iscrowd``) also changes how boxes match.
    """
    names = class_names if class_names is not None else [str(i) for i in range(num_classes)]
    _check_names(names, num_classes)
    pairs = _pair_images(ground_truth, detections)
    integer_ids = all(_is_int(image_id) for image_id, _, _ in pairs)
    images, annotations, results = [], [], []
    for position, (image_id, truth, found) in enumerate(pairs):
        if truth.get("image_hw") is None:
            raise ValueError(
                f"ground truth of image {image_id!r} has no image_hw; COCO evaluation needs "
                "each image's (height, width)"
            )
        height, width = (int(v) for v in truth["image_hw"])
        coco_id = int(image_id) if integer_ids else position
        image = {"id": coco_id, "height": height, "width": width}
        if not integer_ids:
            image["file_name"] = str(image_id)
        images.append(image)
        gt_boxes, gt_classes, _ = _ground_truth_arrays(truth, image_id, num_classes)
        for box, class_id in zip(gt_boxes, gt_classes):
            # COCOeval marks matches by annotation id and treats 0 as "unmatched": ids start at 1.
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": coco_id,
                    "category_id": int(class_id) + 1,
                    "bbox": _xywh(box),
                    "area": _area(box),
                    "iscrowd": 0,
                }
            )
        det_boxes, det_scores, det_classes = _detection_arrays(found, image_id, num_classes)
        for box, score, class_id in zip(det_boxes, det_scores, det_classes):
            results.append(
                {
                    "image_id": coco_id,
                    "category_id": int(class_id) + 1,
                    "bbox": _xywh(box),
                    "score": float(score),
                }
            )
    categories = [{"id": i + 1, "name": str(name)} for i, name in enumerate(names)]
    dataset = {"images": images, "annotations": annotations, "categories": categories}
    return dataset, results


def evaluate_coco(ground_truth, detections, *, num_classes, class_names=None, verbose=False):
    """COCO bbox metrics computed by pycocotools' ``COCOeval`` (the reference implementation).

    Returns:
        ``{name: float for name in COCO_METRICS}`` plus ``"notes"`` (a list of strings). A
        metric with no ground truth in its range (no small boxes, say) is NaN. COCOeval keeps
        the 100 highest-scored detections per image. pycocotools' printing is captured unless
        ``verbose``. With no detections at all every defined metric is 0 (``COCO.loadRes``
        cannot load an empty list, so the empty result set is built directly).
    """
    dataset, results = to_coco(
        ground_truth, detections, num_classes=num_classes, class_names=class_names
    )
    printing = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with printing:
        coco_truth = COCO()
        coco_truth.dataset = dataset
        coco_truth.createIndex()
    metrics = score_coco(coco_truth, results, verbose=verbose)
    notes = metrics["notes"]
    if not dataset["annotations"]:
        notes.append("no ground truth: every metric is undefined (NaN)")
    num_difficult = sum(
        int(_ground_truth_arrays(truth, image_id, num_classes)[2].sum())
        for image_id, truth, _ in _pair_images(ground_truth, detections)
    )
    if num_difficult:
        notes.append(f"{num_difficult} difficult boxes counted as ordinary ground truth")
    return metrics


def score_coco(coco_truth, results, *, image_ids=None, verbose=False):
    """pycocotools' bbox evaluation of ``results`` against a loaded ``COCO`` ground truth.

    Args:
        coco_truth: ``pycocotools.coco.COCO`` (an official annotation file, or one built
            by :func:`to_coco`).
        results: COCO results entries, ``{"image_id", "category_id", "bbox": [x, y, w, h],
            "score"}``, as the evaluation server takes them.
        image_ids: score only these images (default: all of the ground truth).

    Returns:
        ``{name: float for name in COCO_METRICS}`` (NaN where no ground truth is in range)
        and ``"notes"``.
    """
    notes = []
    printing = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with printing:
        if results:
            # loadRes adds ids and areas to the dicts it is given.
            coco_found = coco_truth.loadRes(copy.deepcopy(list(results)))
        else:
            notes.append("no detections: every metric with ground truth is 0")
            coco_found = COCO()
            coco_found.dataset = {
                "images": coco_truth.dataset["images"],
                "categories": coco_truth.dataset["categories"],
                "annotations": [],
            }
            coco_found.createIndex()
        evaluator = COCOeval(coco_truth, coco_found, iouType="bbox")
        if image_ids is not None:
            evaluator.params.imgIds = sorted(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    metrics = {
        name: float(value) if value > -1 else float("nan")
        for name, value in zip(COCO_METRICS, evaluator.stats)
    }
    metrics[AP_BY_IOU] = _ap_by_iou(evaluator)
    metrics["notes"] = notes
    return metrics


def _ap_by_iou(evaluator):
    """``{"0.50": AP, ...}``: COCOeval's precision at each IoU threshold, averaged over recall
    levels and classes as its summary averages it (cells of classes without ground truth,
    -1, left out; NaN where none is left), for all areas at 100 detections an image."""
    area = evaluator.params.areaRngLbl.index("all")
    detections = evaluator.params.maxDets.index(100)
    precision = evaluator.eval["precision"][:, :, :, area, detections]
    by_iou = {}
    for threshold, values in zip(evaluator.params.iouThrs, precision):
        defined = values[values > -1]
        by_iou[f"{threshold:.2f}"] = float(defined.mean()) if defined.size else float("nan")
    return by_iou


def coco_category_ids(categories, class_names):
    """The COCO category id of each class, index = class id.

    With as many classes as categories, class ``i`` is the ``i``-th category in order of id,
    the order ``yolo3 coco-annotation`` numbers classes in and Darknet's COCO mapping
    (80 contiguous classes onto ids 1..90). Otherwise classes are matched by name.
    """
    ordered = sorted(categories, key=lambda category: category["id"])
    if len(ordered) == len(class_names):
        return [int(category["id"]) for category in ordered]
    by_name = {category["name"]: int(category["id"]) for category in ordered}
    missing = [name for name in class_names if name not in by_name]
    if missing:
        raise ValueError(
            f"{len(class_names)} classes but the annotation file has {len(ordered)} categories, "
            f"and classes {missing[:5]} are not among their names; give the classes file the "
            "model was trained with, in the order of the category ids"
        )
    return [by_name[name] for name in class_names]


def to_coco_results(image_id, detection, category_ids):
    """Results-file entries of one image's detections (boxes in original pixels)."""
    return [
        {
            "image_id": int(image_id),
            "category_id": int(category_ids[int(class_id)]),
            "bbox": [round(v, 2) for v in _xywh(box)],
            "score": round(float(score), 5),
        }
        for box, score, class_id in zip(
            detection["boxes"], detection["scores"], detection["classes"]
        )
    ]


def image_arrays(ground_truth, detections, num_classes):
    """Yields each image's checked arrays, in ground-truth order (inputs as in the module
    docstring): ``(image_id, (gt_boxes (M, 4) float64, gt_classes (M,) int64, difficult (M,)
    bool), (det_boxes (K, 4) float64, det_scores (K,) float64, det_classes (K,) int64))``.

    Raises:
        ValueError: naming the image and the box for a malformed box, class id or count.
    """
    for image_id, truth, found in _pair_images(ground_truth, detections):
        yield (
            image_id,
            _ground_truth_arrays(truth, image_id, num_classes),
            _detection_arrays(found, image_id, num_classes),
        )


def _pair_images(ground_truth, detections):
    """``[(image_id, ground-truth entry, detections entry)]`` in ground-truth order."""
    if isinstance(ground_truth, Mapping):
        if not isinstance(detections, Mapping):
            raise TypeError("ground truth is a mapping of image ids, so detections must be one too")
        unknown = [image_id for image_id in detections if image_id not in ground_truth]
        if unknown:
            raise ValueError(
                f"detections for {len(unknown)} image ids that are not in the ground truth, "
                f"e.g. {unknown[0]!r}"
            )
        return [
            (image_id, truth, detections.get(image_id, {}))
            for image_id, truth in ground_truth.items()
        ]
    ground_truth, detections = list(ground_truth), list(detections)
    if len(detections) != len(ground_truth):
        raise ValueError(
            f"{len(detections)} detection entries for {len(ground_truth)} ground-truth images; "
            "pass one entry per image, in the same order (empty arrays for none)"
        )
    return [
        (index, truth, found) for index, (truth, found) in enumerate(zip(ground_truth, detections))
    ]


def _boxes(value, where):
    boxes = np.asarray(value if value is not None else [], np.float64)
    if boxes.size == 0:
        return np.zeros((0, 4))
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{where}: boxes have shape {boxes.shape}; expected (n, 4)")
    bad = np.flatnonzero(
        ~np.isfinite(boxes).all(1) | (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    )
    if bad.size:
        raise ValueError(
            f"{where}: box {bad[0]} is {boxes[bad[0]].tolist()}; expected finite "
            "x_min, y_min, x_max, y_max with x_max >= x_min and y_max >= y_min"
        )
    return boxes


def _per_box(value, count, dtype, name, where):
    array = np.asarray(value if value is not None else [], dtype).reshape(-1)
    if array.size != count:
        raise ValueError(f"{where}: {array.size} {name} for {count} boxes")
    return array


def _classes(value, count, num_classes, where):
    classes = _per_box(value, count, np.int64, "classes", where)
    bad = classes[(classes < 0) | (classes >= num_classes)]
    if bad.size:
        raise ValueError(
            f"{where}: class id {bad[0]} is outside 0..{num_classes - 1} "
            f"(num_classes={num_classes})"
        )
    return classes


def _ground_truth_arrays(entry, image_id, num_classes):
    where = f"ground truth of image {image_id!r}"
    boxes = _boxes(entry.get("boxes"), where)
    classes = _classes(entry.get("classes"), len(boxes), num_classes, where)
    difficult = entry.get("difficult")
    difficult = (
        np.zeros(len(boxes), bool)
        if difficult is None
        else _per_box(difficult, len(boxes), bool, "difficult flags", where)
    )
    return boxes, classes, difficult


def _detection_arrays(entry, image_id, num_classes):
    where = f"detections of image {image_id!r}"
    boxes = _boxes(entry.get("boxes"), where)
    scores = _per_box(entry.get("scores"), len(boxes), np.float64, "scores", where)
    if not np.isfinite(scores).all():
        raise ValueError(f"{where}: scores must be finite")
    return boxes, scores, _classes(entry.get("classes"), len(boxes), num_classes, where)


def _check_names(class_names, num_classes):
    if len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for num_classes={num_classes}")


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _xywh(box):
    x_min, y_min, x_max, y_max = (float(v) for v in box)
    return [x_min, y_min, x_max - x_min, y_max - y_min]


def _area(box):
    return float((box[2] - box[0]) * (box[3] - box[1]))


def _format_ap(value):
    return f"{value:.3f}" if np.isfinite(value) else "n/a"


def _json_value(key, value):
    """A value of :func:`score_coco`'s dict, JSON-ready (NaN as None)."""
    if key == "notes":
        return list(value)
    if key == AP_BY_IOU:
        return {threshold: _json_float(ap) for threshold, ap in value.items()}
    return _json_float(value)


def _json_float(value):
    return float(value) if np.isfinite(value) else None
