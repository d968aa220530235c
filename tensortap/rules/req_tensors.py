"""The tensors (and steps) a rule needs at an evaluation, per trial (smdebug's RequiredTensors).

`fetch()` waits until the steps exist in every trial and checks, from the index only, that each required
tensor was saved there. Values are read once, when the rule asks for them (`value()` memoises them for the
evaluation); smdebug read every value in fetch, threw it away and read it again in the rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import TensorUnavailable, TensorUnavailableForStep
from tensortap.trials.tensor import Tensor

__all__ = ["RequiredTensors", "RequiredTensorsForTrial"]


class RequiredTensorsForTrial:
    """Required tensor names → steps, for one trial."""

    def __init__(self, trial: Any):
        self.trial = trial
        self._steps: dict[str, list[int]] = {}
        self._values: dict[tuple[str, int], np.ndarray] = {}

    def add(self, name: str, steps: list[int], should_match_regex: bool = False) -> None:
        """Require `name` (or, with should_match_regex, every tensor matching it) at `steps` (global)."""
        if should_match_regex:
            names = self.trial.tensor_names(regex=[name])
        else:
            if not self.trial.has_tensor(name):
                raise TensorUnavailable(name)
            names = [name]
        for n in names:
            cur = self._steps.setdefault(n, [])
            cur.extend(s for s in steps if s not in cur)

    def get_tensor_steps(self, name: str) -> list[int]:
        return list(self._steps.get(name, []))

    def get_names(self) -> list[str]:
        return list(self._steps)

    def count(self) -> int:
        """Number of (tensor, step) pairs required."""
        return sum(len(v) for v in self._steps.values())

    def get(self) -> list[Tensor]:
        return [self.trial.tensor(n) for n in self._steps]

    def clear(self) -> None:
        self._steps.clear()
        self._values.clear()

    def fetch(self, timeout: float | None = None) -> None:
        """Wait for the required steps; TensorUnavailableForStep if a tensor was not saved at one of them."""
        if not self._steps:
            return
        all_steps = sorted({s for steps in self._steps.values() for s in steps})
        self.trial.wait_for_steps(all_steps, timeout=timeout)
        for name, steps in self._steps.items():
            have = set(self.trial.tensor(name).steps())
            for s in steps:
                if s not in have:
                    raise TensorUnavailableForStep(name, s, _modes.GLOBAL)

    def value(self, name: str, step: int) -> np.ndarray:
        """The value of `name` at global `step`, read at most once per evaluation."""
        key = (name, step)
        v = self._values.get(key)
        if v is None:
            v = self._values[key] = self.trial.tensor(name).value(step)
        return v


class RequiredTensors:
    """RequiredTensorsForTrial of the base trial and every other trial."""

    def __init__(self, base_trial: Any, other_trials: list[Any] | None = None):
        self.base_trial = base_trial
        self.other_trials = list(other_trials or [])
        self._by_trial: dict[int, RequiredTensorsForTrial] = {}
        for t in [base_trial, *self.other_trials]:
            self._by_trial[id(t)] = RequiredTensorsForTrial(t)

    def _for(self, trial: Any | None) -> RequiredTensorsForTrial:
        trial = self.base_trial if trial is None else trial
        r = self._by_trial.get(id(trial))
        if r is None:
            r = self._by_trial[id(trial)] = RequiredTensorsForTrial(trial)
        return r

    def add(self, name: str, steps: list[int], trial: Any | None = None, should_match_regex: bool = False) -> None:
        self._for(trial).add(name, steps, should_match_regex)

    def get_tensor_steps(self, name: str, trial: Any | None = None) -> list[int]:
        return self._for(trial).get_tensor_steps(name)

    def get_names(self, trial: Any | None = None) -> list[str]:
        return self._for(trial).get_names()

    def get(self, trial: Any | None = None) -> list[Tensor]:
        return self._for(trial).get()

    def value(self, name: str, step: int, trial: Any | None = None) -> np.ndarray:
        return self._for(trial).value(name, step)

    def count(self) -> int:
        """Number of (tensor, step) pairs required over all trials."""
        return sum(r.count() for r in self._by_trial.values())

    def clear(self) -> None:
        for r in self._by_trial.values():
            r.clear()

    def fetch(self, timeout: float | None = None) -> None:
        for r in self._by_trial.values():
            r.fetch(timeout)
