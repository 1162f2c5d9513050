"""A run survives a full disk and a record shard damaged under it.

Either fault ends the run with one line naming the file, exit status 1 and no traceback,
and leaves every checkpoint and backup either the previous complete one or the new one;
the same command continues from the last backup once the fault is repaired. The disk is a
real size-limited tmpfs (root only), the damage a real truncation of a shard file.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import load_tool
from test_preprocess import _rectangles_dataset, _write_classes
from train_helpers import SIZE, small_record_set, train_args, write_anchors

from yolo3 import faults
from yolo3.checkpoint.weights import read_metadata, save_weights
from yolo3.commands import train
from yolo3.data import records
from yolo3.fileio import atomic_write
from yolo3.model.network import tiny_yolo_body

ROOT = Path(__file__).resolve().parents[1]
TRAIN_RECORDS = 24  # two shards of 12 records (about 150 kB each); 6 steps of 4 a pass


@pytest.fixture(scope="module")
def record_set(tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults")
    records_dir = small_record_set(folder / "records", train=TRAIN_RECORDS, val=0)
    return records_dir, write_anchors(folder / "anchors.txt")


def _mount(*args):
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of its own; yields ``(folder, resize)``, ``resize(bytes)`` changing its size."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder))
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs at {folder}: {mounted.stderr.strip()}")

    def resize(size):
        _mount("-o", f"remount,size={size}", str(folder)).check_returncode()

    try:
        yield folder, resize
    finally:
        # Lazily when busy: a file left open must not leave the mount behind.
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)


def _fill(folder):
    """Writes a file into ``folder`` until its filesystem is full; returns the file."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        with pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
    return filler


def _assert_complete(path):
    """Every array of the weights file reads back (a torn file does not open or read)."""
    arrays = []
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda _, item: arrays.append(item[()]) if isinstance(item, h5py.Dataset) else None
        )
    assert arrays, path


def _no_temporaries(folder):
    return [str(path) for path in Path(folder).rglob(".tmp-*")]


def _error_lines(stderr):
    """Standard error without TensorFlow's own log lines (glog style: ``W0000 00:00...``)."""
    return [line for line in stderr.splitlines() if not re.match(r"[IWEF]\d{4} ", line)]


def test_writes_that_find_the_disk_full_name_their_file_and_keep_the_last_one(small_disk):
    folder, resize = small_disk
    resize(4 << 20)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(50_000)])  # 1 MB of weights
    path = str(folder / "last.weights.h5")
    save_weights(model, path, {"epoch": 1})
    _fill(folder)
    model.layers[0].kernel.assign(model.layers[0].kernel + 1.0)

    # Keras writes the weights through h5py: OSError ENOSPC naming the temporary file in its
    # text only; atomic_write names the file it was writing.
    with pytest.raises(OSError, match="No space left") as raised:
        save_weights(model, path, {"epoch": 2})
    assert raised.value.filename == path
    assert faults.no_space_path(raised.value) == path
    assert _no_temporaries(folder) == []
    assert read_metadata(path) == {"epoch": 1}  # the previous complete file, untouched
    _assert_complete(path)

    # TensorBoard's writer: ResourceExhaustedError, "PATH; No space left on device".
    with pytest.raises(tf.errors.ResourceExhaustedError) as raised:
        tf.summary.create_file_writer(str(folder / "tensorboard"))
    named = faults.no_space_path(raised.value)
    assert named.startswith(str(folder / "tensorboard" / "events.out.tfevents.")), named

    with pytest.raises(faults.OutOfSpace, match=rf"^{re.escape(path)}: no space left on device"):
        with faults.out_of_space_fails(str(folder)), atomic_write(path) as temp:
            shutil.copyfile(str(folder / "filler"), temp)
    assert faults.no_space_path(tf.errors.ResourceExhaustedError(None, None, "OOM")) is None
    assert faults.no_space_path(PermissionError(13, "denied", path)) is None


