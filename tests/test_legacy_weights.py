"""Keras 2 HDF5 weights (the original keras-yolo3's files) load into our named layers."""

import re

import h5py
import numpy as np
import pytest
from darknet_files import write_keras2_h5

from yolo3.checkpoint.legacy import KERAS2_BN_EPSILON, read_keras2_layers
from yolo3.checkpoint.weights import load_weights
from yolo3.model.network import BN_EPSILON, tiny_yolo_body, yolo_body


def folded(variance, file_epsilon=KERAS2_BN_EPSILON):
    """The moving variance a file's batch norm gets here: the epsilons' difference added."""
    return (np.float64(variance) + file_epsilon - BN_EPSILON).astype(np.float32)


def assert_weights_equal(model, written, skip=()):
    for layer in model.layers:
        if layer.weights and layer.name not in skip:
            want = list(written[layer.name])
            if layer.name.startswith("bn_"):
                want[3] = folded(want[3])
            for got, expected in zip(layer.get_weights(), want, strict=True):
                np.testing.assert_array_equal(got, expected, err_msg=layer.name)


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
    np.testing.assert_array_equal(variance, folded(written["bn_0"][3]))
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


def _relative_difference(outputs, reference):
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
        for a, b in zip(outputs, reference)
    )


@pytest.mark.parametrize(
    "full_model, file_epsilon",
    [(False, KERAS2_BN_EPSILON), (True, KERAS2_BN_EPSILON), (True, 1e-4)],
    ids=["save_weights, Keras 2 default", "model.save, 1e-3", "model.save, 1e-4 in its config"],
)
def test_loaded_weights_predict_what_the_original_layers_did(tmp_path, full_model, file_epsilon):
    path = str(tmp_path / "yolo.h5")
    rng = np.random.default_rng(3)
    # Moving variances near 0.01, where epsilon 1e-3 against 1e-6 matters most.
    written = write_keras2_h5(
        tiny_yolo_body(num_classes=3),
        path,
        rng,
        full_model=full_model,
        bn_epsilon=file_epsilon if full_model else None,
        variance=(0.005, 0.05),
    )
    # The oracle: the same network with the file's weights as stored and batch norms that
    # use the file's epsilon, as the original's Keras 2 layers did.
    reference = tiny_yolo_body(num_classes=3, input_shape=(64, 64, 3))
    stored = tiny_yolo_body(num_classes=3, input_shape=(64, 64, 3))
    for layer in reference.layers:
        if layer.weights:
            layer.set_weights(written[layer.name])
            stored.get_layer(layer.name).set_weights(written[layer.name])
        if layer.name.startswith("bn_"):
            layer.epsilon = file_epsilon
    ours = tiny_yolo_body(num_classes=3, input_shape=(64, 64, 3))
    load_weights(ours, path)
    images = rng.uniform(0, 1, (2, 64, 64, 3)).astype(np.float32)
    expected = reference(images)
    before = _relative_difference(stored(images), expected)
    after = _relative_difference(ours(images), expected)
    print(f"\nrelative output difference: weights as stored {before:.1e}, folded {after:.1e}")
    assert after <= 1e-5
    assert before >= 1e-3  # the fold is what closes the gap
