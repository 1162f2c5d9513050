"""Darknet -> Keras conversion, checked against OpenCV's Darknet reader as an oracle.

Random weights (see ``darknet_files``) keep every activation O(1), so the heads compared here
are ~1 in size and a 1e-4 bound means ~1e-4 relative agreement through up to 75 layers.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import keras
import numpy as np
import pytest
import tensorflow as tf
from darknet_files import write_cfg, write_random_weights
from helpers import float64_copy, load_tool

from yolo3.checkpoint import darknet
from yolo3.checkpoint import weights as yolo_weights
from yolo3.model.network import tiny_yolo_body
from yolo3.model.resources import read_anchors

ROOT = Path(__file__).resolve().parents[1]
# (classes, cfg size): small sizes keep OpenCV and the NumPy calibration of the weights fast.
SETTINGS = {"tiny": (80, 128), "yolov3": (80, 128), "darknet53": (1000, 64)}


convert_tool = load_tool("convert")


@dataclass
class Converted:
    cfg: str
    weights: str
    model: keras.Model
    info: dict


def write_pair(directory, model_type, seed=0, **header):
    num_classes, size = SETTINGS[model_type]
    cfg, weights = directory / f"{model_type}.cfg", directory / f"{model_type}.weights"
    write_cfg(cfg, model_type, num_classes, size)
    write_random_weights(cfg, weights, np.random.default_rng(seed), **header)
    return str(cfg), str(weights)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """``converted(model_type)``: cfg, weights and the converted model, made once per module."""
    cache = {}

    def get(model_type):
        if model_type not in cache:
            cfg, weights = write_pair(tmp_path_factory.mktemp(model_type), model_type)
            cache[model_type] = Converted(cfg, weights, *darknet.convert(cfg, weights))
        return cache[model_type]

    return get


def random_images(size, batch=1, seed=1):
    return np.random.default_rng(seed).uniform(0, 1, (batch, size, size, 3)).astype(np.float32)


def numpy_outputs(outputs):
    """A model's output(s) as a list of NumPy arrays."""
    return [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(outputs)]


@pytest.mark.parametrize("model_type", ["tiny", "yolov3", "darknet53"])
def test_matches_opencv(converted, model_type):
    """The raw output of each biased (head) convolution agrees with OpenCV's to 1e-4."""
    case = converted(model_type)
    convs = darknet.describe_cfg(darknet.parse_cfg(case.cfg))["convs"]
    heads = [spec for spec in convs if not spec.batch_norm]
    image = random_images(case.info["input_size"][0])

    net = cv2.dnn.readNetFromDarknet(case.cfg, case.weights)
    # OpenCV's Winograd 3x3 convolutions are ~4x less accurate in float32 (2.4e-4 against a
    # float64 evaluation of YOLOv3 vs 5e-5 without), which is OpenCV's rounding, not ours.
    net.enableWinograd(False)
    net.setInput(np.ascontiguousarray(image.transpose(0, 3, 1, 2)))  # NHWC -> NCHW, same RGB
    # OpenCV names a layer after its Darknet index: conv_81 is our conv_58.
    expected = net.forward([f"conv_{spec.layer}" for spec in heads])

    probe = keras.Model(
        case.model.input, [case.model.get_layer(f"conv_{spec.index}").output for spec in heads]
    )
    # TF's oneDNN float32 convolutions alone drift ~1e-4 from exact arithmetic over YOLOv3's
    # 75 layers, so the bound is checked on the converted weights evaluated in float64.
    exact = numpy_outputs(float64_copy(probe)(image.astype(np.float64)))
    as_float32 = numpy_outputs(probe(image))
    for spec, ours, ours32, theirs in zip(heads, exact, as_float32, expected, strict=True):
        theirs = theirs.transpose(0, 2, 3, 1)
        assert ours.shape == theirs.shape
        assert 0.1 < ours.std() < 10, "random weights should keep the outputs O(1)"
        diff = np.abs(ours - theirs).max()
        diff32 = np.abs(ours32 - theirs).max()
        print(
            f"{model_type} conv_{spec.index}: max |keras - opencv| = {diff:.2e} "
            f"(float32 keras: {diff32:.2e}); output std {ours.std():.2f}"
        )
        assert diff <= 1e-4


def test_yolov3_info_and_metadata(converted, tmp_path):
    case = converted("yolov3")
    info = case.info
    assert info["model_type"] == "yolov3" and info["num_classes"] == 80
    np.testing.assert_array_equal(
        info["anchors"], read_anchors(ROOT / "model_data/yolo_anchors.txt")
    )
    assert info["masks"] == [[6, 7, 8], [3, 4, 5], [0, 1, 2]]
    assert info["input_size"] == (128, 128)
    assert info["header"] == {"major": 0, "minor": 2, "revision": 0, "seen": 32013312}
    # 62,001,757 float32 values follow the 20-byte header.
    assert case.model.count_params() == 62_001_757
    assert Path(case.weights).stat().st_size == 20 + 4 * 62_001_757

    path = str(tmp_path / "yolov3.weights.h5")
    darknet.write_weights(case.model, info, path)
    metadata = yolo_weights.read_metadata(path)
    assert metadata["model_type"] == "yolov3"
    assert (metadata["num_classes"], metadata["num_anchors"]) == (80, 3)
    assert metadata["anchor_masks"] == info["masks"]
    assert metadata["anchors"] == info["anchors"].tolist()
    assert metadata["source"] == "darknet:yolov3.cfg,yolov3.weights"