def test_preprocessing_into_a_full_disk_says_so_in_one_line_and_the_same_command_finishes(
    small_disk, tmp_path, capfd
):
    folder, resize = small_disk
    annotations, _ = _rectangles_dataset(tmp_path / "images", 40, np.random.default_rng(0))
    output = folder / "records"
    argv = [
        "--annotations", annotations, "--classes", _write_classes(tmp_path), "--input-size",
        str(SIZE), "--copies", "3", "--num-shards", "4", "--workers", "1", "--quiet",
        "--output", str(output), "--val-fraction", "0",
    ]  # fmt: skip
    resize(150 << 10)  # room for two or three of the four shards (about 50 kB each)
    preprocess = load_tool("preprocess")
    assert preprocess.main(argv) == 1
    [line] = [line for line in _error_lines(capfd.readouterr().err) if line.startswith("error")]
    assert re.fullmatch(
        rf"error: {re.escape(str(output))}/train-0000\d-of-00004\.tfrecord\.incomplete: no "
        "space left on device; free some space there, then run the same command again to "
        "continue where it stopped",
        line,
    ), line
    finished = {path.name: path.read_bytes() for path in output.glob("*.tfrecord")}
    assert finished and not (output / "manifest.json").exists()

    resize(1 << 20)
    assert preprocess.main(argv) == 0
    for name, data in finished.items():  # kept, not written again
        assert (output / name).read_bytes() == data
    assert records.verify(str(output)) == ([], {"shards": 4, "records": 160, "boxes": 158})


def _file_sizes():
    """Bytes of a template checkpoint and of a backup (the trainer with Adam's two slots)
    of the tiny model on two classes, in float32."""
    body = tiny_yolo_body(None, 3, 2, input_shape=(SIZE, SIZE, 3))
    trainable = sum(int(np.prod(weight.shape)) for weight in body.trainable_weights)
    template = 4 * body.count_params()
    return template, template + 2 * 4 * trainable


def _train_until_the_disk_fills(record_set, log_dir, epochs, failing):
    """Runs train.py for ``epochs`` epochs of one step, as a process of its own (what a user
    sees, up to its exit: a file h5py left open once crashed the interpreter there); checks
    that it ends with one line naming ``failing`` and leaves no temporary file. Returns the
    arguments, to run the same command again."""
    args = train_args(*record_set[:1], log_dir, record_set[1], "--epochs", str(epochs))
    args += ["--steps-per-epoch", "1"]
    failed = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True
    )
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert _error_lines(failed.stderr) == [
        f"error: {failing}: no space left on device; free some space there, then run the "
        "same command again to continue from the last backup"
    ]
    assert _no_temporaries(log_dir) == []
    return args


