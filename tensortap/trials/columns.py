"""A trial's data as long columns (numpy only): the one builder under `Trial.to_dataframe()`, `Trial.to_arrow()`,
`tensortap export`, `tensortap.dask` and `tensortap compare` (docs/export.md).

Rows come from the trial's entry table with vectorised numpy: scalar values stored inline in the index (every
scalar and reduction of a native store) are decoded by dtype group, never one by one. Only raw values that are
not scalars are read from the data files, once each, for their computed statistics and the tensors table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap.format.entries import ABS_FLAG, INLINE_CHUNK, RAW, REDUCTION, REDUCTIONS

logger = logging.getLogger("tensortap")

#: the `statistic` vocabulary: "value" (a scalar tensor's own saved value), then every reduction, then the
#: reductions of abs(tensor)
STATISTICS: tuple[str, ...] = ("value", *REDUCTIONS, *(f"abs_{r}" for r in REDUCTIONS))
_VALUE = 0
#: reduction code (with ABS_FLAG) -> index into STATISTICS
_STAT_OF_CODE = np.zeros(256, dtype=np.int16)
for _i in range(len(REDUCTIONS)):
    _STAT_OF_CODE[_i] = 1 + _i
    _STAT_OF_CODE[_i | ABS_FLAG] = 1 + len(REDUCTIONS) + _i
#: statistics computed from a raw value saved without reductions (what to_dataframe() always showed)
COMPUTED = ("l2", "min", "max", "mean", "nonfinite")
#: dtype kinds whose elements are exported as float64 (ml_dtypes floats are kind "V")
_NUMERIC = "biufV"
MODE_NAMES = {1: "TRAIN", 2: "EVAL", 3: "PREDICT", 4: "GLOBAL"}


@dataclass
class Scalars:
    """One row per (worker, step, tensor, statistic). Codes index into the tables beside them."""

    tensors: list[str]
    workers: list[str]
    tensor: np.ndarray  # int32 codes into tensors
    worker: np.ndarray  # int32 codes into workers
    mode: np.ndarray  # uint8 ModeKeys values
    step: np.ndarray  # int64 global steps
    mode_step: np.ndarray  # int64
    statistic: np.ndarray  # int16 codes into STATISTICS
    value: np.ndarray  # float64
    computed: np.ndarray  # bool: computed from the raw value at read time, not saved by the job
    wall_time: np.ndarray  # float64 UNIX seconds, NaN where unknown

    def __len__(self) -> int:
        return len(self.step)


@dataclass
class Tensors:
    """One row per saved raw value that is not a scalar."""

    tensors: list[str]
    workers: list[str]
    tensor: np.ndarray
    worker: np.ndarray
    mode: np.ndarray
    step: np.ndarray
    mode_step: np.ndarray
    wall_time: np.ndarray
    dtype: list[str] = field(default_factory=list)
    shape: list[tuple[int, ...]] = field(default_factory=list)
    #: the elements as float64 (C order), None where the value is larger than max_elements or not numeric
    values: list[np.ndarray | None] = field(default_factory=list)
    #: where a value not inlined lies in the native store: (url of the .dat, offset, length, crc32c), else None
    pointer: list[tuple[str, int, int, int] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.step)


def take(e: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """e[idx] for a packed structured array, moving rows as bytes (numpy's fancy indexing copies such rows field
    by field, many times slower)."""
    e = np.ascontiguousarray(e)
    return np.take(e.view(np.uint8).reshape(len(e), -1), idx, axis=0).view(e.dtype).reshape(-1)


class Extract:
    """The entries of a trial selected for export, and the tables built from them.

    `names`: tensor names (None: all); `mode`: a ModeKeys value to keep (None: all); `steps`: (after, upto]
    global steps to keep (None: all); `complete_only`: only steps the trial counts complete. `workers`: worker
    names to keep (None: all).
    """

    def __init__(self, trial: Any, names: Iterable[str] | None = None, mode: int | None = None,
                 steps: tuple[float, float] | None = None, complete_only: bool = False,
                 workers: Iterable[str] | None = None):
        from tensortap.format.entries import concat

        self.trial = trial
        self.source = src = trial.source
        # The trial's entries as they are, without its per-tensor sort (rows are ordered by tensor below): the
        # entries read since the last sort are joined to the sorted ones, which the trial's next sort keeps.
        if trial._chunks:
            trial._all, trial._chunks = concat([trial._all, *trial._chunks]), []
        e = trial._all
        keep = e["kind"] != 2  # shape-only entries carry no value
        if names is not None:
            ids = [trial._name_ids[n] for n in names if n in trial._name_ids]
            keep &= np.isin(e["name"], np.asarray(ids, dtype=np.uint32))
        if mode is not None:
            keep &= e["mode"] == mode
        if steps is not None:
            lo, hi = steps
            if lo > -np.inf:
                keep &= e["step"] > lo
            if hi < np.inf:
                keep &= e["step"] <= hi
        if complete_only:
            upto = trial.complete_upto()
            if upto != float("inf"):
                keep &= e["step"] <= upto
        if workers is not None:
            wids = [i for i, w in enumerate(src.workers) if w in set(workers)]
            keep &= np.isin(e["worker"], np.asarray(wids, dtype=np.uint16))
        self.entries = take(e, np.flatnonzero(keep)) if not keep.all() else e
        # stable tables: tensors sorted by name, workers in natural order
        from tensortap.trials.trial import natural_key

        present = np.flatnonzero(np.bincount(self.entries["name"], minlength=1))
        order = sorted(present.tolist(), key=lambda i: src.names[i])
        self.tensors = [src.names[i] for i in order]
        self._tensor_code = np.full(max(len(src.names), 1), -1, dtype=np.int32)
        self._tensor_code[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int32)
        wpresent = np.flatnonzero(np.bincount(self.entries["worker"], minlength=1)).tolist()
        worder = sorted(wpresent, key=lambda i: natural_key(src.workers[i]))
        self.workers = [src.workers[i] for i in worder]
        self._worker_code = np.full(max(len(src.workers), 1), -1, dtype=np.int32)
        self._worker_code[np.asarray(worder, dtype=np.int64)] = np.arange(len(worder), dtype=np.int32)
        self.skipped_unreadable = 0
        self._scalar_shape = np.array([sh in ((), (1,)) for sh in src.shapes] or [False], dtype=bool)
        self._known_shape = np.array([sh is not None and all(d >= 0 for d in sh) for sh in src.shapes] or [False],
                                     dtype=bool)
        self._wall = _wall_times(src)

    # --- shared pieces ----------------------------------------------------------------------

    def _codes(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The key columns of the entries at positions `idx`, taken field by field."""
        e = self.entries
        return {"tensor": self._tensor_code[e["name"][idx]], "worker": self._worker_code[e["worker"][idx]],
                "mode": e["mode"][idx], "step": e["step"][idx], "mode_step": e["mode_step"][idx]}

    def _wall_time(self, worker: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Wall times of rows of (worker id, global step)."""
        if self._wall is None or not len(step):
            return np.full(len(step), np.nan)
        if len(self._wall) == 1 and len(self.source.workers) == 1:  # one worker: no selection of its rows
            ((max_steps, times),) = self._wall.values()
            return _lookup(max_steps, times, step)
        out = np.full(len(step), np.nan)
        for wid, (max_steps, times) in self._wall.items():
            sel = np.nonzero(worker == wid)[0]
            if len(sel):
                out[sel] = _lookup(max_steps, times, step[sel])
        return out

    def _inline_scalars(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(float64 values, ok mask) of the inline one-element entries at `idx`, decoded by (dtype, length) group."""
        out = np.full(len(idx), np.nan)
        ok = np.zeros(len(idx), dtype=bool)
        if not len(idx):
            return out, ok
        e = self.entries
        raw = np.ascontiguousarray(e["inline"][idx]).view(np.uint8).reshape(len(idx), -1)
        key = e["dtype"][idx].astype(np.int64) * 64 + e["length"][idx].astype(np.int64)
        for k in np.unique(key).tolist():
            dt = self.source.dtypes[k // 64]
            n = k % 64
            if dt.kind not in _NUMERIC or dt.itemsize != n or n == 0:
                continue
            sel = np.nonzero(key == k)[0]
            block = np.ascontiguousarray(raw[sel, :n]).view(dt).reshape(-1)
            out[sel] = block.astype(np.float64)
            ok[sel] = True
        return out, ok

    # --- the scalars table ------------------------------------------------------------------

    def scalars(self, statistics: bool = True, reductions: bool = True,
                raw_values: dict[int, np.ndarray] | None = None) -> Scalars:
        """Scalar tensors' values, saved reductions and (with `statistics`) COMPUTED statistics of raw values
        that have no saved reduction at that step. `raw_values` (entry position -> value) may hand in raw
        values already read."""
        e = self.entries
        cache = raw_values if raw_values is not None else {}
        kind = e["kind"]
        inline = e["chunk"] == INLINE_CHUNK
        scalar_shape = self._scalar_shape[e["shape"]]
        is_red = kind == REDUCTION
        fast = ((kind == RAW) & scalar_shape | is_red) & inline
        if not reductions:
            fast &= ~is_red
        idx = np.nonzero(fast)[0]
        vals, ok = self._inline_scalars(idx)
        idx, vals = idx[ok], vals[ok]
        stat = np.where(is_red[idx], _STAT_OF_CODE[e["reduction"][idx]], _VALUE).astype(np.int16)
        parts = [(idx, stat, vals, np.zeros(len(idx), dtype=bool))]
        # Entries not decodable from the index: payloads in data files (smdebug event files), unknown shapes.
        slow = ~fast & ((kind == RAW) | (is_red if reductions else False))
        slow &= ~((kind == RAW) & self._known_shape[e["shape"]] & ~scalar_shape)  # known non-scalars: below
        sidx = np.nonzero(slow)[0]
        big: list[int] = []  # raw non-scalars found by reading (unknown shape)
        if len(sidx):
            got_i, got_s, got_v = [], [], []
            readable = self._readable(take(e, sidx))
            values = self._read(take(e, sidx[readable]))
            for i, v in zip(sidx[readable].tolist(), values, strict=True):
                a = np.asarray(v)
                if int(kind[i]) == RAW and a.size != 1:
                    big.append(i)
                    cache[i] = a
                    continue
                if a.dtype.kind not in _NUMERIC or a.size != 1:
                    continue
                got_i.append(i)
                got_s.append(_STAT_OF_CODE[int(e["reduction"][i])] if int(kind[i]) == REDUCTION else _VALUE)
                got_v.append(float(a.reshape(-1)[0].astype(np.float64)))
            parts.append((np.asarray(got_i, np.int64), np.asarray(got_s, np.int16), np.asarray(got_v, np.float64),
                          np.zeros(len(got_i), dtype=bool)))
        if statistics and reductions:
            parts.append(self._computed(cache, big))
        all_idx = np.concatenate([p[0] for p in parts])
        stat = np.concatenate([p[1] for p in parts])
        value = np.concatenate([p[2] for p in parts])
        computed = np.concatenate([p[3] for p in parts])
        cols = self._codes(all_idx)
        # rows by tensor name; within a tensor the entries' order (statistic, step, worker) is kept: a stable
        # sort of runs, near linear
        codes = cols["tensor"]
        # (a radix sort for up to 65,536 tensors: linear)
        order = np.argsort(codes.astype(np.uint16) if len(self.tensors) <= 1 << 16 else codes, kind="stable")
        return Scalars(self.tensors, self.workers, cols["tensor"][order], cols["worker"][order],
                       cols["mode"][order], cols["step"][order], cols["mode_step"][order], stat[order],
                       value[order], computed[order],
                       self._wall_time(e["worker"][all_idx][order], cols["step"][order]))

    def _readable(self, e: np.ndarray) -> np.ndarray:
        from tensortap.format.smdebug import NO_EVENT_FILE

        ok = e["chunk"] != NO_EVENT_FILE
        self.skipped_unreadable += int((~ok).sum())
        return ok

    def _read(self, e: np.ndarray) -> list[np.ndarray]:
        return self.source.read_values(e) if len(e) else []

    def _raw_nonscalar(self) -> np.ndarray:
        e = self.entries
        return np.nonzero((e["kind"] == RAW) & self._known_shape[e["shape"]] & ~self._scalar_shape[e["shape"]])[0]

    def _computed(self, raw_values: dict[int, np.ndarray] | None, extra: list[int]) -> tuple:
        """COMPUTED statistics of raw non-scalar values saved without any reduction at their step."""
        from tensortap.format.writer import compute_reduction

        e = self.entries
        idx = np.concatenate([self._raw_nonscalar(), np.asarray(extra, dtype=np.int64)])
        empty = (np.empty(0, np.int64), np.empty(0, np.int16), np.empty(0), np.empty(0, bool))
        if not len(idx):
            return empty
        red = take(e, np.flatnonzero(e["kind"] == REDUCTION))
        if len(red):
            reduced = np.isin(_key(take(e, idx)), _key(red))
            idx = idx[~reduced]
        if not len(idx):
            return empty
        values = self._values_of(idx, raw_values)
        out_i, out_s, out_v = [], [], []
        stat_codes = [STATISTICS.index(s) for s in COMPUTED]
        for i, v in zip(idx.tolist(), values, strict=True):
            if v is None:
                continue
            v = np.asarray(v)
            if v.dtype.kind not in _NUMERIC or v.size == 0:
                continue
            for s, code in zip(COMPUTED, stat_codes, strict=True):
                out_i.append(i)
                out_s.append(code)
                out_v.append(float(compute_reduction(v, s, False)))
        return (np.asarray(out_i, np.int64), np.asarray(out_s, np.int16), np.asarray(out_v, np.float64),
                np.ones(len(out_i), dtype=bool))

    def _values_of(self, idx: np.ndarray, cache: dict[int, np.ndarray] | None) -> list[np.ndarray | None]:
        """Raw values of entries at positions `idx`, from `cache` or read (and put in `cache`)."""
        e = self.entries
        out: list[np.ndarray | None] = [None] * len(idx)
        todo = [j for j, i in enumerate(idx.tolist()) if cache is None or i not in cache]
        for j, i in enumerate(idx.tolist()):
            if cache is not None and i in cache:
                out[j] = cache[i]
        if todo:
            sub_idx = idx[np.asarray(todo, dtype=np.int64)]
            readable = self._readable(take(e, sub_idx))
            vals = self._read(take(e, sub_idx[readable]))
            it = iter(vals)
            for j, ok in zip(todo, readable.tolist(), strict=True):
                if ok:
                    out[j] = next(it)
                    if cache is not None:
                        cache[int(idx[j])] = out[j]
        return out

    # --- the tensors table ------------------------------------------------------------------

    def tensors_table(self, max_elements: int = 4096, raw_values: dict[int, np.ndarray] | None = None) -> Tensors:
        """Raw values that are not scalars: elements inline up to `max_elements`, a pointer into the native
        store beyond (smdebug values are always inline: their records are not plain arrays)."""
        e = self.entries
        idx = self._raw_nonscalar()
        cache = raw_values if raw_values is not None else {}
        # raw values whose shape the index does not say (smdebug without shapes): read to know
        unknown = np.flatnonzero((e["kind"] == RAW) & ~self._known_shape[e["shape"]])
        unknown = np.asarray([i for i in unknown.tolist() if i not in cache], dtype=np.int64)
        for i, v in zip(unknown.tolist(), self._values_of(unknown, cache), strict=True):
            if v is None or np.asarray(v).size == 1:
                cache.pop(i, None)
        if cache:
            idx = np.union1d(idx, np.fromiter(cache, dtype=np.int64))
        sub = take(e, idx)
        cols = self._codes(idx)
        t = Tensors(self.tensors, self.workers, cols["tensor"], cols["worker"], cols["mode"], cols["step"],
                    cols["mode_step"], self._wall_time(sub["worker"], sub["step"]))
        src = self.source
        native_chunks = getattr(src, "_chunks", None)
        sizes = [int(np.prod(src.shapes[s])) if self._known_shape[s] else -1 for s in sub["shape"].tolist()]
        pointer_ok = native_chunks is not None
        inline = (sub["chunk"] == INLINE_CHUNK).tolist()
        want = [i for i, n, inl in zip(idx.tolist(), sizes, inline, strict=True)
                if inl or not (pointer_ok and n > max_elements)]
        values = dict(zip(want, self._values_of(np.asarray(want, dtype=np.int64), cache), strict=True))
        for i, ent in zip(idx.tolist(), sub, strict=True):
            v = values.get(i)
            ptr = None
            if pointer_ok and int(ent["chunk"]) != INLINE_CHUNK:
                c = native_chunks[int(ent["chunk"])]
                ptr = (src.storage.url.rstrip("/") + "/" + c.dat_key, int(ent["offset"]), int(ent["length"]),
                       int(ent["crc"]))
            if v is not None:
                a = np.asarray(v)
                t.dtype.append(a.dtype.name if a.dtype.kind == "V" else a.dtype.str)
                t.shape.append(tuple(a.shape))
                inline_only = ptr is None  # no pointer to give: the elements always
                t.values.append(a.reshape(-1).astype(np.float64) if a.dtype.kind in _NUMERIC and (
                    inline_only or a.size <= max_elements) else None)
            else:
                dt = src.dtypes[int(ent["dtype"])]
                t.dtype.append(dt.name if dt.kind == "V" else dt.str)
                t.shape.append(tuple(src.shapes[int(ent["shape"])]))
                t.values.append(None)
            t.pointer.append(ptr if t.values[-1] is None else None)
        return t


def _lookup(max_steps: np.ndarray, times: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The time of the first block whose (running) largest step is >= each step; NaN past the last block. Rows
    come in runs of one step: the search runs on the runs."""
    if not len(step):
        return np.empty(0)
    starts = np.flatnonzero(np.diff(step)) + 1
    firsts = np.concatenate([[0], starts])
    i = np.searchsorted(max_steps, step[firsts], side="left")
    t = np.append(times, np.nan)[i]
    return np.repeat(t, np.diff(np.append(firsts, len(step))))


def _key(e: np.ndarray) -> np.ndarray:
    """(name, worker, mode, step) of each entry as one comparable void value."""
    k = np.zeros(len(e), dtype=[("n", "<u4"), ("w", "<u2"), ("m", "u1"), ("s", "<i8")])
    k["n"], k["w"], k["m"], k["s"] = e["name"], e["worker"], e["mode"], e["step"]
    return k.view(f"V{k.dtype.itemsize}")


def _wall_times(src: Any) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """Per worker id: (largest global step of each index block so far, running max; the block's flush time),
    from a native store's block headers (NativeSource.block_times); None where the source has none."""
    bt = getattr(src, "block_times", None)
    if not bt:
        return None
    by: dict[int, list[tuple[int, float]]] = {}
    for wid, max_step, t in bt:
        by.setdefault(wid, []).append((max_step, t))
    out = {}
    for wid, rows in by.items():
        steps = np.maximum.accumulate(np.asarray([r[0] for r in rows], dtype=np.int64))
        out[wid] = (steps, np.asarray([r[1] for r in rows], dtype=np.float64))
    return out


def collections_of(trial: Any, tensors: list[str]) -> list[list[str]]:
    """For each tensor name, the sorted names of the trial's collections holding it (by name or regex)."""
    import re

    out: list[set[str]] = [set() for _ in tensors]
    for cname, info in trial.source.collections.items():
        pats = [re.compile(r) for r in info.include_regex]
        for i, n in enumerate(tensors):
            if n in info.tensor_names or any(p.search(n) for p in pats):
                out[i].add(cname)
    return [sorted(s) for s in out]
