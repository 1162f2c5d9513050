"""Train-step benchmark: the full YOLOv3 step against the bare network's forward and backward.

:func:`run_train` measures images/s of the train function that ``model.fit`` compiles
(built and warmed up by a first ``fit``), fed one in-memory batch repeated
(``tf.data.Dataset.from_tensors(...).repeat()``: no input pipeline), the same model and
optimizer in every row:

(a) the training step of :class:`yolo3.trainer.YoloTrainer` as ``train.py`` runs it: uint8
    images (scaled in the step) and padded boxes (B, max_boxes, 5) in, targets built by
    :func:`yolo3.targets.build_targets` in the step, :func:`yolo3.loss.yolo_loss`,
    gradients, weight decay and the optimizer update;
(b) the same step given prebuilt targets: the loss without target building;
(c) the bare network: the same step with the loss replaced by the mean of the raw outputs
    (plus the same weight decay), so only forward, backward and update remain.

``(a)/(c) - 1`` is the overhead of targets and loss; ``(b)/(c) - 1`` splits it. The three
steps live in one spawned process, using every core, and take turns: each round runs
``steps`` timed steps of (a), then of (b), then of (c), so that load from other processes,
which changes over seconds on a shared machine, falls on all three alike.
"""

import dataclasses
import os
import statistics
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from yolo3 import benchmark, synthetic
from yolo3.model import build_model
from yolo3.targets import build_targets
from yolo3.trainer import WarmupSchedule, YoloTrainer, make_optimizer

# Targets and loss may cost at most this share of the bare network's step.
GOAL_OVERHEAD = 0.15
JIT_CHOICES = {"auto": "auto", "on": True, "off": False}
_EXPECTED_ANCHORS = {"tiny": 6, "yolov3": 9}


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
    """Settings of :func:`run_train`."""

    anchors: tuple  # (6 or 9, 2) anchor sizes in input pixels, smallest first
    model: str = "tiny"
    input_size: int = 416
    batch_size: int = 8
    num_classes: int = 80
    max_boxes: int = 100  # rows of the padded boxes, as make_dataset yields them
    steps: int = 1  # timed steps of each kind per round
    warmup_steps: int = 2
    repeats: int = 15  # rounds
    optimizer: str = "adam"
    jit_compile: str = "auto"
    seed: int = 0

    def __post_init__(self):
        if self.model not in _EXPECTED_ANCHORS:
            raise ValueError(f"--model {self.model!r}: use one of {sorted(_EXPECTED_ANCHORS)}")
        expected = _EXPECTED_ANCHORS[self.model]
        if len(self.anchors) != expected:
            raise ValueError(
                f"--model {self.model} needs {expected} anchors; {len(self.anchors)} given"
            )
        if self.input_size % 32 or self.input_size <= 0:
            raise ValueError(f"--input-size {self.input_size} is not a positive multiple of 32")
        if self.jit_compile not in JIT_CHOICES:
            raise ValueError(f"--jit-compile {self.jit_compile!r}: use one of {list(JIT_CHOICES)}")
        counts = {
            "--batch-size": self.batch_size,
            "--steps": self.steps,
            "--warmup-steps": self.warmup_steps,
            "--repeats": self.repeats,
            "--num-classes": self.num_classes,
            "--max-boxes": self.max_boxes,
        }
        for flag, value in counts.items():
            if value < 1:
                raise ValueError(f"{flag} {value} must be >= 1")


class TrivialLossTrainer(YoloTrainer):
    """:class:`YoloTrainer` with the YOLOv3 loss replaced by the mean of the raw outputs.

    Same input scaling, weight decay, replica scaling and step: what is left is the
    network's forward and backward and the optimizer update. ``y`` is ignored.
    """

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        del x, y, sample_weight, training
        loss = ops.sum(ops.stack([ops.mean(ops.cast(output, "float32")) for output in y_pred]))
        if self.losses:
            loss = loss + ops.sum([ops.cast(reg, "float32") for reg in self.losses])
        return loss / tf.distribute.get_strategy().num_replicas_in_sync


def build_step(config, *, trivial_loss=False, synchronized_bn=False, data_seed=None):
    """A compiled trainer, as ``yolo3.training.run`` compiles it, and its input batch.

    Weights follow ``config.seed``; the batch follows ``data_seed`` (default the same).

    Returns:
        ``(trainer, images, boxes)``: ``images`` (B, S, S, 3) uint8 of generated shapes and
        ``boxes`` (B, max_boxes, 5) float32 padded boxes in input pixels.
    """
    keras.utils.set_random_seed(config.seed)
    size = config.input_size
    images, boxes = synthetic.make_dataset(
        config.batch_size,
        config.seed if data_seed is None else data_seed,
        size=(size, size),
        max_boxes=config.max_boxes,
        min_side=size // 16,
        max_side=size // 2,
    )
    body = build_model(
        config.model, config.num_classes, input_size=size, synchronized_bn=synchronized_bn
    )
    trainer_class = TrivialLossTrainer if trivial_loss else YoloTrainer
    anchors = np.asarray(config.anchors, np.float32)
    trainer = trainer_class(body, anchors=anchors, num_classes=config.num_classes)
    # train.py's kind of schedule; the rate it gives does not change the cost of a step.
    schedule = WarmupSchedule(1e-3, warmup_steps=1000, total_steps=100000, scale=trainer.lr_scale)
    trainer.compile(
        optimizer=make_optimizer(config.optimizer, schedule),
        jit_compile=JIT_CHOICES[config.jit_compile],
    )
    trainer.build((None, size, size, 3))
    trainer.optimizer.build(trainer.trainable_variables)
    return trainer, images, boxes


