"""Record shards are files from elsewhere: a hostile one ends a reader with one line.

A record whose length header claims more than the file holds (its checksum valid, the
manifest updated to match) used to end ``yolo3 train`` and ``yolo3 evaluate`` with a
segmentation fault, and garbage image bytes with a TensorFlow traceback naming no record.
Every reader now names the shard and the record, ``error: ...`` and status 2 (``yolo3
preprocess --verify`` lists it among the problems, status 1): a crash here would end the
test process itself.
"""

import hashlib
import json
import re
import shutil
import struct

import h5py
import numpy as np
import pytest
import tensorflow as tf
from helpers import SMALL_ANCHORS, load_tool
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from record_sets import make_examples, write_record_set
from train_helpers import SIZE, train_args, write_anchors

from yolo3 import faults
from yolo3.checkpoint.weights import read_metadata, save_weights
from yolo3.commands import train
from yolo3.data import records, shard_check
from yolo3.data.pipeline import make_dataset
from yolo3.model.network import tiny_yolo_body

evaluate_tool = load_tool("evaluate")
preprocess_tool = load_tool("preprocess")
SHARD = "train-00000-of-00002.tfrecord"  # train records 0, 2, 4, ... of the set


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    """``(records, anchors, weights)``: a JPEG record set of 12 train and 4 val images of
    64 px in two shards a split, an anchors file and untrained tiny-YOLOv3 weights."""
    folder = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    splits = {"train": make_examples(rng, 12, SIZE), "val": make_examples(rng, 4, SIZE)}
    (folder / "records").mkdir()
    directory = write_record_set(folder / "records", splits, image_format="jpeg")
    weights = str(folder / "tiny.weights.h5")
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    save_weights(body, weights, {"anchors": SMALL_ANCHORS.tolist()})
    return directory, write_anchors(folder / "anchors.txt"), weights


def _payloads(path):
    """Each record's data, as TensorFlow reads it from a sound shard."""
    return [record.numpy() for record in tf.data.TFRecordDataset(str(path))]


def _copy(sound, tmp_path):
    return shutil.copytree(sound[0], tmp_path / "records")


def _rewrite(shard, data):
    """Writes ``data`` as ``shard`` and its size and checksum into the manifest, as a file
    made to pass every whole-file check would be."""
    shard.write_bytes(data)
    manifest_path = shard.parent / records.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            if entry["file"] == shard.name:
                entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))


def _forge_length(data, index, length):
    """``data`` (a sound shard) with record ``index``'s header claiming ``length`` bytes,
    its checksum valid."""
    offset = 0
    for _ in range(index):
        offset += struct.unpack_from("<Q", data, offset)[0] + 16
    header = struct.pack("<Q", length)
    checksum = struct.pack("<I", shard_check.masked_crc32c(header))
    return data[:offset] + header + checksum + data[offset + 12 :]


def _with_feature(payload, name, **value):
    """A record's data with feature ``name`` replaced (``bytes_list=[...]`` etc.)."""
    example = tf.train.Example.FromString(payload)
    feature = example.features.feature[name]
    feature.Clear()
    for kind, values in value.items():
        getattr(feature, kind).value.extend(values)
    return example.SerializeToString(deterministic=True)


def _training_reader(directory, split):
    """The dataset training reads ``split`` with (:func:`make_dataset`), without targets."""
    return make_dataset(directory, split, batch_size=2, training=False, targets=False)


def _error_lines(capfd):
    """Standard error without TensorFlow's own log lines (glog style: ``W0000 00:00...``)."""
    err = capfd.readouterr().err
    return [line for line in err.splitlines() if not re.match(r"[IWEF]\d{4} ", line)]


def test_the_framing_written_and_checked_is_tensorflows(sound):
    shard = f"{sound[0]}/{SHARD}"
    payloads = _payloads(shard)
    with open(shard, "rb") as f:
        assert f.read() == b"".join(shard_check.frame(payload) for payload in payloads)
    assert shard_check.scan_shard(shard) == (len(payloads), None)
    # The check of the CRC-32C itself: its standard test vector.
    assert shard_check.crc32c(b"123456789") == 0xE3069283


