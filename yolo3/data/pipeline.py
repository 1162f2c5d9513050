"""The training input pipeline: packed record sets -> batches of images and targets.

Everything per image runs in TensorFlow ops inside ``tf.data`` (parse, decode, flip, pad,
batch, target building), so no Python runs per image and the pipeline scales with
``num_parallel_calls``. The expensive augmentation (scale, crop, colour) happened offline
in ``yolo3 preprocess``; here only the horizontal flip, which costs nothing, and what
:mod:`yolo3.data.online` is asked for (a milder scale, shift and colour change).

Elements of :func:`make_dataset` and :func:`synthetic_dataset`:
    ``(images, targets)``, or ``(images, targets, boxes)`` with ``with_boxes=True``, or
    ``(images, boxes)`` with uint8 images when ``targets=False``:
    - images: (B, H, W, 3) float32 RGB in [0, 1];
    - targets: the tuple of :func:`yolo3.model.targets.build_targets`, one tensor per output
      level, stride 32 first: (B, H / stride, W / stride, anchors_in_level, 5 + num_classes);
    - boxes: (B, max_boxes, 5) float32, x_min, y_min, x_max, y_max in input pixels and the
      class id; padding rows are all zero.

``targets=False`` is what training uses: :class:`yolo3.engine.trainer.YoloTrainer` scales the
images and builds the targets inside the train step, on the accelerator. The host then
moves uint8 pixels and a few boxes per image instead of float32 pixels and dense targets
(for 80 classes about 0.5 MB instead of 5.7 MB per 416 px image), and the input cores
only read, decode and flip.

Multi-worker input: under ``strategy.distribute_datasets_from_function`` pass the
``tf.distribute.InputContext`` and the per-replica batch size
(``input_context.get_per_replica_batch_size(global_batch_size)``): each input pipeline
then reads its own subset of the shard files. A dataset built without an input context
and handed to Keras ``fit`` under ``MultiWorkerMirroredStrategy`` is auto-sharded by file
by TensorFlow, which also works as long as there are at least as many shards as workers.
"""

import logging
import math
import time

import numpy as np
import tensorflow as tf

from yolo3.data import autotune, records, shard_check
from yolo3.data import online as online_augment
from yolo3.model.targets import build_targets

logger = logging.getLogger(__name__)

# What the pipeline maps is TensorFlow ops with no Python branch or loop on a tensor (tf.cond
# where a draw decides), so tf.data traces it without autograph's conversion, as the train
# step is traced (yolo3/engine/step.py).
_plain = tf.autograph.experimental.do_not_convert

# Files read at once by the training interleave; more only costs memory for read buffers.
_MAX_CYCLE_LENGTH = 16


def flip_horizontal(image, boxes):
    """Mirrors an image left to right and moves its boxes with the pixels.

    Args:
        image: (H, W, C) any dtype.
        boxes: (M, 4 + k) float32, x_min, y_min, x_max, y_max in image pixels, then any
            extra columns (the class id), which are kept. Rows with zero width or height
            are padding and stay all zero.
    Returns:
        ``(image, boxes)``: x_min becomes W - x_max and x_max becomes W - x_min.
    """
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    width = tf.cast(tf.shape(image)[1], tf.float32)
    flipped = tf.concat(
        [width - boxes[:, 2:3], boxes[:, 1:2], width - boxes[:, 0:1], boxes[:, 3:]], axis=-1
    )
    valid = tf.logical_and(boxes[:, 2] > boxes[:, 0], boxes[:, 3] > boxes[:, 1])
    return tf.image.flip_left_right(image), tf.where(valid[:, None], flipped, boxes)


def random_flip(image, boxes, seed, probability=0.5):
    """:func:`flip_horizontal` with probability ``probability``, drawn statelessly.

    Args:
        image, boxes: as for :func:`flip_horizontal`.
        seed: shape (2,) int32 or int64 tensor; the same seed always gives the same draw,
            eagerly and inside ``tf.data``.
        probability: chance of flipping, in [0, 1].
    """
    image = tf.convert_to_tensor(image)
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    do_flip = tf.random.stateless_uniform([], seed=seed) < probability
    return tf.cond(do_flip, lambda: flip_horizontal(image, boxes), lambda: (image, boxes))


def pad_boxes(boxes, max_boxes):
    """(M, 5) boxes -> (max_boxes, 5): the first ``max_boxes`` rows, then zero rows."""
    boxes = boxes[:max_boxes]
    boxes = tf.pad(boxes, [[0, max_boxes - tf.shape(boxes)[0]], [0, 0]])
    return tf.ensure_shape(boxes, [max_boxes, 5])


