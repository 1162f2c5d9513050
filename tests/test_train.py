"""train.py end to end on one device: checkpoints, resume, freezing, mixed precision."""

import dataclasses
import math
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS
from tensorflow.python.data.ops import multi_device_iterator_ops
from test_progress import FakeClock
from train_helpers import SIZE, small_record_set, train_args, validation_loss, write_anchors

from yolo3.callbacks import StopOnNonFinite, read_history, read_training_state
from yolo3.checkpoint.weights import load_weights, read_metadata, save_weights
from yolo3.commands import train
from yolo3.data import records as yolo_records
from yolo3.engine import config as run_config
from yolo3.inference.detector_spec import spec_for_weights
from yolo3.model.network import tiny_yolo_body
from yolo3.model.resources import read_anchors
from yolo3.training import job as training


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    # 7 validation images: a pass of batches of 4 ends with one padding image.
    return small_record_set(folder / "set", val=7), write_anchors(folder / "anchors.txt")


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


def _body(weights=None):
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    if weights:
        load_weights(body, weights)
    return body


def _arrays(path):
    body = _body(path)
    return {
        layer.name: [w.numpy() for w in layer.weights] for layer in body.layers if layer.weights
    }


def test_train_writes_template_checkpoints_that_reload_without_the_trainer(
    record_set, tmp_path, monkeypatch
):
    records, anchors = record_set
    # With grid sensitivity per head, which the checkpoints record and detection decodes with.
    args = train_args(
        records, tmp_path, anchors, "--epochs", "2", "--map-every", "2", "--scale-x-y", "1.1,1.2"
    )
    config = train.config_from_args(train.build_parser().parse_args(args))
    assert not config.neighbour_cells  # the recipe's need a grid sensitivity of 2
    training.configure(config)
    manifests_read = []
    read_manifest = yolo_records.read_manifest
    monkeypatch.setattr(
        yolo_records,
        "read_manifest",
        lambda path: manifests_read.append(path) or read_manifest(path),
    )
    # As TensorFlow ships it, whatever an earlier test of this process installed.
    create = multi_device_iterator_ops._create_device_dataset
    monkeypatch.setattr(
        multi_device_iterator_ops, "_create_device_dataset", getattr(create, "__wrapped__", create)
    )
    logged = []
    result = training.run(config, log=logged.append)
    # One read of the record set's manifest for the whole job: datasets, validation and
    # the mAP evaluation all take the value read at the start.
    assert manifests_read == [records]
    # The run's strategy hands out batches through per-device datasets without tf.data's
    # autotuning thread (yolo3/data/autotune.py).
    assert multi_device_iterator_ops._create_device_dataset.untuned
    assert result.epochs_done == 2 and result.stopped_reason is None
    assert all(math.isfinite(v) for v in result.history["loss"] + result.history["val_loss"])
    for term in ("box_loss", "objectness_loss", "class_loss", "learning_rate"):
        assert term in result.history
    assert 0.0 <= result.history["val_mAP50"][-1] <= 1.0  # evaluated at epoch 2 only
    assert (tmp_path / "config.json").exists()
    checkpoints = tmp_path / "checkpoints"
    assert {p.name for p in checkpoints.iterdir()} == {
        "last.weights.h5",
        "best.weights.h5",
        "state.weights.h5",
    }
    metadata = read_metadata(str(checkpoints / "last.weights.h5"))
    assert metadata["epoch"] == 2
    # The run ends with what a user looks for next: the validation report, the best epoch
    # with its figures (the only one AP was measured on: best by AP, whatever the losses),
    # the weights, and the commands to run on them.
    best = read_metadata(str(checkpoints / "best.weights.h5"))
    assert best["epoch"] == 2 and best["logs"]["val_fitness"] == pytest.approx(
        0.9 * result.history["val_AP"][-1] + 0.1 * result.history["val_AP50"][-1]
    )
    summary = logged[logged.index(next(m for m in logged if m.startswith("trained to"))) + 1 :]
    logs = best["logs"]
    figures = f"val_AP {logs['val_AP']:.4g}, val_AP50 {logs['val_AP50']:.4g}, "
    figures += f"val_loss {logs['val_loss']:.4g}"
    assert (tmp_path / "val" / "confusion_matrix.csv").exists()
    assert summary == [
        f"validation report of epoch 2: {tmp_path / 'val'} (metrics.json, confusion_matrix.png,"
        f" pr/, gallery.png); results.csv and results.png in {tmp_path}",
        f"best epoch 2: {figures} (picked by 0.9 AP + 0.1 AP50 on the validation images)",
        f"weights: {checkpoints / 'best.weights.h5'} (best), {checkpoints / 'last.weights.h5'} "
        "(last)",
        f"next: yolo3 detect --weights {checkpoints / 'best.weights.h5'} --output "
        f"{tmp_path / 'detect'} IMAGES_OR_FOLDERS",
        f"      yolo3 evaluate --weights {checkpoints / 'last.weights.h5'} --records {records}",
        "      (the last weights: best.weights.h5 was picked on these images)",
    ]
    assert metadata["anchor_masks"] == [[3, 4, 5], [0, 1, 2]]  # what Detector will use
    assert metadata["scale_x_y"] == [1.1, 1.2]
    assert spec_for_weights(checkpoints / "last.weights.h5").head.scale_x_y == (1.1, 1.2)
    # The template file holds the bare body: it loads into a fresh model with no wrapper
    # and predicts exactly what the trained model predicts.
    fresh = _body(str(checkpoints / "last.weights.h5"))
    images = np.random.default_rng(0).uniform(0, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
    for ours, theirs in zip(fresh(images), result.trainer.body(images)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    # The last validation pass scored each of the 7 images once (two batches of 4, the
    # last padded): its loss is the mean over the 7 in one batch, plus the weight decay.
    assert any("7 images per pass in 2 global batches of 4, 1 place padded" in m for m in logged)
    expected = validation_loss(checkpoints / "last.weights.h5", records, anchors)
    assert result.history["val_loss"][-1] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_freeze_then_unfreeze_changes_which_weights_move(record_set, tmp_path, capsys):
    records, anchors = record_set
    initial = str(tmp_path / "init.weights.h5")
    # Weights trained with grid sensitivity for the data's 2 classes: fine-tuning them keeps it.
    save_weights(_body(), initial, {"scale_x_y": [1.2, 1.3], "num_classes": 2})
    code = train.main(
        train_args(
            records, tmp_path / "run", anchors,
            "--weights", initial, "--epochs", "2", "--freeze-body", "1",
            "--freeze-epochs", "1", "--checkpoint-every", "1",
        )
    )  # fmt: skip
    assert code == 0
    assert (
        f"--weights {initial}: its heads fit the 2 classes; fine-tuning" in capsys.readouterr().out
    )
    last = read_metadata(str(tmp_path / "run/checkpoints/last.weights.h5"))
    assert last["scale_x_y"] == [1.2, 1.3]
    start = _arrays(initial)
    first = _arrays(str(tmp_path / "run/checkpoints/epoch-0001.weights.h5"))
    second = _arrays(str(tmp_path / "run/checkpoints/epoch-0002.weights.h5"))

    def moved(a, b, name):
        return any(not np.array_equal(x, y) for x, y in zip(a[name], b[name]))

    backbone = [f"{kind}_{i}" for i in range(5) for kind in ("conv", "bn")]
    rest = [name for name in start if name not in backbone]
    # Epoch 1: the backbone (weights and BN statistics) is frozen, the rest trains.
    assert not any(moved(start, first, name) for name in backbone)
    assert all(moved(start, first, name) for name in rest)
    # Epoch 2: everything trains.
    assert all(moved(first, second, name) for name in backbone + rest)


@pytest.mark.slow
def test_a_finished_run_resumes_with_its_optimizer_state(record_set, tmp_path, capsys):
    records, anchors = record_set
    args = train_args(records, tmp_path, anchors, "--steps-per-epoch", "3")
    assert train.main([*args, "--epochs", "1"]) == 0
    path, metadata = read_training_state(str(tmp_path / "checkpoints"))
    assert metadata["epoch"] == 1
    # A second run into the same folder must say how to continue instead of overwriting.
    assert train.main([*args, "--epochs", "2"]) == 2
    # What the saved state was built for cannot change on resume: refused before any step,
    # naming the flag and the saved value.
    other_anchors = write_anchors(tmp_path / "other_anchors.txt", SMALL_ANCHORS * 2)
    resumed = [*args, "--epochs", "2", "--resume"]
    for change, named, saved in (
        (["--anchors", other_anchors], "--anchors", "[[6.0, 8.0], "),
        (["--mixed-precision", "bfloat16"], "--mixed-precision", "saved with float32"),
        (["--scale-x-y", "1"], "--scale-x-y", "saved with [2.0, 2.0]"),
    ):
        capsys.readouterr()
        assert train.main([*resumed, *change]) == 2
        err = capsys.readouterr().err
        assert named in err and saved in err and "Traceback" not in err, err
    # Anything else is honoured, and said.
    config = train.config_from_args(
        train.build_parser().parse_args([*resumed, "--batch-size", "2"])
    )
    training.configure(config)  # the refused run above set bfloat16
    lines = []
    result = training.run(config, log=lines.append)
    assert "resume: --batch-size 2 (the run was saved with 4)" in lines
    assert "resume: global batch 2 (was 4)" in lines
    assert result.epochs_done == 2
    assert int(result.trainer.optimizer.iterations) == 6  # 3 restored + 3 new steps
    assert read_training_state(str(tmp_path / "checkpoints"))[1]["epoch"] == 2
    # The epoch history goes on from the first run's: its epoch 1, then this run's epoch 2.
    first, second = read_history(tmp_path)
    assert (first["epoch"], second["epoch"]) == (1, 2)
    assert first["seconds"] < second["seconds"]


# bfloat16 with YOLOv3's xy and wh terms, float16 with the recipe's CIoU term: one run
# shows both train through yolo3 train.
@pytest.mark.parametrize(
    "precision, loss", [("bfloat16", ("--iou-loss", "mse")), ("float16", ())]
)  # fmt: skip
def test_mixed_precision_trains_with_a_finite_loss(record_set, tmp_path, precision, loss):
    records, anchors = record_set
    args = train_args(
        records, tmp_path, anchors, "--epochs", "1", "--steps-per-epoch", "3",
        "--mixed-precision", precision, *loss,
    )  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    training.configure(config)
    result = training.run(config, log=lambda *_: None)
    assert result.trainer.body.layers[1].compute_dtype == precision
    assert all(math.isfinite(v) for v in result.history["loss"])
    box_terms = ["wh_loss", "xy_loss"] if loss else ["box_loss"]
    assert sorted(k for k in result.history if k in ("box_loss", "xy_loss", "wh_loss")) == box_terms
    assert all(math.isfinite(result.history[key][0]) for key in box_terms)
    # The template checkpoint stays float32 and loads into a float32 model.
    keras.mixed_precision.set_global_policy("float32")
    _body(str(tmp_path / "checkpoints/last.weights.h5"))


def test_non_finite_loss_stops_training_naming_step_and_term():
    callback = StopOnNonFinite()
    callback.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    callback.on_epoch_begin(2)
    callback.on_train_batch_end(0, {"loss": 3.0, "wh_loss": 1.0})
    assert callback.message is None
    callback.on_train_batch_end(6, {"loss": float("nan"), "wh_loss": float("inf")})
    assert callback.model.stop_training
    assert "epoch 3, step 7" in callback.message
    assert "wh_loss=inf" in callback.message and "loss=nan" in callback.message
    # The box term of --iou-loss likewise.
    callback = StopOnNonFinite()
    callback.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    callback.on_train_batch_end(0, {"loss": float("nan"), "box_loss": float("nan")})
    assert "box_loss=nan" in callback.message


def test_bad_flags_give_actionable_errors(record_set, tmp_path, capsys):
    records, anchors = record_set
    assert train.main(train_args(records, tmp_path, anchors, "--freeze-body", "1")) == 2
    assert "--freeze-epochs" in capsys.readouterr().err
    assert train.main(train_args(tmp_path / "nothing", tmp_path, anchors)) == 2
    assert "yolo3 preprocess" in capsys.readouterr().err
    wrong = write_anchors(tmp_path / "nine.txt", np.tile(SMALL_ANCHORS, (2, 1))[:9])
    assert train.main(train_args(records, tmp_path, wrong, "--model-type", "tiny")) == 2
    assert "--model-type tiny needs 6 anchors" in capsys.readouterr().err
    # Tiny's weights share layer names with YOLOv3's first layers, not their meaning: nine
    # anchors make a YOLOv3, which the file's metadata refuses before any model is built.
    tiny_file = str(tmp_path / "tiny.weights.h5")
    save_weights(_body(), tiny_file, {"model_type": "tiny"})
    assert train.main(train_args(records, tmp_path, wrong, "--weights", tiny_file)) == 2
    assert f"weights {tiny_file} are for a tiny model, not yolov3" in capsys.readouterr().err


def test_test_io_and_benchmark_modes(record_set, tmp_path, capsys):
    records, anchors = record_set
    assert train.main(train_args(records, tmp_path / "io", anchors, "--test-io", "1")) == 0
    assert "input pipeline alone:" in capsys.readouterr().out
    args = train_args(
        records, tmp_path / "bench", anchors, "--benchmark", "--epochs", "1",
        "--steps-per-epoch", "2",
    )  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    result = training.run(config, log=lambda *_: None)
    assert result.epochs_done == 1 and math.isfinite(result.history["loss"][0])


@pytest.mark.slow
def test_accumulation_counts_optimizer_steps_and_scales_the_batch(record_set, tmp_path):
    records, anchors = record_set
    args = train_args(
        records, tmp_path, anchors, "--epochs", "1", "--accumulate", "2",
        "--allreduce-dtype", "bfloat16", "--multi-scale", "32:96",
    )  # fmt: skip
    config = train.config_from_args(train.build_parser().parse_args(args))
    logged = []
    result = training.run(config, log=logged.append)
    # 32 training images in optimizer steps of 2 micro-batches of 4.
    assert result.global_batch_size == 8
    assert int(result.trainer.optimizer.iterations) == 4
    # One input size per optimizer step: both micro-batches of a step share it.
    assert len(result.trainer.scale_history) == 4
    assert any("1 replica x 4 x 2 micro-batches = global batch 8" in line for line in logged)
    resolved = training.read_config(str(tmp_path / "config.json"))
    assert (resolved.accumulate, resolved.allreduce_dtype) == (2, "bfloat16")
    assert result.throughput and all(math.isfinite(v) for v in result.history["loss"])


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--accumulate", "0"), "--accumulate"),
        (("--allreduce-dtype", "int8"), "--allreduce-dtype"),
        (("--collective-timeout", "0"), "--collective-timeout"),
        (("--bytes-per-pack", "-1"), "--bytes-per-pack"),
        (("--scale-x-y", "0.9"), "--scale-x-y '0.9': every value must be at least 1"),
        (("--scale-x-y", "1.1,x"), "--scale-x-y '1.1,x': expected a number"),
        (("--scale-x-y", "1,1,1"), "--scale-x-y 1,1,1: give one value, or one per head (2 here"),
        (
            ("--neighbour-cells", "on", "--scale-x-y", "1.5"),
            "--neighbour-cells on: a neighbour cell's prediction",
        ),
        (("--neighbour-cells", "yes"), "--neighbour-cells: 'yes': use on or off"),
        (("--bn-momentum", "1"), "--bn-momentum must be in [0, 1)"),
        (("--scale-jitter", "1"), "--scale-jitter must be in [0, 1)"),
    ],
)
def test_communication_flags_reject_bad_values(record_set, tmp_path, capsys, flags, named):
    records, anchors = record_set
    assert train.main(train_args(records, tmp_path, anchors, *flags)) == 2
    assert named in capsys.readouterr().err


