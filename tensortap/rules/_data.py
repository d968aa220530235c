"""Shared, per-trial cache the built-in rules read through.

A tensor's raw values are read once, in bulk (`Tensor.stacked`), the first time any rule asks for them;
statistics (abs mean, % zeros, ...) are then computed vectorised over all steps at once and looked up per
step. Every rule evaluating the same trial shares the cache, so N rules read each tensor once.

Live jobs: a step the cache has not seen is read point-wise (`Tensor.value`); once such misses outnumber a
quarter of the cached steps the bulk read is redone, so the total work stays linear in the job's length.
Tensors whose full series would exceed the memory budget are always read point-wise.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import (
    ShapeUnavailableForStep,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from tensortap.modes import ModeKeys

__all__ = ["Stat", "TrialData", "data_for", "MISSING"]

#: bytes one tensor's bulk-read series may take; larger tensors are read step by step
MAX_TENSOR_BYTES = int(os.environ.get("TENSORTAP_RULES_TENSOR_MB", "256")) << 20
#: bytes all bulk-read series of one trial may take together
MAX_TRIAL_BYTES = int(os.environ.get("TENSORTAP_RULES_CACHE_MB", "2048")) << 20

MISSING = object()


@dataclass(frozen=True)
class Stat:
    """A per-step statistic of one tensor.

    `fn(rows)` maps values stacked along axis 0 (one row per step, in step order) to one value per row.
    With `window` > 1, row i may use rows i-window+1..i; rows without that much history give None.
    `mode` restricts the rows (and so the windows) to steps of that mode. `reduction=(name, abs)` uses
    that saved reduction when the job saved it (window 1 only), else `fn` on the raw values.
    """

    key: str
    fn: Callable[[np.ndarray], np.ndarray]
    window: int = 1
    mode: ModeKeys | None = None
    reduction: tuple[str, bool] | None = None


class _Series:
    __slots__ = ("steps", "pos", "values", "upto", "generation", "stats", "misses", "nbytes", "by_mode", "any_steps")

    def __init__(self) -> None:
        self.steps: np.ndarray = np.empty(0, dtype=np.int64)
        self.pos: dict[int, int] = {}
        self.values: Any = None  # ndarray (N, ...) or list of arrays, None when read point-wise
        self.upto: float = -1
        self.generation = -1
        self.stats: dict[str, dict[int, Any]] = {}
        self.misses = 0
        self.nbytes = 0
        self.by_mode: dict[Any, np.ndarray] = {}
        self.any_steps: set[int] = set()


class TrialData:
    """Bulk-read values and statistics of one trial's tensors (see the module docstring)."""

    def __init__(self, trial: Any):
        self._trial = weakref.ref(trial)
        self._series: dict[str, _Series] = {}
        self._names: dict[tuple, tuple[int, list[str]]] = {}
        self._modes: dict[int, int] = {}
        self.bytes_used = 0

    @property
    def trial(self) -> Any:
        t = self._trial()
        if t is None:  # pragma: no cover - the rule keeps its trials alive
            raise RuntimeError("the trial of this cache is gone")
        return t

    # --- names --------------------------------------------------------------------------------

    def names(self, collections: Iterable[str] = (), regex: Iterable[str] = (), *, all_if_empty: bool = False
              ) -> list[str]:
        """Sorted tensor names in any of `collections` or matching any of `regex` (cached per generation).
        Unknown collections match nothing. With nothing given: every name if `all_if_empty`, else none."""
        collections, regex = tuple(collections), tuple(regex)
        trial = self.trial
        key = (collections, regex, all_if_empty)
        gen = (trial.generation, len(trial.collections()))
        hit = self._names.get(key)
        if hit is not None and hit[0] == gen:
            return hit[1]
        if not collections and not regex:
            names = list(trial.tensor_names()) if all_if_empty else []
        else:
            found: set[str] = set()
            known = trial.collections()
            for c in collections:
                if c in known:
                    found.update(trial.tensor_names(collection=c))
            if regex:
                found.update(trial.tensor_names(regex=list(regex)))
            names = sorted(found)
        self._names[key] = (gen, names)
        return names

    # --- modes --------------------------------------------------------------------------------

    def mode_of(self, step: int) -> int | None:
        m = self._modes.get(step)
        if m is None:
            mm = self.trial.mode(step)
            if mm is None:
                return None
            m = self._modes[step] = mm.value
        return m

    def _mode_mask(self, steps: np.ndarray, mode: ModeKeys | None) -> np.ndarray:
        if mode is None or mode == _modes.GLOBAL:
            return np.ones(len(steps), dtype=bool)
        return np.fromiter((self.mode_of(int(s)) == mode.value for s in steps), dtype=bool, count=len(steps))

    # --- series -------------------------------------------------------------------------------

    def _build(self, name: str, old: _Series | None) -> _Series:
        trial = self.trial
        t = trial.tensor(name)
        s = _Series()
        s.generation = trial.generation
        s.upto = trial.complete_upto()
        if old is not None:
            self.bytes_used -= old.nbytes
        steps = t.steps()
        s.steps = np.asarray(steps, dtype=np.int64)
        s.any_steps = set(steps)
        bulk = False
        if steps:
            try:
                shape = t.shape(steps[-1])
                est = len(steps) * max(1, int(np.prod(shape, dtype=np.int64))) * 8
                bulk = est <= MAX_TENSOR_BYTES and self.bytes_used + est <= MAX_TRIAL_BYTES
            except (ShapeUnavailableForStep, TensorUnavailableForStep):
                bulk = False
        if bulk:
            rsteps, vals = t.stacked()
            s.steps = np.asarray(rsteps, dtype=np.int64)
            s.values = vals
            s.nbytes = vals.nbytes if isinstance(vals, np.ndarray) else sum(np.asarray(v).nbytes for v in vals)
            self.bytes_used += s.nbytes
        s.pos = {int(x): i for i, x in enumerate(s.steps.tolist())}
        self._series[name] = s
        return s

    def _get(self, name: str) -> _Series:
        s = self._series.get(name)
        if s is None:
            s = self._build(name, None)
        return s

    def _fresh(self, s: _Series, step: int) -> bool:
        """True if the series was built with everything there is to know about `step`."""
        return step <= s.upto and s.generation == self.trial.generation

    def _maybe_rebuild(self, name: str, s: _Series) -> _Series:
        s.misses += 1
        if s.misses > max(8, len(s.steps) // 4):
            return self._build(name, s)
        return s

    def has_step(self, name: str, step: int) -> bool:
        """Whether `name` has anything saved at global `step` (cheap for cached steps)."""
        s = self._get(name)
        if step in s.any_steps:
            return True
        if self._fresh(s, step):
            return False
        return step in self.trial.tensor(name).steps()

    def steps(self, name: str, mode: ModeKeys | None = None) -> np.ndarray:
        """Global steps of `name` known to the cache (rebuilt if stale), optionally of one mode."""
        s = self._get(name)
        if s.generation != self.trial.generation or s.upto != self.trial.complete_upto():
            s = self._build(name, s)
        out = s.by_mode.get(mode)
        if out is None:
            out = s.by_mode[mode] = s.steps[self._mode_mask(s.steps, mode)]
        return out

    def raw(self, name: str, step: int) -> np.ndarray:
        """The raw value of `name` at global `step`; TensorUnavailableForStep if there is none."""
        s = self._get(name)
        i = s.pos.get(step)
        if i is None and not self._fresh(s, step):
            s = self._maybe_rebuild(name, s)
            i = s.pos.get(step)
        if i is not None and s.values is not None:
            return s.values[i]
        if i is None and self._fresh(s, step):
            raise TensorUnavailableForStep(name, step, _modes.GLOBAL)
        return self.trial.tensor(name).value(step)

    def stat(self, name: str, step: int, stat: Stat) -> Any:
        """`stat` of `name` at global `step`: a value, None if the window lacks history, or
        TensorUnavailableForStep if the tensor has no value there."""
        s = self._get(name)
        d = s.stats.get(stat.key)
        if d is None:
            d = s.stats[stat.key] = self._bulk_stat(name, s, stat)
        v = d.get(step, MISSING)
        if v is not MISSING:
            return v
        if self._fresh(s, step):
            raise TensorUnavailableForStep(name, step, _modes.GLOBAL)
        s2 = self._maybe_rebuild(name, s)
        if s2 is not s:
            return self.stat(name, step, stat)
        v = self._point_stat(name, step, stat)
        d[step] = v
        return v

    def _bulk_stat(self, name: str, s: _Series, stat: Stat) -> dict[int, Any]:
        t = self.trial.tensor(name)
        saved: dict[int, Any] = {}
        if stat.reduction is not None and stat.window == 1:
            red = t.reductions(stat.reduction[0], abs=stat.reduction[1])
            if red:
                if stat.mode is not None and stat.mode != _modes.GLOBAL:
                    red = {k: v for k, v in red.items() if self.mode_of(k) == stat.mode.value}
                saved = {int(k): _py(v) for k, v in red.items()}
                if s.values is None or all(int(x) in saved for x in s.steps.tolist()):
                    return saved
        if s.values is None or not len(s.steps):
            return saved
        mask = self._mode_mask(s.steps, stat.mode)
        every = bool(mask.all())
        steps = s.steps if every else s.steps[mask]
        if isinstance(s.values, np.ndarray):
            out = _apply(stat.fn, s.values if every else s.values[mask])
        else:
            vals = [v for v, m in zip(s.values, mask, strict=True) if m]
            out = _apply_list(stat.fn, vals, stat.window)
        keys = steps.tolist()
        vals = out.tolist() if isinstance(out, np.ndarray) and out.ndim == 1 else [_py(v) for v in out]
        res: dict[int, Any] = dict(zip(keys, vals, strict=True))
        for st in keys[: stat.window - 1]:
            res[st] = None
        res.update(saved)  # a step with the reduction saved (and a raw value: e.g. flight records) takes it
        return res

    def _point_stat(self, name: str, step: int, stat: Stat) -> Any:
        t = self.trial.tensor(name)
        if stat.reduction is not None and stat.window == 1:
            if stat.mode is not None and stat.mode != _modes.GLOBAL and self.mode_of(step) != stat.mode.value:
                raise TensorUnavailableForStep(name, step, _modes.GLOBAL)
            try:
                return _py(t.reduction_value(step, stat.reduction[0], abs=stat.reduction[1]))
            except TensorUnavailableForStep:
                pass
        if stat.window == 1:  # no history needed: one read, not a scan of the tensor's steps
            if stat.mode is not None and stat.mode != _modes.GLOBAL and self.mode_of(step) != stat.mode.value:
                raise TensorUnavailableForStep(name, step, _modes.GLOBAL)
            return _py(_apply_list(stat.fn, [t.value(step)], 1)[-1])
        steps = np.asarray(t.steps(), dtype=np.int64)
        steps = steps[steps <= step]
        steps = steps[self._mode_mask(steps, stat.mode)]
        if not len(steps) or steps[-1] != step:
            raise TensorUnavailableForStep(name, step, _modes.GLOBAL)
        if len(steps) < stat.window:
            t.value(step)  # raises if there is no raw value
            return None
        win = [t.value(int(g)) for g in steps[-stat.window:]]
        return _py(_apply_list(stat.fn, win, stat.window)[-1])

    def forget(self) -> None:
        """Drop everything cached."""
        self._series.clear()
        self._names.clear()
        self.bytes_used = 0


def _apply(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray) -> np.ndarray:
    if not len(rows):
        return np.empty(0)
    with np.errstate(all="ignore"):
        return np.asarray(fn(rows))


def _apply_list(fn: Callable[[np.ndarray], np.ndarray], vals: list, window: int) -> list:
    """`fn` over rows of differing shapes: stack each window on its own."""
    out = []
    for i in range(len(vals)):
        lo = max(0, i - window + 1)
        win = [np.asarray(v) for v in vals[lo:i + 1]]
        try:
            stacked = np.stack(win)
        except ValueError:
            out.append(np.nan if window > 1 else _apply(fn, np.asarray(win[-1])[None])[0])
            continue
        out.append(_apply(fn, stacked)[-1])
    return out


def _py(v: Any) -> Any:
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.reshape(-1)[0]
    if isinstance(v, np.generic):
        return v.item()
    return v


_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def data_for(trial: Any) -> TrialData:
    """The shared cache of `trial`."""
    d = _CACHES.get(trial)
    if d is None:
        d = _CACHES[trial] = TrialData(trial)
    return d


def safe_missing() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "no value here": rules skip the tensor for that step."""
    return (TensorUnavailableForStep, StepUnavailable, TensorUnavailable)
