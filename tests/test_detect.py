"""Detector, image reading, the detect CLI and the evaluate CLI on a tiny model whose heads
are set by hand.

The head convolutions get zero kernels, so each head outputs its bias at every cell whatever
the image: one anchor of the stride-32 head is confident of class 1 ("dog") everywhere, and
every other anchor is silent. At a 64 px input that is a 2 x 2 grid of known boxes.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import load_tool
from PIL import Image

from yolo3.checkpoint.weights import load_weights, save_weights
from yolo3.cli import use_device
from yolo3.data.image import load_rgb
from yolo3.inference.detect import Detector, draw_detections
from yolo3.inference.detector_spec import DetectorSpec, spec_for_weights
from yolo3.model.head import HeadSpec
from yolo3.model.network import build_model
from yolo3.model.resources import parse_anchors

detect_cli = load_tool("detect")

# Masks ((3, 4, 5), (0, 1, 2)): the stride-32 head's slot 0 is anchor 3, 12 x 10 px.
ANCHORS_TEXT = "8,10, 16,20, 24,24, 12,10, 40,40, 60,60"
CLASS_NAMES = ["cat", "dog"]
INPUT_SIZE = 64
CONFIDENT, SILENT = 12.0, -12.0
SCORE = (1 / (1 + math.exp(-CONFIDENT))) ** 2  # sigmoid(objectness) * sigmoid(class)

# Stride-32 cells at 64 px have centres (16 or 48, 16 or 48); each box is centre +- (6, 5):
# x' in 10..22 or 42..54, y' in 11..21 or 43..53 (letterboxed input pixels).
# 128 x 96 image: scale 64/128 = 0.5, 48 rows pasted at y 8; x = x' / 0.5, y = (y' - 8) / 0.5.
EXPECTED_LANDSCAPE = [
    [20, 6, 44, 26],
    [20, 70, 44, 90],
    [84, 6, 108, 26],
    [84, 70, 108, 90],
]
# 48 x 96 portrait: scale 64/96 = 2/3, 32 columns pasted at x 16; x = (x' - 16) * 1.5,
# y = y' * 1.5, clipped to the 48 x 96 image: x -9..9 -> 0..9, 39..57 -> 39..48.
EXPECTED_PORTRAIT = [
    [0, 16.5, 9, 31.5],
    [0, 64.5, 9, 79.5],
    [39, 16.5, 48, 31.5],
    [39, 64.5, 48, 79.5],
]


def _head_bias(num_classes, confident_slot=None, class_id=1):
    """Bias of a head: t = 0, objectness and classes silent except one confident slot."""
    depth = 5 + num_classes
    bias = np.zeros(3 * depth, np.float32)
    for slot in range(3):
        bias[slot * depth + 4 : (slot + 1) * depth] = SILENT
    if confident_slot is not None:
        bias[confident_slot * depth + 4] = CONFIDENT
        bias[confident_slot * depth + 5 + class_id] = CONFIDENT
    return bias


def make_head(anchors_text=ANCHORS_TEXT, class_names=CLASS_NAMES):
    return HeadSpec(anchors=parse_anchors(anchors_text), class_names=class_names)


def make_model(num_classes=2):
    model = build_model("tiny", num_classes, input_size=INPUT_SIZE)
    for name, slot in (("conv_9", 0), ("conv_12", None)):
        layer = model.get_layer(name)
        kernel = np.zeros(layer.kernel.shape, np.float32)
        layer.set_weights([kernel, _head_bias(num_classes, slot)])
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("detect")
    paths = {
        "weights": root / "tiny.weights.h5",
        "bare_weights": root / "bare.weights.h5",
        "anchors": root / "anchors.txt",
        "classes": root / "classes.txt",
        "three_classes": root / "three.txt",
    }
    model = make_model()
    save_weights(model, str(paths["weights"]), {"model_type": "tiny", "num_classes": 2})
    save_weights(model, str(paths["bare_weights"]))  # no metadata
    paths["anchors"].write_text(ANCHORS_TEXT)
    paths["classes"].write_text("\n".join(CLASS_NAMES) + "\n")
    paths["three_classes"].write_text("cat\ndog\nbird\n")
    return {key: str(value) for key, value in paths.items()}


@pytest.fixture(scope="module")
def detector(files):
    return Detector(files["weights"], files["anchors"], files["classes"], input_size=INPUT_SIZE)


def sorted_rows(boxes):
    return np.array(sorted(np.asarray(boxes).tolist()))


def _check_grid(result, expected):
    assert len(result["boxes"]) == 4
    np.testing.assert_allclose(sorted_rows(result["boxes"]), expected, atol=1e-3)
    assert result["classes"].tolist() == [1] * 4 and result["labels"] == ["dog"] * 4
    np.testing.assert_allclose(result["scores"], SCORE, rtol=1e-5)


def test_detects_known_boxes_in_images_of_different_sizes(detector):
    landscape = Image.new("RGB", (128, 96), (30, 90, 200))  # PIL sizes are (width, height)
    portrait = np.zeros((96, 48, 3), np.uint8)
    results = detector.detect([landscape, portrait])
    assert len(results) == 2
    _check_grid(results[0], EXPECTED_LANDSCAPE)
    _check_grid(results[1], EXPECTED_PORTRAIT)


def test_from_model_detects_the_same(detector):
    from_model = Detector.from_model(make_model(), make_head())
    assert from_model.input_hw == (INPUT_SIZE, INPUT_SIZE)
    image = np.full((96, 128, 3), 200, np.uint8)
    [result] = from_model.detect(image)
    _check_grid(result, EXPECTED_LANDSCAPE)


def test_from_model_takes_no_size_for_granted():
    # A model that accepts any size has no size to assume: 416 here would be a 13 x 13 grid
    # of boxes where the weights know a 2 x 2 one.
    with pytest.raises(ValueError, match="accepts any input size: give input_size"):
        Detector.from_model(build_model("tiny", 2), make_head())
    dynamic = build_model("tiny", 2)
    dynamic.set_weights(make_model().get_weights())
    given = Detector.from_model(dynamic, make_head(), input_size=INPUT_SIZE)
    [result] = given.detect(np.full((96, 128, 3), 200, np.uint8))
    _check_grid(result, EXPECTED_LANDSCAPE)
    # A head that records the size its weights were trained at gives it.
    recorded = Detector.from_model(dynamic, make_head().replace(input_hw=INPUT_SIZE))
    assert recorded.input_hw == (INPUT_SIZE, INPUT_SIZE)
    [result] = recorded.detect(np.full((96, 128, 3), 200, np.uint8))
    _check_grid(result, EXPECTED_LANDSCAPE)


def test_from_model_rejects_anchors_for_another_head_count():
    nine = make_head("10,13, 16,30, 33,23, 30,61, 62,45, 59,119, 116,90, 156,198, 373,326")
    with pytest.raises(ValueError, match="2 output heads.*describe 3"):
        Detector.from_model(make_model(), nine)


def test_from_model_rejects_class_names_of_another_count():
    with pytest.raises(ValueError, match="heads for 2 classes.*3 class names"):
        Detector.from_model(make_model(), make_head(class_names=["a", "b", "c"]))


def test_thresholds_are_applied(files):
    strict = Detector(
        files["weights"],
        files["anchors"],
        files["classes"],
        input_size=INPUT_SIZE,
        score_threshold=0.99999,  # above SCORE = 0.999988
        max_detections=2,
    )
    assert len(strict.detect([np.zeros((64, 64, 3), np.uint8)])[0]["boxes"]) == 0
    capped = Detector.from_model(make_model(), make_head(), max_detections=2)
    assert len(capped.detect([np.zeros((64, 64, 3), np.uint8)])[0]["boxes"]) == 2


def test_class_count_mismatch_names_both_numbers(files):
    with pytest.raises(ValueError, match=r"2 classes.*3 classes"):
        Detector(files["weights"], files["anchors"], files["three_classes"])


def test_class_count_mismatch_without_metadata_names_both_numbers(files):
    # The file has no recorded class count; the head width (3 * (5 + 2) = 21) tells.
    with pytest.raises(ValueError, match=r"2 classes.*three.txt lists 3 classes"):
        Detector(files["bare_weights"], files["anchors"], files["three_classes"])


def test_draw_detections_draws_in_the_class_colour(detector):
    image = np.zeros((96, 128, 3), np.uint8)
    [result] = detector.detect([image])
    drawn = draw_detections(image, result, detector.class_names)
    assert drawn.size == (128, 96)
    pixels = np.asarray(drawn)
    # The left edge of the box (20, 70, 44, 90) is a line of non-black pixels.
    assert np.all(pixels[75:90, 20].max(axis=-1) > 0)
    assert np.all(pixels[50, 60] == 0)  # away from every box


def test_draw_detections_keeps_captions_whole_inside_the_image():
    from yolo3.inference.detect import class_colors

    image = np.zeros((60, 128, 3), np.uint8)
    detection = {
        # At the top edge and too small to hold its caption; at the right edge.
        "boxes": np.array([[0, 0, 20, 10], [110, 30, 127, 59]], np.float32),
        "scores": np.array([0.9, 0.8], np.float32),
        "classes": np.array([0, 1]),
    }
    drawn = draw_detections(image, detection, ["a", "b"])
    assert drawn.size == (128, 60)  # no legend: the input's size
    pixels = np.asarray(drawn)
    colour_a, colour_b = class_colors(2)
    # "a 0.90" goes below its box (labels are 13 px high: rows 11-23), not over it.
    assert (pixels[11:24, :30] == colour_a).all(-1).mean() > 0.5
    assert (pixels[5, 25:40] == 0).all()
    # "b 0.80" (32 px wide) sits above its box (rows 17-29), moved left to end at the image's
    # right edge, so the whole label shows: its top row spans x 96-127.
    label_top = (pixels[17, :] == colour_b).all(-1)
    assert label_top[96:].all() and not label_top[:96].any()


def test_draw_detections_legend_adds_a_band_below():
    from yolo3.inference.detect import class_colors

    image = np.full((60, 128, 3), 90, np.uint8)
    detection = {
        "boxes": np.array([[30, 20, 90, 50]], np.float32),
        "scores": np.array([0.9], np.float32),
        "classes": np.array([1]),
    }
    plain = np.asarray(draw_detections(image, detection, ["a", "b"]))
    drawn = np.asarray(draw_detections(image, detection, ["a", "b"], legend=True))
    # One line naming class "b": 4 px padding + 16 + 4 px padding.
    assert drawn.shape == (60 + 24, 128, 3)
    np.testing.assert_array_equal(drawn[:60], plain)
    band = drawn[60:]
    assert (band == class_colors(2)[1]).all(-1).any()
    assert not (band == class_colors(2)[0]).all(-1).any()


def test_load_rgb_converts_modes_and_applies_exif_orientation(tmp_path):
    gray16 = tmp_path / "gray16.png"
    Image.fromarray(np.array([[0, 25700, 65535]], np.uint16)).save(gray16)
    # 16-bit scales to 8 bits (Pillow's own conversion would clip 25700 to 255).
    np.testing.assert_array_equal(load_rgb(gray16)[0, :, 0], [0, 100, 255])

    rgba = tmp_path / "rgba.png"
    Image.fromarray(np.array([[[255, 0, 0, 0], [0, 255, 0, 255]]], np.uint8)).save(rgba)
    np.testing.assert_array_equal(load_rgb(rgba)[0], [[128, 128, 128], [0, 255, 0]])

    palette = Image.new("P", (3, 2))
    palette.putpalette([0, 0, 255] * 256)
    palette.save(tmp_path / "palette.png")
    np.testing.assert_array_equal(load_rgb(tmp_path / "palette.png")[0, 0], [0, 0, 255])

    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")
    cmyk = load_rgb(tmp_path / "cmyk.jpg")
    assert cmyk.shape == (8, 8, 3) and cmyk[4, 4, 0] > 200 and cmyk[4, 4, 1:].max() < 60

    Image.new("L", (5, 5), 77).save(tmp_path / "gray.bmp")
    assert load_rgb(tmp_path / "gray.bmp").shape == (5, 5, 3)

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees to display upright
    Image.new("RGB", (40, 20)).save(tmp_path / "rotated.jpg", exif=exif)
    rotated = load_rgb(tmp_path / "rotated.jpg")
    assert rotated.shape == (40, 20, 3) and rotated.dtype == np.uint8


def test_load_rgb_names_an_unreadable_file(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is not an image")
    with pytest.raises(ValueError, match="broken.png: not in an image format") as raised:
        load_rgb(broken)
    assert "BytesIO" not in str(raised.value)  # Pillow's name for its buffer, not the file
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        load_rgb(tmp_path / "missing.jpg")


def _cli_args(files, *inputs, output, extra=()):
    return [
        *map(str, inputs),
        "--weights",
        files["weights"],
        "--anchors",
        files["anchors"],
        "--classes",
        files["classes"],
        "--input-size",
        str(INPUT_SIZE),
        "--output",
        str(output),
        *extra,
    ]


def test_cli_on_a_folder_reports_and_skips_a_file_that_is_not_an_image(files, tmp_path, capsys):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    Image.new("RGB", (128, 96), (10, 20, 30)).save(folder / "a.png")
    Image.new("RGB", (48, 96), (10, 20, 30)).save(folder / "sub" / "b.png")
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "notes.txt").write_text("ignored: not an image extension")
    output = folder / "out"  # inside the input: its annotated images must not be re-read
    args = _cli_args(files, folder, output=output, extra=["--batch-size", "1"])

    assert detect_cli.main(args) == 0
    assert detect_cli.main(args) == 0  # a second run, with the first run's images present

    assert "broken.png" in capsys.readouterr().err
    report = json.loads((output / "detections.json").read_text())
    by_name = {record["path"].rsplit("/", 1)[-1]: record for record in report["images"]}
    assert sorted(by_name) == ["a.png", "b.png"]
    np.testing.assert_allclose(sorted_rows(by_name["a.png"]["boxes"]), EXPECTED_LANDSCAPE)
    np.testing.assert_allclose(sorted_rows(by_name["b.png"]["boxes"]), EXPECTED_PORTRAIT)
    assert by_name["b.png"]["class_ids"] == [1] * 4 and by_name["b.png"]["labels"] == ["dog"] * 4
    assert [e["path"].rsplit("/", 1)[-1] for e in report["errors"]] == ["broken.png"]
    for relative, size in (("photos/a.png", (128, 96)), ("photos/sub/b.png", (48, 96))):
        with Image.open(output / relative) as annotated:
            assert annotated.size == size
    assert not list(output.glob(".tmp-*"))  # the atomic write left no temporary file


def test_cli_legend_adds_a_band_below_each_image(files, tmp_path):
    Image.new("RGB", (128, 96), (10, 20, 30)).save(tmp_path / "a.png")
    args = _cli_args(files, tmp_path / "a.png", output=tmp_path / "out", extra=["--legend"])
    assert detect_cli.main(args) == 0
    [annotated] = (tmp_path / "out").rglob("a.png")
    with Image.open(annotated) as image:
        assert image.width == 128 and image.height > 96  # the band below, the image above


def test_cli_on_a_video_takes_every_nth_frame(files, tmp_path, monkeypatch):
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (128, 96))
    for _ in range(7):
        writer.write(np.full((96, 128, 3), (0, 0, 255), np.uint8))  # red, in OpenCV's BGR
    writer.release()
    output = tmp_path / "out"
    seen = []
    detect = Detector.detect

    def recording_detect(self, images):
        seen.extend(images)
        return detect(self, images)

    monkeypatch.setattr(Detector, "detect", recording_detect)
    args = _cli_args(
        files, video, output=output, extra=["--video-stride", "2", "--batch-size", "3"]
    )
    assert detect_cli.main(args) == 0

    report = json.loads((output / "detections.json").read_text())
    assert [record["frame"] for record in report["images"]] == [0, 2, 4, 6]
    np.testing.assert_allclose(sorted_rows(report["images"][3]["boxes"]), EXPECTED_LANDSCAPE)
    # The network sees RGB: red stays red after decoding (codec error is a few levels).
    assert len(seen) == 4 and seen[0][48, 64, 0] > 200 and seen[0][48, 64, 2] < 60
    annotated = cv2.VideoCapture(str(output / "clip.detections.mp4"))
    frames = 0
    while annotated.read()[0]:
        frames += 1
    annotated.release()
    assert frames == 4


def test_cli_runs_as_a_script_without_installation():
    script = Path(detect_cli.__file__)
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    assert "--video-stride" in result.stdout


def test_cli_usage_and_input_errors(files, tmp_path, capsys):
    output = tmp_path / "out"
    assert (
        detect_cli.main(_cli_args(files, tmp_path, output=output, extra=["--video-stride", "0"]))
        == 2
    )
    bad_size = _cli_args(files, tmp_path, output=output)
    bad_size[bad_size.index("--input-size") + 1] = "100"
    assert detect_cli.main(bad_size) == 2
    mismatch = _cli_args(files, tmp_path, output=output)
    mismatch[mismatch.index("--classes") + 1] = files["three_classes"]
    assert detect_cli.main(mismatch) == 2
    assert "3 classes" in capsys.readouterr().err
    # Nothing to detect on: reported with the name, and a failing exit status.
    assert detect_cli.main(_cli_args(files, tmp_path / "missing.jpg", output=output)) == 1
    assert "missing.jpg" in capsys.readouterr().err


# Masks ((4, 3, 5), (0, 1, 2)): the stride-32 head's slot 0 is anchor 4, 40 x 40 px, so on
# a 64 px image each box is its cell centre (16 or 48) +- 20, clipped to the image.
EXPECTED_WITH_ANCHOR_4 = [[0, 0, 36, 36], [0, 28, 36, 64], [28, 0, 64, 36], [28, 28, 64, 64]]


@pytest.fixture(scope="module")
def weights_with_masks(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("masks") / "masks.weights.h5")
    metadata = {"model_type": "tiny", "num_classes": 2, "anchor_masks": [[4, 3, 5], [0, 1, 2]]}
    save_weights(make_model(), path, metadata)
    return path


def test_detector_uses_the_anchor_masks_the_weights_record(files, weights_with_masks):
    detector = Detector(weights_with_masks, files["anchors"], files["classes"], input_size=64)
    assert detector.head.anchor_masks == ((4, 3, 5), (0, 1, 2))
    [result] = detector.detect(np.zeros((64, 64, 3), np.uint8))
    np.testing.assert_allclose(sorted_rows(result["boxes"]), EXPECTED_WITH_ANCHOR_4, atol=1e-3)
    # Given masks win over recorded ones.
    given = Detector(
        weights_with_masks,
        files["anchors"],
        files["classes"],
        input_size=64,
        head_overrides={"anchor_masks": ((3, 4, 5), (0, 1, 2))},
    )
    assert given.head.anchor_masks == ((3, 4, 5), (0, 1, 2))


def test_original_keras2_tiny_weights_get_the_original_masks(files, tmp_path):
    from darknet_files import write_keras2_h5

    from yolo3.model.network import tiny_yolo_body

    path = str(tmp_path / "trained_weights_final.h5")
    write_keras2_h5(tiny_yolo_body(num_classes=2), path, np.random.default_rng(0))
    detector = Detector(path, files["anchors"], files["classes"], input_size=64)
    assert detector.head.anchor_masks == ((3, 4, 5), (1, 2, 3))


def test_cli_anchor_masks_option(files, weights_with_masks, tmp_path, capsys):
    output = tmp_path / "out"
    image = tmp_path / "black.png"
    Image.new("RGB", (64, 64)).save(image)
    args = _cli_args(files, image, output=output)
    args[args.index("--weights") + 1] = weights_with_masks
    assert detect_cli.main(args) == 0
    [record] = json.loads((output / "detections.json").read_text())["images"]
    np.testing.assert_allclose(sorted_rows(record["boxes"]), EXPECTED_WITH_ANCHOR_4, atol=1e-3)
    assert detect_cli.main([*args, "--anchor-masks", "3,4,5 0,1,2"]) == 0
    [record] = json.loads((output / "detections.json").read_text())["images"]
    assert max(box[2] - box[0] for box in record["boxes"]) < 13  # anchor 3: 12 x 10 px
    assert detect_cli.main([*args, "--anchor-masks", "3,4,x"]) == 2
    err = capsys.readouterr().err
    assert "--anchor-masks" in err and "e.g. '3,4,5 1,2,3'" in err
    assert detect_cli.main([*args, "--anchor-masks", "3,4,9 0,1,2"]) == 2
    assert "index past the 6 anchors" in capsys.readouterr().err


def write_described_weights(path):
    """The hand-set model in a file that records all a detector needs, as train.py writes."""
    metadata = {
        "model_type": "tiny",
        "num_classes": 2,
        "classes": CLASS_NAMES,
        "anchors": parse_anchors(ANCHORS_TEXT).tolist(),
        "anchor_masks": [[3, 4, 5], [0, 1, 2]],
        "input_size": [INPUT_SIZE, INPUT_SIZE],
    }
    save_weights(make_model(), str(path), metadata)
    return str(path)


@pytest.fixture(scope="module")
def described_weights(tmp_path_factory):
    return write_described_weights(tmp_path_factory.mktemp("described") / "described.weights.h5")


def test_cli_takes_what_the_weights_file_records(described_weights, tmp_path, capsys):
    # No --classes, --anchors or --input-size: the file's own (64 px, its classes and
    # anchors) give the known grid. At 416 px, the old default, the same heads give a 13 x 13
    # grid of other boxes.
    Image.new("RGB", (128, 96), (10, 20, 30)).save(tmp_path / "a.png")
    output = tmp_path / "out"
    args = [str(tmp_path / "a.png"), "--weights", described_weights, "--output", str(output)]
    assert detect_cli.main(args) == 0
    assert "record no" not in capsys.readouterr().err  # no fallback taken
    report = json.loads((output / "detections.json").read_text())
    assert report["input_size"] == [INPUT_SIZE, INPUT_SIZE] and report["classes"] == CLASS_NAMES
    [record] = report["images"]
    np.testing.assert_allclose(sorted_rows(record["boxes"]), EXPECTED_LANDSCAPE, atol=1e-3)
    assert record["labels"] == ["dog"] * 4
    # A flag still wins over the file: 96 px is a 3 x 3 grid of the stride-32 head.
    assert detect_cli.main([*args, "--input-size", "96"]) == 0
    report = json.loads((output / "detections.json").read_text())
    assert report["input_size"] == [96, 96] and len(report["images"][0]["boxes"]) == 9


def test_cli_device_flag_runs_on_the_cpu_and_refuses_a_gpu_it_cannot_see(
    described_weights, tmp_path, capsys
):
    Image.new("RGB", (128, 96), (10, 20, 30)).save(tmp_path / "a.png")
    output = tmp_path / "out"
    args = [str(tmp_path / "a.png"), "--weights", described_weights, "--output", str(output)]
    assert detect_cli.main([*args, "--device", "cpu"]) == 0
    [record] = json.loads((output / "detections.json").read_text())["images"]
    np.testing.assert_allclose(sorted_rows(record["boxes"]), EXPECTED_LANDSCAPE, atol=1e-3)
    capsys.readouterr()
    # This machine's TensorFlow sees no GPU: one line naming the flag, exit 2, nothing written.
    assert detect_cli.main([*args, "--device", "gpu:1", "--output", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device gpu:1: TensorFlow ") and "sees 0 GPUs (" in err
    assert "or run on the CPU with --device cpu" in err and "\n" not in err
    assert not (tmp_path / "g").exists()
    assert detect_cli.main([*args, "--device", "tpu"]) == 2
    assert "argument --device: 'tpu': use cpu, gpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--device gpu: onnx models run on the CPU here"):
        use_device("gpu", "onnx")


def test_detector_takes_what_the_weights_file_records(described_weights):
    # The Python API as the tools: no anchors, classes or size given, the file's own.
    detector = Detector(described_weights)
    assert detector.input_hw == (INPUT_SIZE, INPUT_SIZE) and detector.class_names == CLASS_NAMES
    [result] = detector.detect(np.full((96, 128, 3), 200, np.uint8))
    _check_grid(result, EXPECTED_LANDSCAPE)


def test_spec_for_weights_takes_head_fields_given_over_the_files(described_weights):
    recorded = spec_for_weights(described_weights)
    assert recorded.head == make_head().replace(input_hw=INPUT_SIZE)
    assert recorded.head.scale_x_y == (1.0, 1.0)  # the file records none: YOLOv3's
    given = spec_for_weights(
        described_weights,
        head_overrides={
            "anchor_masks": ((4, 3, 5), (0, 1, 2)),
            "scale_x_y": 1.2,
            "model_type": None,
        },
    )
    assert given.head == recorded.head.replace(anchor_masks=((4, 3, 5), (0, 1, 2)), scale_x_y=1.2)


# An artifact's metadata as yolo3 export has written it since box merging was recorded
# (read_artifact_metadata of a tiny model exported at 128 x 96 px).
ARTIFACT_METADATA = {
    "format": "yolo3-detector",
    "version": 1,
    "engine": "onnx",
    "outputs": "detections",
    "quantize": None,
    "model_type": "tiny",
    "classes": ["cat", "dog"],
    "anchors": [[10.0, 14.0], [23.0, 27.0], [37.0, 58.0], [81.0, 82.0], [135.0, 169.0],
                [344.0, 319.0]],
    "anchor_masks": [[3, 4, 5], [0, 1, 2]],
    "input_size": [128, 96],
    "resampling": "darknet",
    "score_threshold": 0.01,
    "iou_threshold": 0.5,
    "max_detections": 30,
    "scale_x_y": [1.1, 1.3],
    "box_merge": True,
}  # fmt: skip


def test_detector_spec_reads_and_writes_the_artifact_json():
    spec = DetectorSpec.from_json(ARTIFACT_METADATA)
    assert spec.head.class_names == ("cat", "dog") and spec.head.input_hw == (128, 96)
    assert spec.head.anchor_masks == ((3, 4, 5), (0, 1, 2))
    assert spec.head.scale_x_y == (1.1, 1.3) and spec.resampling == "darknet"
    assert (spec.score_threshold, spec.iou_threshold, spec.max_detections) == (0.01, 0.5, 30)
    assert spec.box_merge is True
    # The same keys in the same order, so that the JSON text of an export is unchanged.
    own = {key: value for key, value in ARTIFACT_METADATA.items() if key in spec.to_json()}
    assert json.dumps(spec.to_json()) == json.dumps(own)
    # Exported before box merging: plain NMS, which its graph (or its runner) applies.
    plain = {key: value for key, value in ARTIFACT_METADATA.items() if key != "box_merge"}
    assert DetectorSpec.from_json(plain) == dataclasses.replace(spec, box_merge=False)
    with pytest.raises(ValueError, match="box merging is on or off .* not 'yes'"):
        DetectorSpec.from_json({**ARTIFACT_METADATA, "box_merge": "yes"})
    # Before the grid sensitivity was recorded too: YOLOv3's 1 on every level.
    older = {key: value for key, value in plain.items() if key != "scale_x_y"}
    assert DetectorSpec.from_json(older) == dataclasses.replace(
        spec, head=spec.head.replace(scale_x_y=None), box_merge=False
    )
    assert DetectorSpec.from_json(older).head.scale_x_y == (1.0, 1.0)


def test_box_merging_is_bounded_before_anything_is_allocated():
    # 1,576 detections against YOLOv3's 10,647 candidates at 416 px: 2**24 pairs and more.
    tiny = DetectorSpec.from_json(ARTIFACT_METADATA).head
    head = tiny.replace(
        model_type="yolov3", anchors=tiny.anchors + tiny.anchors[:3], anchor_masks=None,
        scale_x_y=None, input_hw=(416, 416),
    )  # fmt: skip
    assert DetectorSpec(head, max_detections=1575).num_candidates == 3 * (13**2 + 26**2 + 52**2)
    with pytest.raises(ValueError, match="16,779,672 pairs .* --box-merge off"):
        DetectorSpec(head, max_detections=1576)
    assert not DetectorSpec(head, max_detections=1576, box_merge=False).box_merge
    # An artifact's metadata asking for as much is refused when it is read.
    with pytest.raises(ValueError, match="--max-detections"):
        DetectorSpec.from_json(
            {**ARTIFACT_METADATA, "max_detections": 2**16, "input_size": [4096, 4096]}
        )


def test_cli_says_which_defaults_fill_what_the_file_does_not_record(files, tmp_path, capsys):
    # Model type and class count only, as a Darknet conversion's file: the class names and
    # anchors come from the flags, the input size from the fallback, said on stderr.
    Image.new("RGB", (64, 64), (10, 20, 30)).save(tmp_path / "a.png")
    args = [
        str(tmp_path / "a.png"), "--weights", files["weights"], "--anchors", files["anchors"],
        "--classes", files["classes"], "--output", str(tmp_path / "out"),
    ]  # fmt: skip
    assert detect_cli.main(args) == 0
    err = capsys.readouterr().err
    assert f"weights {files['weights']} record no input size: using 416 (--input-size)" in err
    report = json.loads((tmp_path / "out" / "detections.json").read_text())
    assert report["input_size"] == [416, 416]


def test_weights_of_the_other_model_type_are_refused(described_weights, tmp_path, capsys):
    # The file records tiny: a YOLOv3 asked for by flag or built by hand does not load it.
    refusal = f"weights {described_weights} are for a tiny model, not yolov3"
    with pytest.raises(ValueError, match=refusal):
        load_weights(build_model("yolov3", 2, input_size=INPUT_SIZE), described_weights)
    Image.new("RGB", (64, 64), (10, 20, 30)).save(tmp_path / "a.png")
    args = [str(tmp_path / "a.png"), "--weights", described_weights, "--model-type", "yolov3"]
    assert detect_cli.main([*args, "--output", str(tmp_path / "out")]) == 2
    assert refusal in capsys.readouterr().err


def test_evaluate_tool_takes_what_the_weights_file_records(described_weights, tmp_path):
    # The truth is the hand-set model's 2 x 2 grid at 64 px: scored with the file's own input
    # size and classes, mAP 1 with no flag; at 416 px (the flag, or the old default) the
    # boxes miss them all.
    evaluate_tool = load_tool("evaluate")
    Image.new("RGB", (128, 96), (10, 20, 30)).save(tmp_path / "a.png")
    boxes = " ".join(",".join(str(int(v)) for v in box) + ",1" for box in EXPECTED_LANDSCAPE)
    (tmp_path / "val.txt").write_text(f"a.png {boxes}\n")
    args = [
        "--weights", described_weights, "--annotations", str(tmp_path / "val.txt"),
        "--no-coco", "--gallery", "0", "--progress", "off",
    ]  # fmt: skip
    for extra, expected in (([], 1.0), (["--input-size", "416"], 0.0)):
        output = tmp_path / f"eval{len(extra)}"
        assert evaluate_tool.main([*args, *extra, "--output", str(output)]) == 0
        metrics = json.loads((output / "metrics.json").read_text())
        assert metrics["voc"]["mAP"] == pytest.approx(expected, abs=1e-6), extra
        assert [c["class"] for c in metrics["voc"]["per_class"]] == CLASS_NAMES
