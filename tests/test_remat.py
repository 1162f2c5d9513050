"""--remat: activations recomputed in the backward pass, with the same loss, gradients and
batch-norm statistics as without, on one device and on two replicas."""

import math
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, make_head, random_boxes, tiny_model
from train_helpers import SIZE, small_record_set, train_args, write_anchors

from yolo3.checkpoint.weights import load_weights
from yolo3.commands import train
from yolo3.engine.trainer import YoloTrainer
from yolo3.model.network import build_model
from yolo3.model.remat import RematForward, split_into_segments
from yolo3.training import job as training

NUM_CLASSES = 2
REPLICAS_SCRIPT = Path(__file__).with_name("remat_replicas.py")
YOLOV3_ANCHORS = np.array([[4, 6], [6, 8], [8, 10], [10, 14], [16, 16], [24, 30], [30, 40],
                           [40, 36], [56, 60]], np.float32)  # fmt: skip


def test_segments_end_at_each_unit_and_cover_every_layer_once():
    body = tiny_model(NUM_CLASSES, SIZE)
    segments = split_into_segments(body)
    # tiny-YOLOv3: 11 units with batch norm and 2 heads.
    assert len(segments) == 13
    names = [layer.name for layers, *_ in segments for layer in layers]
    assert sorted(names) == sorted(layer.name for layer in body.layers[1:])
    last_layers = [layers[-1].name for layers, *_ in segments]
    assert last_layers[:5] == ["leaky_0", "leaky_1", "leaky_2", "leaky_3", "leaky_4"]
    assert {"conv_9", "conv_12"} <= set(last_layers)
    # conv_4's activation (stride 16) is read again by the concat after the stride-32 head.
    _, inputs, outputs, stride = segments[4]
    assert stride == 16 and len(outputs) == 1
    assert any(outputs[0] in later_inputs for _, later_inputs, _, _ in segments[6:])
    # Strides: four max pools of stride 2 before conv_4; the upsampled branch is at 16.
    assert [stride for *_, stride in segments[:6]] == [1, 2, 4, 8, 16, 32]


def test_large_recomputes_only_strides_up_to_8():
    body = tiny_model(NUM_CLASSES, SIZE)
    large = RematForward(body, "large")
    assert [s.recompute for s in large.segments] == [s.stride <= 8 for s in large.segments]
    assert sum(s.recompute for s in large.segments) == 4
    assert all(s.recompute for s in RematForward(body, "full").segments)
    with pytest.raises(ValueError, match="--remat 'some': use one of"):
        RematForward(body, "some")


def _step(model_type, remat, images, boxes, jit_compile=False):
    """One forward and backward pass of the trainer's loss: per-image loss, gradients, and
    the batch-norm moving statistics after the step."""
    keras.utils.set_random_seed(0)
    anchors = SMALL_ANCHORS if model_type == "tiny" else YOLOV3_ANCHORS
    body = build_model(model_type, NUM_CLASSES, input_size=SIZE, weight_decay=5e-4)
    trainer = YoloTrainer(body, head=make_head(anchors, NUM_CLASSES), remat=remat)

    @tf.function(jit_compile=jit_compile)
    def step(images, boxes):
        with tf.GradientTape() as tape:
            outputs = trainer(images, training=True)
            loss = trainer.compute_loss(y=boxes, y_pred=outputs)
        return loss, tape.gradient(loss, body.trainable_variables)

    loss, grads = step(tf.constant(images), tf.constant(boxes))
    statistics = [v.numpy() for v in body.non_trainable_variables]
    return step, float(loss), [g.numpy() for g in grads], statistics


def _assert_close(got, want, what):
    for index, (g, w) in enumerate(zip(got, want)):
        relative = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-12)
        assert relative <= 1e-5, f"{what} {index}: differs by {relative:.2e}"


@pytest.mark.parametrize(
    ("model_type", "remat"), [("tiny", "full"), ("tiny", "large"), ("yolov3", "full")]
)
@pytest.mark.slow
def test_same_loss_gradients_and_statistics_as_without(model_type, remat):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (2, SIZE, SIZE, 3), dtype=np.uint8)
    boxes = random_boxes(rng, 2, 6, SIZE, NUM_CLASSES)
    _, plain_loss, plain_grads, plain_stats = _step(model_type, "off", images, boxes)
    step, loss, grads, stats = _step(model_type, remat, images, boxes)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    _assert_close(grads, plain_grads, "gradient")
    # Moving statistics updated once: the recomputation must not update them again.
    _assert_close(stats, plain_stats, "moving statistic")
    assert not all(np.array_equal(s, 0) for s in stats[::2])  # they did move


