"""WeightUpdateRatio."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.rules._data import Stat
from tensortap.rules.builtin._stats import flat
from tensortap.rules.params import as_float, as_int
from tensortap.rules.rule import Rule

__all__ = ["WeightUpdateRatio"]


class WeightUpdateRatio(Rule):
    """Fires at a step s where, for a tensor of the `weights` collection, the update ratio
    ||w_s - w_p||_2 / (||w_p||_2 + epsilon) is above `large_threshold` or below `small_threshold`.

    p is the previous saved step of that tensor; with `num_steps`, p is the oldest saved step in
    [s - num_steps, s) and s is skipped when there is none (AWS: "the comparison is done between weights at
    step s and at a step >= s - num_steps"). TRAIN steps are used when the job has any (weights do not change
    in EVAL), else all steps. The ratio uses L2 norms of the whole tensor (inferred: AWS documents only
    "the ratio of updates to weights")."""

    description = "Weight updates are too large or too small relative to the weights."
    compares = ('||w_s - w_p|| / ||w_p|| of each weight between saved TRAIN steps with large_threshold and '
                'small_threshold')
    count_empty_steps = False

    def __init__(self, base_trial: Any, num_steps: int | str | None = None, large_threshold: float | str = 10.0,
                 small_threshold: float | str = 0.00000001, epsilon: float | str = 0.000000001, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.num_steps = as_int(num_steps, "num_steps", n, optional=True, minimum=1)
        self.large_threshold = as_float(large_threshold, "large_threshold", n)
        self.small_threshold = as_float(small_threshold, "small_threshold", n, minimum=0.0)
        self.epsilon = as_float(epsilon, "epsilon", n, minimum=0.0)
        self.set_parameters(num_steps=self.num_steps, large_threshold=self.large_threshold,
                            small_threshold=self.small_threshold, epsilon=self.epsilon)
        self._stats: dict[Any, Stat] = {}

    def _mode(self) -> Any:
        return _modes.TRAIN if _modes.TRAIN in self.base_trial.modes() else None

    def _ratio(self, a: np.ndarray, b: np.ndarray) -> float:
        a, b = flat(np.asarray(a)[None])[0], flat(np.asarray(b)[None])[0]
        return float(np.linalg.norm(b - a) / (np.linalg.norm(a) + self.epsilon))

    def _stat(self, mode: Any) -> Stat:
        st = self._stats.get(mode)
        if st is None:
            eps = self.epsilon

            def fn(rows: np.ndarray) -> np.ndarray:
                x = flat(rows)
                out = np.full(x.shape[0], np.nan)
                if x.shape[0] > 1:
                    out[1:] = np.linalg.norm(x[1:] - x[:-1], axis=1) / (np.linalg.norm(x[:-1], axis=1) + eps)
                return out

            st = self._stats[mode] = Stat(f"update_ratio:{eps!r}:{mode}", fn, window=2, mode=mode)
        return st

    def invoke_at_step(self, step: int) -> bool:
        mode = self._mode()
        if mode is not None and self.data().mode_of(step) != mode.value:
            return False
        for name in self.select(["weights"]):
            if self.num_steps is None:
                r = self.stat(name, step, self._stat(mode))
            else:
                steps = self.data().steps(name, mode)
                i = int(np.searchsorted(steps, step))
                if i >= len(steps) or steps[i] != step:
                    continue
                j = int(np.searchsorted(steps, step - self.num_steps))
                if j >= i:
                    continue
                cur, prev = self.raw(name, step), self.raw(name, int(steps[j]))
                r = None if cur is None or prev is None else self._ratio(prev, cur)
            if r is None or np.isnan(r):
                continue
            if r > self.large_threshold:
                self.violation(step, f"update ratio {r:.3g} > large_threshold {self.large_threshold:g}", name, r)
            elif r < self.small_threshold:
                self.violation(step, f"update ratio {r:.3g} < small_threshold {self.small_threshold:g}", name, r)
        return bool(self._violations)
