"""SimilarAcrossRuns."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.exceptions import InvalidConfiguration, NoMoreData, StepUnavailable
from tensortap.rules.params import as_regex_list, as_str_list
from tensortap.rules.rule import Rule
from tensortap.trials.state import StepState

__all__ = ["SimilarAcrossRuns"]


class SimilarAcrossRuns(Rule):
    """Fires at a step where a tensor of `collection_names` / matching `tensor_regex` (every tensor when
    neither is given) differs between the base trial and another trial: different shapes, or values not
    `np.allclose` (NaNs compare equal). Tensors missing from either trial at the step are not compared.
    `other_trials`: a Trial, a path, a comma-separated list of paths, or a list."""

    description = "Two runs diverge: a tensor differs between the base trial and another trial at a step."
    compares = 'each tensor with the same tensor of the other job at the same step'
    count_empty_steps = False

    def __init__(self, base_trial: Any, other_trials: Any, collection_names: Any = None, tensor_regex: Any = None,
                 *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, other_trials=other_trials, actions=actions)
        if not self.other_trials:
            raise InvalidConfiguration(f"{self.rule_name}: other_trials is required (a trial or a path)")
        self.collection_names = as_str_list(collection_names, "collection_names", self.rule_name)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", self.rule_name)
        self.set_parameters(other_trials=[str(t.path) for t in self.other_trials],
                            collection_names=self.collection_names, tensor_regex=self.tensor_regex)

    def _wait_other(self, other: Any, step: int) -> None:
        if other.has_passed_step(step) != StepState.AVAILABLE:
            try:
                other.wait_for_steps([step], timeout=self.wait_timeout)
            except NoMoreData:
                raise StepUnavailable(step, "GLOBAL") from None

    def invoke_at_step(self, step: int) -> bool:
        names = self.select(self.collection_names, self.tensor_regex, all_if_empty=True)
        for other in self.other_trials:
            self._wait_other(other, step)
            for name in names:
                if not other.has_tensor(name):
                    continue
                a = self.raw(name, step)
                if a is None:
                    continue
                b = self.raw(name, step, trial=other)
                if b is None:
                    continue
                a, b = np.asarray(a), np.asarray(b)
                if a.shape != b.shape:
                    self.violation(step, f"shape {a.shape} in base vs {b.shape} in {other.name}", name,
                                   None, other)
                    continue
                try:
                    same = np.allclose(a, b, equal_nan=True) if a.dtype.kind in "biufc" else np.array_equal(a, b)
                except TypeError:
                    same = np.array_equal(a, b)
                if not same:
                    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) \
                        if a.dtype.kind in "biuf" and a.size else None
                    self.violation(step, f"differs from trial {other.name} (max |diff|={diff})", name, diff, other)
        return bool(self._violations)
