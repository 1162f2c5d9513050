"""tools/evaluate.py on record sets and annotation files, and --watch on a run folder."""

import json

import numpy as np
import pytest
from helpers import SMALL_ANCHORS, load_tool
from PIL import Image
from train_helpers import SIZE, small_record_set, write_anchors

from yolo3.checkpoint.weights import read_metadata, save_weights
from yolo3.data.records import iterate_records
from yolo3.evaluation import validate
from yolo3.model.head import HeadSpec
from yolo3.model.network import tiny_yolo_body

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
    truths = [truth for _, truth in iterate_records(records, "val")]
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
    head = HeadSpec(anchors=SMALL_ANCHORS, class_names=["a", "b"])
    evaluation = validate.evaluate_model(body, str(tmp_path / "val.txt"), head=head, coco=False)
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
    from yolo3.evaluation import metrics as evaluate

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
    parser = evaluate_tool.build_parser()

    def masks(*flags):
        args = parser.parse_args(["--weights", legacy, "--anchors", anchors, *flags])
        spec = evaluate_tool._spec(args, legacy, class_names=["a", "b"], input_size=(SIZE, SIZE))
        return spec.head.anchor_masks

    # The original keras-yolo3's tiny files were trained with masks 3,4,5 and 1,2,3.
    assert masks() == ((3, 4, 5), (1, 2, 3))
    assert masks("--anchor-masks", "3,4,5 0,1,2") == ((3, 4, 5), (0, 1, 2))
    args = ["--weights", legacy, "--records", records, "--anchors", anchors, "--no-coco",
            "--gallery", "0", "--output", str(tmp_path / "eval")]  # fmt: skip
    assert evaluate_tool.main([*args, "--anchor-masks", "3,4,5 1,2,3"]) == 0
    assert (tmp_path / "eval" / "metrics.json").exists()
    capsys.readouterr()
    assert evaluate_tool.main([*args, "--anchor-masks", "3,4,5 1,2,x"]) == 2
    assert "--anchor-masks" in capsys.readouterr().err


# A tiny model whose stride-32 head is confident of class 1 in anchor slot 0 at every cell
# and silent elsewhere: at 64 px each 128 x 96 image gets four boxes at known places.
COCO_BOXES = [[20, 6, 44, 26], [20, 70, 44, 90], [84, 6, 108, 26], [84, 70, 108, 90]]


def _constant_head_weights(path, slots=(0,)):
    """The model above; with more ``slots``, those anchor slots of the stride-32 head are
    confident of class 1 at every cell too."""
    from yolo3.model.network import build_model

    model = build_model("tiny", 2, input_size=64)
    for name, confident in (("conv_9", True), ("conv_12", False)):
        layer = model.get_layer(name)
        bias = np.full(layer.bias.shape, -12.0, np.float32)  # objectness, classes silent
        for slot in range(3):
            bias[slot * 7 : slot * 7 + 4] = 0.0  # box offsets (7 = 5 + 2 classes per slot)
        for slot in slots if confident else ():
            bias[slot * 7 + 4], bias[slot * 7 + 5 + 1] = 12.0, 12.0  # objectness, class 1
        layer.set_weights([np.zeros(layer.kernel.shape, np.float32), bias])
    save_weights(model, path, {"model_type": "tiny", "num_classes": 2})