def test_bn_momentum_reaches_every_batch_norm_of_both_models():
    from yolo3.model.network import yolo_body

    for build in (tiny_yolo_body, yolo_body):
        body = build(None, 3, 2, input_shape=(32, 32, 3), bn_momentum=0.9)
        momenta = {layer.momentum for layer in body.layers if hasattr(layer, "moving_mean")}
        assert momenta == {0.9}
    default = tiny_yolo_body(None, 3, 2, input_shape=(32, 32, 3))
    assert {layer.momentum for layer in default.layers if hasattr(layer, "moving_mean")} == {0.97}
    assert training.TrainConfig(records="r", log_dir="l").bn_momentum == 0.97


def test_a_run_without_anchors_takes_the_shipped_ones_of_its_model_type():
    for model, count in ((None, 6), ("tiny", 6), ("yolov3", 9)):
        config = training.TrainConfig(records="r", log_dir="l", model=model)
        assert len(read_anchors(training.anchors_file(config))) == count
    given = training.TrainConfig(records="r", log_dir="l", anchors="mine.txt", model="yolov3")
    assert training.anchors_file(given) == "mine.txt"


def test_every_setting_is_one_flag_whose_default_is_the_settings_default(tmp_path):
    parser = train.build_parser()
    flags = {o for action in parser._actions for o in action.option_strings}
    fields = dataclasses.fields(training.TrainConfig)
    assert {run_config.flag_of(field) for field in fields} <= flags
    # Flags that are no setting: -h, --help, --model (the earlier --model-type), --quiet,
    # --test-io, and the dataset's of --data (yolo3.commands.preprocess.add_dataset_arguments,
    # and --cache-dir).
    dataset = {"--annotations", "--data", "--data-format", "--classes", "--input-size"}
    dataset |= {"--copies", "--image-root", "--val-annotations", "--val-fraction", "--cache-dir"}
    assert dataset <= flags
    assert len(flags) == len(fields) + 5 + len(dataset)
    log_dir = str(tmp_path / "run")
    parsed = train.config_from_args(parser.parse_args(["--records", "r", "--log-dir", log_dir]))
    assert parsed == training.TrainConfig(records="r", log_dir=log_dir)
    with pytest.raises(ValueError, match="^--optimizer: one of adam, sgd$"):
        training.TrainConfig(records="r", log_dir=log_dir, optimizer="adagrad")


