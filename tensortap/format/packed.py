"""Packed statistics entries (docs/format.md §3.3): the statistics of many tensors at one step in one payload, laid
out as a layout says; the layout's description is itself a payload of the chunk's data file (written once per
chunk), which block headers refer to in their `statistics` list.

Readers turn them into what they stand for: the native source expands each into one inline REDUCTION entry per
value (the entries a writer would have written one by one), so every reader of entries reads them unchanged;
`tensortap.trials.read_statistics` reads the payloads of many steps straight into one matrix per dtype
(`Layout.columns`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.format.entries import INLINE_BYTES, PACKED, REDUCTIONS

#: a layout description larger than this is damage
MAX_LAYOUT_BYTES = 256 << 20


class LayoutError(Exception):
    """A layout description that cannot be read: (data file offset, why)."""


class Layout:
    """A packed payload's layout: statistic j is reduction `codes[j]` of tensor `names[j]`, stored as `dtypes[j]`
    at byte `offsets[j]` of the payload; `groups`: per distinct dtype, (dtype, positions j, back to back)."""

    __slots__ = ("names", "codes", "dtypes", "dtype_strs", "widths", "offsets", "length", "groups", "tensors", "body")

    def __init__(self, body: bytes):
        self.body = body
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise LayoutError("the layout description is not JSON") from None
        if not isinstance(obj, dict):
            raise LayoutError("the layout description is not an object")
        names, codes, dts = obj.get("names"), obj.get("reductions"), obj.get("dtypes")
        if not (isinstance(names, list) and isinstance(codes, list) and isinstance(dts, list)
                and len(names) == len(codes) == len(dts) and names):
            raise LayoutError("the layout's lists are missing or differ in length")
        if not all(isinstance(n, str) for n in names) or not all(isinstance(d, str) for d in dts):
            raise LayoutError("a layout's name or dtype is not a string")
        if not all(isinstance(c, int) and 0 <= c <= 0xFF and (c & 0x7F) < len(REDUCTIONS) for c in codes):
            raise LayoutError("a layout's reduction code is unknown")
        self.names: list[str] = names
        self.codes = np.asarray(codes, dtype=np.uint8)
        uniq = sorted(set(dts))
        np_dtypes = {}
        for s in uniq:
            try:
                dt = codec.dtype_from_str(s)
            except Exception:  # noqa: BLE001 - an unknown dtype: the layout is unreadable
                raise LayoutError(f"a layout's dtype {s!r} is unknown") from None
            if dt.kind not in "biufV" or not 0 < dt.itemsize <= INLINE_BYTES:
                raise LayoutError(f"a layout's dtype {s!r} is not a number")
            np_dtypes[s] = dt
        self.dtype_strs = uniq
        self.dtypes = np.asarray([uniq.index(s) for s in dts], dtype=np.int64)  # into dtype_strs
        self.widths = np.asarray([np_dtypes[s].itemsize for s in dts], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(np.int64)
        self.length = int(self.widths.sum())
        self.tensors = len(set(names))
        self.groups: list[tuple[np.dtype, np.ndarray, bool]] = []
        for d, s in enumerate(uniq):
            at = np.flatnonzero(self.dtypes == d)
            w = np_dtypes[s].itemsize
            self.groups.append((np_dtypes[s], at, bool(np.all(np.diff(self.offsets[at]) == w))))

    def columns(self, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per stored dtype: (positions j, values), values a (len(rows) × len(j)) array of that dtype, from the
        payloads `rows` (C-contiguous uint8, len(rows) × length): a strided view of `rows` where the statistics of
        the dtype lie back to back (the writer's order), else a copy."""
        out = []
        for dt, at, contiguous in self.groups:
            w = dt.itemsize
            le = dt.newbyteorder("<")
            if contiguous and rows.flags.c_contiguous and rows.shape[1] == self.length:
                vals = np.ndarray((rows.shape[0], len(at)), dtype=le, buffer=rows, offset=int(self.offsets[at[0]]),
                                  strides=(self.length, w))
            else:
                block = rows[:, (self.offsets[at][:, None] + np.arange(w)).reshape(-1)]
                vals = np.ascontiguousarray(block).view(le)
            out.append((at, vals))
        return out

    def inline_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The values of payloads `rows` as (len(rows) × len(names) × 16) zero-padded inline bytes."""
        inl = np.zeros((len(rows), len(self.names), INLINE_BYTES), dtype=np.uint8)
        for w in np.unique(self.widths).tolist():
            js = np.flatnonzero(self.widths == w)
            cols = (self.offsets[js][:, None] + np.arange(w)).reshape(-1)
            inl[:, js, :w] = rows[:, cols].reshape(len(rows), len(js), w)
        return inl


def refs(header: dict) -> list[tuple[int, int, int]] | str:
    """The block's layout references [(offset, length, crc)], or why they are malformed."""
    objs = header.get("statistics", [])
    if not isinstance(objs, list):
        return "'statistics' is not a list"
    out = []
    for r in objs:
        if not (isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and x >= 0 for x in r)
                and 0 < r[1] <= MAX_LAYOUT_BYTES):
            return "a statistics layout reference is not [offset, length, crc]"
        out.append((r[0], r[1], r[2]))
    return out


