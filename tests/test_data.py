"""The record-set input pipeline: flips, targets, determinism, file sharding, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, SMALL_MASKS, make_head, numpy_targets, tiny_model
from record_sets import make_examples, write_record_set
from tensorflow.python.data.ops import dataset_ops

from yolo3.data import autotune, records
from yolo3.data import pipeline as data
from yolo3.distributed.devices import available_cores
from yolo3.model.loss import yolo_loss
from yolo3.model.targets import build_targets

SIZE = 64
GREY, RED = 100, (255, 0, 0)
HEAD = make_head(SMALL_ANCHORS, 2, anchor_masks=SMALL_MASKS)
PIPELINE = {"head": HEAD}


@pytest.fixture(scope="module")
def train_examples():
    return make_examples(np.random.default_rng(3), 12, SIZE)


@pytest.fixture(scope="module")
def raw_set(tmp_path_factory, train_examples):
    val = make_examples(np.random.default_rng(4), 5, SIZE)
    directory = tmp_path_factory.mktemp("raw")
    return write_record_set(directory, {"train": train_examples, "val": val}, num_shards=3)


def _identify(examples):
    """Maps an image as yielded by the pipeline to (example index, whether it was flipped)."""
    index = {image.tobytes(): i for i, (image, _, _) in enumerate(examples)}

    def identify(image):
        pixels = np.round(np.asarray(image) * 255).astype(np.uint8)
        if pixels.tobytes() in index:
            return index[pixels.tobytes()], False
        return index[np.ascontiguousarray(pixels[:, ::-1]).tobytes()], True

    return identify


def _padded(boxes, classes, max_boxes):
    rows = np.zeros((max_boxes, 5), np.float32)
    rows[: len(boxes)] = np.concatenate([boxes, classes[:, None]], axis=-1)
    return rows


def _rectangle_image(height=48, width=64, box=(10, 5, 30, 20)):
    image = np.full((height, width, 3), GREY, np.uint8)
    x0, y0, x1, y1 = box
    image[y0:y1, x0:x1] = RED
    boxes = np.array([[x0, y0, x1, y1, 1], [0, 0, 0, 0, 0]], np.float32)
    return image, boxes


def _check_flipped(image, boxes):
    image, boxes = np.asarray(image), np.asarray(boxes)
    # x1 -> W - x2: (10, 30) in a 64 px wide image becomes (34, 54); y and class unchanged.
    np.testing.assert_array_equal(boxes, [[34, 5, 54, 20, 1], [0, 0, 0, 0, 0]])
    assert (image[5:20, 34:54] == RED).all()
    assert (image[:, :34] == GREY).all() and (image[:, 54:] == GREY).all()


def test_flip_moves_boxes_with_pixels_eagerly():
    image, boxes = _rectangle_image()
    _check_flipped(*data.flip_horizontal(image, boxes))
    _check_flipped(*data.random_flip(image, boxes, tf.constant([0, 0]), probability=1.0))
    kept_image, kept_boxes = data.random_flip(image, boxes, tf.constant([0, 0]), probability=0.0)
    np.testing.assert_array_equal(kept_image, image)
    np.testing.assert_array_equal(kept_boxes, boxes)


def test_flip_moves_boxes_with_pixels_in_tf_data():
    image, boxes = _rectangle_image()
    dataset = tf.data.Dataset.from_tensors((image, boxes)).map(
        lambda i, b: data.random_flip(i, b, tf.constant([0, 0]), probability=1.0)
    )
    _check_flipped(*next(iter(dataset)))


def test_random_flip_draw_is_the_same_eagerly_and_in_tf_data():
    image, boxes = _rectangle_image()
    seeds = tf.constant([[7, i] for i in range(16)], tf.int64)
    eager = [data.random_flip(image, boxes, seed)[1][0, 0].numpy() for seed in seeds]
    graph = tf.data.Dataset.from_tensor_slices(seeds).map(
        lambda seed: data.random_flip(image, boxes, seed)[1][0, 0]
    )
    assert eager == [float(x) for x in graph.as_numpy_iterator()]
    assert set(eager) == {10.0, 34.0}  # both outcomes occur at p = 0.5


def test_pipeline_flip_moves_boxes_with_pixels(raw_set, train_examples):
    dataset = data.make_dataset(
        raw_set, batch_size=4, flip=1.0, repeat=False, with_boxes=True, max_boxes=5, **PIPELINE
    )
    identify = _identify(train_examples)
    seen = []
    for images, _, boxes in dataset:
        for image, image_boxes in zip(images.numpy(), boxes.numpy()):
            index, flipped = identify(image)
            stored_boxes, classes = train_examples[index][1:]
            expected = _padded(stored_boxes, classes, 5)
            expected[: len(stored_boxes), [0, 2]] = SIZE - stored_boxes[:, [2, 0]]
            assert flipped
            np.testing.assert_array_equal(image_boxes, expected)
            seen.append(index)
    assert sorted(seen) == list(range(len(train_examples)))


def _decoded_boxes(targets, image):
    found = set()
    for level in targets:
        cells = level[image][level[image][..., 4] > 0]
        for x, y, w, h, _, *one_hot in cells:
            box = (x - w / 2, y - h / 2, x + w / 2, y + h / 2)
            found.add((*(round(v * SIZE, 3) for v in box), int(np.argmax(one_hot))))
    return found


@pytest.mark.parametrize("image_format", ["raw", "jpeg"])
def test_images_and_targets_match_the_records(tmp_path, image_format):
    examples = make_examples(np.random.default_rng(5), 6, SIZE)
    records_dir = write_record_set(tmp_path, {"val": examples}, image_format=image_format)
    dataset = data.make_dataset(
        records_dir, "val", batch_size=4, training=False, with_boxes=True, max_boxes=4, **PIPELINE
    )
    batches = list(dataset.as_numpy_iterator())
    assert [len(b[0]) for b in batches] == [4, 2]  # no drop_remainder when evaluating
    # Round-robin shards of 2: manifest order is examples 0, 2, 4, then 1, 3, 5.
    order = [0, 2, 4, 1, 3, 5]
    images = np.concatenate([b[0] for b in batches])
    boxes = np.concatenate([b[2] for b in batches])
    targets = [np.concatenate([b[1][level] for b in batches]) for level in range(2)]
    stored = np.stack([examples[i][0] for i in order]).astype(np.float32) / 255
    if image_format == "raw":
        np.testing.assert_array_equal(images, stored)
    else:
        assert np.abs(images - stored).mean() < 2 / 255
    expected_boxes = np.stack([_padded(*examples[i][1:], 4) for i in order])
    np.testing.assert_array_equal(boxes, expected_boxes)
    oracle = numpy_targets(boxes, (SIZE, SIZE), SMALL_ANCHORS, 2, SMALL_MASKS)
    from_tf = build_targets(boxes, input_hw=(SIZE, SIZE), **PIPELINE)
    for level in range(2):
        np.testing.assert_allclose(targets[level], oracle[level], atol=1e-6)
        np.testing.assert_array_equal(targets[level], from_tf[level])
    assert sum(t[..., 4].sum() for t in targets) > 0
    for image in range(len(order)):
        stored_rows = {(*map(float, row[:4]), int(row[4])) for row in boxes[image] if row[2] > 0}
        assert _decoded_boxes(targets, image) <= stored_rows


def _epochs(records_dir, seed, examples, epochs=2):
    identify = _identify(examples)
    dataset = data.make_dataset(records_dir, batch_size=4, seed=seed, with_boxes=True, **PIPELINE)
    batches = list(dataset.take(epochs * len(examples) // 4).as_numpy_iterator())
    order = [identify(image) for batch in batches for image in batch[0]]
    return batches, order


def test_same_seed_same_batches_and_each_epoch_reshuffles(raw_set, train_examples):
    first, order = _epochs(raw_set, 0, train_examples)
    again, _ = _epochs(raw_set, 0, train_examples)
    for a, b in zip(first, again):
        tf.nest.map_structure(np.testing.assert_array_equal, a, b)
    count = len(train_examples)
    epoch_1, epoch_2 = order[:count], order[count:]
    # Each epoch sees every record once, in a new order and with new flips.
    assert sorted(i for i, _ in epoch_1) == sorted(i for i, _ in epoch_2) == list(range(count))
    assert epoch_1 != epoch_2
    assert {flipped for _, flipped in order} == {True, False}
    _, other_order = _epochs(raw_set, 1, train_examples)
    assert other_order != order


def test_input_pipelines_read_disjoint_shards_covering_all(raw_set, train_examples):
    identify = _identify(train_examples)
    seen = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 2)
        dataset = data.make_dataset(
            raw_set, batch_size=2, training=False, input_context=context, **PIPELINE
        )
        policy = dataset.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.OFF
        seen.append([identify(image)[0] for batch in dataset for image in batch[0].numpy()])
    # 3 shards: pipeline 0 reads shards 0 and 2, pipeline 1 reads shard 1.
    assert set(seen[1]) == {i for i in range(12) if i % 3 == 1}
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(12))


def test_fewer_shards_than_pipelines_is_an_error(raw_set):
    context = tf.distribute.InputContext(4, 0, 4)
    with pytest.raises(ValueError, match=r"3 shard files.*4 input pipelines.*--num-shards"):
        data.make_dataset(raw_set, batch_size=2, input_context=context, **PIPELINE)


def test_wrong_num_classes_or_missing_manifest(raw_set, tmp_path):
    with pytest.raises(ValueError, match=r"model has 3 classes .* has 2 classes"):
        data.make_dataset(raw_set, batch_size=2, head=make_head(SMALL_ANCHORS, 3))
    with pytest.raises(FileNotFoundError, match="preprocess"):
        data.make_dataset(str(tmp_path), batch_size=2, **PIPELINE)


def test_extra_boxes_are_cut_with_a_warning(tmp_path, caplog):
    examples = make_examples(np.random.default_rng(6), 4, SIZE, max_boxes=6)
    most = max(len(boxes) for _, boxes, _ in examples)
    assert most > 2
    records_dir = write_record_set(tmp_path, {"val": examples}, max_boxes_per_image=most)
    dataset = data.make_dataset(
        records_dir, "val", batch_size=4, training=False, with_boxes=True, max_boxes=2, **PIPELINE
    )
    assert f"images with {most} boxes; only the first max_boxes=2" in caplog.text
    boxes = next(iter(dataset))[2].numpy()
    for image, index in enumerate([0, 2, 1, 3]):
        np.testing.assert_array_equal(boxes[image], _padded(*examples[index][1:], 6)[:2])


def test_counts(raw_set):
    record_set = records.open_record_set(raw_set)
    assert record_set.num_records("train") == 12
    with pytest.raises(ValueError, match="no 'test' split"):
        record_set.num_records("test")


def test_pipeline_batches_train_the_model(raw_set):
    model = tiny_model(num_classes=2, size=SIZE)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def train_step(images, targets):
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            total, _ = yolo_loss(targets, outputs, **PIPELINE)
            loss = tf.reduce_mean(total)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    start = [v.numpy() for v in model.trainable_variables]
    dataset = data.make_dataset(raw_set, batch_size=4, **PIPELINE)
    losses = [float(train_step(images, targets)) for images, targets in dataset.take(3)]
    assert np.isfinite(losses).all()
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(start, model.trainable_variables))
    images, targets = next(iter(dataset))
    fixed = [float(train_step(images, targets)) for _ in range(20)]
    assert np.isfinite(fixed).all()
    assert fixed[-1] < 0.5 * fixed[0]


def test_synthetic_dataset_and_throughput(raw_set):
    dataset = data.synthetic_dataset(batch_size=3, input_hw=(SIZE, 96), **PIPELINE)
    first, second = list(dataset.take(2).as_numpy_iterator())
    images, targets = first
    assert images.shape == (3, SIZE, 96, 3) and images.dtype == np.float32
    assert 0 <= images.min() and images.max() <= 1
    assert [t.shape for t in targets] == [(3, 2, 3, 3, 7), (3, 4, 6, 3, 7)]
    assert sum(t[..., 4].sum() for t in targets) > 0
    tf.nest.map_structure(np.testing.assert_array_equal, first, second)

    report = data.measure_throughput(dataset, batches=5)
    assert report["batches"] == 5 and report["images"] == 15
    assert report["images_per_second"] > 0 and report["seconds"] > 0
    timed = data.measure_throughput(dataset, seconds=0.2)
    assert timed["seconds"] >= 0.2 and timed["batches"] > 0
    finite = data.make_dataset(raw_set, "val", batch_size=2, training=False, **PIPELINE)
    assert data.measure_throughput(finite, warmup_batches=1)["images"] == 5 - 2
    with pytest.raises(ValueError, match="forever"):
        data.measure_throughput(dataset)


def test_the_trainers_pipelines_start_no_tuning_thread(raw_set, four_replicas):
    """tf.data's autotuning thread makes deleting an iterator wait for its next wake-up
    once the iterator has run about 20 s: 16 s for one deleted after 25 s, up to a minute
    in a long run (yolo3/data/autotune.py). Every dataset the trainer iterates has it off:
    the record pipeline, the synthetic batches, a shard read for evaluation, and the
    per-device datasets through which a strategy hands each replica its batch."""
    autotune.untune_device_datasets()  # as yolo3.engine.builders.build_datasets does

    def pipeline(context=None):
        return data.make_dataset(
            raw_set, "train", batch_size=1, training=True, targets=False,
            input_context=context, **PIPELINE,
        )  # fmt: skip

    synthetic = data.synthetic_dataset(batch_size=1, input_hw=(SIZE, SIZE), **PIPELINE)
    shard = records.open_record_set(raw_set).shard_paths("val")[0]
    for dataset in (pipeline(), synthetic, records.read_shard(shard)):  # the last: evaluation's
        tuning = dataset.options().autotune
        assert tuning.enabled is False  # None, TensorFlow's default, leaves it on
        assert tuning.initial_parallelism == available_cores()
    distributed = iter(four_replicas.distribute_datasets_from_function(pipeline))
    (worker,) = distributed._iterators  # one worker's multi-device iterator
    devices = [iterator._dataset for iterator in worker._iterator._device_iterators]
    assert len(devices) == 4
    # What reaches TensorFlow's runtime is the options of an OptionsDataset on top (the
    # Python-side `options()` of a per-device dataset reports its source's, not its own).
    for device in devices:
        assert isinstance(device, dataset_ops._OptionsDataset), type(device)
        assert device._options_attr.autotune.enabled is False
