"""What ``--map-every`` writes to TensorBoard: per-class AP and a detection gallery."""

import io
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS
from PIL import Image
from record_sets import make_examples, write_record_set
from tensorboard.backend.event_processing import event_accumulator
from train_helpers import SIZE, train_args, write_anchors

from yolo3.callbacks.evaluation import class_tags
from yolo3.callbacks.history import read_history
from yolo3.commands import train
from yolo3.drawing import MISSED_BOX_COLOR, TRUE_BOX_COLOR
from yolo3.evaluation import validate
from yolo3.model.head import HeadSpec
from yolo3.training import job as training

# Class names TensorBoard tags cannot hold as they are; the examples use the first two only.
CLASSES = ("traffic light", "cat/dog", "never seen")


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    (folder / "set").mkdir()
    rng = np.random.default_rng(3)
    splits = {"train": make_examples(rng, 16, size=SIZE), "val": make_examples(rng, 8, size=SIZE)}
    records = write_record_set(folder / "set", splits, classes=CLASSES)
    return records, write_anchors(folder / "anchors.txt")


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


def _read_run(folder):
    """``{tag: [(step, value)]}`` of a TensorBoard run, read by TensorBoard's own loader."""
    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    reader.Reload()
    return {
        tag: [(event.step, tf.make_ndarray(event.tensor_proto)) for event in reader.Tensors(tag)]
        for tag in reader.Tags()["tensors"]
    }


def _decode_png(image_summary):
    """The one picture of a ``tf.summary.image`` value as an RGB array, from its PNG."""
    width, height, png = image_summary
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == (int(height), int(width), 3)
    return pixels


def test_class_tags_are_safe_and_distinct():
    names = ["traffic light", "cat/dog", "cat_dog", "", "été", "猫", "a.b-c_d"]
    assert class_tags(names) == [
        "traffic_light", "cat_dog", "cat_dog_2", "class_3", "ete", "class_5", "a.b-c_d",
    ]  # fmt: skip
    assert class_tags(["x", "x", "x"]) == ["x", "x_1", "x_2"]


def test_map_every_writes_per_class_ap_and_a_gallery_at_the_epoch_step(record_set, tmp_path):
    records, anchors = record_set
    args = train_args(records, tmp_path, anchors, "--epochs", "2", "--map-every", "2")
    config = train.config_from_args(train.build_parser().parse_args(args))
    training.configure(config)
    result = training.run(config, log=lambda *_: None)
    assert result.epochs_done == 2

    # An evaluation of the trained weights made apart from the training run, decoding as
    # the run trained (its grid sensitivity: 2 from scratch).
    trained = result.trainer.head
    head = HeadSpec(anchors=SMALL_ANCHORS, class_names=CLASSES, scale_x_y=trained.scale_x_y)
    evaluation = validate.evaluate_model(result.trainer.body, records, head=head, coco=False)
    assert all(math.isfinite(ap) for ap in evaluation.voc.ap[:2])
    assert math.isnan(evaluation.voc.ap[2])  # no ground truth: no AP, and no scalar

    run = _read_run(tmp_path / "tensorboard" / "evaluation")
    assert set(run) == {"epoch_AP50/traffic_light", "epoch_AP50/cat_dog", "epoch_gallery"}
    # Epoch 2 only, at the step Keras gives that epoch's losses and mAP (its index, 1).
    keras_run = _read_run(tmp_path / "tensorboard" / "validation")
    assert [step for step, _ in keras_run["epoch_mAP50"]] == [1]
    for tag, ap in zip(("traffic_light", "cat_dog"), evaluation.voc.ap[:2]):
        [(step, value)] = run[f"epoch_AP50/{tag}"]
        assert step == 1
        assert float(value) == pytest.approx(ap, rel=1e-6, abs=1e-7)
    mean = float(keras_run["epoch_mAP50"][0][1])
    assert mean == pytest.approx(np.mean(evaluation.voc.ap[:2]), rel=1e-6, abs=1e-7)
    # history.jsonl holds the same figures, one line an epoch, on a clock that moves on.
    first, second = read_history(tmp_path)
    assert (first["epoch"], second["epoch"]) == (1, 2) and "val_mAP50" not in first
    assert second["val_mAP50"] == pytest.approx(mean, rel=1e-6)
    assert second["loss"] == pytest.approx(result.history["loss"][1], rel=1e-6)
    assert 0 < first["seconds"] < second["seconds"]

    # Six of the eight validation images, three 256-pixel tiles a row.
    [(step, gallery)] = run["epoch_gallery"]
    assert step == 1 and gallery.shape == (3,)
    pixels = _decode_png(gallery)
    # Two rows of tiles, then the legend band below them.
    assert pixels.shape[1:] == (768, 3) and pixels.shape[0] > 512
    tiles = pixels[:512]
    # The true boxes are drawn on the tiles, found or missed.
    assert any((tiles == color).all(-1).any() for color in (TRUE_BOX_COLOR, MISSED_BOX_COLOR))