def test_coco_json_scores_exactly_as_pycocotools_on_the_file(tmp_path, capsys):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from yolo3.evaluation.metrics import COCO_METRICS

    images = tmp_path / "val"
    images.mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (128, 96), (90, 90, 90)).save(images / name)
    # Category ids are not contiguous; areas are segmentation areas, not box areas; image 7
    # has a crowd region over one detection and a box no detection finds.
    data = {
        "images": [
            {"id": 7, "file_name": "a.jpg", "width": 128, "height": 96},
            {"id": 42, "file_name": "b.jpg", "width": 128, "height": 96},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 3, "bbox": [20.4, 6.2, 23.5, 19.7],
             "area": 301.5, "iscrowd": 0},
            {"id": 2, "image_id": 7, "category_id": 3, "bbox": [80, 64, 34, 30],
             "area": 950.0, "iscrowd": 1},
            {"id": 3, "image_id": 7, "category_id": 1, "bbox": [50, 40, 20, 20],
             "area": 380.0, "iscrowd": 0},
            {"id": 4, "image_id": 42, "category_id": 3, "bbox": [84, 6, 24, 20],
             "area": 2000.0, "iscrowd": 0},
            {"id": 5, "image_id": 42, "category_id": 3, "bbox": [21, 71, 22, 18],
             "area": 396.0, "iscrowd": 0},
        ],
    }  # fmt: skip
    annotation_file = tmp_path / "instances_val.json"
    annotation_file.write_text(json.dumps(data))
    weights = str(tmp_path / "constant.weights.h5")
    _constant_head_weights(weights)
    anchors = tmp_path / "anchors.txt"
    anchors.write_text("8,10, 16,20, 24,24, 12,10, 40,40, 60,60")  # slot 0 of stride 32: 12x10
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    output = tmp_path / "eval"
    argv = ["--weights", weights, "--anchors", str(anchors), "--coco-json", str(annotation_file),
            "--images", str(images), "--input-size", "64", "--output", str(output)]  # fmt: skip
    assert evaluate_tool.main([*argv, "--classes", str(classes)]) == 0

    results = json.loads((output / "coco_results.json").read_text())
    assert {r["image_id"] for r in results} == {7, 42}
    assert {r["category_id"] for r in results} == {3}  # class 1 -> the file's id 3
    for image_id in (7, 42):
        found = [r["bbox"] for r in results if r["image_id"] == image_id]
        boxes = sorted([x, y, x + w, y + h] for x, y, w, h in found)
        np.testing.assert_allclose(boxes, COCO_BOXES, atol=0.01)  # original pixels
    # The oracle: pycocotools on the unmodified file and the written results file.
    coco_truth = COCO(str(annotation_file))
    evaluator = COCOeval(coco_truth, coco_truth.loadRes(str(output / "coco_results.json")), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    metrics = json.loads((output / "metrics.json").read_text())["coco"]
    for name, value in zip(COCO_METRICS, evaluator.stats):
        assert metrics[name] == (None if value == -1 else pytest.approx(value, abs=1e-12)), name
    # The crowd region matters here: scored as an ordinary box (as keras-yolo3 lines would
    # have it), the detection on it would be a false positive or a match, and AP50 differ.
    flat = json.loads(json.dumps(data))
    flat["annotations"][1]["iscrowd"] = 0
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    flat_truth = COCO(str(tmp_path / "flat.json"))
    flat_eval = COCOeval(flat_truth, flat_truth.loadRes(str(output / "coco_results.json")), "bbox")
    flat_eval.evaluate()
    flat_eval.accumulate()
    flat_eval.summarize()
    assert flat_eval.stats[1] != pytest.approx(metrics["AP50"], abs=1e-6)
    assert "COCO AP" in capsys.readouterr().out

    # Without --classes the file's categories in order of id are the classes.
    assert evaluate_tool.main([*argv, "--output", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "coco_results.json").read_text())
    assert again == results
    # An image-info file (test-dev): the same detections, written for the server, not scored.
    info = {key: data[key] for key in ("images", "categories")}
    (tmp_path / "image_info.json").write_text(json.dumps(info))
    argv[argv.index("--coco-json") + 1] = str(tmp_path / "image_info.json")
    assert evaluate_tool.main([*argv, "--output", str(tmp_path / "server")]) == 0
    assert json.loads((tmp_path / "server" / "coco_results.json").read_text()) == results
    assert json.loads((tmp_path / "server" / "metrics.json").read_text())["coco"] is None
    assert "not scored" in capsys.readouterr().out


def test_iou_flag_is_the_nms_threshold_of_the_detections_scored(tmp_path, capsys):
    """Two anchor slots detect one box per cell each, centred together: 12 x 10 and 20 x 10
    network pixels, an IoU of 120 / 200 = 0.6 (by hand). NMS at 0.5 keeps one of each
    pair, at 0.7 both; the default, 0.45, one."""
    Image.new("RGB", (128, 96), (90, 90, 90)).save(tmp_path / "a.png")
    annotations = tmp_path / "val.txt"
    annotations.write_text("a.png 20,6,44,26,1\n")
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    anchors = tmp_path / "anchors.txt"
    anchors.write_text("8,10, 16,20, 24,24, 12,10, 20,10, 60,60")  # stride 32: 12x10, 20x10
    weights = str(tmp_path / "pairs.weights.h5")
    _constant_head_weights(weights, slots=(0, 1))
    argv = ["--weights", weights, "--annotations", str(annotations), "--classes", str(classes),
            "--anchors", str(anchors), "--input-size", "64", "--gallery", "0"]  # fmt: skip

    def detections(*flags):
        output = tmp_path / f"eval{len(list(tmp_path.glob('eval*')))}"
        assert evaluate_tool.main([*argv, "--output", str(output), *flags]) == 0
        per_class = json.loads((output / "metrics.json").read_text())["voc"]["per_class"]
        return {row["class"]: row["detections"] for row in per_class}["dog"]

    assert detections() == 4  # one per cell of the 2 x 2 grid
    assert detections("--iou", "0.5") == 4
    assert detections("--iou", "0.7") == 8
    capsys.readouterr()
    assert evaluate_tool.main([*argv, "--iou", "1.5"]) == 2
    assert "argument --iou: an IoU lies in [0, 1], not 1.5" in capsys.readouterr().err
