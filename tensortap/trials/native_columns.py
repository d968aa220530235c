"""The scalars table (docs/export.md §2.1) of a byte range of one native index file, read straight from its
blocks into columns: no Trial, no entry table. Each needed field is taken from the 66-byte records in one
strided pass, already in its final type, and a value from the record's inline bytes by (dtype, length) group.

This is the whole-job read of a job of statistics and scalars (`tensortap.dask.read_jobs`' partitions): it
answers None where the range holds what needs a trial (raw values that are not scalars, whose statistics are
computed from the payloads; damage, which the trial reports; anything it does not know), and the caller reads
that range through a trial instead. Its rows equal the trial's (tests/dask).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tensortap.format import codec, layout, packed
from tensortap.format.entries import PACKED_SPARSE, RAW, REDUCTION, SHAPE, is_packed
from tensortap.trials.columns import _STAT_OF_CODE, _VALUE, Scalars

#: byte offsets of the fields of an index record (docs/format.md §3.2)
_OFFSETS = {name: DISK_OFF for name, (_, DISK_OFF) in codec.DISK_ENTRY_DTYPE.fields.items()}
_NUMERIC = "biufV"


def _field(disk: np.ndarray, name: str, dt: Any = None, extra: int = 0) -> np.ndarray:
    """A strided view of one field of the records (or, with `dt`, of `dt` at `extra` bytes into it)."""
    base = disk.dtype.fields[name][0]
    if not len(disk):
        return np.empty(0, dtype=dt or base)
    return np.ndarray(disk.shape, dtype=dt or base, buffer=disk, offset=_OFFSETS[name] + extra,
                      strides=disk.strides)


def block_ranges(storage: Any, key: str, entries_per_range: int) -> list[tuple[int, int]]:
    """(start, end) byte ranges of the index file `key`, each of whole blocks holding about `entries_per_range`
    values, found by reading the 16-byte head of each block (local files only: one small read per block); a block
    of few entries (≤ 4,096: packed statistics, docs/format.md §3.3) also has its entries read, each packed entry
    counted as the values of its payload (a value per 4 bytes at most). Where a head is damaged the rest of the
    file is one range (its reader meets the damage)."""
    size = storage.size(key) or 0
    out: list[tuple[int, int]] = []
    start = pos = 0
    count = 0
    head = codec.BLOCK_HEAD
    rec = codec.DISK_ENTRY_DTYPE.itemsize
    while pos + head.size <= size:
        magic, hlen, n, _ = head.unpack(storage.read_range(key, pos, head.size))
        end = pos + head.size + hlen + n * rec
        if magic != codec.BLOCK_MAGIC or hlen > codec.MAX_HEADER or n > codec.MAX_ENTRIES or end > size:
            break
        count += n
        if 0 < n <= 4096:
            disk = np.frombuffer(storage.read_range(key, pos + head.size + hlen, n * rec), dtype=codec.DISK_ENTRY_DTYPE)
            if len(disk) == n:
                pk = is_packed(disk["kind"])
                count += int(disk["length"][pk].astype(np.int64).sum()) // 4
        pos = end
        if count >= entries_per_range:
            out.append((start, pos))
            start, count = pos, 0
    if start < size:
        out.append((start, size))
    return out or [(0, size)]


def read_scalars(storage: Any, key: str, start: int = 0, end: int | None = None, *,
                 mode: int | None = None, names: Iterable[str] | None = None) -> Scalars | None:
    """The scalars rows (saved scalars and reductions, one per value) of the whole blocks in bytes
    [start, end) of index file `key`; None when they need a trial (see the module's doc)."""
    from tensortap.format.native import _malformed, _safe_dtype
    from tensortap.trials.trial import natural_key

    length = (storage.size(key) or 0) - start if end is None else end - start
    buf = storage.read_range(key, start, length) if start or end is not None else storage.read(key)
    dec = codec.decode_blocks(buf, start, storage.describe(key), final=True)
    if dec.damage or dec.used != len(buf):
        return None
    wanted = None if names is None else set(names)
    name_ids: dict[str, int] = {}
    name_list: list[str] = []
    worker_ids: dict[str, int] = {}
    worker_list: list[str] = []
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("name", "worker", "mode", "step", "mode_step", "stat",
                                                         "value", "wall")}
    block_steps: dict[int, list[tuple[int, float]]] = {}
    layouts: dict[int, tuple[packed.Layout, np.ndarray]] = {}  # by offset in the data file: layout, its name ids
    for header, disk, _ in dec.blocks:
        if _malformed(header, disk):
            return None
        if not len(disk):
            continue
        kind = _field(disk, "kind")
        if np.any(kind > PACKED_SPARSE):
            return None
        pk = is_packed(kind)
        if pk.any():
            got = _packed_rows(storage, key, header, disk[pk], mode, name_ids, name_list, layouts)
            if got is None:
                return None
            packed_parts, packed_steps = got, disk["step"][pk]
            disk = disk[~pk]
            kind = _field(disk, "kind")
        else:
            packed_parts = None
        keep = kind != SHAPE
        if mode is not None:
            keep &= _field(disk, "mode") == mode
        shapes = header.get("shapes", [])
        scalar_shape = np.array([list(s) in ([], [1]) for s in shapes] or [False], dtype=bool)
        is_raw = kind == RAW
        # a raw value that is not a scalar: its statistics are computed from the payload (the trial's work)
        if np.any(keep & is_raw & ~scalar_shape[_field(disk, "shape")]):
            return None
        if not np.all(_field(disk, "flags")[keep] & codec.FLAG_INLINE):
            return None
        worker = header.get("worker")
        if not isinstance(worker, str):
            return None
        wid = worker_ids.setdefault(worker, len(worker_list))
        if wid == len(worker_list):
            worker_list.append(worker)
        step_all = _field(disk, "step")
        if packed_parts is not None:
            step_all = np.concatenate([step_all, packed_steps])
        if not isinstance(header.get("time"), int | float):
            return None  # (a block without its flush time: the trial dates its values by a later block)
        blocks_of = block_steps.setdefault(wid, [])
        prev_max = max(blocks_of[-1][0], int(step_all.max())) if blocks_of else int(step_all.max())
        first_new = not blocks_of or int(step_all.min()) > blocks_of[-1][0]
        blocks_of.append((prev_max, float(header["time"])))

        def add(parts: tuple, wid: int = wid, first_new: bool = first_new, blocks_of: list = blocks_of) -> None:
            for c, a in zip(("name", "mode", "step", "mode_step", "stat", "value"), parts, strict=True):
                cols[c].append(a)
            cols["worker"].append(np.full(len(parts[0]), wid, dtype=np.int32))
            # wall time: the flush of the first block (of this worker, in file order) whose steps reach the row's
            # step; this block's own, unless an earlier block reached the step already
            if first_new:
                cols["wall"].append(np.full(len(parts[0]), blocks_of[-1][1]))
            else:
                upto = np.asarray([b[0] for b in blocks_of], dtype=np.int64)
                times = np.asarray([b[1] for b in blocks_of], dtype=np.float64)
                cols["wall"].append(times[np.searchsorted(upto, parts[2], side="left")])

        if packed_parts is not None:
            pn, pm, pst, pms, pstat, pv = packed_parts
            if wanted is not None:
                sel_p = np.isin(pn, np.asarray([i for n, i in name_ids.items() if n in wanted], dtype=np.int64))
                pn, pm, pst, pms, pstat, pv = pn[sel_p], pm[sel_p], pst[sel_p], pms[sel_p], pstat[sel_p], pv[sel_p]
            if len(pn):
                add((pn, pm, pst, pms, pstat, pv))
        if not len(disk):
            continue
        local = []
        for n in header["names"]:
            i = name_ids.get(n)
            if i is None:
                i = name_ids[n] = len(name_list)
                name_list.append(n)
            local.append(i)
        name = np.asarray(local, dtype=np.int64)[_field(disk, "name")]
        if wanted is not None:
            keep &= np.isin(name, np.asarray([i for n, i in name_ids.items() if n in wanted], dtype=np.int64))
        sel = None if keep.all() else np.flatnonzero(keep)

        def col(f: str, dt: Any = None, sel: Any = sel, disk: np.ndarray = disk) -> np.ndarray:
            a = _field(disk, f, dt)
            return np.ascontiguousarray(a) if sel is None else a[sel]

        n_rows = len(disk) if sel is None else len(sel)
        if not n_rows:
            continue
        value = np.full(n_rows, np.nan)
        ok = np.zeros(n_rows, dtype=bool)
        dts = header.get("dtypes") or []
        if len(dts) == 1 and np.all(_field(disk, "length") == _safe_dtype(dts[0]).itemsize):
            gkey = None  # one dtype, every value of its size: one group, no key per row
            groups = np.asarray([min(_safe_dtype(dts[0]).itemsize, 63)], dtype=np.int64)
        else:
            gkey = col("dtype").astype(np.int64) * 64 + np.minimum(col("length").astype(np.int64), 63)
            groups = np.unique(gkey)
        for g in groups.tolist():
            dt = _safe_dtype(header["dtypes"][g // 64]) if g // 64 < len(header["dtypes"]) else np.dtype("V1")
            if dt.kind not in _NUMERIC or dt.itemsize != g % 64 or dt.itemsize == 0:
                continue
            vals = _field(disk, "inline", dt)
            if len(groups) == 1:
                value = (np.asarray(vals) if sel is None else vals[sel]).astype(np.float64)
                ok[:] = True
            else:
                at = np.flatnonzero(gkey == g)
                src = at if sel is None else sel[at]
                value[at] = vals[src].astype(np.float64)
                ok[at] = True
        k = col("kind")
        stat = np.where(k == REDUCTION, _STAT_OF_CODE[col("reduction")], _VALUE).astype(np.int16)
        if not ok.all():
            keep_ok = np.flatnonzero(ok)
            name = name if sel is None else name[sel]
            parts = (name[keep_ok], col("mode")[keep_ok], col("step")[keep_ok], col("mode_step")[keep_ok],
                     stat[keep_ok], value[keep_ok])
        else:
            parts = (name if sel is None else name[sel], col("mode"), col("step"), col("mode_step"), stat, value)
        add(parts)
    if not cols["name"]:
        return Scalars([], [], *(np.empty(0, dt) for dt in (np.int32, np.int32, np.uint8, np.int64, np.int64,
                                                             np.int16, np.float64, bool, np.float64)))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    present = np.flatnonzero(np.bincount(c["name"], minlength=len(name_list)))
    tensors = sorted(present.tolist(), key=lambda i: name_list[i])
    code = np.full(len(name_list), -1, dtype=np.int32)
    code[np.asarray(tensors, dtype=np.int64)] = np.arange(len(tensors), dtype=np.int32)
    worder = sorted(range(len(worker_list)), key=lambda i: natural_key(worker_list[i]))
    wcode = np.empty(len(worker_list), dtype=np.int32)
    wcode[np.asarray(worder, dtype=np.int64)] = np.arange(len(worder), dtype=np.int32)
    tcol = code[c["name"]]
    order = np.argsort(tcol.astype(np.uint16) if len(tensors) <= 1 << 16 else tcol, kind="stable")
    wk = c["worker"][order]
    st = c["step"][order]
    wall = c["wall"][order]
    return Scalars([name_list[i] for i in tensors], [worker_list[i] for i in worder], tcol[order],
                   wcode[wk], c["mode"][order], st, c["mode_step"][order], c["stat"][order],
                   c["value"][order], np.zeros(len(order), dtype=bool), wall)


def _packed_rows(storage: Any, key: str, header: dict, disk: np.ndarray, mode: int | None, name_ids: dict[str, int],
                 name_list: list[str], layouts: dict) -> tuple[np.ndarray, ...] | None:
    """(name, mode, step, mode_step, stat, value) rows of a block's packed statistics (docs/format.md §3.3), read
    from the chunk's data file; None on damage (the trial reports it)."""
    p = layout.parse_chunk_key(key)
    if p is None:
        return None
    dat = layout.chunk_key(p[0], p[1], layout.DATA_SUFFIX)
    refs = packed.refs(header)
    if isinstance(refs, str):
        return None

    def fetch(offset: int, length: int) -> bytes:
        return storage.read_range(dat, offset, length)

    if mode is not None:
        disk = disk[disk["mode"] == mode]
    out: list[list[np.ndarray]] = [[] for _ in range(6)]
    lay_of = disk["name"].astype(np.int64)
    for lid in np.unique(lay_of).tolist():
        ref = refs[lid]
        got = layouts.get(ref[0])
        if got is None:
            try:
                lay = packed.read_layout(ref, fetch)
            except packed.LayoutError:
                return None
            ids = []
            for n in lay.names:
                i = name_ids.get(n)
                if i is None:
                    i = name_ids[n] = len(name_list)
                    name_list.append(n)
                ids.append(i)
            got = layouts[ref[0]] = (lay, np.asarray(ids, dtype=np.int64))
        lay, ids = got
        sub = disk[lay_of == lid]
        rows, bad = packed.payloads(sub, lay, fetch)
        if bad:
            return None
        k, n = len(sub), len(lay.names)
        value = np.empty((k, n), dtype=np.float64)
        for at, vals in lay.columns(rows):
            value[:, at] = vals
        out[0].append(np.tile(ids, k))
        for i, f in ((1, "mode"), (2, "step"), (3, "mode_step")):
            out[i].append(np.repeat(sub[f], n))
        out[4].append(np.tile(_STAT_OF_CODE[lay.codes], k).astype(np.int16))
        out[5].append(value.reshape(-1))
    if not out[0]:
        return tuple(np.empty(0, dt) for dt in (np.int64, np.uint8, np.int64, np.int64, np.int16, np.float64))
    return tuple(np.concatenate(x) for x in out)
