"""HeadSpec: one value for the detector's head, its checks, per-level views and metadata."""

import numpy as np
import pytest
from helpers import SMALL_ANCHORS, make_head

from yolo3.model.head import HeadSpec
from yolo3.model.resources import parse_scale_x_y

# The metadata a tiny-YOLOv3 checkpoint of yolo3 train carried before HeadSpec existed
# (RunSetup.metadata then), key for key: a checkpoint written then must read the same head.
CHECKPOINT_METADATA = {
    "model_type": "tiny",
    "num_classes": 2,
    "classes": ["circle", "square"],
    "anchors": [[6.0, 8.0], [10.0, 14.0], [16.0, 16.0], [24.0, 30.0], [40.0, 36.0], [56.0, 60.0]],
    "anchor_masks": [[3, 4, 5], [0, 1, 2]],
    "scale_x_y": [1.1, 1.1],
    "input_size": [96, 96],
}


def test_checkpoint_metadata_reads_and_writes_back_key_for_key():
    head = HeadSpec.from_metadata(CHECKPOINT_METADATA)
    assert head.to_metadata() == CHECKPOINT_METADATA
    assert list(head.to_metadata()) == list(CHECKPOINT_METADATA)  # the same key order
    assert (head.model_type, head.num_classes, head.input_hw) == ("tiny", 2, (96, 96))


def test_metadata_from_before_a_key_existed_reads_as_its_old_meaning():
    # No grid sensitivity: YOLOv3's 1 on every level; no masks: Darknet's for 6 anchors.
    old = {k: v for k, v in CHECKPOINT_METADATA.items() if k not in ("scale_x_y", "anchor_masks")}
    head = HeadSpec.from_metadata(old)
    assert head.scale_x_y == (1.0, 1.0)
    assert head.anchor_masks == ((3, 4, 5), (0, 1, 2))
    # A flag overrides what the file records; None leaves it.
    head = HeadSpec.from_metadata(CHECKPOINT_METADATA, scale_x_y=parse_scale_x_y("1.05,1.2"))
    assert head.scale_x_y == (1.05, 1.2)
    assert HeadSpec.from_metadata(CHECKPOINT_METADATA, scale_x_y=None).scale_x_y == (1.1, 1.1)
    with pytest.raises(ValueError, match="w.weights.h5 records no class names"):
        HeadSpec.from_metadata({"anchors": CHECKPOINT_METADATA["anchors"]}, source="w.weights.h5")


def test_levels_hold_each_outputs_anchors_stride_and_scale():
    head = make_head(SMALL_ANCHORS, 3, scale_x_y=(1.05, 1.2), anchor_masks=((3, 4, 5), (1, 2, 3)))
    first, second = head.levels()
    assert (first.stride, second.stride) == (32, 16)
    np.testing.assert_array_equal(first.anchors, SMALL_ANCHORS[[3, 4, 5]])
    np.testing.assert_array_equal(second.anchors, SMALL_ANCHORS[[1, 2, 3]])
    assert (first.xy_scale, second.xy_scale) == (1.05, 1.2)
    assert head.channels == 3 * (5 + 3)
    yolov3 = make_head(np.tile(SMALL_ANCHORS[:3], (3, 1)), 80, scale_x_y=1.1)
    assert (yolov3.model_type, yolov3.strides, yolov3.scale_x_y) == (
        "yolov3",
        (32, 16, 8),
        (1.1,) * 3,
    )
    # Normalised once: the same head from numbers, arrays or lists is one value.
    assert make_head(SMALL_ANCHORS.tolist(), 3, input_hw=64) == make_head(
        SMALL_ANCHORS, 3, input_hw=(64, 64)
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"model_type": "yolov3"}, "model type yolov3 needs 9 anchors; 6 given"),
        ({"anchor_masks": ((3, 4, 5),)}, r"tiny needs 2 heads"),
        ({"anchor_masks": ((3, 4, 5), (0, 1))}, "every level needs the same number of anchors"),
        ({"anchor_masks": ((3, 4, 6), (0, 1, 2))}, "index past the 6 anchors"),
        ({"scale_x_y": (1.1, 1.2, 1.3)}, "give one value, or one per head .2 here"),
        ({"scale_x_y": 0.9}, "grid sensitivity 0.9: every value must be at least 1"),
        ({"input_hw": (100, 128)}, r"input size \(100, 128\) is not a positive multiple of 32"),
        ({"anchors": -SMALL_ANCHORS}, "sizes must be positive"),
        ({"num_classes": 0}, "at least one class"),
    ],
)
def test_a_head_that_cannot_be_is_refused_naming_the_field(fields, message):
    fields = {"anchors": SMALL_ANCHORS, "num_classes": 2, **fields}
    with pytest.raises(ValueError, match=message):
        make_head(**fields)


def test_outputs_of_another_head_are_named_with_both_counts():
    head = make_head(SMALL_ANCHORS, 3)
    head.check_outputs([(1, 2, 2, 24), (1, 4, 4, 24)])
    with pytest.raises(
        ValueError, match="head 1 has 21 channels; 3 anchors x .5 \\+ 3 classes. = 24"
    ):
        head.check_outputs([(1, 2, 2, 24), (1, 4, 4, 21)])
    with pytest.raises(ValueError, match="model has 1 output heads but the anchor masks"):
        head.check_outputs([(1, 2, 2, 24)])


def test_prior_biases_start_each_score_at_the_datas_prior():
    # Tiny at 64 x 96 px, 5 classes, 3 boxes per image: level 0 has 2 x 3 cells of 3 anchors
    # (18 predictions: objectness 3/18), level 1 4 x 6 (72: 3/72); classes 1/5 each. With
    # the output kernels zeroed the network's scores are those priors exactly, in the
    # channels the loss and the decoder read (anchor a: 5 + classes channels from a * 10).
    import keras
    from keras import ops

    from yolo3.model.head import prior_biases
    from yolo3.model.network import head_layer_names, set_head_biases, tiny_yolo_body

    metadata = dict(CHECKPOINT_METADATA, num_classes=5, classes=list("abcde"))
    head = HeadSpec.from_metadata(metadata)
    biases = prior_biases(head, (64, 96), 3.0)
    body = tiny_yolo_body(None, 3, 5, input_shape=(64, 96, 3))
    set_head_biases(body, "tiny", biases)
    for name in head_layer_names("tiny"):
        kernel = body.get_layer(name).kernel
        kernel.assign(np.zeros(kernel.shape, np.float32))
    images = np.random.default_rng(0).uniform(0, 1, (1, 64, 96, 3)).astype(np.float32)
    for output, cells, expected in zip(body(images), (6, 24), (3 / 18, 3 / 72)):
        scores = keras.ops.convert_to_numpy(ops.sigmoid(output)).reshape(-1, 3, 10)
        assert scores.shape[0] == cells
        np.testing.assert_allclose(scores[..., 4], expected, rtol=1e-5)
        np.testing.assert_allclose(scores[..., 5:], 0.2, rtol=1e-5)
        np.testing.assert_allclose(scores[..., :4], 0.5)
    # More boxes than half the predictions, or a single class: capped at 0.5 (bias 0).
    one_class = HeadSpec.from_metadata(dict(CHECKPOINT_METADATA, num_classes=1, classes=["a"]))
    for bias in prior_biases(one_class, (64, 64), 40.0):
        assert np.all(bias == 0)
