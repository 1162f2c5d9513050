"""Keras -> Darknet (``yolo3.checkpoint.darknet_writer.write_darknet``, ``convert.py
--to-darknet``).

Checked two ways: :func:`yolo3.checkpoint.darknet.convert` reads the files back to the same weights,
anchors, masks, classes and size (exact), and OpenCV's Darknet reader, an implementation of
its own, computes the same heads from them as the Keras model does.
"""

import re
from pathlib import Path

import cv2
import keras
import numpy as np
import pytest
from helpers import SMALL_ANCHORS, float64_copy, load_tool, make_head

from yolo3.checkpoint import darknet, darknet_writer
from yolo3.checkpoint import weights as yolo_weights
from yolo3.inference.postprocess import decode_heads
from yolo3.model.network import build_model
from yolo3.model.resources import read_anchors

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 3
# Non-square sizes catch a width/height swap; non-integer anchors the float32 round trip;
# tiny gets the original keras-yolo3's masks, which are not the defaults.
SETTINGS = {
    "tiny": {
        "input_hw": (96, 128),
        "anchors": SMALL_ANCHORS * np.float32(1.37),
        "anchor_masks": [[3, 4, 5], [1, 2, 3]],
    },
    "yolov3": {
        "input_hw": (128, 96),
        "anchors": read_anchors(ROOT / "model_data" / "yolo_anchors.txt") / np.float32(3.3),
        "anchor_masks": [[6, 7, 8], [3, 4, 5], [0, 1, 2]],
    },
}

convert_tool = load_tool("convert")


def head(kind, num_classes=NUM_CLASSES, **changes):
    """The :class:`HeadSpec` of the ``kind`` model's test settings, with ``changes``."""
    return make_head(num_classes=num_classes, **{**SETTINGS[kind], **changes})


def random_model(model_type, seed=0):
    """A ``model_type`` network at its test size with seeded random weights.

    Kernels are N(0, 1 / fan_in), gammas U(0.8, 1.2), betas and biases N(0, 0.1^2). One
    training-mode pass then gives each batch norm its input's mean m and variance v on
    :func:`random_image`; a drawn variance V in [0.5, 1.5] becomes the moving variance, the
    kernel is scaled by s = sqrt(V / v) and the moving mean set to s * m. Inference on that
    image then normalises like the training pass, so the heads stay O(1) through all 75
    layers of YOLOv3 (statistics of another image's 12 stride-32 cells would not carry over).
    """
    rng = np.random.default_rng(seed)
    model = build_model(
        model_type, NUM_CLASSES, input_size=SETTINGS[model_type]["input_hw"], weight_decay=0.0
    )
    convs = [layer for layer in model.layers if layer.name.startswith("conv_")]
    for conv in convs:
        kernel_shape = conv.kernel.shape
        fan_in = int(np.prod(kernel_shape[:3]))
        values = [rng.normal(0, 1 / np.sqrt(fan_in), kernel_shape)]
        if conv.use_bias:
            values.append(rng.normal(0, 0.1, conv.filters))
        conv.set_weights([v.astype(np.float32) for v in values])
        if not conv.use_bias:
            bn = model.get_layer(conv.name.replace("conv_", "bn_"))
            gamma, beta = rng.uniform(0.8, 1.2, conv.filters), rng.normal(0, 0.1, conv.filters)
            mean, variance = bn.get_weights()[2:]
            bn.set_weights([gamma.astype(np.float32), beta.astype(np.float32), mean, variance])

    normalised = [conv for conv in convs if not conv.use_bias]
    probe = keras.Model(model.input, [conv.output for conv in normalised])
    image = random_image(model_type)
    activations = [keras.ops.convert_to_numpy(a) for a in probe(image, training=True)]
    for conv, y in zip(normalised, activations, strict=True):
        mean, variance = y.mean(axis=(0, 1, 2)), y.var(axis=(0, 1, 2))
        target = rng.uniform(0.5, 1.5, conv.filters)
        scale = np.sqrt(target / np.maximum(variance, 1e-12))
        conv.set_weights([(conv.get_weights()[0] * scale).astype(np.float32)])
        bn = model.get_layer(conv.name.replace("conv_", "bn_"))
        gamma, beta = bn.get_weights()[:2]
        bn.set_weights([gamma, beta, (scale * mean).astype(np.float32), target.astype(np.float32)])
    return model


