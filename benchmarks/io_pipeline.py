"""Input-pipeline benchmark: the original on-the-fly keras-yolo3 input against record sets.

:func:`run_io` generates 640x480 JPEGs of shapes with boxes, then measures images/s of:

(a) the original keras-yolo3 input (:mod:`benchmarks.original_input`): per image in one Python
    thread, decode with Pillow, ``get_random_data``, then ``preprocess_true_boxes`` once
    per batch; it hands the model float64 images *and targets built on the host*;
(b) :func:`yolo3.data.pipeline.make_dataset` with ``targets=False``, what training reads, over a
    record set written once by :func:`yolo3.data.preprocess.run` (not timed), on one thread and
    on all cores: uint8 images and padded boxes. Scaling and target building are left to
    the train step on the accelerator (``python tools/harness.py train`` measures what
    they cost there), so this row does less host work than (a);
(b') the same with ``targets=True``: targets built in ``tf.data`` on the host, as (a) does;
(c) the ceiling for one thread: ``tf.io.decode_jpeg`` of the same records' images;
and the throughput of :func:`yolo3.data.preprocess.run` itself for each worker count.
Measurements run in processes of their own, round-robin (:mod:`benchmarks.harness`).
"""

import dataclasses
import os
import tempfile
import time

import numpy as np

from benchmarks import harness, original_input
from yolo3.data import annotations, synthetic
from yolo3.model.head import HeadSpec

# Goals of the record-set pipeline, per core: against the original, and against decoding.
GOAL_VS_ORIGINAL = 20.0
GOAL_VS_DECODE = 0.70


@dataclasses.dataclass(frozen=True)
class IOConfig:
    """Settings of :func:`run_io`; sizes are (height, width) in pixels."""

    anchors: tuple  # (9, 2) anchor sizes in input pixels, smallest first
    images: int = 200
    image_hw: tuple = (480, 640)
    input_size: int = 416
    num_classes: int = 80
    copies: int = 2
    batch_size: int = 32
    batches: int = 20
    original_images: int = 64
    repeats: int = 3
    workers_list: tuple = (1, 2)
    seed: int = 0
    work_dir: str | None = None

    def __post_init__(self):
        harness.check_input_size(self.input_size)
        if len(self.anchors) != 9:
            raise ValueError(f"{len(self.anchors)} anchors given; the original input uses 9")
        harness.check_counts(
            {
                "--images": self.images,
                "--batch-size": self.batch_size,
                "--batches": self.batches,
                "--original-images": self.original_images,
                "--repeats": self.repeats,
            }
        )
        if not self.workers_list or min(self.workers_list) < 1:
            raise ValueError(f"--workers-list {self.workers_list}: give counts >= 1")
        if self.num_classes < len(synthetic.CLASS_NAMES):
            raise ValueError(
                f"--num-classes {self.num_classes} is below the {len(synthetic.CLASS_NAMES)} "
                "classes of the generated shapes"
            )
        if self.work_dir is not None and len(str(self.work_dir).split()) != 1:
            # The original annotation format splits on whitespace.
            raise ValueError(f"--work-dir {self.work_dir!r} must not contain spaces")


# ---------------------------------------------------------------------------------------
# Measurements, each run in a spawned process of its own.


def _limit_threads(dataset, threads):
    """The pipeline on its own pool of ``threads`` threads, each op on one thread."""
    if threads is None:
        return dataset
    import tensorflow as tf  # noqa: PLC0415 - only the TensorFlow measurements need it

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    options.autotune.cpu_budget = threads
    return dataset.with_options(options)


def _time_original(*, lines, input_hw, anchors, num_classes, batch_size, images, seed, repeat):
    rng = np.random.default_rng(seed + repeat)
    original_input.get_random_data(lines[0], input_hw, rng)  # file cache, first-call costs
    batches = original_input.data_generator(
        lines,
        batch_size=batch_size,
        input_hw=input_hw,
        anchors=anchors,
        num_classes=num_classes,
        rng=rng,
    )
    count, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while count < images:
        count += len(next(batches)[0])
    return {
        "images_per_second": count / (time.perf_counter() - start),
        "cpu_ms_per_image": 1000 * (time.process_time() - cpu_start) / count,
    }


def _time_dataset(dataset, *, batches, threads, warmup_batches=2):
    """Wall-clock and CPU time of ``batches`` batches after ``warmup_batches`` untimed ones.

    The timing of :func:`yolo3.data.pipeline.measure_throughput`, which reports wall-clock time
    only; CPU time (every thread of this process) is steadier on a shared machine.
    """
    import tensorflow as tf  # noqa: PLC0415

    iterator = iter(_limit_threads(dataset, threads))
    for _ in range(warmup_batches):
        next(iterator)
    images, start, cpu_start = 0, time.perf_counter(), time.process_time()
    for _ in range(batches):
        images += int(tf.nest.flatten(next(iterator))[0].shape[0])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"images_per_second": images / seconds, "cpu_ms_per_image": 1000 * cpu / images}


