"""The detection confusion matrix: hand-counted cells, the matching rules, and the report files."""

import csv
import json

import numpy as np
import pytest
from PIL import Image

from yolo3.evaluation import metrics as evaluate
from yolo3.evaluation import validate
from yolo3.evaluation.confusion import ConfusionMatrix, confusion_matrix

CAT, DOG, BIRD, BACKGROUND = 0, 1, 2, 3  # rows predicted, columns true


def truth(boxes, classes, difficult=None):
    entry = {"boxes": np.array(boxes, np.float32).reshape(-1, 4), "classes": np.array(classes)}
    if difficult is not None:
        entry["difficult"] = np.array(difficult, bool)
    return entry


def found(boxes, scores, classes):
    return {
        "boxes": np.array(boxes, np.float32).reshape(-1, 4),
        "scores": np.array(scores, np.float32),
        "classes": np.array(classes),
    }


def three_images():
    """Every outcome once or twice, each box far from the others unless it is meant to match."""
    truths = [
        # Image 0: a cat found as a cat; a dog taken for a cat; a bird missed.
        truth([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [CAT, DOG, BIRD]),
        # Image 1: a dog found as a dog; a difficult bird nobody found; a difficult cat found.
        truth(
            [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]],
            [DOG, BIRD, CAT],
            difficult=[False, True, True],
        ),
        # Image 2: nothing true.
        truth([], []),
    ]
    detections = [
        found(
            [[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]],
            [0.9, 0.8, 0.1],  # the bird's detection scores under 0.25: left out, bird missed
            [CAT, CAT, BIRD],
        ),
        found(
            [[0, 0, 10, 9], [0, 0, 10, 10], [40, 40, 50, 50]],
            # Two dogs on one dog: IoU 1.0 wins (the later one), IoU 0.9 is a duplicate.
            [0.5, 0.4, 0.6],
            [DOG, DOG, BIRD],  # a bird on the difficult cat: neither counted
        ),
        found([[60, 60, 70, 70], [0, 0, 5, 5]], [0.7, 0.3], [BIRD, DOG]),  # two spurious
    ]
    return truths, detections


def test_hand_counted_cells():
    truths, detections = three_images()
    matrix = confusion_matrix(truths, detections, 3)
    expected = np.zeros((4, 4), np.int64)
    expected[CAT, CAT] = 1  # image 0's cat
    expected[CAT, DOG] = 1  # image 0's dog, detected as a cat
    expected[DOG, DOG] = 1  # image 1's dog (the IoU-1.0 detection)
    expected[DOG, BACKGROUND] = 2  # image 1's duplicate dog, image 2's small dog
    expected[BIRD, BACKGROUND] = 1  # image 2's bird
    expected[BACKGROUND, BIRD] = 1  # image 0's bird: its detection scored 0.1
    assert matrix.dtype == np.int64
    np.testing.assert_array_equal(matrix, expected)
    # Column sums are the non-difficult true boxes: 1 cat, 2 dogs, 1 bird.
    np.testing.assert_array_equal(matrix[:, :3].sum(axis=0), [1, 2, 1])


def test_thresholds_move_boxes_between_cells():
    truths, detections = three_images()
    everything = confusion_matrix(truths, detections, 3, score_threshold=0.0)
    assert everything[BIRD, BIRD] == 1 and everything[BACKGROUND, BIRD] == 0
    # IoU of [0, 0, 10, 9] in [0, 0, 10, 10] = 90 / 100 = 0.9: a match at 0.5, at 0.95 a
    # false positive and a miss.
    one = ([truth([[0, 0, 10, 10]], [CAT])], [found([[0, 0, 10, 9]], [0.9], [CAT])])
    assert confusion_matrix(*one, 3)[CAT, CAT] == 1
    strict = confusion_matrix(*one, 3, iou_threshold=0.95)
    assert (strict[CAT, CAT], strict[CAT, BACKGROUND], strict[BACKGROUND, CAT]) == (0, 1, 1)


def test_iou_at_the_threshold_matches_as_voc_does():
    # IoU of [0, 0, 10, 10] and [0, 0, 10, 5] = 50 / 100 = 0.5 exactly.
    matrix = confusion_matrix(
        [truth([[0, 0, 10, 10]], [CAT])], [found([[0, 0, 10, 5]], [0.9], [DOG])], 3
    )
    assert matrix[DOG, CAT] == 1 and matrix.sum() == 1


def test_greedy_matching_takes_the_highest_iou_first_not_the_highest_score():
    # Truths T0 = [0, 0, 10, 10] (cat), T1 = [2, 0, 12, 10] (dog); detections (birds)
    # D0 = [1.2, 0, 11.2, 10] scored 0.5, D1 = [3.5, 0, 13.5, 10] scored 0.9. Heights 10:
    #   D0-T1: overlap 9.2 -> 92 / 108 = 0.852;  D0-T0: 8.8 -> 88 / 112 = 0.786;
    #   D1-T1: 8.5 -> 85 / 115 = 0.739;          D1-T0: 6.5 -> 65 / 135 = 0.481 (no pair).
    # D0 takes T1 first; D0-T0 and D1-T1 then find one side taken: D1 is a false positive
    # and T0 a miss. (By score, D1 would have taken T1 and D0 then T0.)
    truths = [truth([[0, 0, 10, 10], [2, 0, 12, 10]], [CAT, DOG])]
    detections = [found([[1.2, 0, 11.2, 10], [3.5, 0, 13.5, 10]], [0.5, 0.9], [BIRD, BIRD])]
    np.testing.assert_allclose(
        evaluate.box_iou(detections[0]["boxes"], truths[0]["boxes"]),
        [[88 / 112, 92 / 108], [65 / 135, 85 / 115]],
        rtol=1e-5,
    )
    matrix = confusion_matrix(truths, detections, 3)
    expected = np.zeros((4, 4), np.int64)
    expected[BIRD, DOG] = expected[BIRD, BACKGROUND] = expected[BACKGROUND, CAT] = 1
    np.testing.assert_array_equal(matrix, expected)


