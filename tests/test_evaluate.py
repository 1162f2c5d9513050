"""VOC mAP by hand-derived values and oracles; COCO metrics through pycocotools; the PNG plots."""

import json

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from yolo3 import fileio
from yolo3.drawing import class_colors
from yolo3.evaluation import metrics as evaluate
from yolo3.evaluation.metrics import (
    evaluate_coco,
    evaluate_voc,
    format_table,
    match_detections,
    result_to_json,
    voc_ap,
)
from yolo3.evaluation.plots import draw_gallery, plot_pr_curve

FAR = [200.0, 200.0, 210.0, 210.0]  # overlaps none of the ground-truth boxes below


def truth(boxes, classes, difficult=None, image_hw=(300, 300)):
    entry = {"boxes": np.array(boxes, np.float64).reshape(-1, 4), "classes": np.array(classes)}
    if difficult is not None:
        entry["difficult"] = np.array(difficult, bool)
    entry["image_hw"] = image_hw
    return entry


def found(boxes, scores, classes):
    return {
        "boxes": np.array(boxes, np.float64).reshape(-1, 4),
        "scores": np.array(scores, np.float64),
        "classes": np.array(classes, np.int64),
    }


def both_aps(ground_truth, detections, num_classes=1, **kwargs):
    all_point = evaluate_voc(ground_truth, detections, num_classes=num_classes, **kwargs)
    eleven = evaluate_voc(
        ground_truth, detections, num_classes=num_classes, use_11_point=True, **kwargs
    )
    return all_point, eleven


A, B, C = [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 40.0, 40.0], [50.0, 0.0, 80.0, 30.0]


def test_box_iou_uses_continuous_coordinates():
    # [0,2]^2 vs [1,3]^2: inter 1, union 4 + 4 - 1 = 7. A = [0,10]^2 vs [1,3]^2: 4 / 100.
    # [0,10]^2 vs [5,15]x[0,10]: inter 50, union 150 -> 1/3 (the devkit's +1 would give
    # 66 / (121 + 121 - 66) = 0.375).
    ious = evaluate.box_iou([[0, 0, 2, 2], A], [[1, 1, 3, 3], [5, 0, 15, 10]])
    np.testing.assert_allclose(ious, [[1 / 7, 0.0], [4 / 100, 1 / 3]])
    assert evaluate.box_iou(np.zeros((0, 4)), [A]).shape == (0, 1)


def test_perfect_detections_give_ap_one():
    ground_truth = [truth([A, B], [0, 1]), truth([C], [1])]
    detections = [found([A, B], [0.9, 0.8], [0, 1]), found([C], [0.7], [1])]
    for result in both_aps(ground_truth, detections, num_classes=2):
        np.testing.assert_allclose(result.ap, [1.0, 1.0])
        assert result.mean_ap == 1.0
        np.testing.assert_array_equal(result.num_positives, [1, 2])


def test_false_positive_ranked_first():
    # Ranks: FP (0.9), TP (0.8), TP (0.7) of 2 positives.
    # precision 0, 1/2, 2/3 at recall 0, 1/2, 1; envelope 2/3 everywhere.
    # all-point: 0.5 * 2/3 + 0.5 * 2/3 = 2/3; 11-point: every threshold sees 2/3 -> 2/3.
    ground_truth = [truth([A, B], [0, 0])]
    detections = [found([FAR, A, B], [0.9, 0.8, 0.7], [0, 0, 0])]
    all_point, eleven = both_aps(ground_truth, detections)
    np.testing.assert_allclose(all_point.precision[0], [0, 1 / 2, 2 / 3])
    np.testing.assert_allclose(all_point.recall[0], [0, 1 / 2, 1])
    assert all_point.ap[0] == pytest.approx(2 / 3)
    assert eleven.ap[0] == pytest.approx(2 / 3)


