"""Train-step benchmark: the full YOLOv3 step against the bare network's forward and backward,
by precision, with and without XLA, and its peak memory with and without rematerialisation.

:func:`run_train` measures images/s of the train function that ``model.fit`` compiles
(built and warmed up by a first ``fit``), fed one in-memory batch repeated
(``tf.data.Dataset.from_tensors(...).repeat()``: no input pipeline), the same model and
optimizer in every row:

(a) the training step of :class:`yolo3.engine.trainer.YoloTrainer` as ``train.py`` runs it: uint8
    images (scaled in the step) and padded boxes (B, max_boxes, 5) in, targets built by
    :func:`yolo3.model.targets.build_targets` in the step, :func:`yolo3.model.loss.yolo_loss`,
    gradients, weight decay and the optimizer update;
(b) the same step given prebuilt targets: the loss without target building;
(c) the bare network: the same step with the loss replaced by the mean of the raw outputs
    (plus the same weight decay), so only forward, backward and update remain.

``(a)/(c) - 1`` is the overhead of targets and loss; ``(b)/(c) - 1`` splits it. (a), (b)
and (c) run in float32 with ``--jit-compile``. Variants of (a) add every pair of
``precisions`` (float32, or Keras's ``mixed_bfloat16`` / ``mixed_float16`` policies) and
``xla`` (``jit_compile`` off / on); the pair equal to (a) reuses its figures. All of them
live in one spawned process, using every core, and take turns: each round runs ``steps``
timed steps of each, so that load from other processes, which changes over seconds on a
shared machine, falls on all alike.

Every row also gives the model FLOP/s achieved: the train step's FLOPs per image
(:func:`yolo3.model.flops.count_flops` of the convolutions, times ``TRAIN_STEP_FACTOR``) times
images/s, and with a known peak (``--peak-tflops``, or the GPU's in
:data:`yolo3.distributed.devices.PEAK_TFLOPS`) the model FLOPs utilisation.

Memory: each ``remat`` setting (:mod:`yolo3.model.remat`, as ``train.py --remat``) trains (a) in a
process of its own, since the peak resident memory of a process only grows. Figures: the process's
peak RSS, its growth from just before the first step (tracing, activations, gradients,
optimizer slots), and on a GPU the allocator's peak during the timed steps next to the
memory in use before them (weights, optimizer slots, the batch).
"""

import dataclasses
import os
import resource
import statistics
import sys
import time

import keras
import tensorflow as tf
from keras import ops

from benchmarks import harness
from yolo3.data import synthetic
from yolo3.distributed import devices
from yolo3.engine.trainer import WarmupSchedule, YoloTrainer, make_optimizer
from yolo3.model import network as model
from yolo3.model.flops import TRAIN_STEP_FACTOR, count_flops
from yolo3.model.head import HeadSpec
from yolo3.model.remat import REMAT_CHOICES
from yolo3.model.targets import build_targets

