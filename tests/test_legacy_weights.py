"""Keras 2 HDF5 weights (the original keras-yolo3's files) load into our named layers."""

import re

import h5py
import numpy as np
import pytest
from darknet_files import write_keras2_h5

from yolo3.legacy import read_keras2_layers
from yolo3.model import tiny_yolo_body, yolo_body
from yolo3.weights import load_weights


def assert_weights_equal(model, written, skip=()):
    for layer in model.layers:
        if layer.weights and layer.name not in skip:
            for got, want in zip(layer.get_weights(), written[layer.name], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=layer.name)


def conv_numbers_in_file_order(path):
    """Numeric suffixes of the file's convolutions in file order (plain ``conv2d`` is 0)."""
    names = [name for name, weights in read_keras2_layers(path) if "kernel" in weights]
    return [int(re.search(r"(?:_(\d+))?$", name).group(1) or 0) for name in names]


@pytest.mark.parametrize(
    "build, num_layers, full_model, zero_based",
    [
        (tiny_yolo_body, 13 + 11, False, False),  # Keras 2 save_weights: conv2d_1 ...
        (yolo_body, 75 + 72, True, True),  # tf.keras model.save: conv2d, conv2d_1 ...
    ],
)
def test_every_weight_lands_in_its_layer(tmp_path, build, num_layers, full_model, zero_based):
    path = str(tmp_path / "yolo.h5")
    written = write_keras2_h5(
        build(num_classes=3),
        path,
        np.random.default_rng(0),
        full_model=full_model,
        zero_based=zero_based,
    )
    with h5py.File(path, "r") as f:
        assert ("model_weights" in f) == full_model
    # Depth-sorted: the first head comes after later backbone convolutions in the file,
    # so loading in file order would put weights in the wrong layers.
    in_file = conv_numbers_in_file_order(path)
    assert in_file != sorted(in_file)

    model = build(num_classes=3)
    report = load_weights(model, path)
    assert len(report["loaded"]) == num_layers
    assert report["skipped"] == [] and report["missing"] == []
    assert_weights_equal(model, written)


@pytest.fixture
def tiny_file_for_3_classes(tmp_path):
    path = str(tmp_path / "tiny_3_classes.h5")
    written = write_keras2_h5(tiny_yolo_body(num_classes=3), path, np.random.default_rng(1))
    return path, written


def test_other_class_count_names_layers_and_shapes(tiny_file_for_3_classes):
    path, _ = tiny_file_for_3_classes
    model = tiny_yolo_body(num_classes=80)
    before = [w.copy() for w in model.get_weights()]
    # 3 anchors x (5 + 3 classes) = 24 output channels in the file, 255 in the model.
    message = (
        r"file layer conv2d_10 -> conv_9: file has shapes \[\(1, 1, 512, 24\), \(24,\)\], "
        r"model expects \[\(1, 1, 512, 255\), \(255,\)\]"
    )
    with pytest.raises(ValueError, match=message):
        load_weights(model, path)
    for got, want in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)  # nothing was half-loaded


def test_skip_mismatch_loads_everything_but_the_heads(tiny_file_for_3_classes):
    path, written = tiny_file_for_3_classes
    model = tiny_yolo_body(num_classes=80)
    report = load_weights(model, path, skip_mismatch=True)
    assert [name for name, _ in report["skipped"]] == ["conv_9", "conv_12"]
    assert len(report["loaded"]) == 13 + 11 - 2
    assert_weights_equal(model, written, skip={"conv_9", "conv_12"})


def test_other_network_gives_both_layer_counts(tiny_file_for_3_classes):
    path, _ = tiny_file_for_3_classes
    with pytest.raises(ValueError, match=r"13 convolutions and 11 batch norms.*has 75 and 72"):
        load_weights(yolo_body(num_classes=3), path, skip_mismatch=True)


def test_batch_norm_without_gamma_and_beta_is_identity_scaled(tiny_file_for_3_classes):
    path, written = tiny_file_for_3_classes
    # A BatchNormalization(scale=False, center=False) layer saves only its moving statistics.
    with h5py.File(path, "a") as f:
        group = f["batch_normalization_1"]
        del group["batch_normalization_1/gamma:0"], group["batch_normalization_1/beta:0"]
        group.attrs["weight_names"] = [
            b"batch_normalization_1/moving_mean:0",
            b"batch_normalization_1/moving_variance:0",
        ]
    model = tiny_yolo_body(num_classes=3)
    load_weights(model, path)
    gamma, beta, mean, variance = model.get_layer("bn_0").get_weights()
    np.testing.assert_array_equal(gamma, np.ones(16))
    np.testing.assert_array_equal(beta, np.zeros(16))
    np.testing.assert_array_equal(mean, written["bn_0"][2])
    np.testing.assert_array_equal(variance, written["bn_0"][3])
    assert_weights_equal(model, written, skip={"bn_0"})


def test_unknown_layer_kind_is_an_error(tiny_file_for_3_classes):
    path, _ = tiny_file_for_3_classes
    with h5py.File(path, "a") as f:
        names = [bytes(name) for name in f.attrs["layer_names"]] + [b"dense_1"]
        f.attrs["layer_names"] = np.asarray(names, dtype="S")
        f.create_dataset("dense_1/dense_1/kernel:0", data=np.zeros((4, 4), np.float32))
        f.create_dataset("dense_1/dense_1/bias:0", data=np.zeros(4, np.float32))
        f.create_dataset("dense_1/dense_1/gamma:0", data=np.zeros(4, np.float32))
        f["dense_1"].attrs["weight_names"] = [
            b"dense_1/kernel:0",
            b"dense_1/bias:0",
            b"dense_1/gamma:0",
        ]
    with pytest.raises(
        ValueError, match=r"layer dense_1 has weights \['bias', 'gamma', 'kernel'\]"
    ):
        load_weights(tiny_yolo_body(num_classes=3), path)