def test_a_time_budget_plans_epochs_at_the_last_pace(monkeypatch):
    from yolo3.callbacks import schedule
    from yolo3.data.multiscale import ScaleSchedule

    clock = FakeClock()
    monkeypatch.setattr(schedule.time, "perf_counter", clock)
    planned = keras.Variable(0, dtype="int64")
    scales = ScaleSchedule((64, 96), seed=0, total_steps=1000)
    lines = []
    budget = schedule.TimeBudget(
        100.0, started=0.0, steps_per_epoch=10, max_epochs=8, planned=planned,
        scales=scales, log=lines.append,
    )  # fmt: skip
    budget.set_model(types.SimpleNamespace(stop_training=False))
    # Setup 5 s; epoch 1 takes 25 s (tracing), the others 10 s, plus 2 s of checkpoints
    # after the budget has seen each epoch end.
    ends = []
    for epoch, length in enumerate([25.0, 10.0, 10.0, 10.0, 10.0, 10.0]):
        clock.now = 5.0 + sum(ends) + 2.0 * epoch
        budget.on_epoch_begin(epoch)
        clock.now += length
        budget.on_epoch_end(epoch)
        ends.append(length)
        if budget.model.stop_training:
            break
    # After epoch 1 (t = 30): 70 s left at 25 s an epoch: 2 more. After epoch 2 (t = 42):
    # 58 s at 12 s: 4 more, 6; after 3 (54): 46 s: 3 more, 6; then 6 until it is trained.
    assert epoch + 1 == 6 and budget.plan == 6
    assert int(planned.numpy()) == 60 and scales.total_steps == 60 and scales.final_steps == 6
    assert (
        lines[0] == "time budget: 3 epochs planned, the last took 25.0 s, 1.2 of 1.66667 min left"
    )
    # --epochs caps the plan.
    budget = schedule.TimeBudget(
        1000.0, started=0.0, steps_per_epoch=10, max_epochs=4, planned=planned, log=lines.append
    )
    budget.set_model(types.SimpleNamespace(stop_training=False))
    clock.now = 0.0
    budget.on_epoch_begin(0)
    clock.now = 10.0
    budget.on_epoch_end(0)
    assert budget.plan == 4 and lines[-1].startswith("time budget: 4 epochs planned (--epochs caps")