def _check_record_set(record_set, head):
    if head is not None and head.num_classes != len(record_set.classes):
        raise ValueError(
            f"the model has {head.num_classes} classes but the record set {record_set} has "
            f"{len(record_set.classes)} classes; train with its classes file or preprocess again"
        )
    height, width = record_set.input_hw
    if height % 32 or width % 32:
        raise ValueError(
            f"record set {record_set} stores {height}x{width} images; the input size must "
            "be a multiple of 32 (preprocess again with a valid --input-size)"
        )


def _shard_files(files, input_context, record_set, split):
    if input_context is None or input_context.num_input_pipelines <= 1:
        return files
    pipelines = input_context.num_input_pipelines
    if len(files) < pipelines:
        raise ValueError(
            f"the {split!r} split of {record_set} has {len(files)} shard files but there are "
            f"{pipelines} input pipelines; each pipeline needs at least one file: preprocess "
            f"with more shards (--num-shards {pipelines} or more)"
        )
    return files[input_context.input_pipeline_id :: pipelines]


def _padded_passes(dataset, records, pass_size, input_hw, max_boxes):
    """``(image, boxes)`` -> ``(image, boxes, weight)``: the ``records`` elements with
    weight 1, then zero images with weight 0 up to ``pass_size``, repeated."""
    if records > pass_size:
        raise ValueError(f"{records} validation records do not fit a pass of {pass_size}")
    padding = tf.data.Dataset.from_tensors(
        (
            tf.zeros([*input_hw, 3], dataset.element_spec[0].dtype),
            tf.zeros([max_boxes, 5], dataset.element_spec[1].dtype),
            tf.constant(0.0),
        )
    ).repeat(pass_size - records)
    weighted = dataset.map(_plain(lambda image, boxes: (image, boxes, tf.constant(1.0))))
    return weighted.concatenate(padding).repeat()


def padded_pass_steps(record_set, split, *, batch_size, pipelines=1, replicas=1):
    """Steps of a validation pass that reads every record of ``split`` once.

    Each of ``pipelines`` input pipelines reads its own shard files (every n-th, as
    :func:`make_dataset` does) for ``replicas // pipelines`` replicas of ``batch_size``
    images each. The pass has as many steps as the pipeline with the most records needs; the
    others, and that one's last step, are filled with padding images of weight 0
    (``make_dataset(pass_batches=...)``). Every worker runs the same steps, as the
    collectives of a multi-worker job require.
    """
    counts = record_set.shard_records(split)
    per_step = batch_size * max(replicas // pipelines, 1)
    most = max(sum(counts[index::pipelines]) for index in range(pipelines))
    return max(1, math.ceil(most / per_step))


def _warn_of_cut_boxes(record_set, max_boxes):
    most_boxes = record_set.max_boxes_per_image
    if most_boxes is not None and most_boxes > max_boxes:
        logger.warning(
            "record set %s has images with %d boxes; only the first max_boxes=%d are used",
            record_set,
            most_boxes,
            max_boxes,
        )


def _checked_shard_files(record_set, split, input_context):
    """The shard files of ``split`` that this input pipeline reads, their framing checked."""
    files = _shard_files(record_set.shard_paths(split), input_context, record_set, split)
    for path in files:
        # Headers only, before TensorFlow reads a length it cannot allocate: BadRecord.
        shard_check.check_shard(path)
    return files


def _batching_rules(*, training, targets, drop_remainder, repeat, pass_batches):
    """``(drop_remainder, repeat)``: as given, else ``training``; fixed for validation passes."""
    drop_remainder = training if drop_remainder is None else drop_remainder
    repeat = training if repeat is None else repeat
    if pass_batches is not None:
        if training or targets:
            raise ValueError("pass_batches is for validation: training=False, targets=False")
        drop_remainder, repeat = True, False  # the padding makes whole batches; passes repeat
    return drop_remainder, repeat


def _read_records(files, *, training, seed, shuffle_buffer, deterministic):
    """Serialized records of ``files``: when training, files and records shuffled (seeds
    ``seed`` and ``seed + 1``, reshuffled each epoch) and several files read at once; else
    the files one after another, in order."""
    if not training:
        return tf.data.TFRecordDataset(files)
    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), _MAX_CYCLE_LENGTH),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    return dataset.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)


def _skip_mosaic_while_off(dataset, mosaic):
    """Drops mosaic records while the boolean ``tf.Variable`` ``mosaic`` is False."""
    return dataset.filter(
        _plain(
            lambda serialized: tf.logical_or(mosaic, tf.logical_not(records.is_mosaic(serialized)))
        )
    )


def _decode_record(serialized, image_format, input_hw):
    """A serialized record -> ``(image, boxes)``: (H, W, 3) uint8 and (M, 5) float32 corners
    in input pixels and the class id, the objects marked difficult left out."""
    example = records.parse_example(serialized, image_format)
    image = tf.ensure_shape(example["image"], [*input_hw, 3])
    classes = tf.cast(example["classes"][:, None], tf.float32)
    boxes = tf.concat([example["boxes"], classes], axis=-1)
    # Objects marked difficult are not trained on (Darknet's VOC labels leave them out).
    return image, tf.boolean_mask(boxes, tf.logical_not(example["difficult"]))


