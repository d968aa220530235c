"""TFRecord framing: both footers, corruption detection, smdebug's byte-level example (spec 2.1, 2.6)."""

from __future__ import annotations

import io
import os
import struct

import pytest

from tensortap.exceptions import CorruptData
from tensortap.format.tfrecord import (
    SMDEBUG_FOOTER,
    decode_record,
    encode_record,
    iter_records,
    masked_crc32c,
    write_record,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def test_masked_crc_constants():
    assert masked_crc32c(b"0x12345678") == SMDEBUG_FOOTER == 0x062DC0B3
    # spec 2.6: length 95 -> masked CRC bytes 50 3f 28 86
    assert struct.pack("<I", masked_crc32c(struct.pack("<Q", 95))) == bytes.fromhex("503f2886")


@pytest.mark.parametrize("checksum", [True, False])
def test_round_trip_both_footers(checksum):
    payloads = [b"", b"x", os.urandom(1000)]
    f = io.BytesIO()
    sizes = [write_record(f, p, checksum=checksum) for p in payloads]
    assert sizes == [len(p) + 16 for p in payloads]
    buf = f.getvalue()
    footer = struct.unpack_from("<I", buf, 12 + len(payloads[0]))[0]
    assert (footer == SMDEBUG_FOOTER) is (not checksum)
    recs = list(iter_records(buf))
    assert [p for _, p in recs] == payloads
    assert [o for o, _ in recs] == [0, sizes[0], sizes[0] + sizes[1]]


def test_bad_length_crc():
    rec = bytearray(encode_record(b"hello"))
    rec[9] ^= 0xFF
    with pytest.raises(CorruptData) as ei:
        decode_record(bytes(rec), 0, "some/file", 100)
    assert ei.value.path == "some/file" and ei.value.offset == 100
    assert "length" in ei.value.reason


def test_bad_footer_and_payload():
    rec = bytearray(encode_record(b"hello", checksum=True))
    rec[-1] ^= 0x01
    with pytest.raises(CorruptData, match="checksum"):
        decode_record(bytes(rec))
    rec = bytearray(encode_record(b"hello", checksum=True))
    rec[13] ^= 0x01  # payload byte: the real CRC no longer matches
    with pytest.raises(CorruptData, match="checksum"):
        decode_record(bytes(rec))


def test_truncated():
    rec = encode_record(b"hello world")
    with pytest.raises(CorruptData, match="truncated"):
        decode_record(rec[:-2], 0, "f")
    with pytest.raises(CorruptData, match="truncated"):
        decode_record(rec[:5], 0, "f")


def test_reads_real_smdebug_event_file():
    path = os.path.join(FIXTURES, "dtypes", "events", "000000000000", "000000000000_worker_0.tfevents")
    with open(path, "rb") as f:
        buf = f.read()
    recs = list(iter_records(buf, path))
    assert len(recs) > 10
    assert buf[-4:] == struct.pack("<I", SMDEBUG_FOOTER)