def test_close_mosaic_turns_mosaics_off_for_the_last_epochs_of_the_run_or_its_plan():
    from yolo3.callbacks import CloseMosaic

    switch = tf.Variable(True)
    lines = []
    close = CloseMosaic(switch, epochs=6, close=2, log=lines.append)
    states = []
    for epoch in range(6):
        close.on_epoch_begin(epoch)
        states.append(bool(switch.numpy()))
    assert states == [True, True, True, True, False, False]
    assert lines == ["epoch 5: no mosaic records from here on (--close-mosaic 2)"]
    # A run resumed in its last epoch reads no mosaics from its first step.
    switch.assign(True)
    CloseMosaic(switch, epochs=6, close=2).on_epoch_begin(5)
    assert not bool(switch.numpy())
    # Under --time the plan sets the end: planned 4 epochs, mosaics end after epoch 2; a
    # longer plan later turns them back on.
    budget = types.SimpleNamespace(plan=None)
    close = CloseMosaic(switch, epochs=50, close=2, budget=budget, log=lines.append)
    close.on_epoch_begin(0)
    assert bool(switch.numpy())
    budget.plan = 4
    close.on_epoch_begin(2)
    assert not bool(switch.numpy())
    budget.plan = 9
    close.on_epoch_begin(3)
    assert bool(switch.numpy())
    assert lines[-1] == "epoch 4: mosaic records in (--close-mosaic 2)"


