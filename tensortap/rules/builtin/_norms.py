"""Per-step gradient norms for the spike rules: each gradient tensor's L2 norm (its saved `l2` reduction, else
computed from its raw value) and the total norm over all of them, kept per layer for attribution; and the
kurtosis of the module outputs the flight recorder keeps with its full statistics (`l2` and `l4`)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from tensortap.rules._data import Stat
from tensortap.rules.builtin._stats import flat

__all__ = ["L2", "L4", "GradNorms", "OutputKurtosis", "LateSteps"]


def _l2(rows: np.ndarray) -> np.ndarray:
    x = flat(rows)
    if x.shape[1] == 0:
        return np.full(x.shape[0], np.nan)
    return np.sqrt(np.square(x.astype(np.float64, copy=False)).sum(axis=1))


L2 = Stat("l2", _l2, reduction=("l2", False))


def _l4(rows: np.ndarray) -> np.ndarray:
    x = flat(rows)
    if x.shape[1] == 0:
        return np.full(x.shape[0], np.nan)
    return np.sqrt(np.sqrt(np.square(np.square(x.astype(np.float64, copy=False))).sum(axis=1)))


L4 = Stat("l4", _l4, reduction=("l4", False))
_OUTPUT = re.compile(r"_output_\d+$")


class GradNorms:
    """What a rule has read of the gradients' norms, step by step: per layer {tensor: ([steps], [norms])} and
    the total norm (sqrt of the sum of squares) at steps where every gradient seen so far has a norm."""

    def __init__(self, rule: Any, collection: str = "gradients"):
        self.rule = rule
        self.collection = collection
        self.layers: dict[str, tuple[list[int], list[float]]] = {}
        self._most = 0

    def read(self, step: int) -> float | None:
        """Read every gradient's norm at `step` (kept per layer); the total norm there, None when some gradient
        seen before has no norm at this step (a total over part of the layers is not comparable) or none has.
        A non-finite layer norm makes the total non-finite."""
        total, count = 0.0, 0
        for name in self.rule.select([self.collection]):
            v = self.rule.stat(name, step, L2)
            if v is None:
                continue
            v = float(v)
            st, vals = self.layers.setdefault(name, ([], []))
            st.append(step)
            vals.append(v)
            total += v * v
            count += 1
        if not count or count < self._most:
            return None
        self._most = count
        return math.sqrt(total) if math.isfinite(total) else math.nan


class OutputKurtosis:
    """The kurtosis (n·l4⁴/l2⁴, tensortap.analysis.stats) of each module output of the flight recorder's collection
    where the job kept its `l2` and `l4` (statistics="full"), step by step: {tensor: ([steps], [kurtosis])}."""

    def __init__(self, rule: Any):
        self.rule = rule
        self.layers: dict[str, tuple[list[int], list[float]]] = {}

    def read(self, step: int) -> None:
        from tensortap.analysis.stats import kurtosis

        rule = self.rule
        for name in rule.select(["flight"]):
            if not _OUTPUT.search(name):
                continue
            l4 = rule.stat(name, step, L4)
            if l4 is None:
                continue
            l2 = rule.stat(name, step, L2)
            try:
                n = math.prod(rule.base_trial.tensor(name).shape(step))
            except Exception:  # noqa: BLE001 - no shape there: no kurtosis
                continue
            k = kurtosis(n, l2, l4) if l2 is not None and n > 1 else math.nan
            if math.isfinite(k):
                st, vals = self.layers.setdefault(name, ([], []))
                st.append(step)
                vals.append(k)


class LateSteps:
    """Saved steps a rule was not invoked at because they were written after it passed them: the flight
    recorder writes its ring (every step before a problem) when it sees the problem, after those steps ended.
    `upto(step)` gives them, in order, then `step`, so a rule judges each saved step once and in order."""

    def __init__(self, trial: Any):
        self.trial = trial
        self._last = -1
        self._gen = None
        self._steps: list[int] = []

    def upto(self, step: int) -> list[int]:
        import bisect

        t = self.trial
        if self._gen != t.generation:
            self._steps = t.steps()
            self._gen = t.generation
        lo = bisect.bisect_right(self._steps, self._last)
        hi = bisect.bisect_left(self._steps, step)
        late = self._steps[lo:hi]
        self._last = max(self._last, step)
        return [*late, step]