# Targets and loss may cost at most this share of the bare network's step.
GOAL_OVERHEAD = 0.15
JIT_CHOICES = {"auto": "auto", "on": True, "off": False}
# --precisions: the Keras dtype policy of each.
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
XLA_CHOICES = ("off", "on")
_EXPECTED_ANCHORS = {"tiny": 6, "yolov3": 9}
_MIB = 2**20


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
    precisions: tuple = ("float32",)  # variants of (a), each with every xla setting
    xla: tuple = ("off", "on")
    remat: tuple = ("off",)  # one memory process each
    peak_tflops: float | None = None  # the device's peak for every row; None: look it up

    def __post_init__(self):
        if self.model not in _EXPECTED_ANCHORS:
            raise ValueError(f"--model-type {self.model!r}: use one of {sorted(_EXPECTED_ANCHORS)}")
        expected = _EXPECTED_ANCHORS[self.model]
        if len(self.anchors) != expected:
            raise ValueError(
                f"--model-type {self.model} needs {expected} anchors; {len(self.anchors)} given"
            )
        harness.check_input_size(self.input_size)
        if self.jit_compile not in JIT_CHOICES:
            raise ValueError(f"--jit-compile {self.jit_compile!r}: use one of {list(JIT_CHOICES)}")
        harness.check_counts(
            {
                "--batch-size": self.batch_size,
                "--steps": self.steps,
                "--warmup-steps": self.warmup_steps,
                "--repeats": self.repeats,
                "--num-classes": self.num_classes,
                "--max-boxes": self.max_boxes,
            }
        )
        for flag, name, choices in (
            ("--precisions", "precisions", tuple(PRECISIONS)),
            ("--xla", "xla", XLA_CHOICES),
            ("--remat", "remat", REMAT_CHOICES),
        ):
            values = tuple(getattr(self, name))  # a list when read back from JSON
            object.__setattr__(self, name, values)
            unknown = [v for v in values if v not in choices]
            if not values or unknown or len(set(values)) < len(values):
                raise ValueError(
                    f"{flag} {' '.join(values) or '(none)'}: give each of {list(choices)} "
                    "at most once, at least one"
                )
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"--peak-tflops {self.peak_tflops} must be > 0")


def default_precisions(gpus):
    """The precisions timed unless ``--precisions`` says: float16 only with a GPU (``gpus``,
    :class:`yolo3.distributed.devices.GpuInfo`), as the CPU has no fast float16 kernels."""
    return ("float32", "bfloat16", "float16") if gpus else ("float32", "bfloat16")


def variant_key(precision, xla):
    """The key of a variant of (a) in ``rows``: ``"bfloat16_xla_on"``."""
    return f"{precision}_xla_{xla}"


class TrivialLossTrainer(YoloTrainer):
    """:class:`YoloTrainer` with the YOLOv3 loss replaced by the mean of the raw outputs.

    Same input scaling, weight decay, replica scaling and step: what is left is the
    network's forward and backward and the optimizer update. ``y`` is ignored.
    """

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        del x, y, sample_weight, training
        per_image = sum(ops.mean(ops.cast(output, "float32"), axis=(1, 2, 3)) for output in y_pred)
        return self.replica_loss(per_image)


def build_step(
    config,
    *,
    trivial_loss=False,
    synchronized_bn=False,
    data_seed=None,
    jit_compile=None,
    remat="off",
    accumulate=1,
    communication=None,
):
    """A compiled trainer, as ``yolo3.training.job.run`` compiles it, and its input batch.

    Weights follow ``config.seed``; the batch follows ``data_seed`` (default the same).
    ``jit_compile`` (a bool) overrides ``config.jit_compile``; ``remat``, ``accumulate`` and
    ``communication`` (a :class:`yolo3.comm.schemes.Communication`; None: the float32
    all-reduce) go to the trainer.
    Layers take the global dtype policy.

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
    body = model.build_model(
        config.model, config.num_classes, input_size=size, synchronized_bn=synchronized_bn
    )
    trainer_class = TrivialLossTrainer if trivial_loss else YoloTrainer
    head = HeadSpec(anchors=config.anchors, class_names=[str(i) for i in range(config.num_classes)])
    trainer = trainer_class(
        body,
        head=head,
        remat=remat,
        accumulate=accumulate,
        communication=communication,
    )
    # train.py's kind of schedule; the rate it gives does not change the cost of a step.
    schedule = WarmupSchedule(1e-3, warmup_steps=1000, total_steps=100000, scale=trainer.lr_scale)
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer, as train.py's.
    trainer.compile(
        optimizer=make_optimizer(config.optimizer, schedule),
        jit_compile=JIT_CHOICES[config.jit_compile] if jit_compile is None else jit_compile,
    )
    trainer.build((None, size, size, 3))
    trainer.optimizer.build(trainer.trainable_variables)
    return trainer, images, boxes


KINDS = ("full", "loss_only", "bare")


def _build(kind, config, *, precision="float32", **step_options):
    """The ``kind`` step's compiled trainer under ``precision``'s dtype policy, and its
    dataset; the global policy is restored afterwards."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(PRECISIONS[precision])
    try:
        trainer, images, boxes = build_step(config, trivial_loss=kind == "bare", **step_options)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    labels = boxes
    if kind == "loss_only":
        labels = build_targets(
            boxes, head=trainer.head, input_hw=(config.input_size, config.input_size)
        )
    return trainer, tf.data.Dataset.from_tensors((images, labels)).repeat()