def test_defaults_follow_from_training_from_scratch_or_fine_tuning(record_set, tmp_path):
    from yolo3.engine.builders import RunData, recipe_for
    from yolo3.engine.config import RECIPES, TrainConfig
    from yolo3.engine.trainer import scaled_learning_rate

    scratch = TrainConfig(records="r", log_dir="l")
    assert (scratch.lr, scratch.ignore_thresh, scratch.scale_x_y) == (3.2e-2, 0.5, "2")
    assert scratch.neighbour_cells
    # The neighbour cells need a grid sensitivity of 2: one given below leaves them off.
    assert not TrainConfig(records="r", log_dir="l", scale_x_y="1.1,2").neighbour_cells
    assert TrainConfig(records="r", log_dir="l", scale_x_y="2.5").neighbour_cells
    # The demo's peak: 8e-3 at its global batch of 16.
    assert scaled_learning_rate(scratch.lr, 16, scratch.lr_reference_batch) == pytest.approx(8e-3)
    # With --weights, the defaults wait for the weights' metadata: their heads fit the data's
    # 4 classes (fine-tuning), or do not (COCO's 80: the heads start anew, as from scratch).
    weighted = TrainConfig(records="r", log_dir="l", weights="w.weights.h5")
    unset = (weighted.lr, weighted.ignore_thresh, weighted.scale_x_y, weighted.neighbour_cells,
             weighted.objectness_iou)  # fmt: skip
    assert unset == (None, None, None, None, None)
    anchors = np.ones((6, 2), np.float32)
    four = types.SimpleNamespace(classes=("a", "b", "c", "d"))
    masks = [[3, 4, 5], [0, 1, 2]]

    def recipe(metadata):
        data = RunData(four, None, anchors, metadata)
        name, line = recipe_for(weighted, data)
        return name, weighted.with_recipe(name), line

    name, tuned, line = recipe({"num_classes": 4, "anchor_masks": masks})
    assert name == "fine-tune" and "heads fit the 4 classes" in line
    assert (tuned.lr, tuned.ignore_thresh, tuned.scale_x_y) == (1e-3, 0.7, None)  # the file's
    assert tuned.neighbour_cells is False and tuned.objectness_iou == 0.0  # YOLOv3's target
    assert RECIPES["fine-tune"]["ignore_thresh"] == 0.7  # Darknet's
    name, fresh, line = recipe({"num_classes": 80, "anchor_masks": masks})
    assert name == "new-heads" and "(80 classes) do not fit the 4 classes" in line
    assert (fresh.lr, fresh.ignore_thresh, fresh.scale_x_y) == (3.2e-2, 0.5, "2")
    assert fresh.neighbour_cells and fresh.objectness_iou == 1.0
    assert fresh.loss_options().objectness_iou == 1.0  # what the loss is built with
    name, fresh, _ = recipe({"num_classes": 4, "anchor_masks": [[1, 2], [0, 3]]})
    assert name == "new-heads"  # 2 anchors a head against the run's 3: other channels
    name, unknown, line = recipe({})  # a Keras 2 file: as before, the fine-tuning defaults
    assert name == "fine-tune" and "records no class count" in line
    assert recipe_for(scratch, RunData(four, None, anchors)) == ("scratch", None)
    given = TrainConfig(records="r", log_dir="l", weights="w", lr=5e-4, ignore_thresh=0.6)
    given = given.with_recipe("new-heads")
    assert (given.lr, given.ignore_thresh, given.scale_x_y) == (5e-4, 0.6, "2")
    # From the command line, and config.json records the values used.
    records, anchors = record_set
    args = ["--records", str(records), "--log-dir", str(tmp_path), "--anchors", str(anchors)]
    parsed = train.config_from_args(train.build_parser().parse_args(args))
    assert (parsed.lr, parsed.ignore_thresh) == (3.2e-2, 0.5)
    saved = dataclasses.asdict(parsed)
    assert training.TrainConfig(**saved) == parsed


