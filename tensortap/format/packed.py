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
from tensortap.format.entries import INLINE_BYTES, PACKED_SPARSE, REDUCTIONS, is_packed

#: a layout description larger than this is damage
MAX_LAYOUT_BYTES = 256 << 20


class LayoutError(Exception):
    """A layout description that cannot be read: (data file offset, why)."""


class Layout:
    """A packed payload's layout: statistic j is reduction `codes[j]` of tensor `names[j]`, stored as `dtypes[j]`
    at byte `offsets[j]` of the payload; `groups`: per distinct dtype, (dtype, positions j, back to back)."""

    __slots__ = ("names", "codes", "dtypes", "dtype_strs", "widths", "offsets", "length", "groups", "tensors", "body",
                 "runs", "_present")

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
        #: the payload's runs (maximal runs of consecutive statistics of one dtype): (first, end) positions; a
        #: kind 4 entry's mask says which of them its payload holds (the others are all zero)
        cuts = (np.flatnonzero(np.diff(self.dtypes)) + 1).tolist()
        self.runs = list(zip([0, *cuts], [*cuts, len(names)], strict=True))
        self._present: dict[int, Present] = {}

    def present(self, mask: int) -> Present:
        """What a payload holding the runs of `mask` holds (LayoutError: a mask that does not fit the layout)."""
        got = self._present.get(mask)
        if got is None:
            if mask >> len(self.runs) or len(self.runs) > 32:
                raise LayoutError(f"a packed entry's run mask {mask:#x} does not fit its layout of "
                                  f"{len(self.runs)} runs")
            keep = np.zeros(len(self.names), dtype=bool)
            for r, (a, b) in enumerate(self.runs):
                keep[a:b] = bool(mask >> r & 1)
            pos = np.flatnonzero(keep)
            widths = self.widths[pos]
            offs = np.zeros(len(self.names), dtype=np.int64)  # (of the present statistics, in the short payload)
            offs[pos] = np.concatenate([[0], np.cumsum(widths)[:-1]]) if len(pos) else []
            byte_at = (self.offsets[pos][:, None] + np.arange(INLINE_BYTES)).reshape(-1)
            byte_at = byte_at[(np.arange(INLINE_BYTES) < widths[:, None]).reshape(-1)]
            groups = []
            for dt, at, _ in self.groups:
                sub = at[keep[at]]
                if len(sub):
                    groups.append((dt, sub, offs[sub], bool(np.all(np.diff(offs[sub]) == dt.itemsize))))
            got = self._present[mask] = Present(int(widths.sum()), byte_at, groups)
        return got

    @property
    def full_mask(self) -> int:
        return (1 << len(self.runs)) - 1

    def columns(self, rows: np.ndarray, mask: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per stored dtype: (positions j, values), values a (len(rows) × len(j)) array of that dtype, from the
        payloads `rows` (C-contiguous uint8, len(rows) × length): a strided view of `rows` where the statistics of
        the dtype lie back to back (the writer's order), else a copy. `mask`: the payloads hold only those runs
        (kind 4; `rows` is then len(rows) × present(mask).length), and only their statistics are given."""
        if mask is None:
            length, groups = self.length, [(dt, at, self.offsets[at], c) for dt, at, c in self.groups]
        else:
            p = self.present(mask)
            length, groups = p.length, p.groups
        out = []
        for dt, at, offs, contiguous in groups:
            w = dt.itemsize
            le = dt.newbyteorder("<")
            if contiguous and rows.flags.c_contiguous and rows.shape[1] == length:
                vals = np.ndarray((rows.shape[0], len(at)), dtype=le, buffer=rows, offset=int(offs[0]),
                                  strides=(length, w))
            else:
                block = rows[:, (offs[:, None] + np.arange(w)).reshape(-1)]
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


class Present:
    """A kind 4 payload of a layout: its `length`, where its bytes go in the full payload (`byte_at`), and per
    stored dtype (dtype, the positions present, their offsets in the payload, back to back?)."""

    __slots__ = ("length", "byte_at", "groups")

    def __init__(self, length: int, byte_at: np.ndarray, groups: list):
        self.length, self.byte_at, self.groups = length, byte_at, groups


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
    packed = is_packed(disk["kind"])
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


def payloads(sub: np.ndarray, lay: Layout, fetch: Callable[[int, int], bytes]) -> tuple[
        np.ndarray, list[tuple[int, int, str]]]:
    """The payloads of packed entries `sub` (all of layout `lay`) as rows of a byte matrix (`lay.length` bytes
    each, the runs a kind 4 entry leaves out zero), CRC-checked, and the damage met: (row, data file offset, why),
    those rows left zero. `fetch(offset, length)` reads the data file (FileNotFoundError: missing); the payloads of
    a block lie close together: one range."""
    length = lay.length
    rows = np.zeros((len(sub), length), dtype=np.uint8)
    bad: list[tuple[int, int, str]] = []
    sizes = np.full(len(sub), length, dtype=np.int64)
    scatter: dict[int, np.ndarray] = {}  # row -> where a kind 4 payload's bytes go
    for i in np.flatnonzero(sub["kind"] == PACKED_SPARSE).tolist():
        try:
            p = lay.present(int(sub["shape"][i]))
        except LayoutError as e:
            bad.append((i, int(sub["offset"][i]), str(e)))
            continue
        if int(sub["length"][i]) != p.length:
            bad.append((i, int(sub["offset"][i]), f"payload length {int(sub['length'][i])} does not fit its run mask "
                                                  f"({p.length} bytes)"))
            continue
        sizes[i], scatter[i] = p.length, p.byte_at
    skip = {i for i, _, _ in bad}

    def put(i: int, piece: np.ndarray) -> None:
        at = scatter.get(i)
        if at is None:
            rows[i] = piece
        else:
            rows[i, at] = piece

    inline = (sub["flags"] & codec.FLAG_INLINE) != 0
    if inline.any():
        raw = np.frombuffer(sub["inline"][inline].tobytes(), dtype=np.uint8).reshape(-1, INLINE_BYTES)
        for r, i in zip(raw, np.flatnonzero(inline).tolist(), strict=True):
            if i not in skip:
                put(i, r[:sizes[i]])
    out = np.asarray([i for i in np.flatnonzero(~inline).tolist() if i not in skip], dtype=np.int64)
    if not len(out):
        return rows, bad
    offs = sub["offset"][out].astype(np.int64)
    lo, hi = int(offs.min()), int((offs + sizes[out]).max())
    try:
        buf = np.frombuffer(fetch(lo, hi - lo), dtype=np.uint8)
    except FileNotFoundError:
        return rows, bad + [(int(i), int(o), "the data file is missing") for i, o in zip(out, offs, strict=True)]
    crcs = sub["crc"][out].tolist()
    crc_at = codec.crc32c_at
    for i, off, want in zip(out.tolist(), offs.tolist(), crcs, strict=True):
        a, n = off - lo, int(sizes[i])
        if a + n > len(buf):
            bad.append((i, off, f"payload truncated ({max(0, len(buf) - a)} of {n} bytes)"))
            continue
        piece = np.ascontiguousarray(buf[a:a + n])
        got = crc_at(piece.ctypes.data, n) if crc_at is not None else codec.crc32c(piece.tobytes())
        if got != want:
            bad.append((i, off, "payload checksum mismatch"))
            continue
        put(i, piece)
    return rows, bad


def signature(lay: Layout) -> Any:
    """What identifies a layout's content across chunks."""
    return lay.body
