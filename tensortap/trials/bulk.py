"""Bulk reads of a trial: many tensors' statistics or raw values over a set of steps in one pass over the trial's
entry table and one read of the payloads, where a loop over `trial.tensor(name)` pays its bookkeeping per tensor
(`Trial.statistics`, `Trial.values_of`).

The results are those of the per-tensor reads, bit for bit: a statistic at a step is the saved reduction when
one was saved at that step, else it is computed from the raw value as `Tensor.reduction_value` computes it
(`format.writer.compute_reduction`: row-wise here, with the same numpy reductions, and `dot` per row for the
L2 norm, which is what `np.linalg.norm` runs). Without a worker, each step's value is the first worker's (natural
order: worker_2 before worker_10) that saved it, as a Tensor's reads pick it. Only complete steps are read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import InvalidConfiguration, InvalidWorker, TensorUnavailable
from tensortap.format.entries import ENTRY_DTYPE, INLINE_CHUNK, RAW, REDUCTION, reduction_code
from tensortap.format.entries import concat as entries_concat

if TYPE_CHECKING:
    from tensortap.trials.trial import Trial

#: payload bytes of raw values read and reduced at a time (memory stays bounded however many are asked)
BATCH_BYTES = 64 << 20
#: statistics computed row-wise in one numpy call each (the others: `dot` or compute_reduction per row)
_NUMERIC = "biufV"
_STEP_BITS = 40


def _take(e: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """e[idx] moved as bytes (fancy indexing of a packed structured array copies field by field)."""
    e = np.ascontiguousarray(e)
    return np.take(e.view(np.uint8).reshape(len(e), -1), idx, axis=0).view(e.dtype).reshape(-1)


def _steps_arg(steps: Any) -> tuple[str, Any]:
    """("all", None), ("range", (lo, hi)): steps lo..hi inclusive, or ("set", sorted int64 array)."""
    if steps is None:
        return "all", None
    if isinstance(steps, range):
        if steps.step == 1:
            return "range", (steps.start, steps.stop - 1)
        steps = list(steps)
    if isinstance(steps, tuple) and len(steps) == 2 and all(x is None or isinstance(x, int | np.integer)
                                                              for x in steps):
        lo, hi = steps
        return "range", (-np.inf if lo is None else int(lo), np.inf if hi is None else int(hi))
    if isinstance(steps, str | bytes) or not isinstance(steps, Iterable):
        raise InvalidConfiguration(f"steps={steps!r} must be None, (first, last) steps, or a list of steps")
    arr = np.asarray(list(steps))
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0):
        raise InvalidConfiguration(f"steps={steps!r} must be non-negative ints")
    return "set", np.unique(arr.astype(np.int64))


class Selection:
    """The entries of `names` at the complete steps asked, one worker's per (tensor, kind, reduction, step)."""

    def __init__(self, trial: Trial, names: Iterable[str] | None, mode: Any, steps: Any, worker: str | None,
                 kinds: tuple[int, ...]):
        from tensortap.trials.trial import natural_key

        self.trial = trial
        self.mode = _modes.parse_mode(mode)
        if worker is not None and not isinstance(worker, str):
            raise InvalidConfiguration(f"worker={worker!r} must be a worker name (str) or None")
        how, arg = _steps_arg(steps)
        trial.maybe_refresh()
        trial._consolidate()
        src = trial.source
        if names is None:
            names = [src.names[i] for i in trial._groups]
        elif isinstance(names, str) or not isinstance(names, Iterable):
            raise InvalidConfiguration(f"names={names!r} must be a list of tensor names")
        self.names = list(dict.fromkeys(names))
        ids, parts = [], []
        for n in self.names:
            if not isinstance(n, str):
                raise InvalidConfiguration(f"names: {n!r} is not a tensor name (str)")
            nid = trial._name_ids.get(n)
            if nid is None or nid not in trial._groups:
                raise TensorUnavailable(n, [m for m in trial._all_names() if m.endswith("/" + n)][:5])
            ids.append(nid)
        # sharded tensors are assembled from their workers' shards: the per-tensor read does that
        shards = getattr(src, "shards", None) or {}
        sharded = {n for m in shards.values() for n in m} if worker is None else set()
        self.sharded = [n for n in self.names if n in sharded]
        for n, nid in zip(self.names, ids, strict=True):
            if n not in sharded:
                s, t = trial._groups[nid]
                parts.append(trial._all[s:t])
        e = entries_concat(parts) if parts else np.empty(0, dtype=ENTRY_DTYPE)
        kind = e["kind"]
        keep = np.zeros(len(e), dtype=bool)
        for k in kinds:
            keep |= kind == k
        if self.mode != _modes.GLOBAL:
            keep &= e["mode"] == self.mode.value
        keep &= trial._complete_mask(e["step"])
        col = e["step" if self.mode == _modes.GLOBAL else "mode_step"]
        if how == "range":
            keep &= (col >= arg[0]) & (col <= arg[1])
        elif how == "set":
            keep &= _member(col.astype(np.int64), arg)
        if worker is not None:
            if worker not in src.workers:
                raise InvalidWorker(worker, src.workers)
            keep &= e["worker"] == src.workers.index(worker)
        e = _take(e, np.flatnonzero(keep)) if not keep.all() else e
        if worker is None and len(e) and np.any(e["worker"] != e["worker"][0]):
            rank = np.empty(len(src.workers), dtype=np.int64)
            rank[sorted(range(len(src.workers)), key=lambda i: natural_key(src.workers[i]))] = np.arange(
                len(src.workers))
            order = np.lexsort((rank[e["worker"]], e["step"], e["reduction"], e["kind"], e["name"]))
            e = _take(e, order)
            first = np.ones(len(e), dtype=bool)
            same = ((e["name"][1:] == e["name"][:-1]) & (e["kind"][1:] == e["kind"][:-1])
                    & (e["reduction"][1:] == e["reduction"][:-1]) & (e["step"][1:] == e["step"][:-1]))
            first[1:] = ~same
            e = _take(e, np.flatnonzero(first)) if not first.all() else e
        elif len(e) > 1:  # one worker's: a value saved twice at a step (the flight recorder's ring) keeps the first
            same = ((e["name"][1:] == e["name"][:-1]) & (e["kind"][1:] == e["kind"][:-1])
                    & (e["reduction"][1:] == e["reduction"][:-1]) & (e["step"][1:] == e["step"][:-1])
                    & (e["worker"][1:] == e["worker"][:-1]))
            if same.any():
                e = _take(e, np.flatnonzero(np.concatenate([[True], ~same])))
        self.entries = e
        self.name_of = {nid: n for n, nid in zip(self.names, ids, strict=True)}
        self.step_col = "step" if self.mode == _modes.GLOBAL else "mode_step"

    def key(self, e: np.ndarray) -> np.ndarray:
        """(tensor, step) of each entry as one int64 (tensor id in the high bits)."""
        return (e["name"].astype(np.int64) << _STEP_BITS) | e["step"].astype(np.int64)