def _time_records(
    *, records_dir, anchors, num_classes, batch_size, batches, threads, targets, seed, repeat
):
    from yolo3.data import pipeline as data  # noqa: PLC0415

    dataset = data.make_dataset(
        records_dir,
        "train",
        batch_size=batch_size,
        head=HeadSpec(anchors=anchors, class_names=[str(i) for i in range(num_classes)]),
        training=True,
        seed=seed + repeat,
        targets=targets,
    )
    return _time_dataset(dataset, batches=batches, threads=threads)


def _time_decode(*, records_dir, batch_size, batches, threads, seed, repeat):
    import tensorflow as tf  # noqa: PLC0415

    from yolo3.data import records  # noqa: PLC0415

    files = records.shard_paths(records_dir, records.read_manifest(records_dir), "train")
    feature = {"image": tf.io.FixedLenFeature([], tf.string)}
    encoded = [
        tf.io.parse_single_example(serialized, feature)["image"].numpy()
        for serialized in tf.data.TFRecordDataset(files)
    ]
    order = np.random.default_rng(seed + repeat).permutation(len(encoded))
    dataset = tf.data.Dataset.from_tensor_slices([encoded[i] for i in order]).repeat()
    dataset = dataset.map(
        lambda image: tf.io.decode_jpeg(image, channels=3), num_parallel_calls=tf.data.AUTOTUNE
    )
    dataset = dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return _time_dataset(dataset, batches=batches, threads=threads)


# ---------------------------------------------------------------------------------------
# The benchmark.


def write_source_set(directory, config):
    """Writes ``config.images`` JPEGs of shapes and their annotation file ``train.txt``.

    Returns:
        ``(annotation_path, class_names, lines, mean_boxes)``: the shapes use the first three
        of ``config.num_classes`` class names; ``lines`` are the annotation lines, with
        absolute image paths as the original read them.
    """
    height, width = config.image_hw
    rng = np.random.default_rng(config.seed)
    image_dir = os.path.join(directory, "images")
    os.makedirs(image_dir, exist_ok=True)
    lines, boxes_written = [], 0
    side = min(height, width)
    for index in range(config.images):
        image, boxes = synthetic.make_image(
            rng, (height, width), max_objects=6, min_side=side // 16, max_side=side // 2
        )
        path = os.path.abspath(os.path.join(image_dir, f"{index:05d}.jpg"))
        image.save(path, "JPEG", quality=90)
        lines.append(annotations.format_line(path, boxes[:, :4], boxes[:, 4].astype(int)))
        boxes_written += len(boxes)
    annotation_path = os.path.join(directory, "train.txt")
    annotations.write_annotations(annotation_path, lines)
    names = list(synthetic.CLASS_NAMES)
    names += [f"unused_{i}" for i in range(len(names), config.num_classes)]
    return annotation_path, names, lines, boxes_written / config.images