def test_missed_box():
    # 2 positives, one TP: precision 1 up to recall 1/2, nothing beyond.
    # all-point: 0.5 * 1 = 0.5; 11-point: thresholds 0, .1, .., .5 give 1, the other 5 give 0.
    all_point, eleven = both_aps([truth([A, B], [0, 0])], [found([A], [0.9], [0])])
    assert all_point.ap[0] == pytest.approx(0.5)
    assert eleven.ap[0] == pytest.approx(6 / 11)


def test_interleaved_ranking():
    # 3 positives, ranks TP FP TP FP TP: recall 1/3 1/3 2/3 2/3 1, precision 1 1/2 2/3 1/2 3/5.
    # Envelope at recall 1/3, 2/3, 1: 1, 2/3, 3/5 -> all-point = (1 + 2/3 + 3/5) / 3 = 34/45.
    # 11-point: t = 0..0.3 -> 1 (4x), t = 0.4..0.6 -> 2/3 (3x), t = 0.7..1 -> 3/5 (4x)
    # -> (4 + 2 + 2.4) / 11 = 8.4 / 11.
    far_2 = [220.0, 220.0, 230.0, 230.0]
    ground_truth = [truth([A, B, C], [0, 0, 0])]
    detections = [found([A, FAR, B, far_2, C], [0.9, 0.8, 0.7, 0.6, 0.5], [0] * 5)]
    all_point, eleven = both_aps(ground_truth, detections)
    assert all_point.ap[0] == pytest.approx(34 / 45)
    assert eleven.ap[0] == pytest.approx(8.4 / 11)


def test_duplicate_detection_is_a_false_positive():
    # The higher-scored of two detections on A takes it, even though the other overlaps more.
    near_a = [0.0, 0.0, 10.0, 9.0]  # IoU 0.9 with A
    labels = match_detections([A, near_a, B], [0.7, 0.9, 0.8], [A, B])
    np.testing.assert_array_equal(labels, [evaluate.FALSE_POSITIVE, 1, 1])
    # Ranks TP (A), FP (duplicate), TP (B) of 2: precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1.
    # all-point: 0.5 * 1 + 0.5 * 2/3 = 5/6; 11-point: (6 * 1 + 5 * 2/3) / 11 = 28/33.
    ground_truth = [truth([A, B], [0, 0])]
    detections = [found([A, A, B], [0.9, 0.8, 0.7], [0, 0, 0])]
    all_point, eleven = both_aps(ground_truth, detections)
    assert all_point.ap[0] == pytest.approx(5 / 6)
    assert eleven.ap[0] == pytest.approx(28 / 33)


def test_difficult_boxes_are_neither_positives_nor_false_positives():
    # Class 0: A normal, B difficult; detections on B (twice) and A. Only A counts: AP 1.
    # Class 1: its only box is difficult -> no positives, AP undefined, left out of the mean.
    ground_truth = [truth([A, B, C], [0, 0, 1], difficult=[False, True, True])]
    detections = [found([B, B, A, C], [0.9, 0.85, 0.8, 0.7], [0, 0, 0, 1])]
    result = evaluate_voc(ground_truth, detections, num_classes=2)
    np.testing.assert_array_equal(result.num_positives, [1, 0])
    np.testing.assert_array_equal(result.num_detections, [3, 1])
    np.testing.assert_allclose(result.precision[0], [1.0])
    assert result.ap[0] == 1.0 and np.isnan(result.ap[1])
    assert result.mean_ap == 1.0
    labels = match_detections([B, A], [0.9, 0.8], [A, B], [False, True])
    np.testing.assert_array_equal(labels, [evaluate.IGNORED, evaluate.TRUE_POSITIVE])


@pytest.mark.parametrize(("height", "threshold", "expected"), [(4.9, 0.5, 0.0), (5.1, 0.5, 1.0)])
def test_iou_just_under_and_over_the_threshold(height, threshold, expected):
    # [0,10]x[0,h] inside A: IoU = 10 h / 100 -> 0.49 and 0.51.
    detections = [found([[0, 0, 10, height]], [0.9], [0])]
    result = evaluate_voc([truth([A], [0])], detections, num_classes=1, iou_threshold=threshold)
    assert result.ap[0] == expected