def _warm_up(trainer, dataset, config):
    """Traces (and compiles) the train function with ``fit``; returns the iterator to time it
    on."""
    trainer.fit(dataset, epochs=1, steps_per_epoch=config.warmup_steps, verbose=0, shuffle=False)
    iterator = iter(dataset)
    ops.convert_to_numpy(trainer.train_function(iterator)["loss"])  # the iterator's first use
    return iterator


def _prepare(kind, config, **options):
    """``(trainer, iterator)`` of the ``kind`` step, compiled, traced and warmed up."""
    trainer, dataset = _build(kind, config, **options)
    return trainer, _warm_up(trainer, dataset, config)


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


def _first_line(error):
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _measure(config, progress):
    """Runs in a spawned process: the figures of each round of (a), (b), (c) and of the
    variants of (a); ``progress`` prints a line per round.

    Returns:
        A dict: ``runs`` ``{key: [figures of each round]}``, ``jit_compile`` the resolved
        XLA setting of (a), ``variants`` ``{variant key: key of its runs, or None}``,
        ``errors`` ``{variant key: why it did not run}``, ``forward_flops`` per image.
    """
    prepared = {kind: _prepare(kind, config) for kind in KINDS}
    base_jit = bool(prepared["full"][0].jit_compile)
    variants, errors = {}, {}
    for precision in config.precisions:
        for xla in config.xla:
            key = variant_key(precision, xla)
            if precision == "float32" and (xla == "on") == base_jit:
                variants[key] = "full"  # the same step as (a)
                continue
            try:
                prepared[key] = _prepare(
                    "full", config, precision=precision, jit_compile=xla == "on"
                )
                variants[key] = key
            except (tf.errors.OpError, ValueError, TypeError, RuntimeError) as err:
                # One variant the device cannot run (e.g. an op without a kernel at that
                # precision, or not compiling with XLA) leaves the others to be measured.
                variants[key], errors[key] = None, _first_line(err)
                if progress:
                    print(f"  {key} did not run: {errors[key]}", flush=True)
    runs = {key: [] for key in prepared}
    for round_index in range(config.repeats):
        for key, (trainer, iterator) in prepared.items():
            runs[key].append(_time_steps(trainer, iterator, config))
        if progress:
            speeds = ", ".join(f"{k} {runs[k][-1]['images_per_second']:.2f}" for k in runs)
            print(f"  round {round_index + 1}/{config.repeats}: {speeds} images/s", flush=True)
    return {
        "runs": runs,
        "jit_compile": base_jit,
        "variants": variants,
        "errors": errors,
        "forward_flops": count_flops(prepared["full"][0].body),
    }


def _rss_bytes():
    """This process's resident memory now (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes():
    """This process's peak resident memory: ``ru_maxrss`` is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


_MEMORY_STEPS = {}  # remat setting -> (trainer, iterator, memory figures before the steps)