def test_a_length_header_of_2_40_bytes_ends_every_reader_with_one_line(sound, tmp_path, capfd):
    records_dir = _copy(sound, tmp_path)
    shard = records_dir / SHARD
    _rewrite(shard, _forge_length(shard.read_bytes(), 1, 2**40))
    said = f"{shard} record 1: its header claims 1099511627776 bytes, more than the"
    run = tmp_path / "run"

    assert train.main(train_args(records_dir, run, sound[1], "--epochs", "1")) == 2
    (line,) = _error_lines(capfd)
    assert line.startswith(f"error: {said}")
    assert f"yolo3 preprocess --verify {records_dir} lists every damaged record" in line
    assert not run.exists()  # refused before anything was written

    evaluate = ["--weights", sound[2], "--records", str(records_dir), "--split", "train"]
    assert evaluate_tool.main([*evaluate, "--output", str(tmp_path / "eval")]) == 2
    assert [line for line in _error_lines(capfd) if line.startswith("error:")] == [line]

    assert preprocess_tool.main(["--verify", str(records_dir)]) == 1
    problems = _error_lines(capfd)
    assert problems[0].startswith(said)
    assert problems[1] == f"{shard}: 1 records; the manifest says 6 (train)"
    assert records.find_damage(str(records_dir))[:2] == (str(shard), 1)
    with pytest.raises(records.BadRecord, match=re.escape(said)):
        _training_reader(str(records_dir), "train")


def test_garbage_image_bytes_stop_training_with_one_line_and_keep_what_was_written(
    sound, tmp_path, capfd
):
    records_dir = _copy(sound, tmp_path)
    shard = records_dir / SHARD
    payloads = _payloads(shard)
    payloads[3] = _with_feature(payloads[3], "image", bytes_list=[b"\x13" * 600])
    _rewrite(shard, b"".join(shard_check.frame(payload) for payload in payloads))
    said = f"error: {shard} record 3: cannot be decoded (InvalidArgumentError: Unknown image"
    what_to_do = f"(yolo3 preprocess --verify {records_dir} lists every damaged record)"

    # 12 records, 4 a step, one step an epoch: each record is read once in 3 epochs; with
    # the default seed this one in the second, after the first epoch's checkpoints.
    run = tmp_path / "run"
    args = train_args(records_dir, run, sound[1], "--epochs", "3", "--steps-per-epoch", "1")
    assert train.main(args) == 2
    (line,) = [line for line in _error_lines(capfd) if line.startswith("error:")]
    assert line.startswith(said) and line.endswith(what_to_do)
    # What the run had written is whole and kept: no temporary, each file readable, none
    # from the epoch that met the record or after it.
    assert not list(run.rglob(".tmp-*"))
    written = list(run.rglob("*.weights.h5"))
    assert (run / "checkpoints/last.weights.h5") in written
    for path in written:
        assert read_metadata(str(path))["epoch"] < 3
        with h5py.File(path, "r") as f:
            assert f.keys()

    evaluate = ["--weights", sound[2], "--records", str(records_dir), "--split", "train"]
    assert evaluate_tool.main([*evaluate, "--output", str(tmp_path / "eval")]) == 2
    assert [line for line in _error_lines(capfd) if line.startswith("error:")] == [line]


@pytest.mark.parametrize(
    "feature, value, problem",
    [
        ("boxes", {"float_list": [1.0, 2.0, 3.0, 4.0, 5.0]}, r"5 box values for \d class ids"),
        ("classes", {"int64_list": [0] * 7}, r"\d+ box values for 7 class ids"),
        ("format", {"bytes_list": [b"gif"]}, "unknown image format 'gif'"),
        ("format", {"bytes_list": [b"raw"]}, "raw image has .* bytes, not 64x64x3 = 12288"),
        ("height", {}, "'height' feature holds 0 values, not one"),
    ],
)
def test_a_record_that_does_not_decode_is_named_by_each_python_reader(
    sound, tmp_path, feature, value, problem
):
    records_dir = _copy(sound, tmp_path)
    shard = records_dir / SHARD
    payloads = _payloads(shard)
    payloads[3] = _with_feature(payloads[3], feature, **value)
    _rewrite(shard, b"".join(shard_check.frame(payload) for payload in payloads))
    with pytest.raises(records.BadRecord, match=f"^{re.escape(str(shard))} record 3: .*{problem}"):
        list(records.decode_records(str(shard)))
    path, index, said = records.find_undecodable(str(records_dir))
    assert (path, index) == (str(shard), 3) and re.search(problem, said)
    problems, _ = records.verify(str(records_dir))
    assert len(problems) == 1 and problems[0].startswith(f"{shard} record 3: cannot be decoded")


