"""The framing of a TFRecord shard, checked in Python before TensorFlow reads it.

A TFRecord file is a run of records, each framed as::

    uint64  length of the data, little-endian
    uint32  masked CRC-32C of those 8 bytes
    bytes   the data, ``length`` of them
    uint32  masked CRC-32C of the data

TensorFlow's reader believes a length whose checksum matches and allocates that many bytes
before reading them: a header that claims 2**40 bytes ends the process with a segmentation
fault and nothing on standard error. :func:`scan_shard` reads only the headers, 12 bytes a
record, seeking over the data, and checks each length against what is left of the file and
against :data:`MAX_RECORD_BYTES`; a shard it passes holds no length TensorFlow cannot
allocate. The data's own checksum is left to TensorFlow's reader, which checks it as it
reads (a ``DataLossError``, named by :func:`yolo3.data.records.find_damage`): checking it
here, in Python, would read every byte of every shard.

A shard or record found unusable raises :class:`BadRecord`, a ValueError: the tools print
its one line and exit with status 2.
"""

import struct

from yolo3 import fileio

# A record holds one stored image: a raw 8192 x 8192 RGB image is 192 MiB, a 416 px JPEG
# about 50 kB. A longer length is damage, not data, whatever the file's size.
MAX_RECORD_BYTES = 256 << 20
HEADER_BYTES = 12  # the length and its checksum
FOOTER_BYTES = 4  # the data's checksum

CUT_SHORT = "cut short (the file ends inside it)"
CORRUPT = "corrupt (its checksum does not match: the file was overwritten)"


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli) of ``data`` (bytes), as TFRecord files use; pure Python, about a
    microsecond a byte: for headers and tests, not for images."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The checksum a TFRecord file stores for ``data``: :func:`crc32c` rotated right by 15
    bits plus a constant, so that a CRC of bytes holding CRCs is not trivially zero."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """``data`` framed as one TFRecord record (header, data, footer): what
    ``tf.io.TFRecordWriter.write`` appends for it."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def scan_shard(path):
    """Reads the record headers of the shard at ``path`` (local or remote).

    Returns:
        ``(records, problem)``: how many records are soundly framed from the start, and
        None when that is all of the file, else what is wrong with the next one (the
        record of index ``records``), in words.
    """
    records = 0
    with fileio.open_file(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        offset = 0
        while offset < size:
            f.seek(offset)
            header = f.read(HEADER_BYTES)
            if len(header) < HEADER_BYTES:
                return records, CUT_SHORT
            length, checksum = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != checksum:
                return records, CORRUPT
            if length > MAX_RECORD_BYTES:
                return records, (
                    f"its header claims {length} bytes, more than the {MAX_RECORD_BYTES} a "
                    "record may hold (the file was overwritten or is no record shard)"
                )
            offset += HEADER_BYTES + length + FOOTER_BYTES
            if offset > size:
                return records, CUT_SHORT
            records += 1
    return records, None


class BadRecord(ValueError):
    """A record of a shard that cannot be read or decoded: ``path``, ``index`` (None: the
    whole shard) and ``problem``; the message is one line saying what to do."""

    def __init__(self, path, index, problem):
        self.path, self.index, self.problem = str(path), index, problem
        where = self.path if index is None else f"{self.path} record {index}"
        folder = self.path.replace("\\", "/").rpartition("/")[0] or "."
        super().__init__(
            f"{where}: {problem}; the record set cannot be read as it is: restore it or "
            f"preprocess it again (yolo3 preprocess --verify {folder} lists every damaged "
            "record)"
        )


def check_shard(path):
    """The number of records in the shard at ``path`` once :func:`scan_shard` finds each
    soundly framed; :class:`BadRecord` naming the first that is not."""
    records, problem = scan_shard(path)
    if problem is not None:
        raise BadRecord(path, records, problem)
    return records
