"""Exported detectors (SavedModel, ONNX, TFLite) detect what the Keras model detects.

One seeded tiny-YOLOv3 at 128 px, its heads biased so that a few dozen boxes per image pass
the score threshold and NMS has overlaps to settle; images of several sizes, so that the
letterbox inverse inside each artifact is exercised.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import load_tool
from PIL import Image

from yolo3.checkpoint import weights as weights_io
from yolo3.inference.detector_spec import DetectorSpec, spec_for_weights
from yolo3.inference.export import export_detector, read_artifact_metadata
from yolo3.inference.runtime import ArtifactDetector, load_detector
from yolo3.model.network import build_model, head_layer_names

pytest.importorskip("onnxruntime")

INPUT = 128
CLASSES = ("cat", "dog", "bird")
ANCHORS = ((10, 14), (23, 27), (37, 58), (81, 82), (135, 169), (344, 319))
MASKS = ((3, 4, 5), (0, 1, 2))
SIZES = ((128, 128), (96, 160), (150, 70), (64, 64))
# Tolerances of the float32 artifacts against Keras (the contract).
BOX_TOL, SCORE_TOL = 1e-3, 1e-4


def _model(seed=3):
    import keras

    keras.utils.set_random_seed(seed)
    model = build_model("tiny", len(CLASSES), input_size=INPUT)
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if layer.name.startswith("bn_"):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights(
                [gamma, beta, rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, mean.shape)]
            )
    for name in head_layer_names("tiny"):
        layer = model.get_layer(name)
        kernel, bias = layer.get_weights()
        depth = 5 + len(CLASSES)
        bias = bias.reshape(3, depth)
        bias[:, 4] = -3.0  # objectness: a minority of cells pass 0.3
        bias[:, 5:] = 0.5
        # Logits spread over a few units, so that the scores depend on the image.
        layer.set_weights([kernel * 12.5, bias.reshape(-1)])
    return model


def _images():
    rng = np.random.default_rng(7)
    images = []
    for height, width in SIZES:
        # Smooth blobs rather than noise: letterbox resampling of noise is all aliasing.
        small = rng.integers(0, 256, (max(height // 16, 2), max(width // 16, 2), 3), np.uint8)
        images.append(np.asarray(Image.fromarray(small).resize((width, height), Image.BILINEAR)))
    return images


# Slow: the module's artifacts are exported once for all its tests (SavedModel, ONNX,
# TFLite), which alone takes longer than the quick tier allows.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    model = _model()
    weights = root / "model.weights.h5"
    weights_io.save_weights(
        model,
        str(weights),
        metadata={
            "model_type": "tiny",
            "num_classes": len(CLASSES),
            "classes": list(CLASSES),
            "anchors": [list(a) for a in ANCHORS],
            "anchor_masks": [list(m) for m in MASKS],
            # Grid sensitivity: every engine must decode with it as the Keras detector does.
            "scale_x_y": [1.1, 1.3],
            "input_size": [INPUT, INPUT],
        },
    )
    spec = spec_for_weights(weights)
    assert spec.head.scale_x_y == (1.1, 1.3)
    paths = {
        "saved_model": root / "saved_model",
        "onnx": root / "model.onnx",
        "tflite": root / "model.tflite",
    }
    for engine, path in paths.items():
        export_detector(model, spec, path, engine=engine)
    return {"weights": weights, "spec": spec, "model": model, "root": root, **paths}


@pytest.fixture(scope="module")
def reference(exported):
    detector = load_detector(exported["weights"])
    results = detector.detect(_images())
    assert sum(len(r["scores"]) for r in results) >= 20, "the test model detects too little"
    assert all(len(r["scores"]) < exported["spec"].max_detections for r in results)
    return results


def _assert_same(found, expected, box_tol=BOX_TOL, score_tol=SCORE_TOL):
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert len(got["scores"]) == len(want["scores"])
        np.testing.assert_array_equal(got["classes"], want["classes"])
        np.testing.assert_allclose(got["boxes"], want["boxes"], atol=box_tol, rtol=0)
        np.testing.assert_allclose(got["scores"], want["scores"], atol=score_tol, rtol=0)
        assert got["labels"] == want["labels"]


@pytest.mark.parametrize("engine", ["saved_model", "onnx", "tflite"])
def test_float32_artifact_detects_what_keras_detects(exported, reference, engine):
    detector = load_detector(exported[engine], num_threads=1)
    assert isinstance(detector, ArtifactDetector) and detector.engine == engine
    _assert_same(detector.detect(_images()), reference)


def test_artifacts_merge_boxes_where_the_keras_detector_does(exported, reference):
    # The artifacts match the Keras detector above with box merging on (the weights' default);
    # merging moves these boxes, so that match covers it.
    assert exported["spec"].box_merge
    plain = load_detector(exported["weights"], box_merge=False).detect(_images())
    assert [len(found["boxes"]) for found in plain] == [len(found["boxes"]) for found in reference]
    moved = [
        np.abs(p["boxes"] - r["boxes"]).max() for p, r in zip(plain, reference) if len(p["boxes"])
    ]
    assert max(moved) > 0.5  # pixels
    with pytest.raises(ValueError, match="exported with box_merge on; .* to use off"):
        load_detector(exported["onnx"], box_merge=False)


@pytest.mark.parametrize("engine", ["saved_model", "onnx", "tflite"])
def test_artifact_records_its_settings(exported, engine):
    metadata = read_artifact_metadata(exported[engine])
    assert metadata["engine"] == engine
    assert metadata["outputs"] == ("candidates" if engine == "tflite" else "detections")
    assert DetectorSpec.from_json(metadata) == exported["spec"]
    assert metadata["classes"] == list(CLASSES) and metadata["score_threshold"] == 0.3


def test_raw_heads_export_detects_the_same(exported, reference, tmp_path):
    for engine, name in (("onnx", "raw.onnx"), ("tflite", "raw.tflite")):
        path = tmp_path / name
        export_detector(exported["model"], exported["spec"], path, engine=engine, raw=True)
        assert read_artifact_metadata(path)["outputs"] == "heads"
        _assert_same(load_detector(path).detect(_images()), reference)


def test_saved_model_takes_encoded_images_of_any_size(exported, reference):
    import io

    import tensorflow as tf

    loaded = tf.saved_model.load(str(exported["saved_model"]))
    encoded = []
    for image in _images():
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    found = loaded.signatures["detect_encoded"](encoded=tf.constant(encoded))
    # TensorFlow's bicubic resize is not PIL's: the pixels differ by a few levels, so this
    # path is held to the same boxes within a pixel, not to the uint8 path's tolerance.
    for index, want in enumerate(reference):
        count = int(found["num_detections"][index])
        boxes = found["boxes"][index, :count].numpy()
        scores = found["scores"][index, :count].numpy()
        assert abs(count - len(want["scores"])) <= max(2, len(want["scores"]) // 5)
        # Every confident reference box has a same-class box within 2 px among these.
        classes = found["classes"][index, :count].numpy()
        for box, score, label in zip(want["boxes"], want["scores"], want["classes"], strict=True):
            if score < 0.4:
                continue
            close = np.abs(boxes - box).max(axis=1) < 2.0
            assert np.any(close & (classes == label)), (index, box, score)
        assert np.all(scores > 0.3)


FRESH_PROCESS = """
import sys
sys.modules["yolo3"] = None  # no project code: any import of it fails
import json, numpy as np
data = np.load(sys.argv[2])
feed = {"images": data["images"], "image_hw": data["image_hw"]}
engine, path = sys.argv[1], sys.argv[3]
if engine == "saved_model":
    import tensorflow as tf
    # As the test process runs it (tests/graph_rewrites.py): the same graph, the same bits.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    loaded = tf.saved_model.load(path)
    meta = json.loads(loaded.metadata().numpy().decode())
    out = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in feed.items()})
    out = {k: v.numpy() for k, v in out.items()}