SUBPROCESS_SCRIPT = """
import sys
import numpy as np
from yolo3.model.network import yolo_body
from yolo3.checkpoint.weights import load_weights

model = yolo_body(num_classes=80)
report = load_weights(model, sys.argv[1])
assert not report["skipped"] and not report["missing"], report
outputs = model.predict(np.load(sys.argv[2]), verbose=0)
np.savez(sys.argv[3], *outputs)
"""


@pytest.mark.slow
def test_weights_file_loads_in_fresh_process_and_under_strategy(converted, tmp_path):
    case = converted("yolov3")
    path = str(tmp_path / "yolov3.weights.h5")
    darknet.write_weights(case.model, case.info, path)
    images = random_images(128, batch=2)
    expected = case.model.predict(images, verbose=0)

    np.save(tmp_path / "images.npy", images)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SUBPROCESS_SCRIPT,
            path,
            str(tmp_path / "images.npy"),
            str(tmp_path / "outputs.npz"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fresh = np.load(tmp_path / "outputs.npz")
    # Identical in practice; the tolerance only absorbs thread-scheduling rounding.
    for i, want in enumerate(expected):
        np.testing.assert_allclose(fresh[f"arr_{i}"], want, rtol=0, atol=1e-6)

    # Under a strategy, with tiny's file: loading is the same code for either body, so
    # YOLOv3's 62 million weights need not be built a third time for it.
    tiny = converted("tiny")
    tiny_path = str(tmp_path / "tiny.weights.h5")
    darknet.write_weights(tiny.model, tiny.info, tiny_path)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        replicated = tiny_yolo_body(num_classes=80)
        yolo_weights.load_weights(replicated, tiny_path)
    outputs = replicated.predict(images, batch_size=2, verbose=0)
    # Each replica sees one image, and oneDNN picks its float32 kernels by batch size (batch 2
    # vs 1 differ by ~3e-5), so the reference runs one image at a time.
    expected = tiny.model.predict(images, batch_size=1, verbose=0)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_cli_writes_keras_model_that_reloads_safely(converted, tmp_path, capsys):
    case = converted("tiny")
    output = tmp_path / "tiny.keras"
    assert convert_tool.main([case.cfg, case.weights, str(output), "--fixed-size"]) == 0
    printed = capsys.readouterr().out
    assert "tiny (80 classes, 8,858,734 parameters" in printed and str(output) in printed

    reloaded = keras.saving.load_model(output, safe_mode=True)
    assert reloaded.input_shape == (None, 128, 128, 3)  # the cfg's size, from --fixed_size
    images = random_images(128, batch=2)
    expected = numpy_outputs(case.model(images))
    for got, want in zip(numpy_outputs(reloaded(images)), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_cli_weights_only_renames_h5(converted, tmp_path, capsys):
    case = converted("tiny")
    assert convert_tool.main(["-w", case.cfg, case.weights, str(tmp_path / "yolo.h5")]) == 0
    written = tmp_path / "yolo.weights.h5"
    assert f"writing weights to {written}" in capsys.readouterr().out
    assert not (tmp_path / "yolo.h5").exists()

    fresh = tiny_yolo_body(num_classes=80)
    report = yolo_weights.load_weights(fresh, str(written))
    assert len(report["loaded"]) == 13 + 11  # convolutions + batch norms
    for got, want in zip(fresh.get_weights(), case.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    # The earlier release's spelling still works, out of --help.
    argv = [case.cfg, case.weights, str(tmp_path / "old.h5"), "--weights_only"]
    assert convert_tool.main(argv) == 0
    old = tiny_yolo_body(num_classes=80)
    yolo_weights.load_weights(old, str(tmp_path / "old.weights.h5"))
    for got, want in zip(old.get_weights(), case.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    help_text = convert_tool.build_parser().format_help()
    assert "--weights-only" in help_text and "--weights_only" not in help_text
    assert yolo_weights.read_metadata(str(written))["num_anchors"] == 3


def test_script_runs_without_installing(converted, tmp_path):
    case = converted("tiny")
    output = tmp_path / "tiny.weights.h5"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "convert.py"), case.cfg, case.weights, str(output)],
        cwd=tmp_path,  # neither the repository nor PYTHONPATH supplies yolo3
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote weights to {output}" in result.stdout
    assert yolo_weights.read_metadata(str(output))["model_type"] == "tiny"


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.cfg", "x.weights", "out.keras"], "cfg file missing.cfg does not exist"),
        (["{cfg}", "{weights}", "out.h5"], "must end with .weights.h5"),
        (["-w", "{cfg}", "{weights}", "out.keras"], "ends with .keras"),
    ],
)
def test_cli_errors(converted, tmp_path, capsys, args, message):
    case = converted("tiny")
    args = [a.format(cfg=case.cfg, weights=case.weights) for a in args]
    args[-1] = str(tmp_path / args[-1])
    assert convert_tool.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_unknown_section_names_file_line_and_section(tmp_path):
    cfg = tmp_path / "tiny.cfg"
    write_cfg(cfg, "tiny", 80, 128)
    lines = cfg.read_text().splitlines()
    at = lines.index("[maxpool]")
    lines[at:at] = ["[dropout]", "probability=.5", ""]
    cfg.write_text("\n".join(lines))
    with pytest.raises(
        ValueError, match=rf"tiny.cfg, line {at + 1}: unsupported section \[dropout\]"
    ):
        darknet.convert(str(cfg), "unused.weights")
    with pytest.raises(ValueError, match=r"supported sections are \[net\], \[convolutional\]"):
        darknet.convert(str(cfg), "unused.weights")