def _mutations():
    """One change to a sound shard of 6 records: cut at a byte, a byte flipped, a record's
    length claimed otherwise (checksum valid), or a record's data replaced (checksums
    valid)."""
    cut = st.tuples(st.just("cut"), st.floats(0, 1, exclude_max=True))
    flip = st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(1, 255))
    length = st.tuples(
        st.just("length"),
        st.integers(0, 5),
        st.one_of(st.integers(0, 1 << 20), st.sampled_from([2**31, 2**40, 2**63, 2**64 - 1])),
    )
    data = st.tuples(st.just("data"), st.integers(0, 5), st.binary(max_size=64))
    splice = st.tuples(
        st.just("splice"),
        st.integers(0, 5),
        st.floats(0, 1, exclude_max=True),
        st.binary(min_size=1, max_size=8),
    )
    return st.one_of(cut, flip, length, data, splice)


def _mutate(shard, mutation):
    kind, *how = mutation
    if kind in ("cut", "flip", "length"):
        data = bytearray(shard)
        if kind == "cut":
            return bytes(data[: int(how[0] * len(data))])
        if kind == "flip":
            data[int(how[0] * len(data))] ^= how[1]
            return bytes(data)
        return _forge_length(bytes(data), *how)
    payloads = _payloads_of(shard)
    if kind == "data":
        payloads[how[0]] = how[1]
    else:  # bytes overwritten inside a record's data, as a protobuf or image decoder sees
        index, at, new = how
        payload = payloads[index]
        offset = int(at * len(payload))
        payloads[index] = payload[:offset] + new + payload[offset + len(new) :]
    return b"".join(shard_check.frame(payload) for payload in payloads)


def _payloads_of(data):
    payloads, offset = [], 0
    while offset < len(data):
        length = struct.unpack_from("<Q", data, offset)[0]
        payloads.append(data[offset + 12 : offset + 12 + length])
        offset += length + 16
    return payloads


@pytest.fixture(scope="module")
def fuzz_set(tmp_path_factory):
    """``(records, shard, its bytes, dataset)``: a JPEG record set of six 32 px train images
    in one shard, the bytes the fuzz mutates, and the training pipeline over it, built once
    (it opens the shard again each time it is iterated)."""
    folder = tmp_path_factory.mktemp("fuzz")
    examples = make_examples(np.random.default_rng(1), 6, 32, max_boxes=2)
    (folder / "records").mkdir()
    directory = write_record_set(
        folder / "records", {"train": examples}, image_format="jpeg", num_shards=1
    )
    shard = f"{directory}/{records.shard_name('train', 0, 1)}"
    with open(shard, "rb") as f:
        return directory, shard, f.read(), _training_reader(directory, "train")


def _one_line_naming(err, shard):
    text = str(err)
    return "\n" not in text and text.startswith(f"{shard} record ")


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(mutation=_mutations())
def test_fuzz_mutated_shards_read_fine_or_end_in_one_named_error(fuzz_set, mutation):
    directory, shard, sound_bytes, dataset = fuzz_set
    with open(shard, "wb") as f:
        f.write(_mutate(sound_bytes, mutation))
    try:
        # What yolo3 evaluate and yolo3 export read (yolo3.evaluation.validate).
        try:
            decoded = list(records.decode_records(shard))
        except records.BadRecord as err:
            assert _one_line_naming(err, shard), err
        else:
            assert all(record["image"].ndim == 3 for record in decoded)
        # What yolo3 preprocess --verify and a run's damage report read.
        problems, _ = records.verify(directory, check_checksums=False)
        assert all("\n" not in problem for problem in problems)
        damage = records.find_damage(directory)
        assert damage is None or damage[0] == shard
        # What training reads (make_dataset checks the framing as it builds the dataset),
        # with the names the train command gives its errors.
        try:
            with faults.undecodable_records_named([directory]):
                shard_check.check_shard(shard)
                for _ in dataset:
                    pass
        except records.BadRecord as err:
            assert _one_line_naming(err, shard), err
            event(f"training: {err.problem.split(' (')[0]}")
        except tf.errors.DataLossError:
            # A checksum of the data: the trainer names it by find_damage.
            assert damage is not None and damage[1] is not None
            event("training: DataLossError, named by find_damage")
        else:
            event("training: read fine")
    finally:
        with open(shard, "wb") as f:
            f.write(sound_bytes)
