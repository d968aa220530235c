"""TensorVariance."""

from __future__ import annotations

from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin._stats import VARIANCE
from tensortap.rules.params import as_float, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["TensorVariance"]


class TensorVariance(Rule):
    """Fires at a step where the variance of a tensor of `collection_names` / matching `tensor_regex` (every
    tensor when neither is given) is above `max_threshold` or below `min_threshold` (at least one threshold is
    required). Uses the saved `variance` reduction when there is one."""

    description = "A tensor's variance is above max_threshold or below min_threshold."
    compares = 'the variance of each tensor at each saved step with max_threshold and min_threshold'
    count_empty_steps = False

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 max_threshold: float | str | None = None, min_threshold: float | str | None = None, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.max_threshold = as_float(max_threshold, "max_threshold", n, optional=True)
        self.min_threshold = as_float(min_threshold, "min_threshold", n, optional=True)
        if self.max_threshold is None and self.min_threshold is None:
            raise InvalidConfiguration(f"{n}: give max_threshold and/or min_threshold")
        lo, hi = self.min_threshold, self.max_threshold
        if lo is not None and hi is not None and lo > hi:
            raise InvalidConfiguration(f"{n}: min_threshold={self.min_threshold} > max_threshold={self.max_threshold}")
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            max_threshold=self.max_threshold, min_threshold=self.min_threshold)

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(self.collection_names, self.tensor_regex, all_if_empty=True):
            v = self.stat(name, step, VARIANCE)
            if v is None or v != v:
                continue
            if self.max_threshold is not None and v > self.max_threshold:
                self.violation(step, f"variance {v:.4g} > max_threshold {self.max_threshold:g}", name, v)
            elif self.min_threshold is not None and v < self.min_threshold:
                self.violation(step, f"variance {v:.4g} < min_threshold {self.min_threshold:g}", name, v)
        return bool(self._violations)