def _decode_flip_and_pad(
    dataset, *, image_format, input_hw, flip, seed, max_boxes, deterministic, online=None
):
    """Serialized records -> ``(image, boxes)`` with (max_boxes, 5) boxes, each image flipped
    with probability ``flip`` and through ``online`` (:class:`yolo3.data.online.OnlineAugment`)
    when it changes anything."""

    def decode_flip_and_pad(index, serialized):
        image, boxes = _decode_record(serialized, image_format, input_hw)
        image_seed = tf.stack([tf.constant(seed, tf.int64), index])
        if flip > 0:
            image, boxes = random_flip(image, boxes, image_seed, flip)
        if online:
            image, boxes = online_augment.augment(image, boxes, image_seed, online)
        return image, pad_boxes(boxes, max_boxes)

    # The counter makes each image's flip draw depend on (seed, position), not on threads.
    return dataset.enumerate().map(
        _plain(decode_flip_and_pad),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )


def _records_of_this_pipeline(record_set, split, input_context):
    """Records in the shard files of ``split`` that this input pipeline reads: the counts of
    its files, chosen by the rule that chose the files."""
    return sum(_shard_files(record_set.shard_records(split), input_context, record_set, split))


def _add_targets(dataset, *, head, input_hw, with_boxes, deterministic):
    """Batches of ``(uint8 images, boxes)`` -> ``(images, targets)`` or, ``with_boxes``,
    ``(images, targets, boxes)``, the images scaled to [0, 1]."""

    def to_targets(images, boxes):
        targets = build_targets(boxes, head=head, input_hw=input_hw)
        images = tf.cast(images, tf.float32) / 255.0
        return (images, targets, boxes) if with_boxes else (images, targets)

    return dataset.map(
        _plain(to_targets), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
    )


def _set_options_and_prefetch(dataset, input_context):
    options = autotune.untuned_options()
    if input_context is not None:
        # The files are already split between pipelines above; sharding again would lose data.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def make_dataset(
    record_set,
    split="train",
    *,
    batch_size,
    head=None,
    training=True,
    seed=0,
    flip=0.5,
    shuffle_buffer=1024,
    input_context=None,
    max_boxes=100,
    with_boxes=False,
    targets=True,
    drop_remainder=None,
    repeat=None,
    deterministic=None,
    pass_batches=None,
    mosaic=None,
    online=None,
):
    """Batches of images and per-level targets read from a record set.

    Args:
        record_set: a :class:`yolo3.data.records.RecordSet`, or the folder written by
            ``yolo3 preprocess`` (local or ``gs://`` etc.).
        split: ``"train"`` or ``"val"``.
        batch_size: images per element. With ``input_context`` this is the per-replica
            batch size; computing it from the global one is the caller's business.
        head: the :class:`yolo3.model.head.HeadSpec` the targets are built for; its class
            count must equal the manifest's. Needed with ``targets``; without them it only
            checks the class count.
        training: shuffle files and records (reshuffled every epoch), flip, repeat. When
            False: manifest order, no flip, no repeat.
        seed: seeds both shuffles and the flips; the same seed gives the same batches.
        flip: probability of a horizontal flip per image when training.
        shuffle_buffer: records in the shuffle buffer when training.
        input_context: ``tf.distribute.InputContext``; with several input pipelines each
            reads every n-th shard file, so there must be at least as many shards.
        max_boxes: boxes kept per image (the first ones); more are dropped, with a warning
            when the manifest's ``max_boxes_per_image`` says some record has more.
        with_boxes: also yield the padded (B, max_boxes, 5) boxes (for evaluation).
        targets: False yields ``(uint8 images, boxes)`` and leaves scaling and target
            building to the train step (see the module docstring).
        drop_remainder: drop a last partial batch (default: when training).
        repeat: repeat forever (default: when training).
        pass_batches: validation that reads every record once per pass: each element is
            ``(images, boxes, weights)`` with ``weights`` ``(B,)`` float32, 1 for a record
            and 0 for the zero images that fill the pass up to exactly this many batches
            (:func:`padded_pass_steps`); the passes repeat forever. Needs ``training``
            False and ``targets`` False.
        deterministic: order of the parallel reads and maps; None keeps the
            ``tf.data.Options`` default (deterministic). False is faster, but then the order
            and the flips no longer follow from the seed alone.
        mosaic: a boolean ``tf.Variable`` read as records stream by: while False, mosaic
            records (``yolo3 preprocess --mosaic``) are skipped (``--close-mosaic``). The
            filter follows the shuffle, so a change reaches the batches after the few that
            are already prefetched. None: every record.
        online: a :class:`yolo3.data.online.OnlineAugment` applied to each image after the
            flip when training (scale, shift, colour); None or its defaults: none.

    Returns:
        A ``tf.data.Dataset`` of the elements described in the module docstring.

    A record that frames soundly but does not decode stops the iteration with TensorFlow's
    InvalidArgumentError, which names no record: :func:`yolo3.data.records.find_undecodable`
    finds it.

    Raises:
        BadRecord: (:class:`yolo3.data.shard_check.BadRecord`) a shard this pipeline reads is
            not soundly framed, checked here from the record headers.
    """
    record_set = records.open_record_set(record_set)
    if targets and head is None:
        raise ValueError("make_dataset: targets need the head they are built for (head=)")
    _check_record_set(record_set, head)
    image_format = record_set.split_format(split)
    input_hw = record_set.input_hw
    _warn_of_cut_boxes(record_set, max_boxes)
    files = _checked_shard_files(record_set, split, input_context)
    drop_remainder, repeat = _batching_rules(
        training=training,
        targets=targets,
        drop_remainder=drop_remainder,
        repeat=repeat,
        pass_batches=pass_batches,
    )

    dataset = _read_records(
        files,
        training=training,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        deterministic=deterministic,
    )
    if repeat:
        dataset = dataset.repeat()
    if mosaic is not None:
        dataset = _skip_mosaic_while_off(dataset, mosaic)
    dataset = _decode_flip_and_pad(
        dataset,
        image_format=image_format,
        input_hw=input_hw,
        flip=flip if training else 0.0,
        seed=seed,
        max_boxes=max_boxes,
        deterministic=deterministic,
        online=online if training else None,
    )
    if pass_batches is not None:
        here = _records_of_this_pipeline(record_set, split, input_context)
        dataset = _padded_passes(dataset, here, pass_batches * batch_size, input_hw, max_boxes)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if targets:
        dataset = _add_targets(
            dataset,
            head=head,
            input_hw=input_hw,
            with_boxes=with_boxes,
            deterministic=deterministic,
        )
    return _set_options_and_prefetch(dataset, input_context)