def _memory_round(config, remat, repeat, device=None):
    """Runs in the memory process of ``remat`` (:func:`benchmarks.harness.run_round_robin`):
    builds and warms up (a) on the first call, then times ``config.steps`` steps.

    ``device`` is the accelerator whose allocator is read (default: ``GPU:0`` where a GPU is
    visible, else none); a test passes ``CPU:0`` to run that branch without a GPU.

    Returns:
        The figures of :func:`_time_steps` with the process's ``peak_rss_bytes`` so far,
        ``rss_before_steps_bytes`` (after building, before the first step) and
        ``rss_growth_bytes`` (the difference), and with a device ``gpu_peak_bytes``
        (allocator peak during this call's steps) and ``gpu_in_use_bytes`` (just before them).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if device is None and gpus:
        device = "GPU:0"
    if repeat == 0:
        # Several memory processes share the GPU: none may reserve all of it.
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        trainer, dataset = _build("full", config, remat=remat)
        before = _rss_bytes()
        _MEMORY_STEPS[remat] = (trainer, _warm_up(trainer, dataset, config), before)
    trainer, iterator, before = _MEMORY_STEPS[remat]
    if device:
        tf.config.experimental.reset_memory_stats(device)
        in_use = tf.config.experimental.get_memory_info(device)["current"]
    figures = _time_steps(trainer, iterator, config)
    peak = _peak_rss_bytes()
    figures.update(
        peak_rss_bytes=peak,
        rss_before_steps_bytes=before,
        rss_growth_bytes=None if before is None else peak - before,
    )
    if device:
        figures["gpu_peak_bytes"] = tf.config.experimental.get_memory_info(device)["peak"]
        figures["gpu_in_use_bytes"] = in_use
    return figures


def run_train(config, *, command="", log=print, progress=True):
    """Runs the train-step benchmark; ``progress`` prints a line per round from the
    measuring processes.

    Returns:
        A JSON-able dict (printed by :func:`format_train`): ``rows`` (a), (b), (c) with
        median, min and max images/s and CPU ms per image; ``ratios`` the overheads;
        ``flops`` per image; ``variants`` a row per precision and XLA setting of (a);
        ``memory`` a row per remat setting. Every row with images/s has ``step_ms``,
        ``achieved_tflops`` (train-step FLOPs x images/s), ``peak_tflops`` and ``mfu``
        (None without a known peak).
    """
    cores = os.cpu_count() or 1
    gpus = devices.describe_gpus()
    result = {
        "command": command,
        "machine": harness.machine_info(),
        "load_average_start": harness.load_average(),
        "config": dataclasses.asdict(config),
    }
    log(
        f"measuring {config.model} at {config.input_size}, {config.repeats} rounds; "
        f"precisions {' '.join(config.precisions)}, XLA {' '.join(config.xla)}"
    )
    measured = harness.run_spawned(_measure, config=config, progress=progress)
    runs = measured["runs"]
    forward = measured["forward_flops"]
    train_flops = TRAIN_STEP_FACTOR * forward
    result["flops"] = {
        "forward_per_image": forward,
        "train_step_per_image": train_flops,
        "train_step_factor": TRAIN_STEP_FACTOR,
        "counted": "convolutions, 2 FLOPs per multiply-add (yolo3.model.flops.count_flops)",
    }
    speed = {
        precision: _peak(config, gpus, precision) | {"train_flops": train_flops}
        for precision in PRECISIONS
    }
    labels = {
        "full": "(a) train step: uint8 + boxes in, targets + yolo_loss + grads + update",
        "loss_only": "(b) same, targets prebuilt: yolo_loss + grads + update",
        "bare": "(c) bare network: mean(outputs) as loss + grads + update",
    }
    rows = {}
    for kind in KINDS:
        rows[kind] = harness.summarize(labels[kind], runs[kind], cores)
        _add_speed(rows[kind], config, speed["float32"])
    result["rows"] = rows
    result["jit_compile"] = measured["jit_compile"]
    result["ratios"] = {
        name: _overhead(label, rows[kind], rows["bare"], goal)
        for name, kind, label, goal in (
            ("targets_and_loss", "full", "overhead of targets + loss, (a)/(c) - 1", GOAL_OVERHEAD),
            ("loss", "loss_only", "overhead of the loss alone, (b)/(c) - 1", None),
        )
    }
    result["variants"] = {}
    for key, source in measured["variants"].items():
        precision, xla = key.split("_xla_")
        label = f"{precision}, XLA {xla}" + (" = (a)" if source == "full" else "")
        if source is None:
            row = {"label": label, "error": measured["errors"][key]}
        else:
            row = harness.summarize(label, runs[source], cores)
            _add_speed(row, config, speed[precision])
        result["variants"][key] = {"precision": precision, "xla": xla, **row}

    log(f"measuring memory: remat {' '.join(config.remat)}, one process each")
    memory_runs = harness.run_round_robin(
        {
            remat: (None, True, _memory_round, {"config": config, "remat": remat})
            for remat in config.remat
        },
        repeats=config.repeats,
        log=log if progress else _quiet,
    )
    result["memory"] = {
        remat: _memory_row(f"remat {remat}", memory_runs[remat], cores, config, speed["float32"])
        for remat in config.remat
    }
    result["load_average_end"] = harness.load_average()
    return result


def _quiet(line):
    del line


def _peak(config, gpus, precision):
    """``{"peak_tflops", "peak_source"}`` for rows at ``precision``: ``--peak-tflops``, else
    the first GPU's data-sheet peak, else None (the CPU, or a GPU not in the table)."""
    if config.peak_tflops is not None:
        return {"peak_tflops": config.peak_tflops, "peak_source": "--peak-tflops"}
    peak = devices.peak_tflops(gpus[0], precision) if gpus else None
    source = f"{gpus[0].device_name} data sheet" if peak else None
    return {"peak_tflops": peak, "peak_source": source}


