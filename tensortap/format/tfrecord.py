"""TFRecord framing: `[u64 len][u32 masked_crc32c(len)][payload][u32 footer]`, little-endian.

The footer is the masked CRC32C of the payload (standard TFRecord, TensorBoard), or, in smdebug's tensor
event files, the constant SMDEBUG_FOOTER (smdebug does not checksum payloads, spec 2.1). Both are accepted
on read; a wrong length CRC or an unknown footer raises CorruptData.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c

from tensortap.exceptions import CorruptData

HEADER_BYTES = 12  # u64 length + u32 length crc
FRAMING_BYTES = 16  # header + u32 footer
_MASK_DELTA = 0xA282EAD8
# masked_crc32c(b"0x12345678"): what smdebug writes instead of a payload CRC in events/ files
SMDEBUG_FOOTER = 0x062DC0B3


def crc32c(data: bytes) -> int:
    return google_crc32c.value(bytes(data))


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's masked CRC32C."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def encode_record(payload: bytes, checksum: bool = True) -> bytes:
    """One framed record; `checksum=False` writes smdebug's constant footer instead of the payload CRC."""
    header = struct.pack("<Q", len(payload))
    footer = masked_crc32c(payload) if checksum else SMDEBUG_FOOTER
    return header + struct.pack("<I", masked_crc32c(header)) + bytes(payload) + struct.pack("<I", footer)


def write_record(f: BinaryIO, payload: bytes, checksum: bool = True) -> int:
    """Append one record to `f`; returns the bytes written."""
    rec = encode_record(payload, checksum)
    f.write(rec)
    return len(rec)


def decode_record(buf: bytes, pos: int = 0, path: str = "<buffer>", base_offset: int = 0) -> tuple[bytes, int]:
    """(payload, position after the record) of the record starting at `pos` in `buf`.

    `path` and `base_offset + pos` name the record in a CorruptData error.
    """
    where = base_offset + pos
    if len(buf) - pos < HEADER_BYTES:
        raise CorruptData(path, where, f"truncated record header ({len(buf) - pos} bytes)")
    header = bytes(buf[pos : pos + 8])
    (length,) = struct.unpack("<Q", header)
    (len_crc,) = struct.unpack_from("<I", buf, pos + 8)
    if masked_crc32c(header) != len_crc:
        raise CorruptData(path, where, "record length checksum mismatch")
    end = pos + HEADER_BYTES + length
    if end + 4 > len(buf):
        raise CorruptData(path, where, f"truncated record: {length} payload bytes announced")
    payload = bytes(buf[pos + HEADER_BYTES : end])
    (footer,) = struct.unpack_from("<I", buf, end)
    if footer != SMDEBUG_FOOTER and footer != masked_crc32c(payload):
        raise CorruptData(path, where, "record payload checksum mismatch")
    return payload, end + 4


def iter_records(buf: bytes, path: str = "<buffer>") -> Iterator[tuple[int, bytes]]:
    """(offset, payload) of every record of a whole file's bytes."""
    pos = 0
    while pos < len(buf):
        payload, nxt = decode_record(buf, pos, path)
        yield pos, payload
        pos = nxt