def test_class_without_ground_truth_is_excluded_and_reported():
    # Class 2 has detections but no boxes: AP n/a; mAP = (1 + 0.5) / 2 over classes 0 and 1.
    ground_truth = [truth([A, B, C], [0, 1, 1])]
    detections = [found([A, B, FAR], [0.9, 0.8, 0.7], [0, 1, 2])]
    result = evaluate_voc(ground_truth, detections, num_classes=3)
    assert np.isnan(result.ap[2]) and result.mean_ap == pytest.approx(0.75)
    table = format_table(result, ["cat", "dog", "bird"])
    lines = table.splitlines()
    assert lines[-1].startswith("mAP") and "0.750" in lines[-1] and "2 of 3" in lines[-1]
    assert "n/a" in lines[3] and evaluate.NO_GROUND_TRUTH_NOTE in table
    output = result_to_json(result, ["cat", "dog", "bird"])
    assert output["voc"]["per_class"][2]["AP"] is None
    assert output["voc"]["mAP"] == pytest.approx(0.75)
    json.dumps(output, allow_nan=False)  # strict JSON


def test_no_detections_gives_zero():
    empty = found(np.zeros((0, 4)), [], [])
    for result in both_aps([truth([A], [0]), truth([B], [0])], [empty, empty]):
        assert result.ap[0] == 0.0 and result.mean_ap == 0.0


def test_images_by_id_and_missing_detections():
    ground_truth = {"a.jpg": truth([A], [0]), "b.jpg": truth([B], [0])}
    result = evaluate_voc(ground_truth, {"b.jpg": found([B], [0.5], [0])}, num_classes=1)
    assert result.ap[0] == pytest.approx(0.5)  # 1 of 2 found
    with pytest.raises(ValueError, match="not in the ground truth"):
        evaluate_voc(ground_truth, {"c.jpg": found([B], [0.5], [0])}, num_classes=1)


def test_bad_inputs_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="1 detection entries for 2 ground-truth images"):
        evaluate_voc([truth([A], [0])] * 2, [found([A], [1.0], [0])], num_classes=1)
    with pytest.raises(ValueError, match=r"class id 3 is outside 0\.\.1 \(num_classes=2\)"):
        evaluate_voc([truth([A], [3])], [found([A], [1.0], [0])], num_classes=2)
    with pytest.raises(ValueError, match="x_max >= x_min"):
        evaluate_voc([truth([[10, 0, 5, 5]], [0])], [found([A], [1.0], [0])], num_classes=1)
    with pytest.raises(ValueError, match="2 scores for 1 boxes"):
        evaluate_voc([truth([A], [0])], [found([A], [1.0, 0.5], [0])], num_classes=1)
    with pytest.raises(ValueError, match="2 class names for num_classes=3"):
        format_table(evaluate_voc([], [], num_classes=3), ["a", "b"])


def step_integral_ap(recall, precision):
    """Direct integral of the interpolated precision over recall in [0, 1].

    p_interp(r) = max precision over points with recall >= r (0 if none) is constant between
    consecutive distinct recall values, so its value at each interval's midpoint is exact.
    """
    edges = np.unique(np.concatenate([[0.0, 1.0], recall]))
    total = 0.0
    for low, high in zip(edges[:-1], edges[1:]):
        reached = precision[recall >= (low + high) / 2]
        total += (high - low) * (reached.max() if reached.size else 0.0)
    return total


