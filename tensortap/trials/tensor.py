"""A Tensor of a trial: its steps, values, reductions and shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import (
    InvalidWorker,
    NoMoreData,
    ShapeUnavailableForStep,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailableForStep,
)
from tensortap.format.entries import NO_REDUCTION, RAW, REDUCTION, reduction_name
from tensortap.modes import ModeKeys
from tensortap.trials import args as _args
from tensortap.trials.state import StepState

if TYPE_CHECKING:
    from tensortap.trials.trial import Trial

_RAW_KEY = (RAW, NO_REDUCTION)


class Tensor:
    """One saved tensor name. Steps are mode steps when a mode is given, global steps for GLOBAL."""

    def __init__(self, name: str, trial: Trial):
        self.name = name
        self.trial = trial
        self._generation = -1
        self._entries = None
        self._parts: dict[tuple[int, int], np.ndarray] = {}

    @property
    def original_name(self) -> str:
        return self.name

    # --- entry access -----------------------------------------------------------------------

    def _load(self) -> np.ndarray:
        if self._generation != self.trial.generation:
            e = self.trial._entries_of(self.name)
            self._entries = e
            self._parts = {}
            if len(e):
                keys = e["kind"].astype(np.int32) * 256 + e["reduction"].astype(np.int32)
                bounds = np.flatnonzero(np.diff(keys)) + 1
                starts = np.concatenate([[0], bounds])
                ends = np.concatenate([bounds, [len(e)]])
                for s, t in zip(starts, ends, strict=True):
                    k = int(keys[s])
                    self._parts[(k // 256, k % 256)] = e[s:t]
            self._generation = self.trial.generation
        return self._entries

    def _part(self, key: tuple[int, int]) -> np.ndarray:
        self._load()
        p = self._parts.get(key)
        if p is None:
            from tensortap.format.entries import ENTRY_DTYPE

            return np.empty(0, dtype=ENTRY_DTYPE)
        return p

    def _refresh_if_stale(self) -> None:
        self.trial.maybe_refresh()

    def _global(self, step: int, mode: ModeKeys) -> int | None:
        g = self.trial._to_global(step, mode)
        if g is None:
            self._refresh_if_stale()
            g = self.trial._to_global(step, mode)
        return g

    def _rows_at(self, part: np.ndarray, g: int) -> np.ndarray:
        steps = part["step"]
        lo = np.searchsorted(steps, g, side="left")
        hi = np.searchsorted(steps, g, side="right")
        return part[lo:hi]

    def _pick_worker(self, rows: np.ndarray, worker: str | None, step: int) -> np.void:
        src = self.trial.source
        if worker is None:
            if len(rows) == 1:
                return rows[0]
            from tensortap.trials.trial import natural_key

            return min(rows, key=lambda r: natural_key(src.workers[int(r["worker"])]))
        names = [src.workers[int(w)] for w in rows["worker"]]
        if worker not in names:
            raise InvalidWorker(worker, names)
        return rows[names.index(worker)]

    def _locate(self, key: tuple[int, int], step: int, mode: ModeKeys, worker: str | None) -> np.void:
        g = self._global(step, mode)
        if g is not None:
            rows = self._rows_at(self._part(key), g)
            if len(rows) == 0 and not self.trial.is_step_complete(g):
                self.trial.refresh_data()
                rows = self._rows_at(self._part(key), g)
            if len(rows):
                return self._pick_worker(rows, worker, step)
        self._raise_missing(step, mode, g, key)
        raise AssertionError("unreachable")

    def _raise_missing(self, step: int, mode: ModeKeys, g: int | None, key: tuple[int, int]) -> None:
        has_reductions = False
        if g is not None and key == _RAW_KEY:
            self._load()
            has_reductions = any(
                k[0] == REDUCTION and len(self._rows_at(p, g)) for k, p in self._parts.items()
            )
        state = self.trial.has_passed_step(step, mode)
        if state == StepState.AVAILABLE:
            raise TensorUnavailableForStep(self.name, step, mode, has_reductions)
        if state == StepState.UNAVAILABLE:
            raise StepUnavailable(step, mode)
        if self.trial.loaded_all_steps:
            raise NoMoreData(step, mode, self.trial.steps(mode)[-1] if self.trial.steps(mode) else None)
        if g is not None:
            raise TensorUnavailableForStep(self.name, step, mode, has_reductions) if has_reductions else \
                StepNotYetAvailable(step, mode)
        raise StepNotYetAvailable(step, mode)

    # --- steps ------------------------------------------------------------------------------

    def steps(self, mode: ModeKeys | str = _modes.GLOBAL, show_incomplete_steps: bool = False, *,
              raw_only: bool = False) -> list[int]:
        """Steps (mode steps, or global steps for GLOBAL) at which anything of this tensor was saved (`raw_only`:
        its raw value, not only reductions or its shape)."""
        mode = _modes.parse_mode(mode)
        self._refresh_if_stale()
        e = self._part(_RAW_KEY) if raw_only else self._load()
        if mode != _modes.GLOBAL:
            e = e[e["mode"] == mode.value]
        if not len(e):
            return []
        if not show_incomplete_steps:
            e = e[self.trial._complete_mask(e["step"])]
        col = "step" if mode == _modes.GLOBAL else "mode_step"
        return np.unique(e[col]).tolist()

    def prev_steps(self, step: int, n: int | None = None, mode: ModeKeys | str = _modes.GLOBAL) -> list[int]:
        """Complete steps <= `step`, the last `n` of them."""
        step = _args.step(step)
        if n is not None:
            n = _args.step(n, "n")
        s = [x for x in self.steps(mode) if x <= step]
        return s if n is None else s[-n:] if n > 0 else []

    def workers(self, step_num: int, mode: ModeKeys | str = _modes.GLOBAL) -> list[str]:
        """Workers that saved this tensor at the step; TensorUnavailableForStep if none did (as smdebug)."""
        from tensortap.trials.trial import natural_key

        mode = _modes.parse_mode(mode)
        step_num = _args.step(step_num, "step_num")
        g = self._global(step_num, mode)
        ids = np.empty(0)
        if g is not None:
            e = self._load()
            ids = np.unique(e["worker"][e["step"] == g])
        if not len(ids):
            raise TensorUnavailableForStep(self.name, step_num, mode)
        return sorted((self.trial.source.workers[int(i)] for i in ids), key=natural_key)

    # --- values -----------------------------------------------------------------------------

    def value(self, step_num: int, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None) -> np.ndarray:
        """The raw value saved at `step_num` of `mode` (by `worker`, default the first worker)."""
        mode = _modes.parse_mode(mode)
        step_num, worker = _args.step(step_num, "step_num"), _args.worker(worker)
        if worker is None:
            placements = self._placements()
            if placements is not None:
                return self._assembled(step_num, mode, placements)
        row = self._locate(_RAW_KEY, step_num, mode, worker)
        return self.trial.source.read_values(row.reshape(1))[0]

    # --- sharded tensors (DTensor / FSDP2: docs/format.md §10) ------------------------------------

    def _placements(self) -> dict[str, dict[str, Any]] | None:
        """{worker: where its saved value lies in the full tensor} when workers saved shards of this tensor."""
        shards = getattr(self.trial.source, "shards", None)
        if not shards:
            return None
        out = {w: m[self.name] for w, m in shards.items() if self.name in m}
        return out or None

    def _shard_rows(self, key: tuple[int, int], step: int, mode: ModeKeys) -> tuple[np.ndarray, int | None]:
        g = self._global(step, mode)
        if g is None:
            return self._part(key)[:0], None
        rows = self._rows_at(self._part(key), g)
        if not self.trial.is_step_complete(g):
            self.trial.refresh_data()
            rows = self._rows_at(self._part(key), g)
        return rows, g

    def _assembled(self, step: int, mode: ModeKeys, placements: dict[str, dict[str, Any]]) -> np.ndarray:
        """The full tensor from the workers' shards at this step."""
        rows, g = self._shard_rows(_RAW_KEY, step, mode)
        src = self.trial.source
        rows = [r for r in rows if src.workers[int(r["worker"])] in placements]
        if not rows:
            self._raise_missing(step, mode, g, _RAW_KEY)
        values = src.read_values(np.array(rows))
        full: np.ndarray | None = None
        covered: np.ndarray | None = None
        for r, v in zip(rows, values, strict=True):
            meta = placements[src.workers[int(r["worker"])]]
            v = np.asarray(v)
            if full is None:
                full = np.zeros(meta["global_shape"], dtype=v.dtype)
                covered = np.zeros(meta["global_shape"], dtype=bool)
            where = tuple(slice(o, o + n) for o, n in zip(meta["offset"], v.shape, strict=True))
            if meta.get("partial"):
                full[where] += v
            else:
                full[where] = v
            covered[where] = True
        if not covered.all():
            have = sorted({src.workers[int(r["worker"])] for r in rows})
            raise TensorUnavailableForStep(self.name, step, mode) from ValueError(
                f"{self.name!r} is sharded and the shards of workers {have} do not cover it: save every worker's "
                "shards (include_workers='all')")
        return full

    def _merged_reduction(self, step: int, mode: ModeKeys, code: int,
                          placements: dict[str, dict[str, Any]]) -> Any:
        """A reduction of the full tensor merged from the reductions of its shards (None if they do not
        merge: a missing shard, a partial tensor, a reduction of no mergeable kind)."""
        name, _abs = reduction_name(code)
        rows, _g = self._shard_rows((REDUCTION, code), step, mode)
        src = self.trial.source
        metas = [placements.get(src.workers[int(r["worker"])]) for r in rows]
        if not len(rows) or any(m is None or m.get("partial") for m in metas):
            return None
        total = int(np.prod(metas[0]["global_shape"]))
        counts = [int(np.prod(m["local_shape"])) for m in metas]
        if sum(counts) != total or len({tuple(m["offset"]) for m in metas}) != len(metas):
            return None
        vals = [float(_scalar(v)) for v in src.read_values(np.array(rows))]
        if name in ("min",):
            return min(v for v, n in zip(vals, counts, strict=True) if n)
        if name in ("max",):
            return max(v for v, n in zip(vals, counts, strict=True) if n)
        if name in ("sum", "l1", "nonfinite", "zeros"):
            return sum(vals)
        if name == "l2":
            return float(np.sqrt(sum(v * v for v in vals)))
        if name == "l4":
            return float(sum(v ** 4 for v in vals) ** 0.25)
        if name == "mean":
            return sum(v * n for v, n in zip(vals, counts, strict=True)) / total
        if name == "prod":
            return float(np.prod(vals))
        return None

    def _series(self, key: tuple[int, int], mode: ModeKeys, worker: str | None) -> np.ndarray:
        part = self._part(key)
        if mode != _modes.GLOBAL:
            part = part[part["mode"] == mode.value]
        if not len(part):
            return part
        part = part[self.trial._complete_mask(part["step"])]
        src = self.trial.source
        if worker is not None:
            if worker not in src.workers:
                raise InvalidWorker(worker, src.workers)
            return part[part["worker"] == src.workers.index(worker)]
        # one row per step: the first worker (natural order) that wrote it
        from tensortap.trials.trial import natural_key

        order_names = sorted(range(len(src.workers)), key=lambda i: natural_key(src.workers[i]))
        rank = np.empty(len(src.workers), dtype=np.int64)
        rank[order_names] = np.arange(len(src.workers))
        order = np.lexsort((rank[part["worker"]], part["step"]))
        part = part[order]
        first = np.ones(len(part), dtype=bool)
        first[1:] = part["step"][1:] != part["step"][:-1]
        return part[first]

    def stacked(
        self, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None
    ) -> tuple[np.ndarray, np.ndarray | list[np.ndarray]]:
        """(steps, values) of every complete saved step: values stacked into one array when all
        share a shape and dtype, else a list. The bulk path: each chunk is read once."""
        mode = _modes.parse_mode(mode)
        self._refresh_if_stale()
        worker = _args.worker(worker)
        if worker is None and self._placements() is not None:
            full_steps = self.steps(mode)
            vals = [self.value(s, mode) for s in full_steps]
            try:
                return np.asarray(full_steps, dtype=np.int64), np.stack(vals) if vals else np.empty(0)
            except ValueError:
                return np.asarray(full_steps, dtype=np.int64), vals
        part = self._series(_RAW_KEY, mode, worker)
        steps = part["step" if mode == _modes.GLOBAL else "mode_step"]
        src = self.trial.source
        fast = getattr(src, "read_stacked", None)
        arr = fast(part) if fast is not None else None
        if arr is not None:
            return steps.copy(), arr
        vals = src.read_values(part)
        try:
            return steps.copy(), np.stack(vals) if vals else np.empty(0)
        except ValueError:
            return steps.copy(), vals

    def values(self, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None) -> dict[int, np.ndarray]:
        """{step: value} for every complete saved step."""
        steps, vals = self.stacked(mode, worker)
        return dict(zip(steps.tolist(), vals, strict=True))

    # --- reductions -------------------------------------------------------------------------

    def reduction_value(
        self,
        step_num: int,
        reduction_name: str,
        mode: ModeKeys | str = _modes.GLOBAL,
        worker: str | None = None,
        abs: bool = False,
    ) -> Any:
        """The saved reduction, else computed from the saved raw value, else TensorUnavailableForStep."""
        mode = _modes.parse_mode(mode)
        step_num, worker = _args.step(step_num, "step_num"), _args.worker(worker)
        code = _args.reduction(reduction_name, abs)
        key = (REDUCTION, code)
        placements = self._placements() if worker is None else None
        if placements is not None:
            try:
                raw = self._assembled(step_num, mode, placements)
            except TensorUnavailableForStep:
                merged = self._merged_reduction(step_num, mode, code, placements)
                if merged is None:
                    raise TensorUnavailableForStep(self.name, step_num, mode) from None
                return _scalar(merged)
            from tensortap.format.writer import compute_reduction

            base = reduction_name[: -len("_norm")] if reduction_name.endswith("_norm") else reduction_name
            return _scalar(compute_reduction(np.asarray(raw), base, abs))
        g = self._global(step_num, mode)
        if g is not None:
            rows = self._rows_at(self._part(key), g)
            if worker is not None and len(rows):  # another worker's saved reduction is not this one's
                src = self.trial.source
                rows = rows[[src.workers[int(w)] == worker for w in rows["worker"]]]
            if len(rows):
                row = self._pick_worker(rows, worker, step_num)
                return _scalar(self.trial.source.read_values(row.reshape(1))[0])
        try:
            raw = self.value(step_num, mode, worker)
        except TensorUnavailableForStep:
            raise TensorUnavailableForStep(self.name, step_num, mode) from None
        from tensortap.format.writer import compute_reduction

        base = reduction_name[: -len("_norm")] if reduction_name.endswith("_norm") else reduction_name
        return _scalar(compute_reduction(np.asarray(raw), base, abs))

    def reduction_values(
        self, step_num: int, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None
    ) -> dict[tuple[str, bool], Any]:
        """{(name, abs): value} of the reductions saved at this step."""
        mode = _modes.parse_mode(mode)
        step_num, worker = _args.step(step_num, "step_num"), _args.worker(worker)
        g = self._global(step_num, mode)
        out: dict[tuple[str, bool], Any] = {}
        if g is None:
            return out
        self._load()
        for (kind, code), part in self._parts.items():
            if kind != REDUCTION:
                continue
            rows = self._rows_at(part, g)
            if len(rows):
                row = self._pick_worker(rows, worker, step_num)
                out[reduction_name(code)] = _scalar(self.trial.source.read_values(row.reshape(1))[0])
        return out

    def reductions(
        self, reduction_name: str, abs: bool = False, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None
    ) -> dict[int, Any]:
        """{step: value} of one saved reduction over every complete step (bulk)."""
        mode = _modes.parse_mode(mode)
        self._refresh_if_stale()
        worker = _args.worker(worker)
        if worker is None and self._placements() is not None:
            out = {}
            for s in self.steps(mode):
                try:
                    out[s] = self.reduction_value(s, reduction_name, mode, abs=abs)
                except TensorUnavailableForStep:
                    pass
            return out
        part = self._series((REDUCTION, _args.reduction(reduction_name, abs)), mode, worker)
        steps = part["step" if mode == _modes.GLOBAL else "mode_step"].tolist()
        src = self.trial.source
        fast = getattr(src, "read_stacked_inline", None)
        arr = fast(part) if fast is not None else None
        vals = arr.reshape(len(part), -1)[:, 0] if arr is not None else [_scalar(v) for v in src.read_values(part)]
        return dict(zip(steps, [_scalar(v) for v in vals], strict=True))

    # --- shapes -----------------------------------------------------------------------------

    def shape(self, step_num: int, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None) -> tuple:
        """The saved shape (from the value, a reduction or a shape record), else ShapeUnavailableForStep."""
        mode = _modes.parse_mode(mode)
        step_num, worker = _args.step(step_num, "step_num"), _args.worker(worker)
        placements = self._placements() if worker is None else None
        if placements is not None and self.steps(mode) and step_num in self.steps(mode):
            return tuple(next(iter(placements.values()))["global_shape"])
        g = self._global(step_num, mode)
        if g is not None:
            e = self._load()
            rows = e[e["step"] == g]
            if len(rows):
                row = self._pick_worker(rows, worker, step_num)
                shp = self.trial.source.shapes[int(row["shape"])]
                if shp is not None:
                    return tuple(shp)
                try:
                    return tuple(self.value(step_num, mode, worker).shape)
                except TensorUnavailableForStep:
                    pass
        raise ShapeUnavailableForStep(self.name, step_num, mode)

    def shapes(self, mode: ModeKeys | str = _modes.GLOBAL, worker: str | None = None) -> dict[int, tuple]:
        """{step: shape} over every complete step."""
        return {s: self.shape(s, mode, worker) for s in self.steps(mode)}

    def __repr__(self) -> str:
        return f"<Tensor {self.name!r} of trial {self.trial.name!r}>"


def _scalar(v: Any) -> Any:
    """A saved reduction as a numpy scalar (reductions are stored 0-d or, by smdebug, with shape (1,))."""
    a = np.asarray(v)
    return a.reshape(-1)[0] if a.size == 1 else a
