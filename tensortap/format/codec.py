"""Pure encode/decode of tensor payloads and of native index blocks (see docs/format.md)."""

from __future__ import annotations

import json
import struct
from typing import Any, NamedTuple

import google_crc32c
import numpy as np

from tensortap.exceptions import UnsupportedFormatVersion

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


# torch dtypes numpy lacks, stored bit-exact as the ml_dtypes type of the same name (as the PyTorch hook does)
_TORCH_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _torch_to_numpy(value: Any) -> np.ndarray:
    """A torch tensor (any device, with or without grad) as a host numpy array with the same bytes;
    torch is not imported here: a torch tensor means it is loaded already."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return np.asarray(value)
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name in _TORCH_ML_DTYPES:
        mld = _ml_dtypes()
        if mld is None or not hasattr(mld, name):
            return t.float().numpy()  # without ml_dtypes: float32, a readable approximation
        same_width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
        return t.view(same_width).numpy().view(getattr(mld, name))
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"cannot store a torch tensor of dtype {t.dtype}: {e}") from None


def as_storable(value: Any) -> np.ndarray:
    """`value` as a C-contiguous little-endian numpy array that the format can store.

    Strings (str, bytes, object arrays of str) become numpy unicode/bytes arrays; torch tensors keep their
    bytes (bfloat16 and float8 as ml_dtypes types); dicts, None and other objects are refused with a
    TypeError (no pickle).
    """
    arr = _torch_to_numpy(value) if type(value).__module__.startswith("torch") else np.asarray(value)
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


class BlockDamage(NamedTuple):
    """A damaged stretch of an index: `offset` (from the start of the buffer given to decode_blocks),
    `length` bytes skipped, why, and the block's JSON header where it could still be parsed (None
    otherwise): a reader may take the `end` mark from it, nothing else."""

    offset: int
    length: int
    reason: str
    header: dict | None = None


class DecodedBlocks(NamedTuple):
    blocks: list[tuple[dict, np.ndarray, int]]  # (header, entries, offset in the buffer)
    used: int  # bytes consumed: complete blocks and damage; a pending tail is left for later
    damage: list[BlockDamage]


def _head_at(buf: bytes, pos: int) -> tuple[bytes, int, int, int, int] | None:
    """(magic, header_len, count, crc, end) of a block head at `pos`; None if the sizes are implausible."""
    magic, hlen, count, crc = BLOCK_HEAD.unpack_from(buf, pos)
    if hlen > MAX_HEADER or count > MAX_ENTRIES:
        return None
    return magic, hlen, count, crc, pos + BLOCK_HEAD.size + hlen + count * DISK_ENTRY_DTYPE.itemsize


def _valid_at(buf: bytes, pos: int) -> bool:
    """A complete `TTB1` block with a matching checksum starts at `pos`."""
    if pos + BLOCK_HEAD.size > len(buf):
        return False
    h = _head_at(buf, pos)
    if h is None or h[0] != BLOCK_MAGIC or h[4] > len(buf):
        return False
    return google_crc32c.value(buf[pos + BLOCK_HEAD.size : h[4]]) == h[3]


def _resync(buf: bytes, start: int) -> tuple[int, bool]:
    """Where decoding continues after damage found before `start`: (position, is_valid_block).

    The first later `TTB1` that starts a complete block with a matching checksum; else the first later
    `TTB1` whose block runs past the end of `buf` (it may be a block still being written); else the end
    of `buf`, less a tail that is a prefix of the magic (the start of a block being written)."""
    first_open = -1
    pos = buf.find(BLOCK_MAGIC, start)
    while pos >= 0:
        if _valid_at(buf, pos):
            return pos, True
        if first_open < 0 and pos + BLOCK_HEAD.size <= len(buf):
            h = _head_at(buf, pos)
            if h is not None and h[4] > len(buf):
                first_open = pos
        elif first_open < 0 and pos + BLOCK_HEAD.size > len(buf):
            first_open = pos
        pos = buf.find(BLOCK_MAGIC, pos + 1)
    if first_open >= 0:
        return first_open, False
    n = len(buf)
    for k in range(min(len(BLOCK_MAGIC) - 1, n - start), 0, -1):
        if buf[n - k :] == BLOCK_MAGIC[:k]:
            return n - k, False
    return n, False


def _salvage_header(buf: bytes, pos: int, hlen: int) -> dict | None:
    body = buf[pos + BLOCK_HEAD.size : pos + BLOCK_HEAD.size + hlen]
    if len(body) < hlen:
        return None
    try:
        h = json.loads(body)
    except ValueError:
        return None
    return h if isinstance(h, dict) else None


def decode_blocks(buf: bytes, base_offset: int, path: str, final: bool = False) -> DecodedBlocks:
    """Complete blocks in `buf`, the bytes consumed, and the damage met (see docs/format.md §5.1).

    A damaged block (bad checksum, bad magic, implausible sizes, a header that is not a JSON object)
    costs that block only: it is reported and decoding resumes at the next valid block. A block cut
    short by the end of `buf` is pending (being written): decoding stops before it, unless `final`
    (no more bytes will come: a sealed object, or a chunk its writer has left), where it is damage.
    A block magic `TTB<n>` with n > 1 that is not a bit-flipped v1 block raises
    UnsupportedFormatVersion. `path` and `base_offset` only name things in errors.
    """
    blocks: list[tuple[dict, np.ndarray, int]] = []
    damage: list[BlockDamage] = []
    pos = 0
    n = len(buf)

    def damaged(at: int, reason: str, header: dict | None = None) -> int:
        nxt, _ = _resync(buf, at + 1)
        damage.append(BlockDamage(at, nxt - at, reason, header))
        return nxt

    while pos < n:
        if pos + BLOCK_HEAD.size > n:
            if final:
                damage.append(BlockDamage(pos, n - pos, f"truncated block ({n - pos} bytes of a block head)"))
                pos = n
            break
        h = _head_at(buf, pos)
        magic = buf[pos : pos + 4]
        if magic != BLOCK_MAGIC:
            newer = magic[:3] == b"TTB" and magic[3:4].isdigit() and magic[3:4] > b"1"
            if newer and not _valid_at(buf[:pos] + BLOCK_MAGIC + buf[pos + 4 :], pos):
                raise UnsupportedFormatVersion(
                    f"{path}: index block version {magic!r} at offset {base_offset + pos} is newer than this "
                    "reader: upgrade tensortap"
                )
            pos = damaged(pos, f"bad block magic {magic!r}")
            continue
        if h is None:
            hlen, count = BLOCK_HEAD.unpack_from(buf, pos)[1:3]
            pos = damaged(pos, f"implausible block sizes (header {hlen} bytes, {count} entries)")
            continue
        _, hlen, count, crc, end = h
        if end > n:
            nxt, valid = _resync(buf, pos + 1)
            if valid:  # a later block is whole: this one was cut short (a writer never appends after a torn block)
                damage.append(BlockDamage(pos, nxt - pos, f"truncated block ({n - pos} of {end - pos} bytes "
                                          "before the next block)"))
                pos = nxt
                continue
            if final:
                damage.append(BlockDamage(pos, n - pos, f"truncated block ({n - pos} of {end - pos} bytes)",
                                          _salvage_header(buf, pos, hlen)))
                pos = n
            break  # pending: being written, or torn by a crash
        body = buf[pos + BLOCK_HEAD.size : end]
        if google_crc32c.value(body) != crc:
            pos = damaged(pos, "index block checksum mismatch", _salvage_header(buf, pos, hlen))
            continue
        try:
            header = json.loads(body[:hlen])
        except ValueError as e:
            header = e
        if not isinstance(header, dict):
            pos = damaged(pos, f"block header is not a JSON object ({header})")
            continue
        entries = np.frombuffer(body, dtype=DISK_ENTRY_DTYPE, count=count, offset=hlen)
        blocks.append((header, entries, pos))
        pos = end
    return DecodedBlocks(blocks, pos, damage)
