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
import time
from typing import BinaryIO

import numpy as np

from tensortap.format import _proto, tfrecord

FILE_VERSION = "brain.Event:2"


def encode_histogram(
    vmin: float, vmax: float, num: float, vsum: float, sum_squares: float,
    bucket_limit: np.ndarray, bucket: np.ndarray,
) -> bytes:
    """A HistogramProto: bucket[i] counts the values in (bucket_limit[i-1], bucket_limit[i]]."""
    return (
        _proto.field_double(1, vmin)
        + _proto.field_double(2, vmax)
        + _proto.field_double(3, num)
        + _proto.field_double(4, vsum)
        + _proto.field_double(5, sum_squares)
        + _proto.field_bytes(6, np.asarray(bucket_limit, dtype="<f8").tobytes())  # packed repeated double
        + _proto.field_bytes(7, np.asarray(bucket, dtype="<f8").tobytes())
    )


def scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value with simple_value (a float32, as TensorBoard's scalars are)."""
    return _proto.encode_value(tag, simple_value=float(value))


def histogram_value(tag: str, histo: bytes) -> bytes:
    return _proto.encode_value(tag, histo=histo)


def event_record(step: int, values: list[bytes], wall_time: float | None = None) -> bytes:
    """One framed Event record (with payload CRC) holding a Summary of `values`."""
    ev = _proto.encode_event(time.time() if wall_time is None else wall_time, step, values)
    return tfrecord.encode_record(ev, checksum=True)


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