def _add_speed(row, config, speed):
    """Adds ``step_ms``, ``achieved_tflops`` (model FLOP/s in units of 10^12) and ``mfu``
    (their share of the peak, or None) to a row of median images/s."""
    per_second = row["images_per_second"]
    row["step_ms"] = 1000 * config.batch_size / per_second
    row["achieved_tflops"] = speed["train_flops"] * per_second / 1e12
    row["peak_tflops"] = speed["peak_tflops"]
    row["peak_source"] = speed["peak_source"]
    row["mfu"] = row["achieved_tflops"] / row["peak_tflops"] if row["peak_tflops"] else None


def _memory_row(label, runs, cores, config, speed):
    """The row of a remat setting: speed, and the memory peaks over all its rounds."""
    row = harness.summarize(label, runs, cores)
    _add_speed(row, config, speed)
    row["peak_rss_bytes"] = max(run["peak_rss_bytes"] for run in runs)
    row["rss_before_steps_bytes"] = runs[0]["rss_before_steps_bytes"]
    if row["rss_before_steps_bytes"] is None:
        row["rss_growth_bytes"] = None
    else:
        row["rss_growth_bytes"] = row["peak_rss_bytes"] - row["rss_before_steps_bytes"]
    if "gpu_peak_bytes" in runs[0]:
        row["gpu_peak_bytes"] = max(run["gpu_peak_bytes"] for run in runs)
        row["gpu_in_use_bytes"] = runs[0]["gpu_in_use_bytes"]
    return row


def _overhead(label, row, bare, goal):
    """Extra time per image of ``row`` over the bare network, as a fraction of the bare time.

    The median over rounds of the ratio within each round: the two steps of a round ran
    seconds apart, so a change of machine load between rounds cancels out.
    """
    pairs = list(zip(row["runs"], bare["runs"]))
    value = statistics.median(b["images_per_second"] / r["images_per_second"] for r, b in pairs)
    cpu_value = statistics.median(r["cpu_ms_per_image"] / b["cpu_ms_per_image"] for r, b in pairs)
    return harness.make_ratio(label, value - 1, cpu_value - 1, goal, harness.OVERHEAD)


def _table(title, columns, lines):
    """Aligned lines: ``lines`` are ``(label, [cells])`` under ``columns``."""
    width = max([len(title)] + [len(label) for label, _ in lines])
    header = f"{title:<{width}}" + "".join(f"  {c:>10}" for c in columns)
    body = [
        f"{label:<{width}}" + "".join(f"  {cell:>10}" for cell in cells) for label, cells in lines
    ]
    return [header, "-" * len(header), *body]