def test_images_without_truth_or_detections():
    truths = [truth([], []), truth([[0, 0, 4, 4]], [BIRD])]
    detections = [found([[0, 0, 4, 4]], [0.9], [CAT]), found([], [], [])]
    matrix = confusion_matrix(truths, detections, 3)
    assert matrix[CAT, BACKGROUND] == 1 and matrix[BACKGROUND, BIRD] == 1 and matrix.sum() == 2


def test_bad_class_ids_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="class id 5 is outside 0..2"):
        confusion_matrix([truth([[0, 0, 4, 4]], [5])], [found([], [], [])], 3)


def test_csv_and_json_layout():
    confusion = ConfusionMatrix.count(*three_images(), 3)
    names = ["cat", "dog", "bird"]
    rows = list(csv.reader(confusion.to_csv(names).splitlines()))
    assert rows[0] == ["predicted/true", "cat", "dog", "bird", "background"]
    assert [row[0] for row in rows[1:]] == ["cat", "dog", "bird", "background"]
    assert [[int(v) for v in row[1:]] for row in rows[1:]] == confusion.matrix.tolist()
    as_json = confusion.to_json(names)
    assert as_json["labels"][-1] == "background" and as_json["matrix"] == confusion.matrix.tolist()
    assert (as_json["iou_threshold"], as_json["score_threshold"]) == (0.5, 0.25)
    with pytest.raises(ValueError, match="2 class names for a matrix of 3 classes"):
        confusion.labels(["cat", "dog"])


@pytest.mark.parametrize("num_classes", [3, 80])
def test_report_writes_the_matrix_files(tmp_path, num_classes):
    truths, detections = three_images()
    names = [f"class number {i}" for i in range(num_classes)]
    voc = evaluate.evaluate_voc(truths, detections, num_classes=num_classes)
    confusion = ConfusionMatrix.count(truths, detections, num_classes)
    evaluation = validate.Evaluation(voc, voc, None, 3, names, confusion=confusion)
    validate.write_report(evaluation, str(tmp_path), curves=False, gallery=False)
    with open(tmp_path / "confusion_matrix.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(rows) == num_classes + 2 and {len(row) for row in rows} == {num_classes + 2}
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert np.array(summary["confusion"]["matrix"]).shape == (num_classes + 1,) * 2
    with Image.open(tmp_path / "confusion_matrix.png") as image:
        width, height = image.size
    assert 150 < width <= 1400 and 150 < height <= 1400


def test_report_without_a_matrix_writes_none(tmp_path):
    truths, detections = three_images()
    voc = evaluate.evaluate_voc(truths, detections, num_classes=3)
    evaluation = validate.Evaluation(voc, voc, None, 3, ["a", "b", "c"])
    validate.write_report(evaluation, str(tmp_path), curves=False, gallery=False)
    assert not (tmp_path / "confusion_matrix.csv").exists()
    assert "confusion" not in json.loads((tmp_path / "metrics.json").read_text())


class FixedDetections:
    """A stand-in detector: each image's "detection" is a fixed list, in image order."""

    class_names = ["cat", "dog", "bird"]

    def __init__(self, detections):
        self.pending = list(detections)

    def detect(self, images):
        return [self.pending.pop(0) for _ in images]


def test_every_evaluation_counts_its_matrix(tmp_path):
    """evaluate_detector on annotation lines: the difficult flag (sixth field) reaches the
    matrix, and the matrix reaches the report."""
    for name in ("a.png", "b.png"):
        Image.new("RGB", (64, 48)).save(tmp_path / name)
    (tmp_path / "val.txt").write_text("a.png 0,0,10,10,0 20,0,30,10,1\nb.png 40,0,50,10,2,1\n")
    detections = [
        found([[0, 0, 10, 10], [20, 0, 30, 10]], [0.9, 0.9], [CAT, CAT]),  # cat; dog as cat
        found([[40, 0, 50, 10]], [0.9], [BIRD]),  # on the difficult bird: not counted
    ]
    evaluation = validate.evaluate_detector(
        FixedDetections(detections), str(tmp_path / "val.txt"), coco=False, gallery_size=0
    )
    expected = np.zeros((4, 4), np.int64)
    expected[CAT, CAT] = expected[CAT, DOG] = 1
    np.testing.assert_array_equal(evaluation.confusion.matrix, expected)
    assert (evaluation.confusion.iou_threshold, evaluation.confusion.score_threshold) == (0.5, 0.25)
    validate.write_report(evaluation, str(tmp_path / "report"), curves=False)
    assert (tmp_path / "report/confusion_matrix.png").is_file()