def _member(a: np.ndarray, b: np.ndarray, b_sorted: bool = False) -> np.ndarray:
    """np.isin(a, b) for int64 arrays, by a sort of b and a binary search (no hash table of a)."""
    if not len(b) or not len(a):
        return np.zeros(len(a), dtype=bool)
    if not b_sorted:
        b = np.sort(b)
    i = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return b[i] == a


def _inline_floats(source: Any, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, ok) of one-element entries: inline ones decoded by (dtype, length) group, the others
    read (smdebug's event files)."""
    out = np.full(len(e), np.nan)
    ok = np.zeros(len(e), dtype=bool)
    if not len(e):
        return out, ok
    inline = e["chunk"] == INLINE_CHUNK
    if inline.any():
        idx = np.flatnonzero(inline)
        raw = np.ascontiguousarray(e["inline"][idx]).view(np.uint8).reshape(len(idx), -1)
        key = e["dtype"][idx].astype(np.int64) * 64 + e["length"][idx].astype(np.int64)
        for k in np.unique(key).tolist():
            dt = source.dtypes[k // 64]
            n = k % 64
            if dt.kind not in _NUMERIC or dt.itemsize != n or n == 0:
                continue
            sel = np.flatnonzero(key == k)
            out[idx[sel]] = np.ascontiguousarray(raw[sel, :n]).view(dt).reshape(-1).astype(np.float64)
            ok[idx[sel]] = True
    rest = np.flatnonzero(~inline & ~ok)
    if len(rest):
        from tensortap.format.smdebug import NO_EVENT_FILE

        rest = rest[e["chunk"][rest] != NO_EVENT_FILE]
        for i, v in zip(rest.tolist(), source.read_values(_take(e, rest)) if len(rest) else [], strict=True):
            a = np.asarray(v)
            if a.size == 1 and a.dtype.kind in _NUMERIC:
                out[i] = float(a.reshape(-1)[0])
                ok[i] = True
    return out, ok


def rowwise(x: np.ndarray, name: str, abs_: bool = False) -> np.ndarray:
    """compute_reduction(row, name, abs_) of every row of the 2-D `x`, as float64, bit for bit: the same casts,
    and the same numpy reduction over each (contiguous) row."""
    from tensortap.format.writer import compute_reduction

    n = len(x)
    if name == "nonfinite":
        if x.dtype.kind in "fc" or x.dtype.kind == "V" or x.dtype == np.float16:
            f = x.astype(np.float32) if x.dtype.kind == "V" else x
            return (x.shape[1] - np.count_nonzero(np.isfinite(f), axis=1)).astype(np.float64)
        return np.zeros(n)
    if x.shape[1] == 0:  # (min and max of an empty row raise: the caller skips them)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing is NaN, as per tensor
            return np.array([float(compute_reduction(row, name, abs_)) for row in x], dtype=np.float64)
    v = np.abs(x) if abs_ else x
    if v.dtype.kind == "b" or v.dtype.kind in "iu" and name in ("mean", "std", "variance", "median", "l2"):
        v = v.astype(np.float64)
    elif v.dtype.kind == "V" or v.dtype == np.float16:
        v = v.astype(np.float32)
    v = np.ascontiguousarray(v)
    if name == "min":
        r = v.min(axis=1)
    elif name == "max":
        r = v.max(axis=1)
    elif name == "mean":
        r = v.mean(axis=1)
    elif name == "sum":
        r = v.sum(axis=1)
    elif name == "l2" and v.dtype.kind == "f":
        # np.linalg.norm(row, 2) of a 1-d float row is sqrt(row.dot(row)): the same BLAS call per row
        r = np.sqrt(np.fromiter((row.dot(row) for row in v), dtype=v.dtype, count=n))
    else:
        return np.array([float(compute_reduction(row, name, abs_)) for row in x], dtype=np.float64)
    return np.asarray(r).astype(np.float64)


def _gather(source: Any, e: np.ndarray) -> np.ndarray | None:
    """The payloads of raw entries of one dtype and shape as stacked rows, gathered from the mapped data files of
    a local native store in one numpy take per file and checked against their CRC32C; None where that does not
    apply (inline or mixed entries, object stores), or a payload does not check out (the per-entry read then
    raises CorruptData naming it)."""
    chunks, storage = getattr(source, "_chunks", None), getattr(source, "storage", None)
    if chunks is None or storage is None or not getattr(storage, "supports_append", False) or not len(e):
        return None
    n = int(e["length"][0])
    if n == 0 or np.any(e["chunk"] == INLINE_CHUNK) or not np.all(e["length"] == n):
        return None
    from tensortap.format import codec

    out = np.empty((len(e), n), dtype=np.uint8)
    chunk = e["chunk"]
    for cid in np.unique(chunk).tolist():
        at = np.flatnonzero(chunk == cid)
        mm = storage.mapped(chunks[cid].dat_key)
        if mm is None:
            return None
        buf = np.frombuffer(mm, dtype=np.uint8)
        offs = e["offset"][at].astype(np.int64)
        if int(offs.max()) + n > len(buf):
            return None
        out[at] = buf[offs[:, None] + np.arange(n, dtype=np.int64)]
        del buf
    crc_at = codec.crc32c_at
    want = e["crc"].tolist()
    if crc_at is not None:
        base = out.ctypes.data
        ok = all(crc_at(base + j * n, n) == w for j, w in enumerate(want))
    else:
        ok = all(codec.crc32c(row.tobytes()) == w for row, w in zip(out, want, strict=True))
    return out if ok else None


def _stacked(source: Any, e: np.ndarray) -> np.ndarray | None:
    """Entries of one tensor kind, dtype and shape as one stacked array (what the source's read_stacked gives,
    gathered at once where it can be), else None."""
    if not len(e) or not (np.all(e["dtype"] == e["dtype"][0]) and np.all(e["shape"] == e["shape"][0])
                          and np.all(e["kind"] == RAW)):
        return None
    rows = _gather(source, e)
    if rows is not None:
        shape = tuple(source.shapes[int(e["shape"][0])])
        return rows.view(source.dtypes[int(e["dtype"][0])]).reshape((len(e), *shape))
    fast = getattr(source, "read_stacked", None)
    return fast(e) if fast is not None else None


def _raw_batches(source: Any, e: np.ndarray) -> Iterable[tuple[np.ndarray, Any]]:
    """(positions in `e`, values) of raw entries, read in payload order in batches of one (dtype, shape):
    values a 2-D array (rows flattened) where they stack, else a list of arrays."""
    if not len(e):
        return
    order = np.lexsort((e["offset"], e["chunk"], e["shape"], e["dtype"]))
    key = e["dtype"][order].astype(np.int64) << 32 | e["shape"][order].astype(np.int64)
    bounds = np.flatnonzero(np.diff(key)) + 1
    for grp in np.split(order, bounds):
        size = max(int(e["length"][grp[0]]), 1)
        per = max(1, BATCH_BYTES // size)
        for a in range(0, len(grp), per):
            pos = grp[a:a + per]
            sub = _take(e, pos)
            arr = _stacked(source, sub)
            if arr is not None:
                yield pos, np.asarray(arr).reshape(len(pos), -1)
                continue
            from tensortap.format.smdebug import NO_EVENT_FILE

            ok = sub["chunk"] != NO_EVENT_FILE
            vals = source.read_values(_take(sub, np.flatnonzero(ok))) if ok.any() else []
            yield pos[ok], [np.asarray(v) for v in vals]


def statistics(trial: Trial, names: Iterable[str] | None = None,
               stats: Iterable[str] = ("l2", "min", "max", "nonfinite"), *, mode: Any = _modes.GLOBAL,
               worker: str | None = None, steps: Any = None) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{tensor: {statistic: (steps, float64 values)}} (see Trial.statistics)."""
    from tensortap.trials.tensor import _scalar

    if isinstance(stats, str) or not isinstance(stats, Iterable):
        raise InvalidConfiguration(f"stats={stats!r} must be a list of reduction names")
    stats = list(dict.fromkeys(stats))
    codes = {}
    for s in stats:
        if not isinstance(s, str):
            raise InvalidConfiguration(f"stats: {s!r} is not a reduction name")
        absolute = s.startswith("abs_")
        try:
            codes[s] = (reduction_code(s[4:] if absolute else s, absolute), absolute)
        except ValueError as err:
            raise InvalidConfiguration(str(err)) from None
    sel = Selection(trial, names, mode, steps, worker, (RAW, REDUCTION))
    e, src = sel.entries, trial.source
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {n: {} for n in sel.names}
    red = e["kind"] == REDUCTION
    raw = e[~red] if red.any() else e
    raw_key = sel.key(raw)
    saved: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # stat -> (entries, key, float64 values)
    saved_sorted: dict[str, np.ndarray] = {}
    need = np.zeros(len(raw), dtype=bool)
    for s, (code, _) in codes.items():
        r = e[red & (e["reduction"] == code)]
        vals, ok = _inline_floats(src, r)
        r, vals = (r[ok], vals[ok]) if not ok.all() else (r, vals)
        saved[s] = (r, sel.key(r), vals)
        saved_sorted[s] = np.sort(saved[s][1])
        need |= ~_member(raw_key, saved_sorted[s], True)
    # raw values whose step lacks a saved reduction asked for: read once, every missing statistic computed
    todo = raw[need] if not need.all() else raw
    todo_key = raw_key[need] if not need.all() else raw_key
    computed: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in stats}
    for pos, vals in _raw_batches(src, todo):
        k = todo_key[pos]
        for s, (_code, absolute) in codes.items():
            base = s[4:] if absolute else s
            miss = ~_member(k, saved_sorted[s], True)
            if not miss.any():
                continue
            if isinstance(vals, np.ndarray) and vals.dtype.kind in _NUMERIC:
                if vals.shape[1] == 0 and base in ("min", "max"):
                    continue  # no value (the per-tensor read raises)
                computed[s].append((k[miss], rowwise(vals[miss], base, absolute)))
            else:
                from tensortap.format.writer import compute_reduction

                ks, vs = [], []
                for kk, v, m in zip(k.tolist(), vals, miss.tolist(), strict=True):
                    if not m:
                        continue
                    try:  # (strings: what the per-tensor read gives, where it is a real number)
                        with np.errstate(all="ignore"), warnings.catch_warnings():
                            warnings.simplefilter("ignore", RuntimeWarning)
                            r = _scalar(compute_reduction(v, base, absolute))
                        if np.iscomplexobj(r):
                            continue  # a complex statistic is no float64
                        vs.append(float(r))
                    except (ValueError, TypeError):
                        continue
                    ks.append(kk)
                computed[s].append((np.asarray(ks, dtype=np.int64), np.asarray(vs, dtype=np.float64)))
    step_of = _step_lookup(e, sel.step_col)
    for s in stats:
        r, k, v = saved[s]
        keys = np.concatenate([k, *[c[0] for c in computed[s]]])
        vals = np.concatenate([v, *[c[1] for c in computed[s]]])
        if not len(keys):
            continue
        order = np.argsort(keys, kind="stable")
        keys, vals = keys[order], vals[order]
        nid = keys >> _STEP_BITS
        bounds = np.flatnonzero(np.diff(nid)) + 1
        for a, b in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(keys)]]).tolist(),
                        strict=True):
            name = sel.name_of[int(nid[a])]
            gsteps = keys[a:b] & ((1 << _STEP_BITS) - 1)
            out[name][s] = (step_of(int(nid[a]), gsteps), vals[a:b])
    for n in sel.sharded:  # assembled from shards, tensor by tensor
        t = trial.tensor(n)
        for s in stats:
            absolute = s.startswith("abs_")
            got = {}
            for st in _steps_arg_filter(t.steps(sel.mode), steps):
                try:
                    got[st] = float(t.reduction_value(st, s[4:] if absolute else s, sel.mode, abs=absolute))
                except Exception:  # noqa: BLE001 - the per-tensor read has no value at this step
                    continue
            if got:
                out[n][s] = (np.fromiter(got, dtype=np.int64, count=len(got)),
                             np.fromiter(got.values(), dtype=np.float64, count=len(got)))
    return out


def _step_lookup(e: np.ndarray, col: str) -> Any:
    """A function (tensor id, global steps) -> the steps to report (global, or the mode's own steps)."""
    if col == "step":
        return lambda nid, g: g
    g2m = dict(zip(e["step"].tolist(), e["mode_step"].tolist(), strict=False))

    def f(nid: int, g: np.ndarray) -> np.ndarray:
        return np.fromiter((g2m[x] for x in g.tolist()), dtype=np.int64, count=len(g))
    return f


def values(trial: Trial, names: Iterable[str] | None = None, *, mode: Any = _modes.GLOBAL,
           worker: str | None = None, steps: Any = None) -> dict[str, tuple[np.ndarray, Any]]:
    """{tensor: (steps, values)} of raw values (see Trial.values_of)."""
    sel = Selection(trial, names, mode, steps, worker, (RAW,))
    e, src = sel.entries, trial.source
    out: dict[str, tuple[np.ndarray, Any]] = {}
    nid = e["name"]
    bounds = np.flatnonzero(np.diff(nid)) + 1
    for a, b in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(e)]]).tolist(),
                    strict=True):
        if a == b:
            continue
        part = e[a:b]  # one tensor's entries, by step (as Tensor.stacked reads them)
        st = part[sel.step_col].copy()
        arr = _stacked(src, part)
        if arr is None:
            from tensortap.format.smdebug import NO_EVENT_FILE

            ok = part["chunk"] != NO_EVENT_FILE
            if not ok.all():
                part, st = part[ok], st[ok]
            vals = src.read_values(part)
            try:
                arr = np.stack(vals) if vals else np.empty(0)
            except ValueError:
                arr = vals
        out[sel.name_of[int(nid[a])]] = (st, arr)
    for n in sel.sharded:
        t = trial.tensor(n)
        want = _steps_arg_filter(t.steps(sel.mode), steps)
        vals = [t.value(s, sel.mode) for s in want]
        try:
            arr = np.stack(vals) if vals else np.empty(0)
        except ValueError:
            arr = vals
        out[n] = (np.asarray(want, dtype=np.int64), arr)
    return {n: out[n] for n in sel.names if n in out}


def _steps_arg_filter(steps: list[int], asked: Any) -> list[int]:
    how, arg = _steps_arg(asked)
    if how == "range":
        return [s for s in steps if arg[0] <= s <= arg[1]]
    if how == "set":
        keep = set(arg.tolist())
        return [s for s in steps if s in keep]
    return steps
