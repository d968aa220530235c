"""The whole-job read of saved statistics (`tensortap.trials.read_statistics`): every saved reduction of a job of
tensortap's store, straight from the index blocks and the packed payloads (docs/format.md §3.3) into one matrix
per layout and dtype, without a trial or an entry per value.

A packed payload holds a step's statistics of many tensors; the payloads of one layout are read, CRC-checked, into
the rows of one byte matrix (threads: the reads and checksums release the GIL) and viewed as numbers by column
slices, so the read costs the payload bytes (4 or 8 a value; nothing for a run of zeros the writer left out, kind
4) and their copy, not an index entry per value. The result holds the values `Trial.statistics(stats=...)` gives
for the saved statistics, bit for bit, each in the dtype it was saved as or in the dtype asked (tests/trials);
where the job holds what this read does not cover (damage, sharded tensors, an smdebug out_dir) it is read through
a trial.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import CorruptData, InvalidConfiguration, InvalidWorker, TensorUnavailable
from tensortap.format import codec, layout, packed
from tensortap.format.entries import INLINE_BYTES, PACKED_SPARSE, REDUCTION, is_packed, reduction_code, reduction_name

_THREADS = min(16, os.cpu_count() or 1)


def _stat_name(code: int) -> str:
    name, absolute = reduction_name(code)
    return ("abs_" if absolute else "") + name


class _Group:
    """The packed entries of one layout (same tensors, statistics and dtypes) over blocks and chunks."""

    def __init__(self, lay: packed.Layout, names: np.ndarray):
        self.layout, self.names = lay, names  # names: job-wide tensor ids of the layout's statistics
        self.key_names: list[str] = []  # data files
        self._key_ids: dict[str, int] = {}
        #: per block: (data file id, offsets, crcs, run masks (-1: all runs), the inline payloads or None)
        self.where: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
        self.worker: list[np.ndarray] = []
        self.mode: list[np.ndarray] = []
        self.step: list[np.ndarray] = []
        self.mode_step: list[np.ndarray] = []
        self.seq: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []  # payload bytes (-1 - bytes: inline)

    def add(self, dat_key: str, sub: np.ndarray, wid: int, seq: np.ndarray) -> None:
        """Packed entries `sub` of worker `wid`; `seq`: their order of writing (within a worker)."""
        self.seq.append(seq.astype(np.int64))
        k = self._key_ids.setdefault(dat_key, len(self.key_names))
        if k == len(self.key_names):
            self.key_names.append(dat_key)
        inline = (sub["flags"] & codec.FLAG_INLINE) != 0
        self.where.append((k, sub["offset"].astype(np.int64), sub["crc"].astype(np.int64),
                           np.where(sub["kind"] == PACKED_SPARSE, sub["shape"].astype(np.int64), -1),
                           np.frombuffer(sub["inline"].tobytes(), np.uint8).reshape(-1, INLINE_BYTES).copy()
                           if inline.any() else None))
        self.lengths.append(np.where(inline, -1 - sub["length"].astype(np.int64), sub["length"].astype(np.int64)))
        self.worker.append(np.full(len(sub), wid, dtype=np.int64))
        for f, lst in (("mode", self.mode), ("step", self.step), ("mode_step", self.mode_step)):
            lst.append(sub[f].astype(np.int64))

    def finish(self) -> None:
        """Per entry: its data file id, payload offset, CRC, run mask and inline payload (if any) as arrays."""
        self.keys = np.concatenate([np.full(len(w[1]), w[0], dtype=np.int64) for w in self.where])
        self.offsets = np.concatenate([w[1] for w in self.where])
        self.crcs = np.concatenate([w[2] for w in self.where])
        self.masks = np.concatenate([w[3] for w in self.where])
        self.masks[self.masks < 0] = self.layout.full_mask
        self.lengths_all = np.concatenate(self.lengths)
        self.inline = None
        if any(w[4] is not None for w in self.where):
            self.inline = np.concatenate([w[4] if w[4] is not None else np.zeros((len(w[1]), INLINE_BYTES), np.uint8)
                                          for w in self.where])


#: payload bytes read and turned into columns at a time (memory: the result and this)
SLICE_BYTES = 256 << 20


def _read_rows(storage: Any, g: _Group, rows_at: np.ndarray, length: int) -> np.ndarray:
    """Payloads `rows_at` of the group (positions over its entries), `length` bytes each, as the rows of one byte
    matrix, each CRC-checked (CorruptData naming the file and offset); read by threads (pread and the checksum
    release the GIL)."""
    rows = np.empty((len(rows_at), length), dtype=np.uint8)
    keys, offs, crcs = g.keys[rows_at], g.offsets[rows_at], g.crcs[rows_at]
    inline = g.inline[rows_at] if g.inline is not None else None
    crc_at = codec.crc32c_at
    base = rows.ctypes.data

    def work(lo: int, hi: int) -> None:
        for r in range(lo, hi):
            if inline is not None and g.lengths_all[rows_at[r]] < 0:
                rows[r] = inline[r, :length]
                continue
            key, off, want = g.key_names[keys[r]], int(offs[r]), int(crcs[r])
            try:
                got = storage.readinto(key, off, rows[r])
            except FileNotFoundError:
                raise CorruptData(storage.describe(key), off, "the data file is missing") from None
            if got != length:
                raise CorruptData(storage.describe(key), off, f"payload truncated ({got} of {length} bytes)")
            crc = crc_at(base + r * length, length) if crc_at is not None else codec.crc32c(rows[r].tobytes())
            if crc != want:
                raise CorruptData(storage.describe(key), off, "payload checksum mismatch")

    n = len(rows_at)
    step = max(64, n // (4 * _THREADS) + 1)
    tasks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
    if len(tasks) <= 1:
        for t in tasks:
            work(*t)
    else:
        with ThreadPoolExecutor(_THREADS) as pool:
            for f in [pool.submit(work, *t) for t in tasks]:
                f.result()
    return rows


def read_statistics(path: str, stats: Iterable[str] | None = None, *, names: Iterable[str] | None = None,
                    steps: Any = None, mode: Any = _modes.GLOBAL, worker: str | None = None,
                    dtype: Any = None) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{tensor: {statistic: (steps, values)}} of every reduction the job at `path` saved (or those named in
    `stats`: `l2`, `abs_mean`, ...; of the tensors in `names`; at the steps in `steps`: (first, last) inclusive, or
    a list), at its complete steps: the steps and values `Trial.statistics(names, stats, steps=...)` gives for
    them, bit for bit, read without a trial (docs/export.md). Statistics a trial computes from raw values are not
    included. `mode`: steps of that mode (its own step numbers); `worker`: that worker's values, else each step's
    first worker's (natural order). `dtype`: None (default) gives each statistic in the dtype it was saved as
    (float32 `l2`, int64 `nonfinite`; bfloat16 as float32): exact, and half the memory of float64 or less;
    `"float64"` (or another numpy dtype) casts to it, as `Trial.statistics` gives them."""
    from tensortap.storage import open_storage
    from tensortap.trials.bulk import _steps_arg
    from tensortap.trials.trial import natural_key

    mode = _modes.parse_mode(mode)
    codes: set[int] | None = None
    if stats is not None:
        if isinstance(stats, str) or not isinstance(stats, Iterable):
            raise InvalidConfiguration(f"stats={stats!r} must be a list of reduction names")
        stats = list(stats)
        codes = set()
        for s in stats:
            if not isinstance(s, str):
                raise InvalidConfiguration(f"stats: {s!r} is not a reduction name")
            absolute = s.startswith("abs_")
            try:
                codes.add(reduction_code(s[4:] if absolute else s, absolute))
            except ValueError as err:
                raise InvalidConfiguration(str(err)) from None
    wanted_names: list[str] | None = None
    if names is not None:
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise InvalidConfiguration(f"names={names!r} must be a list of tensor names")
        wanted_names = list(dict.fromkeys(names))
        for n in wanted_names:
            if not isinstance(n, str):
                raise InvalidConfiguration(f"names: {n!r} is not a tensor name (str)")
    how, step_arg = _steps_arg(steps)
    out_dtype = _result_dtype_arg(dtype)
    if worker is not None and not isinstance(worker, str):
        raise InvalidConfiguration(f"worker={worker!r} must be a worker name (str) or None")
    storage = open_storage(str(path))

    def by_trial() -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
        from tensortap.trials import create_trial

        t = create_trial(str(path))
        got = t.statistics(wanted_names, stats=_saved_names(t) if stats is None else list(stats), mode=mode,
                           worker=worker, steps=steps)
        saved = _saved_dtypes(t) if out_dtype is None else {}
        return {n: {s: (st, v.astype(out_dtype if out_dtype is not None else saved.get((n, s), v.dtype)))
                    for s, (st, v) in d.items()} for n, d in got.items() if d}

    keys = [k for k in storage.list(layout.ROOT + "/") if (p := layout.parse_chunk_key(k)) and p[2] == "idx"]
    if not keys:
        return by_trial()
    chunks = sorted((layout.parse_chunk_key(k)[:2], k) for k in keys)  # type: ignore[index]
    all_names: list[str] = []
    name_ids: dict[str, int] = {}
    workers: list[str] = []
    groups: dict[bytes, _Group] = {}  # by the layout's description
    by_ref: dict[tuple[str, int], _Group] = {}  # by (data file, offset) of a layout's description
    loose: list[tuple[np.ndarray, ...]] = []  # inline reductions: (name, code, worker, mode, step, mode_step, value)
    passed: dict[str, int] = {}
    ended: set[str] = set()
    block_no = 0
    num_workers = 1
    for (_, _seq), key in chunks:
        buf = storage.read(key)
        dec = codec.decode_blocks(buf, 0, storage.describe(key), final=False)
        if dec.damage:
            return by_trial()
        dat_key = key[: -len(layout.INDEX_SUFFIX)] + layout.DATA_SUFFIX
        for header, disk, _ in dec.blocks:
            from tensortap.format.native import _malformed

            block_no += 1
            if _malformed(header, disk) or (header.get("collections") or {}).get("_meta", {}).get("shards"):
                return by_trial()
            w = header.get("worker")
            if w not in workers:
                workers.append(w)
            wid = workers.index(w)
            if isinstance(header.get("num_workers"), int):
                num_workers = max(num_workers, header["num_workers"])
            if "passed" in header:
                passed[w] = max(passed.get(w, -1), int(header["passed"]["step"]))
            if header.get("end"):
                ended.add(w)
            if not len(disk):
                continue
            local = np.asarray([name_ids.setdefault(n, len(name_ids)) for n in header["names"]], dtype=np.int64)
            if len(name_ids) > len(all_names):
                all_names.extend(list(name_ids)[len(all_names):])
            kind = disk["kind"]
            pk = np.flatnonzero(is_packed(kind))
            if len(pk):
                refs = packed.refs(header)
                assert not isinstance(refs, str)
                lay_of = disk["name"][pk].astype(np.int64)
                for lid in np.unique(lay_of).tolist():
                    ref = refs[lid]
                    g = by_ref.get((dat_key, ref[0]))
                    if g is None:
                        try:
                            lay = packed.read_layout(ref, lambda o, n, k=dat_key: storage.read_range(k, o, n))
                        except packed.LayoutError:
                            return by_trial()  # (damage: the trial reports it)
                        g = groups.get(lay.body)
                        if g is None:
                            gnames = np.asarray([name_ids.setdefault(n, len(name_ids)) for n in lay.names],
                                                dtype=np.int64)
                            all_names.extend(list(name_ids)[len(all_names):])
                            g = groups[lay.body] = _Group(lay, gnames)
                        by_ref[(dat_key, ref[0])] = g
                    g.add(dat_key, disk[pk[lay_of == lid]], wid, (block_no << 32) + pk[lay_of == lid])
            red = np.flatnonzero(kind == REDUCTION)
            if len(red):
                sub = disk[red]
                if not np.all(sub["flags"] & codec.FLAG_INLINE):
                    return by_trial()
                dts = header["dtypes"]
                gkey = sub["dtype"].astype(np.int64) * 64 + np.minimum(sub["length"].astype(np.int64), 63)
                for gk in np.unique(gkey).tolist():
                    at = np.flatnonzero(gkey == gk)
                    dt = codec.dtype_from_str(dts[gk // 64])
                    if dt.kind not in "biufV" or dt.itemsize != gk % 64:
                        continue
                    raw = np.frombuffer(sub["inline"][at].tobytes(), dtype=np.uint8).reshape(-1, INLINE_BYTES)
                    vals = np.ascontiguousarray(raw[:, :dt.itemsize]).view(dt.newbyteorder("<")).reshape(-1)
                    vals = vals.astype(out_dtype if out_dtype is not None else _stored_result(dt))
                    s = sub[at]
                    loose.append(((block_no << 32) + red[at], local[s["name"]], s["reduction"].astype(np.int64),
                                  np.full(len(s), wid),
                                  s["mode"].astype(np.int64), s["step"].astype(np.int64),
                                  s["mode_step"].astype(np.int64), vals))
    if worker is not None and worker not in workers:
        raise InvalidWorker(worker, sorted(workers, key=natural_key))
    want_ids: np.ndarray | None = None
    if wanted_names is not None:
        for n in wanted_names:
            if n not in name_ids:
                raise TensorUnavailable(n, [m for m in all_names if m.endswith("/" + n)][:5])
        want_ids = np.asarray([name_ids[n] for n in wanted_names], dtype=np.int64)
    # complete steps (docs/format.md §9.1)
    if len(ended) == len(workers) and len(workers) >= num_workers:
        upto = np.inf
    elif len(workers) < num_workers:
        upto = -np.inf
    else:
        upto = min(np.inf if w in ended else passed.get(w, -1) for w in workers)
    rank = np.empty(len(workers), dtype=np.int64)
    rank[sorted(range(len(workers)), key=lambda i: natural_key(workers[i]))] = np.arange(len(workers))
    want_w = workers.index(worker) if worker is not None else None
    pieces: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}

    def keep_mask(w: np.ndarray, m: np.ndarray, st: np.ndarray, ms: np.ndarray) -> np.ndarray | None:
        keep = st <= upto
        if mode != _modes.GLOBAL:
            keep &= m == mode.value
        if want_w is not None:
            keep &= w == want_w
        col = st if mode == _modes.GLOBAL else ms
        if how == "range":
            keep &= (col >= step_arg[0]) & (col <= step_arg[1])
        elif how == "set":
            keep &= np.isin(col, step_arg)
        return None if keep.all() else keep

    for g in groups.values():
        w, m, st, ms, sq = (np.concatenate(x) for x in (g.worker, g.mode, g.step, g.mode_step, g.seq))
        keep = keep_mask(w, m, st, ms)
        lay = g.layout
        chosen = np.ones(len(lay.names), dtype=bool)
        if codes is not None:
            chosen &= np.isin(lay.codes, list(codes))
        if want_ids is not None:
            chosen &= np.isin(g.names, want_ids)
        if not chosen.any() or (keep is not None and not keep.any()):
            continue
        g.finish()
        at_rows = np.arange(len(w)) if keep is None else np.flatnonzero(keep)
        w, st, ms, sq = w[at_rows], st[at_rows], ms[at_rows], sq[at_rows]
        masks = g.masks[at_rows]
        steps_col = st if mode == _modes.GLOBAL else ms
        wr = rank[w]
        try:  # (a mask that does not fit the layout, a length that does not fit the mask: damage, the trial's)
            for mk in np.unique(masks).tolist():
                sizes = g.lengths_all[at_rows[masks == mk]]
                if np.any(np.where(sizes < 0, -1 - sizes, sizes) != lay.present(mk).length):
                    return by_trial()
        except packed.LayoutError:
            return by_trial()
        # per dtype: the chosen positions among its statistics, and their result matrix (zero: a run left out)
        slot = np.full(len(lay.names), -1, dtype=np.int64)  # statistic -> its row in its dtype's result
        group_of = np.empty(len(lay.names), dtype=np.int64)
        results = []
        for d, (dt, at, _) in enumerate(lay.groups):
            sel = at[chosen[at]]
            slot[sel] = np.arange(len(sel))
            group_of[at] = d
            rdt = out_dtype if out_dtype is not None else _stored_result(dt)
            results.append((sel, np.zeros((len(sel), len(at_rows)), dtype=rdt) if len(sel) else None))
        per = max(1, SLICE_BYTES // max(1, lay.length))
        for lo in range(0, len(at_rows), per):  # a slice of steps at a time: memory is the result's and a slice's
            slice_masks = masks[lo:lo + per]
            for mk in np.unique(slice_masks).tolist():
                r = np.flatnonzero(slice_masks == mk) if len(np.unique(slice_masks)) > 1 else np.arange(
                    len(slice_masks))
                p = lay.present(mk)
                if not p.length:
                    continue
                try:
                    rows = _read_rows(storage, g, at_rows[lo + r], p.length)
                except CorruptData:
                    return by_trial()  # (damage: the trial reports it, once, and reads the rest)
                # the rows' runs of consecutive steps (a mask changes rarely: a step with non-finite values)
                cuts = [0, *(np.flatnonzero(np.diff(r) != 1) + 1).tolist(), len(r)]
                for at, vals in lay.columns(rows, mk):
                    res = results[group_of[at[0]]][1]
                    k = slot[at]
                    c = np.flatnonzero(k >= 0)
                    if not len(c):
                        continue
                    v, kk = (vals, k) if len(c) == len(at) else (vals[:, c], k[c])
                    if kk[-1] - kk[0] + 1 == len(kk) and np.all(np.diff(kk) > 0) and len(cuts) <= 2 + len(r) // 16:
                        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                            _transpose(v[a:b], res[kk[0]:kk[-1] + 1, lo + r[a]:lo + r[b - 1] + 1])
                    else:
                        res[np.ix_(kk, lo + r)] = v.T
                del rows
        for sel, res in results:
            for j, row in zip(sel.tolist(), res if res is not None else (), strict=True):
                pieces.setdefault((int(g.names[j]), int(lay.codes[j])), []).append((st, steps_col, wr, row, sq))
    for sq, name, code, w, m, st, ms, vals in loose:
        keep = keep_mask(w, m, st, ms)
        if keep is not None:
            sq, name, code, w, st, ms, vals = sq[keep], name[keep], code[keep], w[keep], st[keep], ms[keep], vals[keep]
        c = np.ones(len(name), dtype=bool)
        if codes is not None:
            c &= np.isin(code, list(codes))
        if want_ids is not None:
            c &= np.isin(name, want_ids)
        if not c.all():
            sq, name, code, w, st, ms, vals = sq[c], name[c], code[c], w[c], st[c], ms[c], vals[c]
        if not len(name):
            continue
        steps_col = st if mode == _modes.GLOBAL else ms
        order = np.lexsort((code, name))
        key = name[order] * 256 + code[order]
        bounds = np.flatnonzero(np.diff(key)) + 1
        for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(key)], strict=True):
            o = order[a:b]
            pieces.setdefault((int(name[o[0]]), int(code[o[0]])), []).append(
                (st[o], steps_col[o], rank[w[o]], vals[o], sq[o]))
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    order_of = {n: i for i, n in enumerate(wanted_names)} if wanted_names is not None else None
    for (nid, code), parts in sorted(pieces.items(), key=lambda kv: order_of[all_names[kv[0][0]]]) if (
            order_of is not None) else pieces.items():
        if len(parts) == 1 and (len(parts[0][0]) < 2 or np.all(np.diff(parts[0][0]) > 0)):
            _, steps_col, _, vals, _ = parts[0]
        else:  # first worker (natural order) per step, first written per worker
            gs, steps_col, wr, vals, sq = (np.concatenate(x) for x in zip(*parts, strict=True))
            order = np.lexsort((sq, wr, gs))
            first = np.ones(len(order), dtype=bool)
            first[1:] = gs[order][1:] != gs[order][:-1]
            o = order[first]
            steps_col, vals = steps_col[o], vals[o]
        out.setdefault(all_names[nid], {})[_stat_name(code)] = (steps_col, vals)
    return out