elif engine == "onnx":
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    meta = json.loads(session.get_modelmeta().custom_metadata_map["yolo3"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(names, feed)))
else:
    from ai_edge_litert.interpreter import Interpreter
    out = Interpreter(model_path=path).get_signature_runner()(**feed)
    meta = None
np.savez(sys.argv[4], **out)
print(json.dumps(meta))
"""


@pytest.mark.parametrize("engine", ["saved_model", "onnx", "tflite"])
def test_artifact_runs_in_a_fresh_process_without_project_code(exported, engine, tmp_path):
    detector = ArtifactDetector(exported[engine])
    inputs = np.stack([detector.letterbox(image) for image in _images()])
    sizes = np.asarray([image.shape[:2] for image in _images()], np.int32)
    np.savez(tmp_path / "feed.npz", images=inputs, image_hw=sizes)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(FRESH_PROCESS))
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            engine,
            str(tmp_path / "feed.npz"),
            str(exported[engine]),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    expected = detector._run({"images": inputs, "image_hw": sizes})
    for name, value in expected.items():
        np.testing.assert_array_equal(out[name], value)
    meta = json.loads(result.stdout.strip().splitlines()[-1])
    if engine != "tflite":
        assert meta["classes"] == list(CLASSES)


def _quantized_agreement(found, expected):
    """Fraction of reference detections matched by a same-class detection with IoU >= 0.5."""
    from yolo3.evaluation.metrics import box_iou  # noqa: PLC0415

    matched = total = 0
    for got, want in zip(found, expected, strict=True):
        total += len(want["scores"])
        if len(got["scores"]) and len(want["scores"]):
            iou = box_iou(want["boxes"], got["boxes"])
            same = want["classes"][:, None] == got["classes"][None, :]
            matched += int(np.sum(np.max(np.where(same, iou, 0.0), axis=1) >= 0.5))
    return matched / total


@pytest.fixture(scope="module")
def calibration_records(tmp_path_factory):
    from record_sets import write_record_set

    images = _images() * 3
    examples = [
        (
            np.asarray(Image.fromarray(image).resize((INPUT, INPUT))),
            np.zeros((0, 4), np.float32),
            np.zeros((0,), np.int64),
        )
        for image in images
    ]
    return write_record_set(
        tmp_path_factory.mktemp("calibration"),
        {"train": examples[:2], "val": examples},
        classes=CLASSES,
    )


# Documented tolerances of the quantised files (docs/guides/export.md, "Quantised TFLite"):
# float16 keeps boxes within 0.5 px and scores within 2e-3 of float32; int8 keeps at least
# 80% of the detections (same class, IoU >= 0.5) on this untrained, deliberately sensitive
# model.
FLOAT16_BOX_TOL, FLOAT16_SCORE_TOL, INT8_AGREEMENT = 0.5, 2e-3, 0.8


def test_cli_quantized_tflite_float16_and_int8(exported, reference, calibration_records, tmp_path):
    export_tool = load_tool("export")
    common = ["--weights", str(exported["weights"]), "--format", "tflite"]
    half = tmp_path / "half.tflite"
    assert export_tool.main([*common, "--output", str(half), "--quantize", "float16"]) == 0
    found = load_detector(half).detect(_images())
    # A score that moves across the threshold changes the count: compare the confident ones.
    for got, want in zip(found, reference, strict=True):
        keep = want["scores"] > 0.3 + FLOAT16_SCORE_TOL
        assert _quantized_agreement([got], [want]) >= 0.95
        assert np.sum(got["scores"] > 0.3 + FLOAT16_SCORE_TOL) >= np.sum(keep) - 2
    small = tmp_path / "int8.tflite"
    args = [*common, "--output", str(small), "--quantize", "int8"]
    assert export_tool.main([*args, "--calibration", str(calibration_records)]) == 0
    assert read_artifact_metadata(small)["quantize"] == "int8"
    assert small.stat().st_size < 0.35 * (exported["tflite"]).stat().st_size
    assert _quantized_agreement(load_detector(small).detect(_images()), reference) >= INT8_AGREEMENT


def test_cli_onnx_then_detect_tool_runs_it(exported, reference, tmp_path):
    path = tmp_path / "cli.onnx"
    code = load_tool("export").main(
        ["--weights", str(exported["weights"]), "--format", "onnx", "--output", str(path)]
    )
    assert code == 0
    folder = tmp_path / "images"
    folder.mkdir()
    for index, image in enumerate(_images()):
        Image.fromarray(image).save(folder / f"{index}.png")
    out = tmp_path / "out"
    assert (
        load_tool("detect").main([str(folder), "--weights", str(path), "--output", str(out)]) == 0
    )
    records = json.loads((out / "detections.json").read_text())["images"]
    assert [len(r["scores"]) for r in records] == [len(r["scores"]) for r in reference]
    # An artifact's thresholds are part of it.
    code = load_tool("detect").main(
        [str(folder), "--weights", str(path), "--output", str(out), "--score", "0.5"]
    )
    assert code == 2


def test_cli_errors_name_the_problem(exported, tmp_path, capsys):
    export_tool = load_tool("export")
    bare = tmp_path / "bare.weights.h5"
    weights_io.save_weights(exported["model"], str(bare))
    out = str(tmp_path / "x.onnx")
    assert export_tool.main(["--weights", str(bare), "--format", "onnx", "--output", out]) == 2
    assert "--classes" in capsys.readouterr().err
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(CLASSES))
    args = ["--weights", str(bare), "--format", "onnx", "--output", out, "--classes", str(classes)]
    assert export_tool.main(args) == 2
    assert "--anchors" in capsys.readouterr().err
    missing = str(tmp_path / "missing.weights.h5")
    assert export_tool.main(["--weights", missing, "--format", "onnx", "--output", out]) == 2
    assert "missing.weights.h5" in capsys.readouterr().err
    weights = str(exported["weights"])
    for extra, needle in (
        (["--format", "onnx", "--output", out, "--quantize", "int8"], "--quantize"),
        (
            ["--format", "tflite", "--output", str(tmp_path / "q.tflite"), "--quantize", "int8"],
            "--calibration",
        ),
        (["--format", "onnx", "--output", str(tmp_path / "x.tflite")], ".onnx"),
    ):
        assert export_tool.main(["--weights", weights, *extra]) == 2
        assert needle in capsys.readouterr().err


def test_loading_something_that_is_not_a_detector_says_so(exported, tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="notes.onnx"):
        load_detector(text)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_detector(tmp_path / "nowhere.tflite")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(ValueError, match="not a SavedModel"):
        load_detector(folder)
    jpeg = tmp_path / "photo.tflite"
    Image.fromarray(_images()[0]).save(jpeg, format="JPEG")
    with pytest.raises(ValueError, match="photo.tflite"):
        load_detector(jpeg)


@pytest.fixture(scope="module")
def scored_records(tmp_path_factory):
    from record_sets import make_examples, write_record_set

    examples = make_examples(np.random.default_rng(5), 12, size=INPUT, num_classes=len(CLASSES))
    return write_record_set(
        tmp_path_factory.mktemp("scored"),
        {"train": examples[:2], "val": examples},
        classes=CLASSES,
    )


def test_evaluate_tool_scores_an_artifact_as_it_scores_the_weights(
    exported, scored_records, tmp_path
):
    """The same mAP from the weights and from a TFLite export at the mAP threshold."""
    path = tmp_path / "map.tflite"
    args = ["--weights", str(exported["weights"]), "--format", "tflite", "--output", str(path)]
    assert load_tool("export").main([*args, "--score", "0.01"]) == 0
    evaluate = load_tool("evaluate")
    common = ["--records", scored_records, "--no-coco", "--gallery", "0"]
    figures = []
    for name, value in (("weights", exported["weights"]), ("tflite", path)):
        output = tmp_path / name
        assert evaluate.main(["--weights", str(value), *common, "--output", str(output)]) == 0
        figures.append(json.loads((output / "metrics.json").read_text()))
    assert figures[0]["voc"]["mAP"] == pytest.approx(figures[1]["voc"]["mAP"], abs=1e-6)
    assert figures[0]["voc"]["mAP"] > 0  # the untrained model finds some boxes by chance
    assert evaluate.main(["--weights", str(path), "--coco-json", "x.json"]) == 2


def test_detect_benchmark_runs_every_engine_against_opencv(tmp_path, capsys):
    pytest.importorskip("cv2")
    argv = [
        "detect", "--model-types", "tiny", "--input-size", "64", "--batch-sizes", "1", "2",
        "--threads", "1", "--calls", "1", "--engines", "keras", "tflite", "opencv",
        "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "detect.json"),
    ]  # fmt: skip
    assert load_tool("benchmark").main(argv) == 0
    result = json.loads((tmp_path / "detect.json").read_text())
    engines = [row["engine"] for row in result["rows"]]
    assert engines == ["keras", "tflite", "opencv"]
    for row in result["rows"]:
        for figures in row["batches"].values():
            assert figures["images_per_second"] > 0 and figures["p90_ms"] >= figures["median_ms"]
    matched = {r["label"]: r["value"] for r in result["ratios"] if "matched" in r["label"]}
    assert matched == {
        "tiny tflite: Keras detections matched (batch 2)": 1.0,
        "tiny opencv: Keras detections matched (batch 2)": 1.0,
    }
    assert "| tiny | opencv | 1 |" in capsys.readouterr().out