def random_image(model_type, seed=1):
    height, width = SETTINGS[model_type]["input_hw"]
    return np.random.default_rng(seed).uniform(0, 1, (1, height, width, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(model_type)``: ``(model, cfg, weights)``, made once per module."""
    cache = {}

    def get(model_type):
        if model_type not in cache:
            model = random_model(model_type)
            directory = tmp_path_factory.mktemp(model_type)
            cfg, weights = str(directory / "out.cfg"), str(directory / "out.weights")
            darknet_writer.write_darknet(model, cfg, weights, head(model_type))
            cache[model_type] = (model, cfg, weights)
        return cache[model_type]

    return get


def assert_same_weights(model, other):
    """Every array of every layer with weights is equal, matched by layer name."""
    layers = [layer for layer in model.layers if layer.weights]
    assert [layer.name for layer in layers] == [
        layer.name for layer in other.layers if layer.weights
    ]
    for layer in layers:
        got_all = other.get_layer(layer.name).get_weights()
        for got, want in zip(got_all, layer.get_weights(), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=layer.name)


def assert_reads_back(model, cfg, weights, model_type, settings):
    converted, info = darknet.convert(cfg, weights, input_size="cfg")
    assert_same_weights(model, converted)
    assert info["model_type"] == model_type and info["num_classes"] == NUM_CLASSES
    assert info["anchors"].dtype == np.float32
    np.testing.assert_array_equal(info["anchors"], settings["anchors"])
    assert info["masks"] == [list(mask) for mask in settings["anchor_masks"]]
    assert info["input_size"] == tuple(settings["input_hw"])
    assert info["header"] == {"major": 0, "minor": 2, "revision": 0, "seen": 0}
    # One float32 per parameter (batch-norm statistics included) after the 20-byte header.
    assert Path(weights).stat().st_size == 20 + 4 * model.count_params()


@pytest.mark.parametrize("model_type", ["tiny", "yolov3"])
def test_convert_reads_back_exactly(exported, model_type):
    model, cfg, weights = exported(model_type)
    variances = [layer.get_weights()[3] for layer in model.layers if layer.name.startswith("bn_")]
    assert all(0.5 <= v.min() and v.max() <= 1.5 for v in variances)
    assert_reads_back(model, cfg, weights, model_type, SETTINGS[model_type])
    assert Path(cfg).read_text() == darknet_writer.cfg_text(head(model_type))


# The random weights above subtract each channel's exact mean in batch norm (up to ~5 times its
# spread), so float32 rounding grows with depth: over YOLOv3's 75 layers OpenCV lands 0.8e-4
# to 1.8e-4 from exact arithmetic, as TF's own float32 does (0.8e-4 to 1.5e-4). A bug in the
# export (a transposed kernel, swapped batch-norm terms, a wrong mask) costs O(1).
TOLERANCE = {"tiny": 1e-4, "yolov3": 5e-4}


@pytest.mark.parametrize("model_type", ["tiny", "yolov3"])
def test_opencv_runs_the_written_files_like_keras(exported, model_type):
    """OpenCV's raw head outputs on our files equal the Keras model's (heads are ~1)."""
    model, cfg, weights = exported(model_type)
    heads = [spec for spec in darknet.describe_cfg(darknet.parse_cfg(cfg))["convs"]]
    heads = [spec for spec in heads if not spec.batch_norm]
    image = random_image(model_type)

    net = cv2.dnn.readNetFromDarknet(cfg, weights)
    # Winograd 3x3 convolutions round ~4x worse in float32 (see test_convert).
    net.enableWinograd(False)
    net.setInput(np.ascontiguousarray(image.transpose(0, 3, 1, 2)))  # NHWC -> NCHW, RGB
    # OpenCV names a layer after its Darknet index (YOLOv3's conv_81 is our conv_58).
    theirs = net.forward([f"conv_{spec.layer}" for spec in heads])

    probe = keras.Model(model.input, [model.get_layer(f"conv_{s.index}").output for s in heads])
    # Float64 Keras, so the bound measures the export rather than TF's float32 drift.
    exact = keras.tree.flatten(float64_copy(probe)(image.astype(np.float64)))
    as_float32 = keras.tree.flatten(probe(image))
    for spec, mine, mine32, other in zip(heads, exact, as_float32, theirs, strict=True):
        mine, other = keras.ops.convert_to_numpy(mine), other.transpose(0, 2, 3, 1)
        assert mine.shape == other.shape
        assert 0.1 < mine.std() < 10, "the random weights should keep the heads O(1)"
        diff = np.abs(mine - other).max()
        diff32 = np.abs(mine - keras.ops.convert_to_numpy(mine32)).max()
        print(
            f"{model_type} conv_{spec.index}: max |keras - opencv| = {diff:.2e} "
            f"(float32 keras: {diff32:.2e}); output std {mine.std():.2f}"
        )
        assert diff <= TOLERANCE[model_type]


def test_grid_sensitivity_is_written_read_back_and_decoded_as_opencv_decodes(exported, tmp_path):
    """scale_x_y goes into each [yolo]; convert reads it back; OpenCV's [yolo] layer, which
    decodes with it, places every box where decode_heads does."""
    model, _, _ = exported("tiny")
    settings = {**SETTINGS["tiny"], "scale_x_y": (1.05, 1.2)}
    cfg, weights = str(tmp_path / "grid.cfg"), str(tmp_path / "grid.weights")
    darknet_writer.write_darknet(model, cfg, weights, head("tiny", scale_x_y=(1.05, 1.2)))
    assert [line for line in Path(cfg).read_text().splitlines() if "scale_x_y" in line] == [
        "scale_x_y=1.05",
        "scale_x_y=1.2",
    ]
    _, info = darknet.convert(cfg, weights)
    assert info["scale_x_y"] == [1.05, 1.2]
    assert darknet.conversion_metadata(info)["scale_x_y"] == [1.05, 1.2]

    image = random_image("tiny")
    net = cv2.dnn.readNetFromDarknet(cfg, weights)
    net.enableWinograd(False)
    net.setInput(np.ascontiguousarray(image.transpose(0, 3, 1, 2)))
    # Per [yolo], rows in (row, column, anchor) order: centre x, y and width, height as
    # fractions of the input, then the scores.
    theirs = np.concatenate(net.forward(net.getUnconnectedOutLayersNames()))[:, :4]
    height, width = settings["input_hw"]
    boxes, _ = decode_heads(model(image), head("tiny", scale_x_y=(1.05, 1.2)), (height, width))
    corners = boxes.numpy()[0] / np.array([width, height, width, height], np.float32)
    ours = np.concatenate(
        [(corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]], 1
    )
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    # The same boxes without the scale are elsewhere: the comparison sees it.
    plain, _ = decode_heads(model(image), head("tiny"), (height, width))
    assert np.abs(plain.numpy()[0] - boxes.numpy()[0]).max() > 0.1


@pytest.mark.parametrize(
    "line, message",
    [
        ("scale_x_y=0.9", "scale_x_y=0.9: values below 1 are not supported"),
        ("new_coords=1", "new_coords=1 (Scaled-YOLOv4's box decoding) is not supported"),
    ],
)
def test_yolo_decoding_this_library_lacks_is_named_with_its_line(tmp_path, line, message):
    text = darknet_writer.cfg_text(head("tiny"))
    first = text.index("[yolo]\n") + len("[yolo]\n")
    cfg = tmp_path / "odd.cfg"
    cfg.write_text(text[:first] + line + "\n" + text[first:])
    yolo_line = text[:first].count("\n")
    expected = rf"odd.cfg, line {yolo_line}: \[yolo\] {re.escape(message)}"
    with pytest.raises(ValueError, match=expected):
        darknet.describe_cfg(darknet.parse_cfg(str(cfg)), str(cfg))


def test_batch_norm_epsilon_is_folded_into_the_variance(tmp_path):
    """A batch norm of another epsilon (a Keras 2 model's 1e-3) exports the same function."""
    model = random_model("tiny", seed=3)
    model.get_layer("bn_4").epsilon = 1e-3
    cfg, weights = str(tmp_path / "eps.cfg"), str(tmp_path / "eps.weights")
    darknet_writer.write_darknet(model, cfg, weights, head("tiny"))
    converted, _ = darknet.convert(cfg, weights)
    want = model.get_layer("bn_4").get_weights()[3] + np.float32(1e-3 - 1e-6)
    np.testing.assert_allclose(converted.get_layer("bn_4").get_weights()[3], want, rtol=1e-6)
    image = random_image("tiny")
    for got, expected in zip(converted(image), model(image), strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_mismatched_model_is_named_and_nothing_written(exported, tmp_path):
    model, _, _ = exported("tiny")
    cfg, weights = tmp_path / "bad.cfg", tmp_path / "bad.weights"

    def write(model, spec):
        darknet_writer.write_darknet(model, str(cfg), str(weights), spec)

    # 80 classes: 3 x 85 = 255 filters in the heads, our model has 3 x 8 = 24.
    with pytest.raises(ValueError, match=r"conv_9: kernel shape \(1, 1, 512, 24\).*255\)"):
        write(model, head("tiny", num_classes=80))
    with pytest.raises(ValueError, match=r"conv_0: kernel shape \(3, 3, 3, 16\).*32\)"):
        write(model, head("yolov3", input_hw=(96, 128)))
    one_head = keras.Model(model.input, model.outputs[0], name="stride_32_only")
    with pytest.raises(ValueError, match="model stride_32_only has no layer conv_10"):
        write(one_head, head("tiny"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"input_hw": (100, 128)}, r"input size \(100, 128\) is not a positive multiple of 32"),
        ({"anchor_masks": [[3, 4, 5]]}, r"tiny needs 2 heads"),
        ({"anchor_masks": [[3, 4, 6], [0, 1, 2]]}, "index past the 6 anchors"),
        ({"anchors": -SMALL_ANCHORS}, "sizes must be positive"),
        ({"model_type": "darknet53"}, "model type 'darknet53': use one of"),
        ({"input_hw": None}, "the Darknet cfg needs an input size"),
    ],
)
def test_cfg_text_rejects_bad_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        darknet_writer.cfg_text(head("tiny", **changes))


def metadata(model_type):
    """What training writes beside the weights (``yolo3.training.job``)."""
    settings = SETTINGS[model_type]
    return {
        "model_type": model_type,
        "num_classes": NUM_CLASSES,
        "classes": ["cat", "dog", "bird"],
        "anchors": settings["anchors"].tolist(),
        "anchor_masks": settings["anchor_masks"],
        "input_size": list(settings["input_hw"]),
    }


def test_cli_exports_a_trained_weights_file(exported, tmp_path, capsys):
    model, _, _ = exported("tiny")
    source = str(tmp_path / "trained.weights.h5")
    yolo_weights.save_weights(model, source, metadata=metadata("tiny"))
    cfg, weights = str(tmp_path / "tiny.cfg"), str(tmp_path / "tiny.weights")

    assert convert_tool.main(["--to-darknet", source, cfg, weights]) == 0
    printed = capsys.readouterr().out
    assert "wrote tiny (3 classes, 8,680,864 parameters; masks [[3, 4, 5], [1, 2, 3]]" in printed
    assert f"input 96x128) to {cfg} and {weights}" in printed
    assert_reads_back(model, cfg, weights, "tiny", SETTINGS["tiny"])


def test_cli_needs_flags_for_a_file_without_metadata(exported, tmp_path, capsys):
    model, _, _ = exported("tiny")
    source = str(tmp_path / "bare.weights.h5")
    yolo_weights.save_weights(model, source)  # no metadata
    cfg, weights = str(tmp_path / "tiny.cfg"), str(tmp_path / "tiny.weights")
    export = ["--to-darknet", source, cfg, weights]

    assert convert_tool.main(export) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {source} does not record its number of classes")
    assert "pass --num-classes" in err and "Traceback" not in err
    assert convert_tool.main([*export, "--num-classes", "3"]) == 2
    assert "does not record its anchors; pass --anchors FILE" in capsys.readouterr().err
    assert not Path(cfg).exists() and not Path(weights).exists()

    settings = SETTINGS["tiny"]
    anchors = tmp_path / "anchors.txt"
    anchors.write_text(", ".join(f"{w!r},{h!r}" for w, h in settings["anchors"].tolist()))
    flags = ["--num-classes", "3", "--anchors", str(anchors)]
    # The model type follows from the 6 anchors; masks and [net] size get their defaults.
    assert convert_tool.main([*export, *flags]) == 0
    assert "does not record its input size; the cfg gets 416x416" in capsys.readouterr().out
    defaults = {**settings, "input_hw": (416, 416), "anchor_masks": [[3, 4, 5], [0, 1, 2]]}
    assert_reads_back(model, cfg, weights, "tiny", defaults)

    flags += ["--input-size", "96x128", "--anchor-masks", "3,4,5 1,2,3", "--model-type", "tiny"]
    assert convert_tool.main([*export, *flags]) == 0
    assert_reads_back(model, cfg, weights, "tiny", settings)


@pytest.mark.parametrize(
    "args, message",
    [
        (["a.cfg", "a.weights"], "required: output_path"),
        (["--to-darknet", "m.weights.h5", "a.cfg", "a.weights", "x.h5"], "drop x.h5"),
        (["--to-darknet", "m.weights.h5", "a.cfg", "a.weights", "-w"], "not --to-darknet"),
        (["a.cfg", "a.weights", "out.keras", "--num-classes", "3"], "only apply with"),
        (["--to-darknet", "m.weights.h5", "a.cfg", "a.weights", "--input-size", "9x"], "9x"),
    ],
)
def test_cli_argument_errors(args, message, capsys):
    assert convert_tool.main(args) == 2
    assert message in capsys.readouterr().err


def test_cli_missing_source_file(tmp_path, capsys):
    source = str(tmp_path / "missing.weights.h5")
    args = ["--to-darknet", source, str(tmp_path / "a.cfg"), str(tmp_path / "a.weights")]
    assert convert_tool.main(args) == 2
    assert f"error: weights file {source} does not exist" in capsys.readouterr().err