def _epochs_on_disk(log_dir):
    """``{file name: epoch (checkpoints) or step (backups)}``, each file read to the end."""
    found = {}
    for path in sorted((log_dir / "checkpoints").glob("*.h5")):
        _assert_complete(path)
        found[path.name] = read_metadata(str(path))["epoch"]
    for path in sorted((log_dir / "backup" / "worker-0").glob("*.h5")):
        _assert_complete(path)
        found[path.name] = read_metadata(str(path))["step"]
    return found


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_one_line_and_the_same_command_finishes_it(
    record_set, small_disk, capsys
):
    folder, resize = small_disk
    template, backup = _file_sizes()
    # Epoch 1 leaves a backup and the training state (a backup's size each), last and best
    # (a template each); half of epoch 2's backup fits, and the write fails there.
    resize(2 * backup + 2 * template + backup // 2)
    log_dir = folder / "run"
    backups = log_dir / "backup" / "worker-0"
    args = _train_until_the_disk_fills(
        record_set, log_dir, 3, backups / "backup-000000002.weights.h5"
    )
    assert _epochs_on_disk(log_dir) == {
        "best.weights.h5": 1,
        "last.weights.h5": 1,
        "state.weights.h5": 1,
        "backup-000000001.weights.h5": 1,
    }

    resize(4 * backup + 4 * template)
    capsys.readouterr()
    assert train.main(args) == 0
    assert f"restored backup {backups / 'backup-000000001.weights.h5'}" in capsys.readouterr().out
    assert read_metadata(str(log_dir / "checkpoints" / "state.weights.h5"))["epoch"] == 3
    assert not backups.exists()


@pytest.mark.slow
def test_a_disk_full_at_the_last_checkpoint_gets_it_written_by_the_same_command(
    record_set, small_disk, capsys
):
    folder, resize = small_disk
    template, backup = _file_sizes()
    # At the end of epoch 2 of 2: two backups and the previous state (3 backups' size),
    # last and best (2 templates), and room for a third template, written and renamed over
    # last (and best) first, but not for the new state, which needs a backup's size.
    resize(3 * backup + 3 * template + (backup - template) // 2)
    log_dir = folder / "run"
    checkpoints = log_dir / "checkpoints"
    args = _train_until_the_disk_fills(record_set, log_dir, 2, checkpoints / "state.weights.h5")
    on_disk = _epochs_on_disk(log_dir)
    assert on_disk.pop("best.weights.h5") in (1, 2)  # 2 when epoch 2's loss was lower
    assert on_disk == {
        "last.weights.h5": 2,
        "state.weights.h5": 1,  # the previous complete one
        "backup-000000001.weights.h5": 1,
        "backup-000000002.weights.h5": 2,
    }

    # Nothing is left to train, but epoch 2's state is only in its backup, which the end of
    # the run deletes: the run writes the checkpoints from it first.
    resize(5 * backup + 5 * template)
    capsys.readouterr()
    assert train.main(args) == 0
    assert "checkpoints of epoch 2 written from its backup" in capsys.readouterr().out
    assert read_metadata(str(checkpoints / "state.weights.h5"))["epoch"] == 2
    assert read_metadata(str(checkpoints / "last.weights.h5"))["epoch"] == 2
    assert not (log_dir / "backup" / "worker-0").exists()


def _record_ends(path):
    """The byte offset where each record of a TFRecord file ends (each record is framed by
    its length, 8 bytes, and two checksums of 4)."""
    return np.cumsum([len(record.numpy()) + 16 for record in tf.data.TFRecordDataset(path)])


def _train_and_cut(args, first_backup, shard, size):
    """``yolo3 train args`` in this process, ``shard`` truncated to ``size`` bytes by another
    thread once ``first_backup`` is written; the exit status."""
    training_done = threading.Event()

    def cut_after_the_first_backup():
        while not first_backup.exists():
            if training_done.wait(0.01):
                return
        os.truncate(shard, size)

    cutter = threading.Thread(target=cut_after_the_first_backup)
    cutter.start()
    try:
        return train.main(args)
    finally:
        training_done.set()
        cutter.join()


def test_find_damage_names_the_shard_and_the_record(record_set, tmp_path):
    copy = shutil.copytree(record_set[0], tmp_path / "records")
    assert records.find_damage(str(copy)) is None
    first, second = sorted(copy.glob("train-*.tfrecord"))
    sound = second.read_bytes()
    ends = _record_ends(second)
    with open(second, "r+b") as f:  # overwritten in place: the same size, checksums wrong
        f.seek((ends[4] + ends[5]) // 2)
        f.write(b"\xff" * 64)
    assert records.find_damage(str(copy)) == (
        str(second), 5, "corrupt (its checksum does not match: the file was overwritten)"
    )  # fmt: skip
    second.write_bytes(sound)

    size = first.stat().st_size
    os.truncate(first, _record_ends(first)[4])  # at a record's end: it reads, but is short
    assert records.find_damage(str(copy)) == (
        str(first), None, f"{_record_ends(first)[-1]} bytes where the manifest says {size}"
    )  # fmt: skip
    first.unlink()
    assert records.find_damage(str(copy)) == (
        str(first), None, "missing, though the manifest lists it"
    )  # fmt: skip


def test_a_shard_cut_short_mid_run_ends_it_naming_the_shard_and_the_record(
    record_set, tmp_path, capfd
):
    records_dir = shutil.copytree(record_set[0], tmp_path / "records")
    shard = records_dir / "train-00000-of-00002.tfrecord"
    ends = _record_ends(shard)
    log_dir = tmp_path / "run"
    first_backup = log_dir / "backup" / "worker-0" / "backup-000000006.weights.h5"
    args = train_args(
        records_dir, log_dir, record_set[1], "--epochs", "4", "--steps-per-epoch", "6"
    )
    # Whatever the pipeline has read ahead, epochs 3 and 4 open the shard again.
    status = _train_and_cut(args, first_backup, shard, (ends[6] + ends[7]) // 2)  # in record 7
    assert status == 1
    assert _error_lines(capfd.readouterr().err) == [
        f"error: {shard} record 7: cut short (the file ends inside it); the record set changed "
        f"after training started (yolo3 preprocess --verify {records_dir} lists all "
        "damage): restore or preprocess it again, then run the same command to continue from "
        "the last backup"
    ]
    # The run stopped in epoch 2, 3 or 4: its newest backup complete, none half-written.
    backups = sorted((log_dir / "backup" / "worker-0").iterdir())
    assert backups and _no_temporaries(log_dir) == []
    assert read_metadata(str(backups[-1]))["step"] == int(re.search(r"\d+", backups[-1].name)[0])
    _assert_complete(backups[-1])

    assert load_tool("preprocess").main(["--verify", str(records_dir)]) == 1
    problems = capfd.readouterr().err
    assert f"{shard} record 7: cut short (the file ends inside it)" in problems
    assert f"{shard}: 7 records; the manifest says 12 (train)" in problems


def test_a_shard_cut_at_a_records_end_is_found_at_the_start_and_at_the_next_epochs_end(
    record_set, tmp_path, capfd
):
    records_dir = shutil.copytree(record_set[0], tmp_path / "records")
    shard = records_dir / "train-00001-of-00002.tfrecord"
    sound, ends = shard.read_bytes(), _record_ends(shard)
    log_dir = tmp_path / "run"
    args = train_args(
        records_dir, log_dir, record_set[1], "--epochs", "2", "--steps-per-epoch", "6"
    )

    def error_line(since):
        return (
            f"error: {shard}: {ends[6]} bytes where the manifest says {len(sound)}; the record "
            f"set changed after {since} (yolo3 preprocess --verify {records_dir} lists all "
            "damage): restore or preprocess it again, then run the same command to continue "
            "from the last backup"
        )

    os.truncate(shard, ends[6])  # 7 whole records of 12: every one of them still reads
    assert train.main(args) == 1  # before anything is built
    assert _error_lines(capfd.readouterr().err) == [error_line("it was written")]
    assert not log_dir.exists()

    shard.write_bytes(sound)
    first_backup = log_dir / "backup" / "worker-0" / "backup-000000006.weights.h5"
    status = _train_and_cut(args, first_backup, shard, ends[6])
    assert status == 1
    assert _error_lines(capfd.readouterr().err) == [error_line("training started")]
    # Ended at epoch 2's end, before its backup and checkpoints: epoch 1's are what is left.
    assert [path.name for path in (log_dir / "backup" / "worker-0").iterdir()] == [
        first_backup.name
    ]
    _assert_complete(first_backup)
    assert read_metadata(str(log_dir / "checkpoints" / "last.weights.h5"))["epoch"] == 1


def test_a_lost_worker_is_named_by_its_cause_not_tensorflows_header():
    """What a surviving worker's one line says in brackets: the cause at the end of the chain
    of aborted collectives, not "Graph execution error:" (messages as TensorFlow 2.21 raised
    them when another worker was killed, the trace shortened)."""
    from yolo3.training.job import _cause

    trace = (
        "Graph execution error:\n\nDetected at node sgd/CollectiveReduceV2 defined at (most "
        'recent call last):\n  File "train.py", line 129, in <module>\n\n'
    )
    tail = (
        "\nThe error could be from a previous operation. Restart your program to reset.\n"
        "\t [[{{node sgd/CollectiveReduceV2}}]] [Op:__inference_train_function_4038]"
    )
    reset = "Collective ops is aborted by: recvmsg:Connection reset by peer"
    refused = (
        "Collective ops is aborted by: Collective ops is aborted by: failed to connect to all "
        "addresses; last error: UNKNOWN: ipv4:127.0.0.1:46439: Failed to connect to remote "
        "host: Connection refused"
    )
    assert _cause(tf.errors.UnavailableError(None, None, trace + reset + tail)) == (
        "recvmsg:Connection reset by peer"
    )
    assert _cause(tf.errors.UnavailableError(None, None, trace + refused + tail)).startswith(
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:46439"
    )
    timeout = "Deadline Exceeded: no heartbeat from task 1 for 30 s"
    assert _cause(tf.errors.DeadlineExceededError(None, None, trace + timeout)) == timeout
    for message in ("Socket closed", "Collective ops is aborted by:\nSocket closed"):
        assert _cause(tf.errors.UnavailableError(None, None, trace + message)) == "Socket closed"