KINDS = ("full", "loss_only", "bare")


def _prepare(kind, config):
    """The ``kind`` step compiled, traced and warmed up by ``fit``; returns
    ``(trainer, iterator)`` for timing its train function."""
    trainer, images, boxes = build_step(config, trivial_loss=kind == "bare")
    labels = boxes
    if kind == "loss_only":
        labels = build_targets(
            boxes,
            input_hw=(config.input_size, config.input_size),
            anchors=trainer.anchors,
            num_classes=config.num_classes,
        )
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    trainer.fit(dataset, epochs=1, steps_per_epoch=config.warmup_steps, verbose=0, shuffle=False)
    iterator = iter(dataset)
    ops.convert_to_numpy(trainer.train_function(iterator)["loss"])  # the iterator's first use
    return trainer, iterator


def _time_steps(trainer, iterator, config):
    """Images/s and CPU ms per image of ``config.steps`` calls of the train function."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(config.steps):
        logs = trainer.train_function(iterator)
    # Steps run one after another, so the last loss waits for all (accelerators are async).
    loss = float(ops.convert_to_numpy(logs["loss"]))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    images = config.steps * config.batch_size
    return {
        "images_per_second": images / wall,
        "cpu_ms_per_image": 1000 * cpu / images,
        "step_ms": 1000 * wall / config.steps,
        "loss": loss,
    }


def _measure(config, progress):
    """Runs in a spawned process: ``{kind: [figures of each round]}`` and the resolved XLA
    setting; ``progress`` prints a line per round."""
    prepared = {kind: _prepare(kind, config) for kind in KINDS}
    runs = {kind: [] for kind in KINDS}
    for round_index in range(config.repeats):
        for kind in KINDS:
            runs[kind].append(_time_steps(*prepared[kind], config))
        if progress:
            speeds = ", ".join(f"{k} {runs[k][-1]['images_per_second']:.2f}" for k in KINDS)
            print(f"  round {round_index + 1}/{config.repeats}: {speeds} images/s", flush=True)
    return runs, bool(prepared["full"][0].jit_compile)


def run_train(config, *, command="", log=print, progress=True):
    """Runs the train-step benchmark; ``progress`` prints a line per round from the
    measuring process.

    Returns:
        A JSON-able dict (printed by :func:`format_train`): ``rows`` (a), (b), (c) with
        median, min and max images/s and CPU ms per image; ``ratios`` the overheads.
    """
    cores = os.cpu_count() or 1
    result = {
        "command": command,
        "machine": benchmark.machine_info(),
        "load_average_start": benchmark.load_average(),
        "config": dataclasses.asdict(config),
    }
    log(f"measuring {config.model} at {config.input_size}, {config.repeats} rounds")
    runs, jit_compile = benchmark.run_spawned(_measure, config=config, progress=progress)
    labels = {
        "full": "(a) train step: uint8 + boxes in, targets + yolo_loss + grads + update",
        "loss_only": "(b) same, targets prebuilt: yolo_loss + grads + update",
        "bare": "(c) bare network: mean(outputs) as loss + grads + update",
    }
    rows = {kind: benchmark.summarize(labels[kind], runs[kind], cores) for kind in KINDS}
    result["rows"] = rows
    result["jit_compile"] = jit_compile
    result["ratios"] = {
        name: _overhead(label, rows[kind], rows["bare"], goal)
        for name, kind, label, goal in (
            ("targets_and_loss", "full", "overhead of targets + loss, (a)/(c) - 1", GOAL_OVERHEAD),
            ("loss", "loss_only", "overhead of the loss alone, (b)/(c) - 1", None),
        )
    }
    result["load_average_end"] = benchmark.load_average()
    return result


def _overhead(label, row, bare, goal):
    """Extra time per image of ``row`` over the bare network, as a fraction of the bare time.

    The median over rounds of the ratio within each round: the two steps of a round ran
    seconds apart, so a change of machine load between rounds cancels out.
    """
    pairs = list(zip(row["runs"], bare["runs"]))
    value = statistics.median(b["images_per_second"] / r["images_per_second"] for r, b in pairs)
    cpu_value = statistics.median(r["cpu_ms_per_image"] / b["cpu_ms_per_image"] for r, b in pairs)
    return benchmark.make_ratio(label, value - 1, cpu_value - 1, goal, benchmark.OVERHEAD)


def format_train(result):
    """The figures of :func:`run_train` as a plain-text report."""
    config = result["config"]
    details = [
        (
            "model",
            f"{config['model']} at {config['input_size']}x{config['input_size']}, "
            f"{config['num_classes']} classes, batch {config['batch_size']}, boxes padded to "
            f"{config['max_boxes']}; {config['optimizer']}, weight decay on, jit_compile "
            f"{config['jit_compile']} (resolved: {result['jit_compile']})",
        ),
        (
            "timing",
            f"median, min, max of {config['repeats']} rounds; per round {config['steps']} "
            "step(s) of (a), then (b), then (c), in one process, after "
            f"{config['warmup_steps']} warm-up steps each; overheads are medians of the "
            "ratios within a round; one in-memory batch, no input pipeline",
        ),
    ]
    return benchmark.format_report(result, details)
