"""Faults that end a run which had started well: a full disk, a record shard damaged under it.

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
    that cannot be read where there is one; ``since``: when the set was still sound."""
    from yolo3.data import records  # noqa: PLC0415 - see the module docstring

    for record_set in record_sets:
        if records.changed_shards(record_set):
            raise damaged_record(records.find_damage(record_set), record_set.directory, since=since)


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
