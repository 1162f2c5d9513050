"""Record sets and anchors files for training tests, written into a temporary folder."""

import json
from pathlib import Path

import keras
import numpy as np
from helpers import SMALL_ANCHORS
from record_sets import make_examples, write_record_set

from yolo3.checkpoint.weights import load_weights, read_metadata, save_weights
from yolo3.data.pipeline import make_dataset
from yolo3.engine.trainer import YoloTrainer
from yolo3.model.head import HeadSpec
from yolo3.model.loss import LossOptions
from yolo3.model.network import tiny_yolo_body
from yolo3.model.resources import read_anchors

SIZE = 64


def write_anchors(path, anchors=SMALL_ANCHORS):
    path.write_text(", ".join(f"{int(w)},{int(h)}" for w, h in anchors) + "\n")
    return str(path)


def small_record_set(directory, *, train=32, val=8, num_shards=2, seed=0, noise=0):
    """A raw-format record set of flat boxes on gray, plus uniform noise of +-``noise``.

    Noise matters where runs are compared number for number: on flat images many max-pool
    windows hold exact ties and many activations sit exactly on LeakyReLU's kink, so
    rounding differences of 1e-7 reroute gradients and the runs part by 1e-2.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def examples(count):
        made = make_examples(rng, count, size=SIZE)
        if noise:
            made = [
                (
                    np.clip(image + rng.integers(-noise, noise + 1, image.shape), 0, 255).astype(
                        np.uint8
                    ),
                    boxes,
                    classes,
                )
                for image, boxes, classes in made
            ]
        return made

    splits = {"train": examples(train)}
    if val:
        splits["val"] = examples(val)
    return write_record_set(directory, splits, num_shards=num_shards)


def validation_loss(weights, records, anchors):
    """The validation loss the weights file ``weights`` (tiny-YOLOv3, 2 classes) has on the
    whole val split of ``records``: the mean per-image loss over every image, in one batch,
    plus the weight decay, with the grid sensitivity the file records and the ignore
    threshold, neighbour cells and objectness target of the run's ``config.json`` (beside
    ``checkpoints/``).
    What a run's validation pass must log for those weights."""
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    load_weights(body, str(weights))
    anchors = read_anchors(anchors)
    count = int(
        json.loads((Path(records) / "manifest.json").read_text())["splits"]["val"]["records"]
    )
    # The head the checkpoint records (its grid sensitivity included), with the run's anchors.
    head = HeadSpec.from_metadata(read_metadata(str(weights)), anchors=anchors)
    assert head.num_classes == 2
    dataset = make_dataset(
        str(records), "val", batch_size=count, head=head, training=False, targets=False
    )
    images, boxes = next(iter(dataset))
    assert len(images) == count
    run = json.loads((Path(weights).parents[1] / "config.json").read_text())
    trainer = YoloTrainer(
        body,
        head=head,
        ignore_thresh=run["ignore_thresh"],
        neighbour_cells=bool(run.get("neighbour_cells")),
        loss_options=LossOptions(objectness_iou=run["objectness_iou"]),
    )
    per_image, _ = trainer.per_image_loss(images, boxes, trainer(images))
    return float(np.mean(per_image)) + float(sum(np.asarray(w) for w in body.losses))


def job_inputs(folder, *, train=8, val=8, num_shards=2):
    """What a test that runs train.py in processes starts from, written into ``folder``:
    ``(records, anchors, initial)``, a record set of ``train`` and ``val`` noisy records in
    ``num_shards`` shards (a job needs one a worker at least), an anchors file and
    tiny-YOLOv3 initial weights for 2 classes.

    The weights are drawn with seed 0: a float16 run from some random initialisations
    overflows to an infinite loss within a few steps, and the run then rightly stops.
    """
    records = small_record_set(
        folder / "records", train=train, val=val, num_shards=num_shards, noise=20
    )
    anchors = write_anchors(folder / "anchors.txt")
    initial = str(folder / "init.weights.h5")
    keras.utils.set_random_seed(0)
    save_weights(tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3)), initial)
    return records, anchors, initial


def frozen_heads(epochs):
    """Flags that train only the heads, on a frozen body with unsynchronised batch norm, for
    the ``epochs`` epochs of a run.

    For the tests of where a job stops, resumes and ends (kills, preemption, lost workers,
    Slurm steps), which the body's backward pass and its collectives only slow down:
    tests/test_resume.py took 173 core-seconds with the whole model trained, 113 with this.
    Training the whole body across workers and resuming it stay with the tests that compare
    layouts and communication settings (tests/test_train_distributed.py, test_local_steps,
    test_compression) and with the sbatch script's job.
    """
    return ("--freeze-body", "2", "--freeze-epochs", str(epochs), "--sync-bn", "off")


def train_args(records, log_dir, anchors, *extra):
    """``yolo3 train`` flags for a small run. No AP pass unless ``extra`` gives
    ``--map-every K``: the tests of other things pay neither its time nor its tracing (the
    pass itself: tests/test_train_data.py, test_train.py, and the two-worker cluster of
    test_train_distributed.py)."""
    return [
        "--records", str(records), "--log-dir", str(log_dir), "--anchors", str(anchors),
        "--batch-size", "4", "--quiet", "--lr", "0.02", "--warmup-epochs", "0",
        "--map-every", "0", *extra,
    ]  # fmt: skip


def assert_only_the_chief_wrote(job, *, epochs, workers, event_files=2):
    """A multi-worker run's folder holds one set of checkpoints (every epoch kept), one
    TensorBoard run and one config, all from the chief, and no backups left over.

    ``event_files``: 2 for a run started once (train, validation); the chief of each start
    writes a train file of its own, and a validation file where an epoch ended. The AP
    pass's run (``tensorboard/evaluation``) is the chief's too: one file per start that
    scored an epoch, not counted here.
    """
    kept = [f"epoch-{epoch:04d}.weights.h5" for epoch in range(1, epochs + 1)]
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == sorted(
        ["best.weights.h5", "last.weights.h5", "state.weights.h5", *kept]
    )
    assert read_metadata(str(job / "checkpoints/last.weights.h5"))["epoch"] == epochs
    runs = [p for p in (job / "tensorboard").iterdir() if p.name != "evaluation"]
    assert sum(len(list(run.rglob("events.out.tfevents.*"))) for run in runs) == event_files
    assert (job / "results.csv").exists()
    assert json.loads((job / "config.json").read_text())["resolved"]["num_workers"] == workers
    assert not (job / "backup").exists() or not any((job / "backup").iterdir())
