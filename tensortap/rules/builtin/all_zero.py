"""AllZero."""

from __future__ import annotations

from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin._stats import ZERO_PCT
from tensortap.rules.params import as_float, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["AllZero"]


class AllZero(Rule):
    """Fires at a step where the percentage of zeros in a tensor of `collection_names` / matching
    `tensor_regex` (one of them is required) is >= `threshold` (percent)."""

    description = "Tensors are all (or threshold % of them) zero."
    compares = 'the percentage of zeros in each tensor at each saved step with threshold'
    count_empty_steps = False

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 threshold: float | str = 100, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        if not self.collection_names and not self.tensor_regex:
            raise InvalidConfiguration(f"{n}: give collection_names or tensor_regex (one is required)")
        self.threshold = as_float(threshold, "threshold", n, minimum=0.0, maximum=100.0)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            threshold=self.threshold)

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(self.collection_names, self.tensor_regex):
            pct = self.stat(name, step, ZERO_PCT)
            if pct is not None and pct == pct and pct >= self.threshold:
                self.violation(step, f"{pct:.4g}% of the values are zero (>= {self.threshold:g}%)", name, pct)
        return bool(self._violations)