def _convolutions(step_function, images, boxes):
    graph = step_function.get_concrete_function(tf.constant(images), tf.constant(boxes)).graph
    names = [op.type for op in graph.get_operations()]

    def nested(graph):
        for function in graph._functions.values():
            inner = function.graph if hasattr(function, "graph") else None
            if inner is not None:
                yield from (op.type for op in inner.get_operations())
                yield from nested(inner)

    return sum(kind == "Conv2D" for kind in names + list(nested(graph)))


def test_full_runs_every_convolution_again_in_the_backward_pass():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (2, SIZE, SIZE, 3), dtype=np.uint8)
    boxes = random_boxes(rng, 2, 4, SIZE, NUM_CLASSES)
    plain_step, *_ = _step("tiny", "off", images, boxes)
    full_step, *_ = _step("tiny", "full", images, boxes)
    # 13 forward convolutions; remat runs each once more (their input and kernel
    # gradients are Conv2DBackprop* ops, not counted).
    assert _convolutions(plain_step, images, boxes) == 13
    assert _convolutions(full_step, images, boxes) == 26


@pytest.mark.slow
def test_the_step_compiles_with_xla_and_gives_the_same_loss():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (2, SIZE, SIZE, 3), dtype=np.uint8)
    boxes = random_boxes(rng, 2, 4, SIZE, NUM_CLASSES)
    _, plain_loss, plain_grads, _ = _step("tiny", "off", images, boxes)
    _, loss, grads, _ = _step("tiny", "large", images, boxes, jit_compile=True)
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    # XLA reorders float32 sums: the looser bound of tests/test_xla.py's fit comparison.
    flat = np.concatenate([g.ravel() for g in grads])
    plain_flat = np.concatenate([g.ravel() for g in plain_grads])
    assert np.linalg.norm(flat - plain_flat) <= 0.1 * np.linalg.norm(plain_flat)


@pytest.mark.slow
def test_replicas_step_as_without_and_sync_bn_is_refused(tmp_path):
    result_path = tmp_path / "replicas.npz"
    command = [sys.executable, str(REPLICAS_SCRIPT), str(result_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = dict(np.load(result_path))

    def values(remat, kind):
        count = sum(name.startswith(f"{remat}_{kind}_") for name in result)
        return [result[f"{remat}_{kind}_{index}"] for index in range(count)]

    assert float(result["full_loss"]) == pytest.approx(float(result["off_loss"]), rel=1e-6)
    _assert_close(values("full", "change"), values("off", "change"), "weight change")
    _assert_close(values("full", "statistic"), values("off", "statistic"), "moving statistic")
    assert "--remat full with synchronised batch norm on 2 replicas" in str(result["sync_bn_error"])
    # One replica: the same layers are plain batch norm, and recompute.
    assert RematForward(tiny_model(NUM_CLASSES, SIZE, synchronized_bn=True), "full").segments


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    return small_record_set(folder / "set", noise=8), write_anchors(folder / "anchors.txt")


def test_train_py_with_remat_trains_and_writes_a_checkpoint(record_set, tmp_path):
    records, anchors = record_set
    args = train_args(records, tmp_path, anchors, "--epochs", "1", "--steps-per-epoch", "2",
                      "--remat", "full")  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    assert config.remat == "full"
    result = training.run(config, log=lambda *_: None)
    assert result.trainer.remat == "full"
    assert math.isfinite(result.history["loss"][0])
    body = tiny_model(NUM_CLASSES, SIZE, weight_decay=5e-4)
    load_weights(body, str(tmp_path / "checkpoints/last.weights.h5"))
    np.testing.assert_array_equal(
        body.get_layer("conv_0").kernel.numpy(), result.trainer.body.get_layer("conv_0").kernel
    )


def test_train_py_rejects_an_unknown_remat(capsys):
    with pytest.raises(SystemExit):
        train.build_parser().parse_args(["--records", "r", "--log-dir", "l", "--remat", "x"])
    assert "--remat: invalid choice: 'x'" in capsys.readouterr().err