def _result_dtype_arg(dtype: Any) -> np.dtype | None:
    """The dtype asked for the values (None: as saved); a clear error for anything that is not a numeric dtype."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "iuf":
        raise InvalidConfiguration(f"dtype={dtype!r} must be None (as saved) or a numeric numpy dtype such as "
                                   "'float64' or 'float32'")
    return dt


def _stored_result(dt: np.dtype) -> np.dtype:
    """The dtype a value saved as `dt` is given in when asked as saved: itself (native order), float32 for
    bfloat16 and other non-numpy floats."""
    return dt.newbyteorder("=") if dt.kind in "biuf" else np.dtype(np.float32)


def _saved_dtypes(trial: Any) -> dict[tuple[str, str], np.dtype]:
    """(tensor, statistic) -> the dtype its saved reductions have (promoted across entries)."""
    trial._consolidate()
    e = trial._all
    r = e[e["kind"] == REDUCTION]
    src = trial.source
    out: dict[tuple[str, str], np.dtype] = {}
    if not len(r):
        return out
    key = np.unique(np.stack([r["name"].astype(np.int64), r["reduction"].astype(np.int64),
                              r["dtype"].astype(np.int64)], axis=1), axis=0)
    for nid, code, did in key.tolist():
        k = (src.names[nid], _stat_name(code))
        dt = _stored_result(np.dtype(src.dtypes[did]))
        out[k] = np.result_type(out[k], dt) if k in out else dt
    return out


def _transpose(vals: np.ndarray, out: np.ndarray) -> None:
    """`out` (statistics × steps, float64) = `vals` (steps × statistics) transposed: in tiles that stay in cache,
    by threads (numpy's copy releases the GIL)."""
    n_steps, n = vals.shape
    tile = 256

    def work(lo: int) -> None:
        for j in range(0, n_steps, tile):
            out[lo:lo + tile, j:j + tile] = vals[j:j + tile, lo:lo + tile].T

    starts = range(0, n, tile)
    if len(starts) <= 1 or _THREADS == 1:
        for lo in starts:
            work(lo)
    else:
        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(work, starts))


def _saved_names(trial: Any) -> list[str]:
    """Every reduction name a trial's entries hold."""
    trial._consolidate()
    e = trial._all
    return sorted({_stat_name(c) for c in np.unique(e["reduction"][e["kind"] == REDUCTION]).tolist()})
