"""Faults that end a run which had started well: a full disk, a record shard damaged under it.

(A record that was never sound, found at the start or by the input pipeline, is bad input
instead: :func:`check_record_sets` and :func:`undecodable_records_named` raise it as
:class:`yolo3.data.shard_check.BadRecord`, a ValueError, status 2.)

Each becomes a :class:`RunFailed` whose message is one line naming the file and what to do;
:func:`yolo3.cli.run_main` prints it and exits with status 1 (a run that failed, not a bad
command), without a traceback. What is on disk stays usable: every checkpoint and backup is
written to a temporary file and renamed (:func:`yolo3.fileio.atomic_write`), so the newest
complete backup is still there, and the same command continues from it once the fault is
repaired.

TensorFlow is imported only inside the functions: :mod:`yolo3.cli` imports this module and
stays light.
"""

import contextlib
import re
import sys

from yolo3.fileio import NO_SPACE_ERRNOS

# How TensorFlow's file writers (TensorBoard's event files) say it, after the op's name in
# braces: "{{function_node ...}} PATH; No space left on device".
_TF_NO_SPACE = re.compile(r"(?P<path>[^\n;{}]*); No space left on device")


class RunFailed(RuntimeError):
    """A run that started and then failed; the message is one line saying what to do."""


class OutOfSpace(RunFailed):
    """A write of the run found its filesystem full."""


class DamagedRecord(RunFailed):
    """A record shard could not be read: it changed on disk after the run started."""


def no_space_path(error):
    """The path a write that ran out of space was writing, ``""`` when the error does not
    say, or None when ``error`` is no out-of-space error.

    Python's file calls and h5py raise OSError with ``errno`` ENOSPC (the path in
    ``filename`` when known); TensorFlow's writers raise ResourceExhaustedError, which is
    also what running out of accelerator memory raises, so only its message tells them apart.
    """
    if isinstance(error, OSError):
        return (error.filename or "") if error.errno in NO_SPACE_ERRNOS else None
    # A TensorFlow error comes only from a process that imported it: every tool's error
    # passes here (yolo3.cli.run_main), and those that never start TensorFlow stay light.
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(error, tf.errors.ResourceExhaustedError):
        match = _TF_NO_SPACE.search(error.message)
        return match.group("path").strip() if match else None
    return None


@contextlib.contextmanager
def out_of_space_fails(folder):
    """Turns an out-of-space error in the block into :class:`OutOfSpace`, naming the file
    (``folder`` when the error names none)."""
    import tensorflow as tf  # noqa: PLC0415 - see the module docstring

    try:
        yield
    except (OSError, tf.errors.ResourceExhaustedError) as error:
        path = no_space_path(error)
        if path is None:
            raise
        raise out_of_space(path or folder) from error


def out_of_space(path, *, then="continue from the last backup"):
    """:class:`OutOfSpace` for a write to ``path`` that found its filesystem full; ``then``:
    what running the same command again does."""
    return OutOfSpace(
        f"{path}: no space left on device; free some space there, then run the same command "
        f"again to {then}"
    )


def check_record_sets(record_sets, *, since="training started"):
    """Raises :class:`DamagedRecord` for the first of ``record_sets`` whose shards are not
    the sizes its manifest says (one ``stat`` a shard), naming the shard, and the record
    that cannot be read where there is one; ``since``: when the set was still sound. Then
    :class:`yolo3.data.shard_check.BadRecord` (a ValueError: bad input, status 2) for the
    first record whose header TensorFlow must not read (headers only, 20 ms for the demo's
    record set: :func:`yolo3.data.records.check_framing`)."""
    from yolo3.data import records  # noqa: PLC0415 - see the module docstring

    for record_set in record_sets:
        if records.changed_shards(record_set):
            raise damaged_record(records.find_damage(record_set), record_set.directory, since=since)
    for record_set in record_sets:
        records.check_framing(record_set)


@contextlib.contextmanager
def undecodable_records_named(record_sets):
    """Turns the error an input pipeline stops with on a record that does not decode
    (garbage image bytes, a box array that is not 4 values a box) into
    :class:`yolo3.data.shard_check.BadRecord` naming the shard and the record: a ValueError,
    which the tools print as one line with status 2.

    TensorFlow's InvalidArgumentError names neither; decoding ``record_sets`` (record sets
    or their folders) in Python again finds the record
    (:func:`yolo3.data.records.find_undecodable`), on this error path only: the pipeline
    itself runs as before. An InvalidArgumentError from elsewhere, or one no record
    explains, is raised as it was.
    """
    import tensorflow as tf  # noqa: PLC0415 - see the module docstring

    try:
        yield
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as error:
        # An InvalidArgumentError of the input pipeline comes from an iterator's GetNext
        # (IteratorGetNext, MultiDeviceIteratorGetNext...), not from the model. A record
        # that is no protobuf at all gives a UnicodeDecodeError instead: TensorFlow quotes
        # its bytes in the error's message, which its Python side then fails to decode.
        if isinstance(error, tf.errors.InvalidArgumentError) and "GetNext" not in error.message:
            raise
        from yolo3.data import records  # noqa: PLC0415 - see the module docstring

        for record_set in record_sets:
            found = records.find_undecodable(record_set)
            if found is not None:
                raise records.BadRecord(*found) from error
        raise


def damaged_record(damage, records_dir, *, since="training started"):
    """:class:`DamagedRecord` for ``damage``, a ``(shard path, record index, problem)`` of
    :func:`yolo3.data.records.find_damage` (index None: the whole shard), in the record set
    ``records_dir``, which changed on disk ``since`` the moment named."""
    path, index, problem = damage
    where = path if index is None else f"{path} record {index}"
    return DamagedRecord(
        f"{where}: {problem}; the record set changed after {since} (yolo3 "
        f"preprocess --verify {records_dir} lists all damage): restore or preprocess "
        "it again, then run the same command to continue from the last backup"
    )
