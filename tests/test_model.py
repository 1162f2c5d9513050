"""Model topology: Darknet's parameter counts, stable names, input sizes, safe reloading."""

import re

import keras
import numpy as np
import pytest

from yolo3.model.network import (
    build_model,
    darknet_body,
    head_layer_names,
    tiny_yolo_body,
    yolo_body,
)

LAYER_NAME = re.compile(r"^(image|(conv|bn|leaky|pad|add|upsample|concat|maxpool)_\d+)$")


@pytest.fixture(scope="module")
def yolov3():
    return build_model("yolov3", 80, input_size=416)


def test_parameter_counts_match_darknet(yolov3):
    assert yolov3.count_params() == 62_001_757
    assert build_model("tiny", 80, input_size=416).count_params() == 8_858_734


def test_every_layer_has_an_explicit_name(yolov3):
    for model in (yolov3, build_model("tiny", 80)):
        names = [layer.name for layer in model.layers]
        assert all(LAYER_NAME.match(name) for name in names), names
        assert len(set(names)) == len(names)


def test_heads_and_strides(yolov3):
    assert [o.shape[1:] for o in yolov3.outputs] == [(13, 13, 255), (26, 26, 255), (52, 52, 255)]
    assert [t.name for t in yolov3.outputs] == [
        yolov3.get_layer(n).output.name for n in head_layer_names("yolov3")
    ]
    # Conv 61 of Darknet's cfg counting route/shortcut sections is our stride-16 tap.
    features = darknet_body(input_shape=(256, 256, 3))
    assert [o.shape[1:] for o in features.outputs] == [(32, 32, 256), (16, 16, 512), (8, 8, 1024)]


@pytest.mark.parametrize("model_type", ["yolov3", "tiny"])
def test_any_multiple_of_32_runs_and_none_for_inference(model_type):
    model = build_model(model_type, 3)  # (None, None, 3)
    for height, width in [(64, 96), (128, 64)]:
        outputs = model(np.zeros((1, height, width, 3), np.float32))
        strides = (32, 16, 8)[: len(outputs)]
        assert [o.shape[1:3] for o in outputs] == [(height // s, width // s) for s in strides]
        assert all(o.shape[-1] == 3 * (5 + 3) for o in outputs)


@pytest.mark.parametrize("size", [400, 100, (416, 300)])
def test_input_size_not_multiple_of_32_is_an_error(size):
    bad = size if isinstance(size, int) else size[1]
    with pytest.raises(ValueError, match=f"input size {bad} is not a multiple of 32"):
        build_model("tiny", 2, input_size=size)


def test_bad_counts_and_type_are_errors():
    with pytest.raises(ValueError, match="num_classes"):
        yolo_body(None, 3, 0)
    with pytest.raises(ValueError, match="unknown model type 'yolov4'"):
        build_model("yolov4", 2)
    with pytest.raises(ValueError, match="expects 3"):
        tiny_yolo_body(keras.Input((64, 64, 1)), 3, 2)


def test_keras_file_reloads_in_safe_mode(tmp_path):
    model = build_model("tiny", 2, synchronized_bn=False)
    path = str(tmp_path / "tiny.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True, compile=False)
    images = np.random.default_rng(0).uniform(0, 1, (2, 96, 64, 3)).astype(np.float32)
    for a, b in zip(model(images), reloaded(images)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not any(isinstance(layer, keras.layers.Lambda) for layer in reloaded.layers)
