"""File access that works for local paths and for every filesystem TensorFlow provides, and
atomic writes (:func:`atomic_write`, :func:`write_json`): a killed job never leaves a
half-written file under the final name.

Local paths use the standard library, so preprocessing worker processes never import
TensorFlow. A path with a scheme (``gs://bucket/...``, ``s3://``, ``hdfs://``) goes through
``tf.io.gfile``, imported only then.
"""

import contextlib
import errno
import glob as _glob
import json
import os
import shutil
import tempfile

# errno values of a write that found no room: the filesystem is full, or the user's quota.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_remote(path):
    """True for ``scheme://`` paths, which need ``tf.io.gfile``."""
    return "://" in os.fspath(path)


def _gfile():
    import tensorflow as tf  # deferred: local paths never pay for it

    return tf.io.gfile


def join(*parts):
    parts = [os.fspath(p) for p in parts]
    if is_remote(parts[0]):
        return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])
    return os.path.join(*parts)


def exists(path):
    path = os.fspath(path)
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def makedirs(path):
    path = os.fspath(path)
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def open_file(path, mode="rb"):
    """A file object for ``path``: built-in ``open`` locally, ``tf.io.gfile.GFile`` remotely."""
    path = os.fspath(path)
    if is_remote(path):
        return _gfile().GFile(path, mode)
    encoding = None if "b" in mode else "utf-8"
    return open(path, mode, encoding=encoding)


def read_bytes(path):
    with open_file(path, "rb") as f:
        return f.read()


def rename(source, target):
    """Renames ``source`` to ``target``, replacing it (atomic on local filesystems)."""
    source, target = os.fspath(source), os.fspath(target)
    if is_remote(source):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def remove(path):
    path = os.fspath(path)
    if is_remote(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path):
    path = os.fspath(path)
    if is_remote(path):
        _gfile().rmtree(path)
    else:
        shutil.rmtree(path)


def glob(pattern):
    pattern = os.fspath(pattern)
    return sorted(_gfile().glob(pattern) if is_remote(pattern) else _glob.glob(pattern))


def files_under(folder):
    """Every file below ``folder``, at any depth, sorted; hidden folders are not entered."""
    folder = os.fspath(folder)
    walk = _gfile().walk(folder) if is_remote(folder) else os.walk(folder)
    found = []
    for directory, subfolders, names in walk:
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found.extend(join(directory, name) for name in names)
    return sorted(found)


def atomic_path(path):
    """A temporary path beside ``path`` with the same suffix, for write-then-rename."""
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = ".weights.h5" if path.endswith(".weights.h5") else os.path.splitext(path)[1]
    fd, temp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    os.close(fd)
    os.remove(temp)
    return temp


def remove_temporaries(directory):
    """Deletes the ``.tmp-*`` files :func:`atomic_write` left in ``directory`` when a run was
    killed mid-write (a backup's is as large as the model and its optimizer state). Only for
    a folder no other process writes to while this one runs. Returns the names removed."""
    removed = []
    for path in _glob.glob(os.path.join(_glob.escape(os.fspath(directory)), ".tmp-*")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(os.path.basename(path))
    return sorted(removed)


@contextlib.contextmanager
def atomic_write(path):
    """Yields a temporary path to write; renames it over ``path`` only if the block succeeds.

    A run killed mid-write leaves a hidden ``.tmp-*`` file, never a half-written ``path``;
    a write that fails (a full disk) removes its temporary file, and its OSError names
    ``path``, not the temporary name (h5py's names neither, but in its message).
    """
    temp = atomic_path(path)
    try:
        yield temp
        os.replace(temp, path)
    except OSError as error:
        if error.errno in NO_SPACE_ERRNOS:
            raise OSError(error.errno, os.strerror(error.errno), os.fspath(path)) from error
        raise
    finally:
        if os.path.exists(temp):
            os.remove(temp)


def write_json(path, data, *, indent=2):
    """Writes ``data`` as JSON with a final newline, atomically (:func:`write_text`)."""
    write_text(path, json.dumps(data, indent=indent) + "\n")


def write_text(path, text):
    """Writes ``text`` to ``path`` atomically: locally through :func:`atomic_write`, on a
    remote filesystem as a temporary file renamed over ``path``."""
    if is_remote(path):
        temp = f"{path}.tmp"
        with open_file(temp, "w") as f:
            f.write(text)
        rename(temp, path)
        return
    with atomic_write(path) as temp, open(temp, "w", encoding="utf-8") as f:
        f.write(text)
