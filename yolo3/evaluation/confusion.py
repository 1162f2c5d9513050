"""The detection confusion matrix: which class each true box was taken for, and what the
detections that matched nothing were.

Convention (Ultralytics' layout): a ``(C + 1, C + 1)`` int64 matrix, **rows the predicted
class, columns the true class**, index ``C`` (the last row and column) "background":

- ``matrix[p, t]``: a detection of class ``p`` matched a true box of class ``t`` (the
  diagonal holds the correct ones, off the diagonal a right box with the wrong class);
- ``matrix[C, t]``: a true box of class ``t`` that no detection matched (missed);
- ``matrix[p, C]``: a detection of class ``p`` that matched no true box (a false positive:
  a duplicate, a badly placed box or nothing there);
- ``matrix[C, C]`` is always 0.

Matching, per image: detections scored ``score_threshold`` or more take part; every
detection/truth pair with IoU >= ``iou_threshold`` is a candidate (the same ``>=`` as
:mod:`yolo3.evaluation.metrics`, so the matrix agrees with the gallery at exact equality);
candidates are taken by IoU, highest first, each truth and each detection at most once.
Matching ignores classes, so a wrong class lands off the diagonal rather than counting
twice (a miss and a false positive), unlike VOC's per-class matching behind mAP.

VOC-difficult truths take part in the matching but are never counted: a difficult truth
left alone is not a miss, and a detection matched to one is not a false positive (VOC does
not score either).

Inputs follow :mod:`yolo3.evaluation.metrics`'s data contract: boxes are ``x_min, y_min,
x_max, y_max`` in original image pixels, class ids ``0 .. num_classes - 1``.
"""

import csv
import dataclasses
import io

import numpy as np

from yolo3.evaluation.metrics import box_iou, image_arrays

# Ultralytics' defaults for its confusion matrix; detections below it are ones a user would
# not be shown, whereas mAP counts every detection down to a score of 0.01.
SCORE_THRESHOLD = 0.25
IOU_THRESHOLD = 0.5
BACKGROUND = "background"


@dataclasses.dataclass(frozen=True)
class ConfusionMatrix:
    """A confusion matrix and the thresholds it was counted at.

    Attributes:
        matrix: ``(C + 1, C + 1)`` int64; rows predicted class, columns true class, the
            last row and column background (see the module docstring).
        iou_threshold: the IoU at which a detection matched a truth.
        score_threshold: the lowest detection score counted.
    """

    matrix: np.ndarray
    iou_threshold: float
    score_threshold: float

    @classmethod
    def count(
        cls,
        truths,
        detections,
        num_classes,
        *,
        iou_threshold=IOU_THRESHOLD,
        score_threshold=SCORE_THRESHOLD,
    ):
        """:func:`confusion_matrix` with the thresholds it used."""
        matrix = confusion_matrix(
            truths,
            detections,
            num_classes,
            iou_threshold=iou_threshold,
            score_threshold=score_threshold,
        )
        return cls(matrix, float(iou_threshold), float(score_threshold))

    @property
    def num_classes(self):
        return len(self.matrix) - 1

    def labels(self, class_names):
        """The row and column names: the class names, then ``"background"``."""
        if len(class_names) != self.num_classes:
            raise ValueError(
                f"{len(class_names)} class names for a matrix of {self.num_classes} classes"
            )
        return [str(name) for name in class_names] + [BACKGROUND]

    def to_json(self, class_names):
        """``{"labels", "matrix" (list of row lists), "rows", "columns", "iou_threshold",
        "score_threshold"}`` for ``metrics.json``."""
        return {
            "labels": self.labels(class_names),
            "rows": "predicted",
            "columns": "true",
            "matrix": self.matrix.tolist(),
            "iou_threshold": float(self.iou_threshold),
            "score_threshold": float(self.score_threshold),
        }

    def to_csv(self, class_names):
        """CSV text: a header row ``predicted/true, <class names>, background``, then one row
        per predicted class, its name first."""
        labels = self.labels(class_names)
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["predicted/true", *labels])
        for label, row in zip(labels, self.matrix.tolist()):
            writer.writerow([label, *row])
        return text.getvalue()


def confusion_matrix(
    truths,
    detections,
    num_classes,
    *,
    iou_threshold=IOU_THRESHOLD,
    score_threshold=SCORE_THRESHOLD,
):
    """Counts the detection confusion matrix over every image (see the module docstring).

    Args:
        truths: per image ``{"boxes": (M, 4) float, "classes": (M,) int}``, optionally
            ``"difficult": (M,) bool``; a sequence or a mapping of image ids, as
            :func:`yolo3.evaluation.metrics.evaluate_voc` takes.
        detections: per image ``{"boxes": (K, 4) float, "scores": (K,) float, "classes":
            (K,) int}``, the same images in the same order (or a mapping with their ids).
        num_classes: C.
        iou_threshold: a detection and a truth match at IoU >= this.
        score_threshold: detections scored below it are left out.

    Returns:
        ``(C + 1, C + 1)`` int64, rows predicted class, columns true class, index C background.
    """
    matrix = np.zeros((num_classes + 1, num_classes + 1), np.int64)
    for _, truth_arrays, detection_arrays in image_arrays(truths, detections, num_classes):
        gt_boxes, gt_classes, difficult = truth_arrays
        det_boxes, det_scores, det_classes = detection_arrays
        kept = det_scores >= score_threshold
        add_image(
            matrix,
            gt_boxes,
            gt_classes,
            difficult,
            det_boxes[kept],
            det_classes[kept],
            iou_threshold=iou_threshold,
        )
    return matrix


def add_image(matrix, gt_boxes, gt_classes, difficult, det_boxes, det_classes, *, iou_threshold):
    """Adds one image's counts to ``matrix`` in place (detections already score-filtered).

    Args:
        matrix: ``(C + 1, C + 1)`` int64.
        gt_boxes: ``(M, 4)``; gt_classes: ``(M,)`` int; difficult: ``(M,)`` bool.
        det_boxes: ``(K, 4)``; det_classes: ``(K,)`` int.
    """
    background = len(matrix) - 1
    det_for_truth = np.full(len(gt_boxes), -1)
    truth_for_det = np.full(len(det_boxes), -1)
    if len(gt_boxes) and len(det_boxes):
        ious = box_iou(det_boxes, gt_boxes)
        det_index, gt_index = np.nonzero((ious >= iou_threshold) & (ious > 0))
        # Highest IoU first; ties keep detection order, then truth order (stable).
        order = np.argsort(-ious[det_index, gt_index], kind="stable")
        for det, gt in zip(det_index[order], gt_index[order]):
            if truth_for_det[det] < 0 and det_for_truth[gt] < 0:
                truth_for_det[det], det_for_truth[gt] = gt, det
    matched = truth_for_det >= 0
    counted = matched.copy()
    counted[matched] = ~difficult[truth_for_det[matched]]
    np.add.at(matrix, (det_classes[counted], gt_classes[truth_for_det[counted]]), 1)
    np.add.at(matrix, (det_classes[~matched], background), 1)
    missed = (det_for_truth < 0) & ~difficult
    np.add.at(matrix, (background, gt_classes[missed]), 1)