def _cpu_seconds():
    """CPU time of this process and of its finished children (the preprocessing workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _time_preprocess(config, annotation_path, class_names, directory, log):
    """``({workers: figures}, records_dir)``: one :func:`yolo3.data.preprocess.run` per count."""
    from yolo3.data import preprocess  # noqa: PLC0415

    timings, records_dir = {}, None
    for workers in config.workers_list:
        output = os.path.join(directory, f"records-{workers}w")
        preprocess_config = preprocess.PreprocessConfig(
            annotations=(annotation_path,),
            classes=tuple(class_names),
            output=output,
            input_size=(config.input_size, config.input_size),
            copies=config.copies,
            seed=config.seed,
        )
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        preprocess.run(
            preprocess_config, workers=workers, overwrite=True, progress="off", log=lambda _: None
        )
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        timings[workers] = {
            "images_per_second": config.images / seconds,
            "cpu_ms_per_image": 1000 * cpu / config.images,
            "seconds": seconds,
        }
        log(f"  preprocess.run, {workers} workers: {seconds:.1f} s, {cpu:.1f} s of CPU")
        records_dir = records_dir or output
    return timings, records_dir


def _measurements(config, lines, records_dir):
    """``{key: (threads or None for all, uses TensorFlow, function, keyword arguments)}``."""
    input_hw = (config.input_size, config.input_size)
    pipeline = {
        "records_dir": records_dir,
        "anchors": config.anchors,
        "num_classes": config.num_classes,
        "batch_size": config.batch_size,
        "batches": config.batches,
        "seed": config.seed,
    }
    original = {
        "lines": lines,
        "input_hw": input_hw,
        "anchors": config.anchors,
        "num_classes": config.num_classes,
        "batch_size": config.batch_size,
        "images": config.original_images,
        "seed": config.seed,
    }
    decode = {key: pipeline[key] for key in ("records_dir", "batch_size", "batches", "seed")}
    return {
        "original": (1, False, _time_original, original),
        "records_1": (1, True, _time_records, {**pipeline, "threads": 1, "targets": False}),
        "records_all": (
            None,
            True,
            _time_records,
            {**pipeline, "threads": None, "targets": False},
        ),
        "records_targets_1": (1, True, _time_records, {**pipeline, "threads": 1, "targets": True}),
        "decode_1": (1, True, _time_decode, {**decode, "threads": 1}),
    }


def run_io(config, *, command="", log=print):
    """Runs the io benchmark.

    Returns:
        A JSON-able dict (printed by :func:`format_io`): ``rows`` maps a measurement to its
        median, min and max images/s over the repeats and its median CPU ms per image;
        ``ratios`` holds (b)/(a) and (b)/(c) against their goals, and (b')/(a).
    """
    cores = os.cpu_count() or 1
    result = {
        "command": command,
        "machine": harness.machine_info(),
        "load_average_start": harness.load_average(),
        "config": dataclasses.asdict(config),
    }
    with tempfile.TemporaryDirectory(prefix="yolo3-io-") as temp:
        directory = config.work_dir or temp
        os.makedirs(directory, exist_ok=True)
        log(f"writing {config.images} JPEGs of {config.image_hw[1]}x{config.image_hw[0]} px")
        annotation_path, class_names, lines, mean_boxes = write_source_set(directory, config)
        result["mean_boxes_per_image"] = mean_boxes
        log("preprocessing (timed per worker count; the first set feeds (b) and (c))")
        preprocess_runs, records_dir = _time_preprocess(
            config, annotation_path, class_names, directory, log
        )
        log(f"measuring, {config.repeats} repeats")
        runs = harness.run_round_robin(
            _measurements(config, lines, records_dir), repeats=config.repeats, log=log
        )

    summarize = harness.summarize
    left = "targets left to the train step"
    rows = {
        "original": summarize(
            f"(a) original on the fly, 1 thread (targets on the host, per batch of "
            f"{config.batch_size})",
            runs["original"],
            1,
        ),
        "records_1": summarize(f"(b) record set pipeline, 1 thread ({left})", runs["records_1"], 1),
        "records_all": summarize(
            f"(b) record set pipeline, all {cores} cores ({left})", runs["records_all"], cores
        ),
        "records_targets_1": summarize(
            "(b') same, targets built in tf.data, 1 thread", runs["records_targets_1"], 1
        ),
        "decode_1": summarize("(c) JPEG decode only (ceiling), 1 thread", runs["decode_1"], 1),
    }
    for workers, figures in preprocess_runs.items():
        rows[f"preprocess_{workers}"] = summarize(
            f"preprocess.run, {workers} worker{'s' if workers > 1 else ''} "
            f"(source images/s, {config.copies + 1} records each)",
            [figures],
            workers,
        )
    result["rows"] = rows
    ratio = harness.speed_ratio
    result["ratios"] = {
        "records_vs_original": ratio(
            "(b)/(a), 1 thread each", rows["records_1"], rows["original"], GOAL_VS_ORIGINAL
        ),
        "records_vs_decode": ratio(
            "(b)/(c), 1 thread each",
            rows["records_1"],
            rows["decode_1"],
            GOAL_VS_DECODE,
            harness.FRACTION,
        ),
        "records_targets_vs_original": ratio(
            "(b')/(a), 1 thread each, both building targets",
            rows["records_targets_1"],
            rows["original"],
            GOAL_VS_ORIGINAL,
        ),
    }
    result["load_average_end"] = harness.load_average()
    return result


def format_io(result):
    """The figures of :func:`run_io` as a plain-text report with aligned columns."""
    config = result["config"]
    details = [
        (
            "data",
            f"{config['images']} JPEGs of {config['image_hw'][1]}x{config['image_hw'][0]}, "
            f"{result['mean_boxes_per_image']:.1f} boxes per image; input "
            f"{config['input_size']}, 9 anchors, {config['num_classes']} classes, batch "
            f"{config['batch_size']}, {config['copies']} augmented copies per image",
        ),
        (
            "timing",
            f"median, min, max of {config['repeats']} repeats; per repeat (a) "
            f"{config['original_images']} images, (b), (b') and (c) {config['batches']} "
            "batches; preprocessing 1 run",
        ),
    ]
    return harness.format_report(result, details)
