"""tools/evaluate.py on record sets and annotation files, and --watch on a run folder."""

import json

import numpy as np
import pytest
from helpers import SMALL_ANCHORS, load_tool
from PIL import Image
from train_helpers import SIZE, small_record_set, write_anchors

from yolo3 import validate
from yolo3.model import tiny_yolo_body
from yolo3.weights import read_metadata, save_weights

evaluate_tool = load_tool("evaluate")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished two-epoch run as train.py leaves it: config and template checkpoints."""
    folder = tmp_path_factory.mktemp("run")
    records = small_record_set(folder / "records", train=8, val=6)
    anchors = write_anchors(folder / "anchors.txt")
    checkpoints = folder / "log/checkpoints"
    checkpoints.mkdir(parents=True)
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    metadata = {"anchors": SMALL_ANCHORS.tolist(), "epoch": 2}
    save_weights(body, str(checkpoints / "last.weights.h5"), metadata)
    config = {"records": records, "log_dir": str(folder / "log"), "anchors": anchors,
              "epochs": 2, "resolved": {}}  # fmt: skip
    (folder / "log/config.json").write_text(json.dumps(config))
    return folder, records, anchors, body


def test_evaluates_a_record_set_and_writes_the_report(run_folder, tmp_path, capsys):
    folder, records, _, _ = run_folder
    weights = str(folder / "log/checkpoints/last.weights.h5")
    code = evaluate_tool.main(
        ["--weights", weights, "--records", records, "--output", str(tmp_path / "eval")]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "mAP" in out and "COCO AP" in out and "6 images" in out
    metrics = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert metrics["num_images"] == 6
    assert 0.0 <= metrics["voc"]["mAP"] <= 1.0
    assert {c["class"] for c in metrics["voc"]["per_class"]} == {"circle", "square"}
    assert Image.open(tmp_path / "eval/gallery.png").size[0] > 0
    assert len(list((tmp_path / "eval/pr").glob("*.png"))) >= 1


def test_ground_truth_as_detections_scores_one(run_folder):
    """The glue between sources and the scorer: truth fed back as detections gives mAP 1."""
    _, records, _, _ = run_folder
    truths = [truth for _, truth in validate.iterate_records(records, "val")]
    detections = [
        {"boxes": t["boxes"], "classes": t["classes"], "scores": np.ones(len(t["classes"]))}
        for t in truths
    ]
    result = validate.evaluate.evaluate_voc(truths, detections, num_classes=2)
    assert result.mean_ap == pytest.approx(1.0)


def test_annotation_source_maps_boxes_to_original_pixels(run_folder, tmp_path):
    _, _, _, body = run_folder
    image = np.full((90, 150, 3), 90, np.uint8)
    Image.fromarray(image).save(tmp_path / "a.png")
    (tmp_path / "val.txt").write_text("a.png 10,20,60,70,1\nmissing.png 1,1,5,5,0\n")
    evaluation = validate.evaluate_model(
        body, str(tmp_path / "val.txt"), anchors=SMALL_ANCHORS, class_names=["a", "b"],
        coco=False,
    )  # fmt: skip
    assert evaluation.num_images == 1
    assert any("missing.png" in message for message in evaluation.skipped)
    _, truth, detection = evaluation.gallery[0]
    assert truth["image_hw"] == (90, 150)
    if len(detection["boxes"]):
        assert detection["boxes"][:, [0, 2]].max() <= 150 + 1e-3


def test_watch_evaluates_the_last_epoch_and_stops(run_folder, capsys):
    folder, _, _, _ = run_folder
    log_dir = folder / "log"
    assert evaluate_tool.main(["--watch", str(log_dir), "--poll", "0.1", "--gallery", "0"]) == 0
    out = capsys.readouterr().out
    assert "epoch 2: evaluating" in out and "last epoch (2) is evaluated" in out
    assert read_metadata(str(log_dir / "checkpoints/best_map.weights.h5"))["epoch"] == 2
    assert list((log_dir / "eval").glob("events.out.tfevents.*"))
    assert (log_dir / "eval/epoch-0002/metrics.json").exists()


def test_missing_inputs_are_usage_errors(tmp_path, capsys):
    assert evaluate_tool.main(["--records", str(tmp_path)]) == 2
    assert "--weights" in capsys.readouterr().err


def test_report_keeps_class_names_and_writes_strict_json(tmp_path):
    from yolo3 import evaluate

    names = ["NaNny goat", "Infinity pool"]
    truths = [{"boxes": np.array([[0, 0, 10, 10]], np.float32), "classes": np.array([0])}]
    found = [
        {
            "boxes": np.array([[0, 0, 10, 10]], np.float32),
            "scores": np.array([0.9], np.float32),
            "classes": np.array([0]),
        }
    ]
    voc = evaluate.evaluate_voc(truths, found, num_classes=2)
    evaluation = validate.Evaluation(voc, voc, None, 1, names)
    validate.write_report(evaluation, str(tmp_path), curves=False, gallery=False)
    text = (tmp_path / "metrics.json").read_text()

    def refuse(constant):
        raise AssertionError(f"metrics.json holds the non-JSON number {constant}")

    summary = json.loads(text, parse_constant=refuse)
    per_class = summary["voc"]["per_class"]
    assert [entry["class"] for entry in per_class] == names
    assert per_class[0]["AP"] == 1.0 and per_class[1]["AP"] is None  # no ground truth


def test_anchor_masks_come_from_the_file_or_the_flag(run_folder, tmp_path, capsys):
    from darknet_files import write_keras2_h5

    _, records, anchors, _ = run_folder
    legacy = str(tmp_path / "trained_weights_final.h5")
    write_keras2_h5(
        tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3)), legacy, np.random.default_rng(0)
    )
    # The original keras-yolo3's tiny files were trained with masks 3,4,5 and 1,2,3.
    _, _, masks = evaluate_tool._model_for(legacy, SMALL_ANCHORS, 2, (SIZE, SIZE))
    assert masks == ((3, 4, 5), (1, 2, 3))
    _, _, masks = evaluate_tool._model_for(
        legacy, SMALL_ANCHORS, 2, (SIZE, SIZE), ((3, 4, 5), (0, 1, 2))
    )
    assert masks == ((3, 4, 5), (0, 1, 2))
    args = ["--weights", legacy, "--records", records, "--anchors", anchors, "--no-coco",
            "--gallery", "0", "--output", str(tmp_path / "eval")]  # fmt: skip
    assert evaluate_tool.main([*args, "--anchor-masks", "3,4,5 1,2,3"]) == 0
    assert (tmp_path / "eval" / "metrics.json").exists()
    capsys.readouterr()
    assert evaluate_tool.main([*args, "--anchor-masks", "3,4,5 1,2,x"]) == 2
    assert "--anchor-masks" in capsys.readouterr().err
