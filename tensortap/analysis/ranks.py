"""Ranks (workers) whose curve diverges from the others', step by step.

Per worker, the median of its last `window` finite values is compared with the median of all the workers'
medians (with two workers, with the other's): a worker diverges when the two differ by more than
`ratio_threshold` times (in either direction; for curves with values <= 0, when the difference is more than
`ratio_threshold - 1` times the other's magnitude). Medians of a few saved values, not single values:
data-parallel ranks see different batches, so their losses differ by the batches' noise. A worker whose value
is non-finite while others' are finite diverges at once.

With two workers both differ from "the other" alike: the one named is the one that moved from where all the
workers were before (the median of every worker's values before its current window); both are named when they
moved alike or there is no earlier history.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Divergence", "DivergenceTracker"]


@dataclass
class Divergence:
    """Workers whose values diverge from the others' at a step."""

    step: int
    workers: list[str]  # the diverging workers
    values: dict[str, float]  # each worker's median of its last values (its value, for a non-finite one)
    others: float  # what the first diverging worker was compared with (the workers' median, or the other's)
    ratio: float  # how many times apart
    reason: str  # "non-finite" or "ratio"
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self, what: str = "value") -> str:
        ws = " and ".join(self.workers)
        if self.reason == "non-finite":
            vals = ", ".join(f"{w} {self.values[w]}" for w in self.workers)
            return f"{what} of {ws} is not finite at step {self.step} ({vals}) while the other workers' is finite"
        vals = ", ".join(f"{w} {v:.4g}" for w, v in self.values.items())
        return (f"{what} of {ws} diverges from the other workers' at step {self.step}: medians of the last values "
                f"{vals} ({self.ratio:.3g}x apart)")

    def to_dict(self) -> dict[str, Any]:
        def j(v: float) -> Any:
            return v if math.isfinite(v) else (None if math.isnan(v) else ("inf" if v > 0 else "-inf"))
        return {"step": self.step, "workers": self.workers, "values": {k: j(v) for k, v in self.values.items()},
                "others": j(self.others), "ratio": j(self.ratio), "reason": self.reason}


def _apart(a: float, b: float) -> float:
    """How many times apart a and b are (>= 1); for values <= 0, 1 + |a - b| / max(|b|, tiny)."""
    if a > 0 and b > 0:
        return max(a / b, b / a)
    return 1.0 + abs(a - b) / max(abs(b), 1e-12)


class DivergenceTracker:
    """Judges one curve of every worker step by step (`add`)."""

    def __init__(self, ratio_threshold: float = 2.0, window: int = 5, history: int = 50):
        self.ratio_threshold = float(ratio_threshold)
        self.window = int(window)
        self._recent: dict[str, deque[float]] = {}
        self._older: dict[str, deque[float]] = {}
        self._history = int(history)
        self.judged = 0

    def add(self, step: int, values: Mapping[str, float]) -> Divergence | None:
        """Judge the workers' values at `step` (a worker may be missing), then keep them."""
        vals = {w: float(v) for w, v in values.items()}
        out = None
        finite = {w for w, v in vals.items() if math.isfinite(v)}
        if len(vals) >= 2:
            bad = sorted(w for w in vals if w not in finite)
            if bad and finite:
                self.judged += 1
                out = Divergence(int(step), bad, {w: vals[w] for w in bad}, math.nan, math.inf, "non-finite")
        for w in finite:
            rec = self._recent.setdefault(w, deque(maxlen=self.window))
            if len(rec) == self.window:
                self._older.setdefault(w, deque(maxlen=self._history)).append(rec[0])
            rec.append(vals[w])
        if out is not None:
            return out
        ready = {w: float(np.median(self._recent[w])) for w in finite
                 if len(self._recent.get(w, ())) >= self.window}
        if len(ready) < 2:
            return None
        self.judged += 1
        flagged: list[tuple[str, float, float]] = []
        everyone = float(np.median(list(ready.values())))
        for w, m in ready.items():
            # two workers: each against the other; more: against the median of all (the majority's value)
            others = next(x for o, x in ready.items() if o != w) if len(ready) == 2 else everyone
            r = _apart(m, others)
            if r > self.ratio_threshold:
                flagged.append((w, others, r))
        if not flagged:
            return None
        names = [w for w, _, _ in flagged]
        if len(ready) == 2:
            names = self._blame(ready) or names
        first = next(f for f in flagged if f[0] == names[0]) if names[0] in [f[0] for f in flagged] else flagged[0]
        return Divergence(int(step), sorted(names), ready, first[1], first[2], "ratio")

    def _blame(self, ready: Mapping[str, float]) -> list[str]:
        """Of two workers apart, the one that moved from where both were before (both when alike)."""
        olds = [x for w in ready for x in self._older.get(w, ())]
        if len(olds) < 2:
            return []
        base = float(np.median(olds))
        moved = {w: math.log(_apart(m, base)) for w, m in ready.items()}
        top = max(moved.values())
        if top <= 0:
            return []
        return [w for w, d in moved.items() if d >= 0.5 * top]