def synthetic_dataset(
    *,
    batch_size,
    input_hw,
    head,
    boxes_per_image=4,
    seed=0,
):
    """One random batch, built once, held in memory and repeated forever.

    Training on it costs nothing for input, so comparing its step time with the real
    pipeline's tells an input-bound run from a compute-bound one (``--benchmark``).
    Elements are ``(images, targets)`` as from :func:`make_dataset`.
    """
    height, width = (int(v) for v in input_hw)
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 1.0, (batch_size, height, width, 3)).astype(np.float32)
    box_w = rng.uniform(0.05, 0.6, (batch_size, boxes_per_image)) * width
    box_h = rng.uniform(0.05, 0.6, (batch_size, boxes_per_image)) * height
    x_min = rng.uniform(0.0, 1.0, box_w.shape) * (width - box_w)
    y_min = rng.uniform(0.0, 1.0, box_h.shape) * (height - box_h)
    class_ids = rng.integers(0, head.num_classes, box_w.shape)
    boxes = np.stack([x_min, y_min, x_min + box_w, y_min + box_h, class_ids], axis=-1)
    targets = build_targets(boxes.astype(np.float32), head=head, input_hw=(height, width))
    dataset = tf.data.Dataset.from_tensors((tf.constant(images), targets)).repeat()
    return dataset.with_options(autotune.untuned_options())


def measure_throughput(dataset, *, batches=None, seconds=None, warmup_batches=2):
    """Iterates ``dataset`` alone and reports how fast it delivers images (``--test-io``).

    Stops after ``batches`` timed batches, after ``seconds``, or at the end of the dataset,
    whichever comes first. The first ``warmup_batches`` fill buffers and are not timed.

    Returns:
        ``{"images_per_second", "images", "batches", "seconds"}`` of the timed part.
    """
    unbounded = batches is None and seconds is None
    if unbounded and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ValueError("the dataset repeats forever: pass batches or seconds")
    iterator = iter(dataset)
    for _ in range(warmup_batches):
        if next(iterator, None) is None:
            break
    count = images = 0
    start = time.perf_counter()
    while batches is None or count < batches:
        if seconds is not None and time.perf_counter() - start >= seconds:
            break
        element = next(iterator, None)
        if element is None:
            break
        images += int(tf.nest.flatten(element)[0].shape[0])
        count += 1
    elapsed = time.perf_counter() - start
    return {
        "images_per_second": images / elapsed if elapsed > 0 else 0.0,
        "images": images,
        "batches": count,
        "seconds": elapsed,
    }
