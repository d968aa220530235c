"""Pure encode/decode of tensor payloads and of native index blocks (see docs/format.md)."""

from __future__ import annotations

import json
import struct
from typing import Any

import google_crc32c
import numpy as np

from tensortap.exceptions import CorruptData, UnsupportedFormatVersion

FORMAT_VERSION = 1
BLOCK_MAGIC = b"TTB1"
BLOCK_HEAD = struct.Struct("<4sIII")  # magic, header_len, n_entries, crc32c(header + entries)
MAX_HEADER = 64 << 20
MAX_ENTRIES = 1 << 26

FLAG_INLINE = 1

# One index entry as stored in an .idx block. Ids (name, dtype, shape) point into the block's own tables.
DISK_ENTRY_DTYPE = np.dtype(
    [
        ("name", "<u4"),
        ("mode", "u1"),
        ("kind", "u1"),
        ("reduction", "u1"),
        ("flags", "u1"),
        ("dtype", "<u2"),
        ("shape", "<u4"),
        ("step", "<i8"),
        ("mode_step", "<i8"),
        ("offset", "<u8"),
        ("length", "<u8"),
        ("crc", "<u4"),
        ("inline", "V16"),
    ]
)


def crc32c(data: bytes | memoryview) -> int:
    return google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)


def _load_crc32c_at() -> Any:
    """`crc32c_at(address, length)`: CRC32C of raw memory through ctypes, which releases the GIL for the
    call (google_crc32c keeps it for buffers under 1 MiB, so the writer thread would stall the training
    thread while it checksums). None when google_crc32c's bundled libcrc32c cannot be found."""
    import ctypes
    import glob
    import os

    pkg = os.path.dirname(google_crc32c.__file__)
    for path in sorted(glob.glob(os.path.join(pkg + ".libs", "libcrc32c*.so*")) + glob.glob(
        os.path.join(pkg, "libcrc32c*.so*"))):
        try:
            fn = ctypes.CDLL(path).crc32c_value
        except (OSError, AttributeError):
            continue
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        fn.restype = ctypes.c_uint32
        probe = bytes(range(256)) * 5
        buf = ctypes.create_string_buffer(probe, len(probe))
        if fn(ctypes.addressof(buf), len(probe)) == google_crc32c.value(probe):
            return fn
    return None


try:
    crc32c_at = _load_crc32c_at()
except Exception:  # noqa: BLE001 - an odd build: the GIL-holding path still works
    crc32c_at = None


# --- dtypes -------------------------------------------------------------------------------------

def _ml_dtypes():
    try:
        import ml_dtypes  # optional: bfloat16 and friends
    except ImportError:
        return None
    return ml_dtypes


def dtype_to_str(dt: np.dtype) -> str:
    """A stable name for a payload dtype: numpy's `str` (`<f4`, `<U5`, `|b1`), or the ml_dtypes name."""
    if dt.kind == "V" and dt.names is None:
        return dt.name  # ml_dtypes extension types (bfloat16, float8_*) report kind 'V'
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    return dt.str


def dtype_from_str(s: str) -> np.dtype:
    if s[:1] in "<>|=":
        return np.dtype(s)
    mld = _ml_dtypes()
    if mld is None or not hasattr(mld, s):
        raise UnsupportedFormatVersion(f"dtype {s!r} needs the ml_dtypes package: pip install ml_dtypes")
    return np.dtype(getattr(mld, s))


def as_storable(value: Any) -> np.ndarray:
    """`value` as a C-contiguous little-endian numpy array that the format can store.

    Strings (str, bytes, object arrays of str) become numpy unicode/bytes arrays; dicts and other
    objects are refused (no pickle).
    """
    arr = np.asarray(value)
    if arr.dtype.kind == "O":
        flat = arr.ravel().tolist()
        if all(isinstance(x, str) for x in flat):
            arr = np.array(flat, dtype=str).reshape(arr.shape) if flat else np.zeros(arr.shape, dtype="<U1")
        elif all(isinstance(x, bytes) for x in flat):
            arr = np.array(flat, dtype=bytes).reshape(arr.shape) if flat else np.zeros(arr.shape, dtype="S1")
        else:
            raise TypeError(
                f"cannot store a value of type {type(value).__name__} with object dtype: "
                "only numeric, bool, complex and string arrays can be saved"
            )
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype.names is not None:
        raise TypeError("structured arrays cannot be saved: save each field as its own tensor")
    return arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)


def decode_payload(buf: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()


# --- index blocks ---------------------------------------------------------------------------------

def encode_block(header: dict[str, Any], entries: np.ndarray) -> bytes:
    """One framed index block: fixed head, JSON header (tables and job metadata), entry records."""
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    ebytes = entries.astype(DISK_ENTRY_DTYPE, copy=False).tobytes()
    crc = google_crc32c.value(hbytes + ebytes)
    return BLOCK_HEAD.pack(BLOCK_MAGIC, len(hbytes), len(entries), crc) + hbytes + ebytes


class TornBlock(Exception):
    """The bytes end inside a block: more may arrive."""


def decode_blocks(buf: bytes, base_offset: int, path: str) -> tuple[list[tuple[dict, np.ndarray]], int]:
    """Complete blocks in `buf` and the number of bytes they used.

    A block cut short by the end of `buf` (being written, or torn by a crash) ends decoding without
    error; it is consumed once complete. A block that is complete but fails its checksum raises
    CorruptData naming `path` and the block's offset.
    """
    blocks = []
    pos = 0
    n = len(buf)
    esize = DISK_ENTRY_DTYPE.itemsize
    while pos + BLOCK_HEAD.size <= n:
        magic, hlen, count, crc = BLOCK_HEAD.unpack_from(buf, pos)
        if magic != BLOCK_MAGIC:
            if magic[:2] == b"TT" and magic != BLOCK_MAGIC:
                raise UnsupportedFormatVersion(f"{path}: index block version {magic!r} is newer than this reader")
            raise CorruptData(path, base_offset + pos, f"bad block magic {magic!r}")
        if hlen > MAX_HEADER or count > MAX_ENTRIES:
            raise CorruptData(path, base_offset + pos, f"implausible block sizes ({hlen}, {count})")
        end = pos + BLOCK_HEAD.size + hlen + count * esize
        if end > n:
            break  # torn or still being written
        body = buf[pos + BLOCK_HEAD.size : end]
        if google_crc32c.value(body) != crc:
            if end == n:
                break  # the tail may still be landing; a complete block re-read later decides
            raise CorruptData(path, base_offset + pos, "index block checksum mismatch")
        header = json.loads(body[:hlen])
        entries = np.frombuffer(body[hlen:], dtype=DISK_ENTRY_DTYPE, count=count)
        blocks.append((header, entries))
        pos = end
    return blocks, pos