def test_a_run_saved_before_grid_sensitivity_resumes_only_with_its_own():
    from yolo3.engine.resume import check_resumed

    # config.json of a run from before: resolved settings without scale_x_y, which was 1.
    head = {"model": "tiny", "classes": ["a"], "anchors": [[8, 8]] * 6, "input_size": [64, 64]}
    saved = {"batch_size": 4, "resolved": {**head, "precision": "float32"}}
    masks = [[3, 4, 5], [0, 1, 2]]  # Darknet's, as a run of today records
    resolved = {**head, "precision": "float32", "anchor_masks": masks, "scale_x_y": [1.1, 1.1]}
    with pytest.raises(ValueError, match=r"--scale-x-y gives \[1.1, 1.1\] but the run was saved"):
        check_resumed(saved, {"batch_size": 4}, resolved, log=lambda *_: None)
    check_resumed(saved, {"batch_size": 4}, {**resolved, "scale_x_y": [1.0, 1.0]})


def test_prior_biases_start_the_heads_that_weights_do_not_fill(record_set, tmp_path):
    from yolo3.engine import builders
    from yolo3.model.head import prior_biases

    records, anchors = record_set

    def head_biases(*extra):
        args = train_args(records, tmp_path / "run", anchors, "--prior-bias", "on", *extra)
        config = train.config_from_args(train.build_parser().parse_args(args))
        strategy, info = builders.build_strategy(config)
        data = builders.read_data(config)
        config = builders.with_recipe(config, data, lambda line: None)
        setup = builders.resolve_setup(config, strategy, info, data)
        trainer = builders.build_trainer(config, setup, strategy, lambda line: None)
        assert data.boxes_per_image is None
        expected = prior_biases(setup.head, data.input_hw, None)
        found = [trainer.body.get_layer(name).bias.numpy() for name in ("conv_9", "conv_12")]
        return found, expected

    # From scratch: the priors of the training split's boxes per image, as yolo3 preprocess
    # counts them in the manifest (1 where it does not, as in this set).
    found, expected = head_biases()
    assert expected[0][4] == pytest.approx(math.log(1 / (3 * (SIZE // 32) ** 2 - 1)))
    for bias, prior in zip(found, expected):
        np.testing.assert_allclose(bias, prior)
    anchors_array = np.ones((6, 2), np.float32)
    for counts, per_image in (
        ({"images": 1000, "boxes": 2100}, 2.1),
        ({"images": 0, "boxes": 0}, None),
        ({"images": 10, "boxes": -1}, None),
        ({"images": "10", "boxes": 5}, None),
        ({"records": 10}, None),
    ):
        record_set = types.SimpleNamespace(manifest={"splits": {"train": counts}})
        assert builders.RunData(record_set, None, anchors_array).boxes_per_image == per_image
    # Heads that load keep the file's biases; heads that do not fit (3 classes) take priors.
    for classes, kept in ((2, True), (3, False)):
        body = tiny_yolo_body(None, 3, classes, input_shape=(SIZE, SIZE, 3))
        for name in ("conv_9", "conv_12"):
            body.get_layer(name).bias.assign(np.full(body.get_layer(name).bias.shape, 0.25))
        path = str(tmp_path / f"classes{classes}.weights.h5")
        save_weights(body, path, {"num_classes": classes})
        found, expected = head_biases("--weights", path)
        for bias, prior in zip(found, expected):
            np.testing.assert_allclose(bias, 0.25 if kept else prior)