def test_truncated_and_oversized_weights_say_how_many_values(converted, tmp_path):
    case = converted("tiny")
    data = Path(case.weights).read_bytes()
    expected = (len(data) - 20) // 4  # 8,858,734: one float32 per parameter
    assert expected == 8_858_734
    short, long = tmp_path / "short.weights", tmp_path / "long.weights"
    short.write_bytes(data[: -4 * 10])
    long.write_bytes(data + np.zeros(3, "<f4").tobytes())
    with pytest.raises(ValueError, match=rf"truncated.*need {expected} .*found {expected - 10}"):
        darknet.convert(case.cfg, str(short))
    with pytest.raises(ValueError, match=rf"left over.*need {expected} .*found {expected + 3}"):
        darknet.convert(case.cfg, str(long))


def test_old_header_with_32_bit_seen_converts(converted, tmp_path):
    case = converted("tiny")
    cfg, weights = write_pair(tmp_path, "tiny", major=0, minor=1)
    assert Path(weights).stat().st_size == Path(case.weights).stat().st_size - 4
    model, info = darknet.convert(cfg, weights)
    assert info["header"] == {"major": 0, "minor": 1, "revision": 0, "seen": 32013312}
    # Same seed, so the same values: only the header's width differs.
    for got, want in zip(model.get_weights(), case.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def _edit_cfg(tmp_path, old, new, occurrence):
    """A tiny cfg with the ``occurrence``-th line equal to ``old`` replaced; returns path, line."""
    cfg = tmp_path / "edited.cfg"
    write_cfg(cfg, "tiny", 80, 128)
    lines = cfg.read_text().splitlines()
    at = [i for i, line in enumerate(lines) if line == old][occurrence]
    lines[at] = new
    cfg.write_text("\n".join(lines))
    header = max(i for i in range(at) if lines[i].startswith("["))
    return str(cfg), header + 1


def test_cfg_disagreeing_with_our_network_is_rejected_before_reading_weights(tmp_path):
    cfg, line = _edit_cfg(tmp_path, "size=3", "size=1", occurrence=6)
    with pytest.raises(ValueError, match=rf"line {line}: .*#6 .*conv_6: size=1 \(expected 3\)"):
        darknet.convert(cfg, "unused.weights")
    cfg, line = _edit_cfg(tmp_path, "stride=2", "stride=1", occurrence=0)
    with pytest.raises(ValueError, match=rf"line {line}: \[maxpool\] .*maxpool_0: stride=1 \("):
        darknet.convert(cfg, "unused.weights")
    # A concat of the wrong stride-16 layer: 128 + 128 input channels instead of 128 + 256.
    cfg, line = _edit_cfg(tmp_path, "layers = -1, 8", "layers = -1, 6", occurrence=0)
    with pytest.raises(ValueError, match=r"conv_11: input channels=256 \(expected 384\)"):
        darknet.convert(cfg, "unused.weights")


def test_unsupported_network_is_named(tmp_path):
    cfg, _ = _edit_cfg(tmp_path, "[yolo]", "[softmax]", occurrence=0)
    with pytest.raises(ValueError, match=r"13 \[convolutional\] and 1 \[yolo\].*yolov3-tiny.cfg"):
        darknet.convert(cfg, "unused.weights")


def test_swapped_cfg_and_weights_are_named(tmp_path, capsys):
    weights = tmp_path / "tiny.weights"
    weights.write_bytes(np.arange(8, dtype="<i4").tobytes() + bytes([0xAB]) * 64)
    cfg = tmp_path / "tiny.cfg"
    write_cfg(cfg, "tiny", 80, 128)
    assert convert_tool.main([str(weights), str(cfg), str(tmp_path / "out.weights.h5")]) == 2
    assert f"cfg file {weights} is not text; a Darknet .cfg comes first" in capsys.readouterr().err