def _speed_cells(row):
    many = len(row["runs"]) > 1
    return [
        f"{row['images_per_second']:.1f}",
        f"{row['min']:.1f}" if many else "-",
        f"{row['max']:.1f}" if many else "-",
        f"{row['step_ms']:.1f}",
        f"{row['achieved_tflops']:.3g}",
        "-" if row["mfu"] is None else f"{100 * row['mfu']:.3g}%",  # 0.0215% on a CPU
    ]


def _mib(value):
    return "-" if value is None else f"{value / _MIB:.0f}"


def format_train(result):
    """The figures of :func:`run_train` as a plain-text report."""
    config = result["config"]
    flops = result["flops"]
    peaks = {
        (row["peak_tflops"], row["peak_source"])
        for row in (*result["rows"].values(), *result["variants"].values())
        if row.get("peak_tflops")
    }
    peak_text = "; ".join(f"{peak:g} TFLOP/s ({source})" for peak, source in sorted(peaks))
    details = [
        (
            "model",
            f"{config['model']} at {config['input_size']}x{config['input_size']}, "
            f"{config['num_classes']} classes, batch {config['batch_size']}, boxes padded to "
            f"{config['max_boxes']}; {config['optimizer']}, weight decay on; (a), (b), (c) "
            f"float32 with jit_compile {config['jit_compile']} (resolved: "
            f"{result['jit_compile']})",
        ),
        (
            "flops",
            f"{flops['forward_per_image'] / 1e9:.3f} GFLOPs forward per image (convolutions, "
            f"2 per multiply-add); train step {flops['train_step_factor']} x forward = "
            f"{flops['train_step_per_image'] / 1e9:.3f} GFLOPs per image; TFLOP/s = train "
            "step FLOPs x images/s",
        ),
        ("peak", f"MFU against {peak_text}" if peaks else "unknown: no MFU (--peak-tflops)"),
        (
            "timing",
            f"median, min, max of {config['repeats']} rounds; per round {config['steps']} "
            "step(s) of (a), (b), (c) and each variant in turn, in one process, after "
            f"{config['warmup_steps']} warm-up steps each; overheads are medians of the "
            "ratios within a round; one in-memory batch, no input pipeline",
        ),
    ]
    lines = [harness.format_report(result, details), ""]
    variants = []
    for row in result["variants"].values():
        if "error" in row:
            variants.append((row["label"], ["failed"] + ["-"] * 5))
        else:
            variants.append((row["label"], _speed_cells(row)))
    columns = ("images/s", "min", "max", "step ms", "TFLOP/s", "MFU")
    lines += _table("(a) by precision and XLA", columns, variants)
    lines += [
        f"  {row['label']}: {row['error']}" for row in result["variants"].values() if "error" in row
    ]

    on_gpu = any("gpu_peak_bytes" in row for row in result["memory"].values())
    columns = ("images/s", "step ms", "TFLOP/s", "peak RSS", "RSS growth")
    columns += ("GPU peak", "GPU before") if on_gpu else ()
    memory = []
    for row in result["memory"].values():
        cells = _speed_cells(row)
        cells = [cells[0], cells[3], cells[4], _mib(row["peak_rss_bytes"])]
        cells.append(_mib(row["rss_growth_bytes"]))
        if on_gpu:
            cells += [_mib(row.get("gpu_peak_bytes")), _mib(row.get("gpu_in_use_bytes"))]
        memory.append((row["label"], cells))
    lines += ["", *_table("(a) memory, MiB, float32", columns, memory)]
    lines.append(
        "  one process per remat setting; RSS growth: peak RSS less the RSS after building, "
        "before the first step"
        + (
            "; GPU: allocator peak during the timed steps, memory in use before them"
            if on_gpu
            else ""
        )
    )
    return "\n".join(lines)