def malformed(header: dict, disk: np.ndarray) -> str | None:
    """Why the block's packed entries cannot be read (None: they can, or there are none)."""
    packed = disk["kind"] == PACKED
    r = refs(header)
    if isinstance(r, str):
        return r
    if packed.any() and int(disk["name"][packed].max()) >= len(r):
        return "a packed entry's layout id is outside the block's statistics list"
    return None


def read_layout(ref: tuple[int, int, int], fetch: Callable[[int, int], bytes]) -> Layout:
    """The layout a reference names, read from the data file and CRC-checked (LayoutError: damage)."""
    off, n, want = ref
    try:
        body = bytes(fetch(off, n))
    except FileNotFoundError:
        raise LayoutError("the data file is missing") from None
    if len(body) != n:
        raise LayoutError(f"layout description truncated ({len(body)} of {n} bytes)")
    if codec.crc32c(body) != want:
        raise LayoutError("layout description checksum mismatch")
    return Layout(body)


def payloads(sub: np.ndarray, length: int, fetch: Callable[[int, int], bytes]) -> tuple[
        np.ndarray, list[tuple[int, int, str]]]:
    """The payloads of packed entries `sub` (all of one layout, `length` bytes each) as rows of a byte matrix,
    CRC-checked, and the damage met: (row, data file offset, why), those rows left zero. `fetch(offset, length)`
    reads the data file (FileNotFoundError: missing); the payloads of a block lie close together: one range."""
    rows = np.zeros((len(sub), length), dtype=np.uint8)
    bad: list[tuple[int, int, str]] = []
    inline = (sub["flags"] & codec.FLAG_INLINE) != 0
    if inline.any():
        raw = np.frombuffer(sub["inline"][inline].tobytes(), dtype=np.uint8).reshape(-1, INLINE_BYTES)
        rows[inline] = raw[:, :length]
    out = np.flatnonzero(~inline)
    if not len(out):
        return rows, bad
    offs = sub["offset"][out].astype(np.int64)
    lo, hi = int(offs.min()), int(offs.max()) + length
    try:
        buf = np.frombuffer(fetch(lo, hi - lo), dtype=np.uint8)
    except FileNotFoundError:
        return rows, [(int(i), int(o), "the data file is missing") for i, o in zip(out, offs, strict=True)]
    crcs = sub["crc"][out].tolist()
    crc_at = codec.crc32c_at
    for i, off, want in zip(out.tolist(), offs.tolist(), crcs, strict=True):
        a = off - lo
        if a + length > len(buf):
            bad.append((i, off, f"payload truncated ({max(0, len(buf) - a)} of {length} bytes)"))
            continue
        rows[i] = buf[a:a + length]
        got = crc_at(rows.ctypes.data + i * length, length) if crc_at is not None else codec.crc32c(
            rows[i].tobytes())
        if got != want:
            rows[i] = 0
            bad.append((i, off, "payload checksum mismatch"))
    return rows, bad


def signature(lay: Layout) -> Any:
    """What identifies a layout's content across chunks."""
    return lay.body
