"""TensorBoard event files: the encoding of scalar and histogram summaries, and an appending file writer.

The encoding uses the project's own protobuf wire codec (`tensortap.format._proto`) and TFRecord framing
(`tensortap.format.tfrecord`, CRC32C in C through google-crc32c) rather than tensorboardX: tensorboardX
needs the `protobuf` runtime and its generated classes (version conflicts between protobuf runtimes and
generated code are what broke smdebug's users), and it runs its own writer thread and queue, where here
the caller is already a writer thread or process. The messages involved (Event, Summary.Value,
HistogramProto) are a few fields each; TensorBoard's own reader checks them in tests/tensorboard.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from functools import lru_cache
from typing import BinaryIO

import numpy as np

from tensortap.format import _proto, tfrecord

FILE_VERSION = "brain.Event:2"


# Field keys (field number << 3 | wire type) of the messages written here, and one struct for the five
# doubles of a HistogramProto: the values of a step are encoded with a few concatenations, no per-field calls.
_HISTO_HEAD = struct.Struct("<BdBdBdBdBd")  # min=1, max=2, num=3, sum=4, sum_squares=5 (fixed64)
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_F32_MAX = float(np.finfo(np.float32).max)


def _varint(n: int) -> bytes:
    return bytes((n,)) if n < 0x80 else _proto.encode_varint(n)


def encode_histogram(
    vmin: float, vmax: float, num: float, vsum: float, sum_squares: float,
    bucket_limit: np.ndarray, bucket: np.ndarray,
) -> bytes:
    """A HistogramProto: bucket[i] counts the values in (bucket_limit[i-1], bucket_limit[i]]."""
    limits = np.asarray(bucket_limit, dtype="<f8").tobytes()  # packed repeated double
    counts = np.asarray(bucket, dtype="<f8").tobytes()
    return b"".join((
        _HISTO_HEAD.pack(0x09, vmin, 0x11, vmax, 0x19, num, 0x21, vsum, 0x29, sum_squares),
        b"\x32", _varint(len(limits)), limits, b"\x3a", _varint(len(counts)), counts,
    ))


@lru_cache(maxsize=1 << 16)
def _tag_field(tag: str) -> bytes:
    """Summary.Value's tag field (1)."""
    t = tag.encode("utf-8")
    return b"\x0a" + _varint(len(t)) + t


def _float32(value: float) -> bytes:
    try:
        return _F32.pack(value)
    except OverflowError:  # finite beyond float32's range: the float32 it rounds to, +-inf
        return _F32.pack(float("inf") if value > _F32_MAX else float("-inf"))


def scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value with simple_value (field 2, a float32, as TensorBoard's scalars are; values beyond
    float32's range become +-inf)."""
    return _tag_field(tag) + b"\x15" + _float32(float(value))


def histogram_value(tag: str, histo: bytes) -> bytes:
    """A Summary.Value with histo (field 5)."""
    return b"".join((_tag_field(tag), b"\x2a", _varint(len(histo)), histo))


def event_record(step: int, values: list[bytes], wall_time: float | None = None) -> bytes:
    """One framed Event record (with payload CRC): wall_time (1), step (2, omitted when 0), a Summary (5) of
    `values` (each a Summary.Value, field 1)."""
    parts = [b"\x09", _F64.pack(time.time() if wall_time is None else wall_time)]
    if step:
        parts += [b"\x10", _proto.encode_varint(step)]
    summary = b"".join([p for v in values for p in (b"\x0a", _varint(len(v)), v)])
    parts += [b"\x2a", _varint(len(summary)), summary]
    return tfrecord.encode_record(b"".join(parts), checksum=True)


def event_file_name(index: int = 0) -> str:
    """TensorBoard's naming: `events.out.tfevents.<seconds>.<host>.<pid>.<index>` (sorts by creation time)."""
    return f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{index}"


class EventFile:
    """One event file, created with its file_version record and appended to; `flush()` makes it readable."""

    def __init__(self, directory: str, index: int = 0):
        os.makedirs(directory, exist_ok=True)
        name = event_file_name(index)
        path = os.path.join(directory, name)
        while os.path.exists(path):  # another exporter of this process and second: next index
            index += 1
            path = os.path.join(directory, event_file_name(index))
        self.path = path
        self._f: BinaryIO = open(path, "ab")  # noqa: SIM115 - kept open for appending until close()
        version = _proto.encode_event(time.time(), 0, None, file_version=FILE_VERSION)
        self._f.write(tfrecord.encode_record(version, checksum=True))
        self.bytes_written = 0

    def write(self, record: bytes) -> None:
        self._f.write(record)
        self.bytes_written += len(record)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
