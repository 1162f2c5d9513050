"""FLOPs counted from the layers, against hand-derived values and Darknet's printout."""

import keras
import pytest

from yolo3.model.flops import count_flops, flops_by_layer
from yolo3.model.network import build_model


def test_one_convolution_counts_two_flops_per_multiply_add():
    inputs = keras.Input((10, 12, 3))
    outputs = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    # 10 x 12 outputs x (3 x 3 x 3 inputs) x 4 filters = 12,960 multiply-adds -> 25,920.
    assert count_flops(keras.Model(inputs, outputs)) == 25_920


def test_stride_groups_dense_and_nested_models_are_counted():
    inputs = keras.Input((16, 16, 8))
    # valid 3x3 stride 2: 7 x 7 outputs; 4 groups of 2 inputs: 49 x 9 x 2 x 8 x 2 = 14,112.
    x = keras.layers.Conv2D(8, 3, strides=2, groups=4, name="grouped")(inputs)
    inner = keras.Model(inputs, x, name="inner")
    outer_inputs = keras.Input((16, 16, 8))
    y = keras.layers.ReLU()(inner(outer_inputs))
    y = keras.layers.MaxPooling2D()(y)  # not counted
    # Dense on (3, 3, 8): 9 positions x 8 x 5 = 360 multiply-adds -> 720.
    y = keras.layers.Dense(5, name="dense")(y)
    model = keras.Model(outer_inputs, y)
    assert flops_by_layer(model) == {"grouped": 14_112, "dense": 720}
    assert count_flops(model) == 14_832


def test_a_model_without_a_fixed_input_size_is_refused():
    model = build_model("tiny", 3)
    with pytest.raises(ValueError, match="FLOPs need a fixed input size"):
        count_flops(model)


def test_tiny_yolov3_at_416_matches_darknet():
    model = build_model("tiny", 80, input_size=416)
    counts = flops_by_layer(model)
    # By hand, 2 x out_h x out_w x k x k x in x out:
    # conv_0  416^2 x 9 x 3 x 16 x 2                      =   149,520,384
    # conv_1..conv_5 and conv_8: 3x3, each 398,721,024 (e.g. 208^2 x 9 x 16 x 32 x 2)
    # conv_6  13^2 x 9 x 512 x 1024 x 2                   = 1,594,884,096
    # conv_7  13^2 x 1024 x 256 x 2 = 88,604,672;  conv_9  13^2 x 512 x 255 x 2 = 44,129,280
    # conv_10 13^2 x 256 x 128 x 2 = 11,075,584;   conv_11 26^2 x 9 x 384 x 256 x 2
    # = 1,196,163,072;  conv_12 26^2 x 256 x 255 x 2 = 88,258,560. Sum 5,564,961,792.
    assert counts["conv_0"] == 149_520_384 and counts["conv_11"] == 1_196_163_072
    assert count_flops(model) == 5_564_961_792
    # Darknet prints 5.571 BFLOPs for yolov3-tiny.cfg at 416: it also counts its six max
    # pools, size^2 x channels x out_h x out_w each: 4 x (16 x 208^2 + 32 x 104^2 + 64 x 52^2
    # + 128 x 26^2 + 256 x 13^2 + 512 x 13^2) = 5,710,848. 5.5650 + 0.0057 = 5.5707 -> 5.571.
    max_pool = 4 * (16 * 208**2 + 32 * 104**2 + 64 * 52**2 + 128 * 26**2 + 256 * 169 + 512 * 169)
    assert round((count_flops(model) + max_pool) / 1e9, 3) == 5.571
    assert count_flops(model) / 5.571e9 == pytest.approx(1, rel=0.005)


def test_yolov3_at_416_matches_darknet():
    model = build_model("yolov3", 80, input_size=416)
    flops = count_flops(model)
    assert len(flops_by_layer(model)) == 75  # every [convolutional] of yolov3.cfg
    # Darknet prints 65.879 BFLOPs for yolov3.cfg at 416: it also counts one operation per
    # output of its 23 residual adds ([shortcut]): 208^2 x 64 + 2 x 104^2 x 128
    # + 8 x 52^2 x 256 + 8 x 26^2 x 512 + 4 x 13^2 x 1024 = 14,536,704.
    shortcuts = 208**2 * 64 + 2 * 104**2 * 128 + 8 * 52**2 * 256 + 8 * 26**2 * 512
    shortcuts += 4 * 13**2 * 1024
    assert round((flops + shortcuts) / 1e9, 3) == 65.879
    assert flops / 65.879e9 == pytest.approx(1, rel=0.005)
