"""The train step under XLA, as Keras compiles it on one GPU: same loss, same gradients.

XLA runs on the CPU too (``jit_compile=True``), so the step a one-GPU user gets by default
is compiled and checked here against the same step without XLA.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    SMALL_ANCHORS,
    SMALL_MASKS,
    make_head,
    numpy_loss,
    numpy_targets,
    random_boxes,
    tiny_model,
)
from test_combinations import ELSEWHERE
from train_helpers import SIZE, small_record_set, train_args, write_anchors

from yolo3.callbacks import Throughput
from yolo3.checkpoint.weights import load_weights
from yolo3.commands import train
from yolo3.engine.combinations import OPTIONS
from yolo3.engine.trainer import YoloTrainer
from yolo3.model.loss import yolo_loss
from yolo3.model.targets import build_targets
from yolo3.training import job as training

NUM_CLASSES = 2


def _colliding_boxes(rng, batch=3):
    """Random boxes, and image 0 holding only two 16x16 boxes in one stride-16 cell, both
    best matched by anchor 16x16: the first loses its cell and anchor to the second, so
    only the given boxes hold both."""
    boxes = random_boxes(rng, batch, 6, SIZE, NUM_CLASSES)
    boxes[0] = 0
    boxes[0, 0] = [32, 32, 48, 48, 0]
    boxes[0, 1] = [39, 39, 55, 55, 1]
    return boxes


def _outputs(rng, batch):
    channels = 3 * (5 + NUM_CLASSES)
    return [
        rng.normal(0, 1.5, (batch, SIZE // stride, SIZE // stride, channels)).astype(np.float32)
        for stride in (32, 16)
    ]


def _targets(boxes):
    """The loss targets of ``boxes`` from build_targets, and from the NumPy oracle."""
    targets = build_targets(
        boxes, input_hw=(SIZE, SIZE), head=make_head(SMALL_ANCHORS, NUM_CLASSES)
    )
    return targets, numpy_targets(boxes, (SIZE, SIZE), SMALL_ANCHORS, NUM_CLASSES, SMALL_MASKS)


def _loss_and_oracle(targets, oracle_targets, outputs, oracle_boxes, **options):
    """``(total, terms)`` of yolo_loss with ``options``, and of the NumPy oracle given
    ``oracle_boxes``: the true boxes that those options make the loss compare against."""
    loss = yolo_loss(
        targets,
        outputs,
        head=make_head(SMALL_ANCHORS, NUM_CLASSES),
        ignore_thresh=0.5,
        **options,
    )
    oracle = numpy_loss(
        oracle_targets, outputs, SMALL_ANCHORS, NUM_CLASSES, SMALL_MASKS, 0.5, oracle_boxes
    )
    return loss, oracle


def test_ignore_mask_with_given_boxes_matches_numpy_oracle():
    rng = np.random.default_rng(11)
    boxes = _colliding_boxes(rng)
    outputs = _outputs(rng, len(boxes))
    # Image 0, stride 16, cell (2, 2), anchor 6x8: a confident prediction of exactly the
    # losing box (centre 40, 40, size 16): IoU 1 with it, 81 / 431 with the winner.
    outputs[1][0, 2, 2, :5] = [0.0, 0.0, np.log(16 / 6), np.log(16 / 8), 3.0]
    targets, oracle_targets = _targets(boxes)
    results = {}
    for given in (None, boxes):
        (total, terms), (expected_total, expected_terms) = _loss_and_oracle(
            targets, oracle_targets, outputs, given, true_boxes=given
        )
        np.testing.assert_allclose(total.numpy()[:, 0], expected_total, rtol=1e-5)
        np.testing.assert_allclose(
            terms["objectness"].numpy()[:, 0], expected_terms["objectness"], rtol=1e-5
        )
        results["boxes" if given is not None else "targets"] = terms["objectness"].numpy()[:, 0]
    # The box that lost the collision spares predictions near it only when boxes are given.
    np.testing.assert_allclose(
        results["targets"][0] - results["boxes"][0], np.logaddexp(0, 3.0), rtol=1e-5
    )


def test_targets_only_fallback_caps_truths_in_level_order():
    rng = np.random.default_rng(5)
    boxes = random_boxes(rng, 2, 6, SIZE, NUM_CLASSES, fill=1.0)
    outputs = _outputs(rng, 2)
    targets, oracle_targets = _targets(boxes)
    cap = 2
    first_assigned = np.zeros((2, cap, 4), np.float32)  # corner pixels, in level order
    for image in range(2):
        cells = [
            level[image][index][:4]
            for level in oracle_targets
            for index in np.ndindex(level.shape[1:4])
            if level[image][index][4] > 0
        ]
        assert len(cells) > cap
        for row, (cx, cy, w, h) in enumerate(cells[:cap]):
            first_assigned[image, row] = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    first_assigned *= SIZE
    (total, _), (expected, _) = _loss_and_oracle(
        targets, oracle_targets, outputs, first_assigned, max_true_boxes=cap
    )
    np.testing.assert_allclose(total.numpy()[:, 0], expected, rtol=1e-5)


def _loss_and_gradients(jit_compile, model, images, boxes):
    @tf.function(jit_compile=jit_compile)
    def step(images, boxes):
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            targets = build_targets(
                boxes, input_hw=(SIZE, SIZE), head=make_head(SMALL_ANCHORS, NUM_CLASSES)
            )
            total, _ = yolo_loss(
                targets, outputs, head=make_head(SMALL_ANCHORS, NUM_CLASSES), true_boxes=boxes
            )
            loss = tf.reduce_mean(total)
        return total, tape.gradient(loss, model.trainable_variables)

    total, grads = step(tf.constant(images), tf.constant(boxes))
    return total.numpy(), [g.numpy() for g in grads]


@pytest.fixture
def float64_network():
    """Builds the network in float64 (the loss stays float32).

    In float32 an activation within rounding of LeakyReLU's kink takes the other slope
    when XLA fuses and reorders sums, and batch norm over a few 2x2 maps amplifies that
    into percent-level gradient differences on some inputs (seen: 2.5e-2 on one batch,
    7e-6 on another). In float64 no activation sits that close, so the comparison shows
    whether XLA computes the same function.
    """
    keras.mixed_precision.set_global_policy("float64")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
def test_loss_and_gradients_are_the_same_with_and_without_xla(float64_network):
    # One batch: in float64 the comparison holds on any, and a second seed ran the same
    # code on other numbers.
    rng = np.random.default_rng(4)
    boxes = _colliding_boxes(rng, batch=4)
    images = rng.uniform(0, 1, (4, SIZE, SIZE, 3))
    keras.utils.set_random_seed(0)
    model = tiny_model(NUM_CLASSES, SIZE)
    plain_total, plain_grads = _loss_and_gradients(False, model, images, boxes)
    xla_total, xla_grads = _loss_and_gradients(True, model, images, boxes)
    np.testing.assert_allclose(xla_total, plain_total, rtol=1e-5)
    for variable, plain, xla in zip(model.trainable_variables, plain_grads, xla_grads):
        relative = np.linalg.norm(xla - plain) / max(np.linalg.norm(plain), 1e-12)
        assert relative <= 1e-5, f"{variable.path}: gradient differs by {relative:.2e}"


def _fit_one_step(jit_compile, images, boxes):
    keras.utils.set_random_seed(0)
    trainer = YoloTrainer(tiny_model(NUM_CLASSES, SIZE), head=make_head(SMALL_ANCHORS, NUM_CLASSES))
    trainer.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=jit_compile)
    trainer.build((None, SIZE, SIZE, 3))
    before = [v.numpy() for v in trainer.trainable_variables]
    trainer.measure_input_wait()
    throughput = Throughput(len(images), skip_first=0)
    dataset = tf.data.Dataset.from_tensors((images, boxes)).repeat()
    history = trainer.fit(
        dataset, epochs=1, steps_per_epoch=1, verbose=0, callbacks=[throughput], shuffle=False
    ).history
    after = [v.numpy() for v in trainer.trainable_variables]
    return trainer, history, [a - b for a, b in zip(after, before)]


@pytest.mark.slow
def test_fit_compiles_the_step_with_xla_and_still_measures_input_wait():
    rng = np.random.default_rng(4)
    boxes = _colliding_boxes(rng, batch=4)
    images = rng.integers(0, 256, (4, SIZE, SIZE, 3), dtype=np.uint8)
    trainer, history, xla_update = _fit_one_step(True, images, boxes)
    assert trainer.jit_compile is True
    assert 0.0 <= history["input_wait_fraction"][0] <= 1.0
    assert history["images_per_second"][0] > 0
    _, plain_history, plain_update = _fit_one_step(False, images, boxes)
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-4)
    # The same SGD update up to float32 kink crossings (see float64_network): a broken
    # step (a term lost, a wrong scale) would be off by far more.
    xla_update = np.concatenate([u.ravel() for u in xla_update])
    plain_update = np.concatenate([u.ravel() for u in plain_update])
    assert np.linalg.norm(xla_update - plain_update) <= 0.1 * np.linalg.norm(plain_update)


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    return small_record_set(folder / "set", noise=8), write_anchors(folder / "anchors.txt")


@pytest.fixture
def restore_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


# What --jit-compile auto and --mixed-precision auto give on one GPU: XLA with float32
# (older GPUs), float16 and loss scaling (compute capability 7.x), bfloat16 (8.0 and newer).
# bfloat16 trains in tests/test_combinations.py (its "XLA, PowerSGD" row), float32 in
# test_fit_compiles_the_step_with_xla_and_still_measures_input_wait above; float16 trains
# here, with overlapped local steps (the combinations table's pair of XLA and local steps,
# test_combinations.ELSEWHERE), and its checkpoint loads in float32 as the trained weights.
@pytest.mark.slow
def test_train_py_with_jit_compile_on_trains_and_writes_a_checkpoint(
    record_set, tmp_path, restore_policy
):
    precision = "float16"
    records, anchors = record_set
    args = train_args(
        records, tmp_path, anchors, "--epochs", "1", "--steps-per-epoch", "3",
        "--mixed-precision", precision,
        *(flag for option in ELSEWHERE["tests/test_xla.py"] for flag in OPTIONS[option]),
    )  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    assert training.configure(config) == precision
    result = training.run(config, log=lambda *_: None)
    assert result.trainer.jit_compile is True
    assert (result.trainer.communication.steps, result.trainer.communication.overlap) == (2, 1)
    assert isinstance(result.trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert math.isfinite(result.history["loss"][0])
    assert "input_wait_fraction" in result.history
    keras.mixed_precision.set_global_policy("float32")  # the checkpoint loads in float32
    body = tiny_model(NUM_CLASSES, SIZE, weight_decay=5e-4)
    load_weights(body, str(tmp_path / "checkpoints/last.weights.h5"))
    np.testing.assert_array_equal(
        body.get_layer("conv_0").kernel.numpy(),
        np.asarray(result.trainer.body.get_layer("conv_0").kernel.numpy(), np.float32),
    )


def test_an_xla_compile_failure_is_one_clear_line(record_set, tmp_path, monkeypatch, capsys):
    records, anchors = record_set

    def timestamped_loss(self, *args, **kwargs):  # an op XLA has no kernel for
        return tf.cast(tf.timestamp(), "float32") * 0.0 + original(self, *args, **kwargs)

    original = YoloTrainer.compute_loss
    monkeypatch.setattr(YoloTrainer, "compute_loss", timestamped_loss)
    args = train_args(
        records, tmp_path, anchors, "--epochs", "1", "--steps-per-epoch", "1",
        "--jit-compile", "on", "--mixed-precision", "off",
    )  # fmt: skip
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: XLA could not compile the train step")
    assert "--jit-compile off" in err[-1] and "Traceback" not in "\n".join(err)