def test_all_point_ap_matches_step_integration_on_random_curves():
    rng = np.random.default_rng(0)
    for _ in range(200):
        num_positives = int(rng.integers(1, 12))
        is_true = rng.random(int(rng.integers(0, 25))) < rng.random()
        is_true[np.cumsum(is_true) > num_positives] = False  # no more TPs than positives
        true_positives = np.cumsum(is_true)
        recall = true_positives / num_positives
        precision = true_positives / np.arange(1, len(is_true) + 1)
        assert voc_ap(recall, precision) == pytest.approx(step_integral_ap(recall, precision))


def random_scene(rng, num_classes):
    """One 400x400 image: boxes in separate 100 px cells, and detections whose labels are known.

    Returns ground truth, detections and, per detection, its known outcome: 1 TP, 0 FP, -1
    ignored. A copy of a box (jittered by <= 2 px, IoU >= 0.68) is a TP if it is the
    highest-scored copy of the right class; other copies, wrong-class copies and boxes in
    empty cells are FPs; copies of difficult boxes are ignored.
    """
    cells = rng.permutation(16)
    num_boxes = int(rng.integers(0, 10))
    boxes, classes, difficult = [], [], []
    for cell in cells[:num_boxes]:
        x, y = (cell % 4) * 100 + rng.uniform(0, 30), (cell // 4) * 100 + rng.uniform(0, 30)
        w, h = rng.uniform(20, 60, size=2)
        boxes.append([x, y, x + w, y + h])
        classes.append(int(rng.integers(num_classes)))
        difficult.append(bool(rng.random() < 0.15))
    det_boxes, det_classes, det_outcomes = [], [], []
    for box, class_id, hard in zip(boxes, classes, difficult):
        copies = int(rng.choice([0, 1, 1, 2, 3]))
        for _ in range(copies):
            wrong_class = num_classes > 1 and rng.random() < 0.2
            det_class = (class_id + 1) % num_classes if wrong_class else class_id
            det_boxes.append(np.array(box) + rng.uniform(-2, 2, size=4))
            det_classes.append(det_class)
            det_outcomes.append(-1 if hard and not wrong_class else 0)
    for cell in cells[num_boxes : num_boxes + int(rng.integers(0, 4))]:
        x, y = (cell % 4) * 100, (cell // 4) * 100
        det_boxes.append([x + 10, y + 10, x + 50, y + 50])
        det_classes.append(int(rng.integers(num_classes)))
        det_outcomes.append(0)
    scores = rng.random(len(det_boxes))
    # The best-scored right-class copy of each non-difficult box is its TP.
    for box_index, (class_id, hard) in enumerate(zip(classes, difficult)):
        if hard:
            continue
        copies = [
            k
            for k, det_box in enumerate(det_boxes)
            if det_classes[k] == class_id
            and np.abs(np.subtract(det_box, boxes[box_index])).max() <= 2
        ]
        if copies:
            det_outcomes[max(copies, key=lambda k: scores[k])] = 1
    ground_truth = truth(boxes, classes, difficult, image_hw=(400, 400))
    return ground_truth, found(det_boxes, scores, det_classes), det_outcomes


def rank_form_ap(scores, outcomes, num_positives):
    """All-point AP as the mean over positives of the best precision at or after each TP's rank."""
    order = np.argsort(-np.asarray(scores))
    ranked = np.asarray(outcomes)[order]
    ranked = ranked[ranked != -1]
    precision = np.cumsum(ranked == 1) / np.arange(1, len(ranked) + 1)
    best_from_here = [precision[k:].max() for k in range(len(ranked))]
    return sum(best_from_here[k] for k in range(len(ranked)) if ranked[k] == 1) / num_positives


def test_evaluate_voc_matches_known_outcomes_on_random_scenes():
    rng = np.random.default_rng(1)
    num_classes = 3
    scenes = [random_scene(rng, num_classes) for _ in range(40)]
    result = evaluate_voc([s[0] for s in scenes], [s[1] for s in scenes], num_classes=num_classes)
    for class_id in range(num_classes):
        scores, outcomes, positives = [], [], 0
        for ground_truth, detections, det_outcomes in scenes:
            in_class = detections["classes"] == class_id
            scores += list(detections["scores"][in_class])
            outcomes += list(np.asarray(det_outcomes, int)[in_class])
            positives += int(
                np.sum((ground_truth["classes"] == class_id) & ~ground_truth["difficult"])
            )
        assert result.num_positives[class_id] == positives
        assert result.ap[class_id] == pytest.approx(rank_form_ap(scores, outcomes, positives))


def coco_scene():
    """Two images; class 0 has boxes in both, class 1 in the second."""
    ground_truth = [
        truth([A, B], [0, 0], image_hw=(100, 120)),
        truth([C, [10, 50, 60, 90]], [0, 1], image_hw=(100, 120)),
    ]
    detections = [
        found([A, B], [0.9, 0.8], [0, 0]),
        found([C, [10, 50, 60, 90]], [0.7, 0.6], [0, 1]),
    ]
    return ground_truth, detections


def test_coco_perfect_detections_give_one_and_print_nothing(capsys):
    ground_truth, detections = coco_scene()
    metrics = evaluate_coco(ground_truth, detections, num_classes=2)
    for key in ("AP", "AP50", "AP75", "AR10", "AR100"):
        assert metrics[key] == pytest.approx(1.0), key
    # AR1 keeps one detection per image and class: class 0 finds 1 of 2 boxes in image 0 and
    # 1 of 1 in image 1 (2/3), class 1 finds its box (1) -> (2/3 + 1) / 2 = 5/6.
    assert metrics["AR1"] == pytest.approx(5 / 6)
    assert set(evaluate.COCO_METRICS) <= set(metrics) and metrics["notes"] == []
    assert capsys.readouterr().out == ""
    evaluate_coco(ground_truth, detections, num_classes=2, verbose=True)
    assert "Average Precision" in capsys.readouterr().out


def test_coco_one_class_missed_halves_ap50():
    # Class 1's only detection is shifted: [10,50,60,90] vs [40,50,90,90] -> IoU 20/80 = 0.25.
    # AP50 = mean(class 0: 1, class 1: 0) = 0.5; the same at every IoU threshold.
    ground_truth, detections = coco_scene()
    detections[1] = found([C, [40, 50, 90, 90]], [0.7, 0.6], [0, 1])
    metrics = evaluate_coco(ground_truth, detections, num_classes=2)
    assert metrics["AP50"] == pytest.approx(0.5)
    assert metrics["AP"] == pytest.approx(0.5)


def test_coco_ap_at_each_iou_threshold_is_one_up_to_the_boxes_iou_and_zero_beyond():
    # One box of class 0, found as [0,0,10,8.2]: IoU 82/100 = 0.82 (by hand), a match at the
    # thresholds 0.50-0.80 and none at 0.85-0.95; class 1 has no ground truth (left out).
    # AP is their mean: 7/10.
    ground_truth = [truth([[0, 0, 10, 10]], [0], image_hw=(50, 50))]
    detections = [found([[0, 0, 10, 8.2], [20, 20, 30, 30]], [0.9, 0.8], [0, 1])]
    metrics = evaluate_coco(ground_truth, detections, num_classes=2)
    by_iou = metrics[evaluate.AP_BY_IOU]
    assert list(by_iou) == [f"{t:.2f}" for t in np.arange(50, 96, 5) / 100]
    assert [by_iou[t] for t in by_iou] == pytest.approx([1.0] * 7 + [0.0] * 3)
    assert metrics["AP"] == pytest.approx(0.7)
    assert metrics["AP75"] == by_iou["0.75"] and metrics["AP50"] == by_iou["0.50"]
    written = evaluate.result_to_json(
        evaluate_voc(ground_truth, detections, num_classes=2), ["a", "b"], coco_metrics=metrics
    )
    assert json.loads(json.dumps(written))["coco"][evaluate.AP_BY_IOU]["0.85"] == 0.0


def test_coco_area_ranges():
    # Areas 20^2 = 400 (small, < 32^2), 50^2 = 2500 (medium), 120^2 = 14400 (large, >= 96^2).
    small, medium, large = [0, 0, 20, 20], [30, 0, 80, 50], [0, 60, 120, 180]
    ground_truth = [truth([small, medium, large], [0, 0, 0], image_hw=(200, 200))]
    detections = [found([small, large], [0.9, 0.8], [0, 0])]
    metrics = evaluate_coco(ground_truth, detections, num_classes=1)
    assert metrics["AP_small"] == pytest.approx(1.0)
    assert metrics["AP_medium"] == 0.0
    assert metrics["AP_large"] == pytest.approx(1.0)
    only_small = evaluate_coco(
        [truth([small], [0], image_hw=(200, 200))], [found([small], [0.9], [0])], num_classes=1
    )
    assert np.isnan(only_small["AP_large"])  # no large ground truth: undefined, not 0


def test_coco_without_detections_gives_zeros_and_a_note():
    ground_truth, _ = coco_scene()
    empty = [found(np.zeros((0, 4)), [], [])] * 2
    metrics = evaluate_coco(ground_truth, empty, num_classes=2)
    for key in ("AP", "AP50", "AP75", "AR100"):
        assert metrics[key] == 0.0
    assert any("no detections" in note for note in metrics["notes"])


def test_coco_needs_image_sizes():
    with pytest.raises(ValueError, match="image 0 has no image_hw"):
        evaluate_coco([{"boxes": [A], "classes": [0]}], [found([A], [1.0], [0])], num_classes=1)


def test_written_coco_files_evaluate_the_same(tmp_path):
    ground_truth, detections = coco_scene()
    detections[1] = found([C, [40, 50, 90, 90]], [0.7, 0.6], [0, 1])
    gt_path, det_path = tmp_path / "gt.json", tmp_path / "det.json"
    dataset, results = evaluate.to_coco(ground_truth, detections, num_classes=2)
    fileio.write_json(gt_path, dataset)
    fileio.write_json(det_path, results)
    coco_truth = COCO(str(gt_path))
    coco_eval = COCOeval(coco_truth, coco_truth.loadRes(str(det_path)), iouType="bbox")
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    metrics = evaluate_coco(ground_truth, detections, num_classes=2)
    reference = np.where(coco_eval.stats == -1, np.nan, coco_eval.stats)  # -1: undefined
    np.testing.assert_allclose(reference, [metrics[k] for k in evaluate.COCO_METRICS])
    saved = json.loads(gt_path.read_text())
    assert saved["annotations"][0]["bbox"] == [0.0, 0.0, 10.0, 10.0]
    assert saved["annotations"][0]["category_id"] == 1 and saved["annotations"][0]["id"] == 1
    # No temporary files left behind.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["det.json", "gt.json"]


def test_pr_curve_png(tmp_path):
    result = evaluate_voc(
        [truth([A, B], [0, 0])], [found([FAR, A, B], [0.9, 0.8, 0.7], [0, 0, 0])], num_classes=1
    )
    path = tmp_path / "pr.png"
    plot_pr_curve(result.recall[0], result.precision[0], result.ap[0], "cat", path)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (480, 360)
        pixels = np.asarray(image.convert("RGB"))
    assert (pixels == (20, 70, 180)).all(-1).any()  # the interpolated curve is drawn
    plot_pr_curve([], [], float("nan"), "empty", tmp_path / "empty.png", size=(200, 150))
    with Image.open(tmp_path / "empty.png") as image:
        assert image.size == (200, 150)


def test_gallery_png(tmp_path):
    rng = np.random.default_rng(0)
    images = [np.full((60 + 10 * i, 80, 3), 90, np.uint8) for i in range(5)]
    images[0] = Image.fromarray(rng.integers(0, 255, (50, 50, 3), dtype=np.uint8))
    ground_truths = [truth([[5, 5, 40, 40]], [0])] * 5
    detections = [found([[6, 6, 42, 38], [0, 0, 9, 9]], [0.9, 0.1], [1, 0])] * 5
    path = tmp_path / "gallery.png"
    draw_gallery(images, ground_truths, detections, ["a", "b"], path, columns=4, tile_size=96)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] == 4 * 96
        pixels = np.asarray(image.convert("RGB"))
    legend_height = pixels.shape[0] - 2 * 96
    assert legend_height > 0 and (legend_height - 8) % 16 == 0  # 4 px padding, 16 px lines
    tiles = pixels[: 2 * 96]
    assert (tiles == class_colors(2)[1]).all(-1).any()  # the detection of class "b"
    # Class "b" on a truth of class "a": a false positive, and the truth is missed.
    assert (tiles == (255, 0, 255)).all(-1).any()
    with pytest.raises(ValueError, match="4 detections entries for 5 images"):
        draw_gallery(images, None, detections[:4], ["a", "b"], path)


GREEN = (0, 230, 0)  # the truth colour itself: a truth line alone would vanish on it


def _marked_gallery(**kwargs):
    """One 160 px green image, drawn 1:1: a matched pair, a missed truth, a false positive."""
    from yolo3.evaluation.plots import gallery_image

    image = np.zeros((160, 160, 3), np.uint8) + np.uint8(GREEN)
    truths = [truth([[20, 20, 80, 80], [100, 100, 150, 150]], [0, 0])]
    # IoU of the first pair: 58 * 58 / (60 * 60) = 0.93; the second detection is of class "b".
    detections = [found([[22, 22, 80, 80], [100, 10, 150, 50]], [0.9, 0.8], [0, 1])]
    return np.asarray(gallery_image([image], truths, detections, ["a", "b"], 1, tile_size=160,
                                    **kwargs))  # fmt: skip


def test_gallery_marks_matches_misses_and_false_positives_apart():
    pixels = _marked_gallery()
    colour_a, colour_b = class_colors(2)

    def colours(strip):
        return {tuple(int(v) for v in pixel) for pixel in strip}

    # Left edges, below the captions at the top of each box: the matched detection is solid
    # in its class colour; the truth it found is a thin green line between black halo pixels.
    assert colours(pixels[40:76, 22]) == colours(pixels[40:76, 23]) == {colour_a}
    assert colours(pixels[40:76, 20]) == {GREEN}
    assert colours(pixels[40:76, 19]) == {(0, 0, 0)}  # the halo: visible on a green image
    # The false positive: class colour dashed with black, 4 px each (y 10-13 colour, 14-17 black).
    assert colours(pixels[26:48, 100]) == {colour_b, (0, 0, 0)}
    assert tuple(pixels[26, 100]) == colour_b and tuple(pixels[30, 100]) == (0, 0, 0)
    # The missed truth: 3 px magenta and white dashes, a black halo, a magenta "miss" tag at
    # its bottom (y 138-150: labels are 13 px high).
    assert colours(pixels[100:136, 101]) == {(255, 0, 255), (255, 255, 255)}
    assert colours(pixels[100:136, 99]) == {(0, 0, 0)}
    assert (pixels[140:149, 101:130] == (255, 0, 255)).all(-1).mean() > 0.5
    # Away from every box the image is untouched.
    assert colours(pixels[90:98, 40:60].reshape(-1, 3)) == {GREEN}


def test_gallery_draws_a_truth_visibly_on_its_own_colour():
    from yolo3.evaluation.plots import gallery_image

    image = np.zeros((100, 100, 3), np.uint8) + np.uint8(GREEN)
    picture = gallery_image([image], [truth([[30, 30, 70, 70]], [0])], None, ["a"], tile_size=100)
    pixels = np.asarray(picture)[:100].astype(int)
    outline = np.concatenate([pixels[29, 29:72], pixels[29:72, 29], pixels[71, 29:72]])
    assert (np.abs(outline - GREEN).sum(-1) >= 230).all()  # every halo pixel is black
    assert (pixels[30, 31:70] == GREEN).all()  # over the halo, the truth line itself


def test_gallery_legend_is_a_band_below_the_tiles():
    from yolo3.drawing import legend_band
    from yolo3.evaluation.plots import gallery_image

    with_legend = _marked_gallery()
    without = _marked_gallery(legend=False)
    assert without.shape == (160, 160, 3)
    # The band only adds rows: the tile above it is the same picture.
    np.testing.assert_array_equal(with_legend[:160], without)
    band = with_legend[160:]
    # 160 px is too narrow for the four marks on one line: the band is 4 px padding, then
    # 16 px lines (4 + 16 * lines + 4), and it explains each mark and both classes' colours.
    assert band.shape[0] > 8 + 2 * 16 and (band.shape[0] - 8) % 16 == 0
    for colour in (GREEN, (255, 0, 255), *class_colors(2), (0, 0, 0)):
        assert (band == colour).all(-1).any()

    # 4 tiles of 200 px: the marks fit one line, the classes a second: 4 + 2 * 16 + 4 = 40.
    images = [np.zeros((50, 50, 3), np.uint8)] * 4
    truths = [truth([[5, 5, 40, 40]], [0])] * 4
    detections = [found([[6, 6, 40, 40]], [0.9], [1])] * 4
    picture = gallery_image(images, truths, detections, ["a", "b"], 4, tile_size=200)
    assert picture.size == (4 * 200, 200 + 40)
    band = np.asarray(picture)[200:]
    assert (band == class_colors(2)[1]).all(-1).any()
    assert not (band == class_colors(2)[0]).all(-1).any()  # no "a" detected: not listed
    # Past 20 classes the list ends with "+N more" and stops growing.
    names = [f"class {i}" for i in range(200)]
    marks = ("truth", "missed", "match", "false_positive")
    assert legend_band(800, names, range(200), marks).height == 8 + 16 * 3
    assert legend_band(800, names, range(25), marks).height == 8 + 16 * 3


def test_gallery_without_truth_draws_no_false_positives():
    pixels_with_truth = _marked_gallery(legend=False)
    from yolo3.evaluation.plots import gallery_image

    image = np.zeros((160, 160, 3), np.uint8) + np.uint8(GREEN)
    detections = [found([[100, 10, 150, 50]], [0.8], [1])]
    pixels = np.asarray(gallery_image([image], None, detections, ["a", "b"], 1, tile_size=160))
    # With truths the box is dashed (a false positive); without, solid: nothing to judge by.
    assert tuple(pixels_with_truth[30, 100]) == (0, 0, 0)
    assert (pixels[26:48, 100] == class_colors(2)[1]).all()


def test_gallery_matching_takes_each_truth_once_by_score():
    from yolo3.evaluation.plots import match_image

    truths = truth([A, B, FAR], [0, 0, 1], difficult=[False, False, True])
    # By score: 0.9 takes A; 0.8 overlaps A most, taken: a duplicate; class 1 on B: wrong
    # class; 0.6 takes B; 0.5 hits the difficult FAR, which VOC ignores.
    detections = found([A, A, B, B, FAR], [0.8, 0.9, 0.7, 0.6, 0.5], [0, 0, 1, 0, 1])
    matched, found_truths = match_image(truths, detections)
    assert matched.tolist() == [False, True, False, True, True]
    assert found_truths.tolist() == [True, True, True]
    matched, found_truths = match_image(truths, found([B], [0.9], [1]))
    assert matched.tolist() == [False] and found_truths.tolist() == [False, False, True]


def test_gallery_colours_match_detection_drawing():
    from yolo3.inference.detect import class_colors as detect_class_colors

    assert class_colors(7) == detect_class_colors(7)
