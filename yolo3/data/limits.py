"""Bounds on what the files of a user's dataset may hold, and a line reader that keeps to them.

Annotation files, label files, list files and dataset descriptions come with a dataset from
elsewhere and are read as untrusted: a line of 200 MB, five million boxes on one image or a
coordinate of 1e300 ends as a counted, listed reject (or, in a file that describes the
whole dataset, one error line), never as a MemoryError or a traceback. The bounds:

- :data:`MAX_LINE_BYTES`, a line of an annotation or label file: room for a path of
  :data:`MAX_PATH_BYTES` and :data:`MAX_BOXES_PER_IMAGE` boxes of some 200 characters each.
  Longer lines are skipped unread (``line_too_long``), so memory stays near this size
  whatever the file holds.
- :data:`MAX_PATH_BYTES`, Linux's ``PATH_MAX``: no filesystem opens a longer path, so a
  longer line of a list file is skipped, and a longer image path rejected.
- :data:`MAX_BOXES_PER_IMAGE`: the densest public detection sets (SKU-110K, some 700 objects
  an image; DOTA's aerial scenes, a few thousand) fit; an image over it is skipped as a whole
  (``too_many_boxes``), as an image whose boxes were all rejected is: trained with only some
  of its objects marked, it would teach the model that the others are background.
- :data:`MAX_CLASSES`: class ids index the classes file; ImageNet-21k's 21,841 classes fit
  three times over.
- :data:`MAX_COORDINATE`: pixel coordinates beyond it are rejected; float32, which the
  records store boxes in, stops holding whole pixels there.

No TensorFlow here: preprocessing workers import this.
"""

import os

from yolo3 import fileio

MAX_LINE_BYTES = 2**21  # 2 MiB
MAX_PATH_BYTES = 4096
MAX_BOXES_PER_IMAGE = 10_000
MAX_CLASSES = 2**16
MAX_COORDINATE = float(2**24)
# What a message quotes of a line or token: enough to find it, never the whole of a huge one.
EXCERPT_CHARS = 120
# Lines are read in pieces of this size, so a line over the bound is skipped in bounded memory.
_CHUNK_BYTES = 2**16


def excerpt(text, limit=EXCERPT_CHARS):
    """``text`` (a str) as is when short, else its start and its length: for messages."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters)"


def read_lines(path, *, max_bytes=MAX_LINE_BYTES, universal=True):
    """The lines of a UTF-8 text file (local or any ``tf.io.gfile`` path), read as a stream.

    Args:
        path: the file.
        max_bytes: the longest line read; a longer one is skipped without being held in
            memory.
        universal: also break lines where :meth:`str.splitlines` does (``\\r``, ``\\v``,
            ``\\x1c``...), as the readers of label and list files always have; False breaks
            at ``\\n`` only, as the annotation line format does (``\\r`` is then stripped
            with the other whitespace). The bound applies to a line between two ``\\n``.

    Yields:
        ``(number, text, size)``: the 1-based line number, the line without its line break
        (the byte order mark at the start of the file dropped) or None for a line over
        ``max_bytes``, and the size in bytes of the ``\n``-separated line it came from.

    Raises:
        ValueError naming ``path:line`` when a line is not UTF-8 text.
    """
    path = os.fspath(path)
    number = 0
    for raw, size in _raw_lines(path, max_bytes):
        if raw is None:
            number += 1
            yield number, None, size
            continue
        try:
            text = raw.decode("utf-8-sig" if number == 0 else "utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path}:{number + 1}: not UTF-8 text ({err.reason} at byte {err.start} of "
                "the line)"
            ) from err
        # splitlines() breaks "\r\n" once and gives nothing for "", where the line is one.
        for part in (text.splitlines() or [""]) if universal else [text]:
            number += 1
            yield number, part, size


def _raw_lines(path, max_bytes):
    """``(bytes or None, size)`` of each ``\\n``-separated line, reading pieces of a file."""
    parts, held, skipped = [], 0, None  # the current line's pieces; its size while skipped
    with fileio.open_file(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            pieces = chunk.split(b"\n")
            for index, piece in enumerate(pieces):
                if skipped is not None:
                    skipped += len(piece)
                elif held + len(piece) > max_bytes:
                    skipped, parts, held = held + len(piece), [], 0
                else:
                    parts.append(piece)
                    held += len(piece)
                if index == len(pieces) - 1:
                    break  # the line goes on in the next chunk
                yield (None, skipped) if skipped is not None else (b"".join(parts), held)
                parts, held, skipped = [], 0, None
    if skipped is not None:
        yield None, skipped
    elif held:
        yield b"".join(parts), held


def read_small_file(path, max_bytes, what):
    """The bytes of a file that must be small (a dataset's description), read no further
    than ``max_bytes``; ValueError naming the file when it is larger."""
    path = os.fspath(path)
    with fileio.open_file(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(
            f"{path}: over {max_bytes} bytes, more than any {what} holds; is it the right file?"
        )
    return data


def is_inside(path, folders):
    """True when ``path`` lies in one of ``folders`` (or is one), comparing absolute paths
    without following links."""
    path = os.path.abspath(os.fspath(path))
    for folder in folders:
        folder = os.path.abspath(os.fspath(folder))
        if os.path.commonpath([path, folder]) == folder:
            return True
    return False
