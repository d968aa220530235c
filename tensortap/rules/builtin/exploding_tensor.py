"""ExplodingTensor."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.exceptions import TensorUnavailableForStep
from tensortap.rules.builtin._stats import NAN_INF
from tensortap.rules.params import as_bool, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["ExplodingTensor"]


class ExplodingTensor(Rule):
    """Fires at a step where a tensor of `collection_names` / matching `tensor_regex` (every tensor when
    neither is given, except XGBoost's `trees` tables, where NaN marks a leaf) holds a NaN, or an infinity unless
    `only_nan`. Tensors saved only as reductions are judged by their saved reductions."""

    description = "Tensors explode: a value is NaN or infinite (only NaN with only_nan)."
    compares = "every value of each tensor at each saved step with NaN and +-inf"
    count_empty_steps = False

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 only_nan: bool | str = False, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        self.collection_names = as_str_list(collection_names, "collection_names", self.rule_name)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", self.rule_name)
        self.only_nan = as_bool(only_nan, "only_nan", self.rule_name)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            only_nan=self.only_nan)

    def invoke_at_step(self, step: int) -> bool:
        limit = 2 if self.only_nan else 1
        names = self.select(self.collection_names, self.tensor_regex, all_if_empty=True)
        if not self.collection_names and not self.tensor_regex:
            trees = set(self.select(["trees"]))
            names = [n for n in names if n not in trees]
        for name in names:
            code = self.stat(name, step, NAN_INF)
            if code is None:
                code = self._from_reductions(name, step)
            if code is not None and code >= limit:
                what = "NaN" if code == 2 else "an infinite value"
                self.violation(step, f"holds {what}", name, "nan" if code == 2 else "inf")
        return bool(self._violations)

    def _from_reductions(self, name: str, step: int) -> float | None:
        if not self.data().has_step(name, step):
            return None
        try:
            vals = self.base_trial.tensor(name).reduction_values(step)
        except TensorUnavailableForStep:
            return None
        if not vals:
            return None
        self.count(len(vals))
        arr = np.asarray([np.asarray(v, dtype=np.float64).reshape(-1)[0] for v in vals.values()])
        return 2.0 if np.isnan(arr).any() else 1.0 if np.isinf(arr).any() else 0.0
