"""FeatureImportanceOverweight (XGBoost)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["FeatureImportanceOverweight"]


class FeatureImportanceOverweight(Rule):
    """Fires at a step where the `nfeatures` most important features (one scalar tensor per feature, matching
    `tensor_regex`, e.g. `feature_importance/weight/f0`) hold more than `threshold` of the total importance
    (importances are normalised to sum 1). With `nfeatures` features or fewer the share is trivially 1, so
    the step is not judged (a warning goes in the report). Rounds before `min_round` are not judged: the first
    trees split on a few features whatever the data (smdebug judged round 0, where one depth-4 tree uses ~3)."""

    description = "A few features carry most of the importance: the top nfeatures share > threshold (from min_round)."
    compares = "the share of the top nfeatures in the total feature importance at each saved round >= min_round"
    count_empty_steps = False

    def __init__(self, base_trial: Any, threshold: float | str = 0.8, nfeatures: int | str = 3,
                 tensor_regex: Any = ".*feature_importance/weight", min_round: int | str = 20, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.threshold = as_float(threshold, "threshold", n, minimum=0.0, maximum=1.0)
        self.nfeatures = as_int(nfeatures, "nfeatures", n, minimum=1)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.min_round = as_int(min_round, "min_round", n, minimum=0)
        self.set_parameters(threshold=self.threshold, nfeatures=self.nfeatures, tensor_regex=self.tensor_regex,
                            min_round=self.min_round)

    def invoke_at_step(self, step: int) -> bool:
        if self.base_trial.mode_modestep(step)[1] < self.min_round:
            return False
        vals = {}
        for name in self.select(regex=self.tensor_regex):
            v = self.stat(name, step, MEAN)
            if v is not None and v == v:
                vals[name] = abs(v)
        if not vals:
            return False
        if len(vals) <= self.nfeatures:
            self.report.warn(f"only {len(vals)} features, not more than nfeatures={self.nfeatures}: not judged")
            return False
        total = sum(vals.values())
        if total <= 0:
            return False
        top = sorted(vals.items(), key=lambda kv: -kv[1])[: self.nfeatures]
        share = float(np.sum([v for _, v in top]) / total)
        if share > self.threshold:
            shares = ", ".join(f"{k.rsplit('/', 1)[-1]} {100 * v / total:.0f}%" for k, v in top)
            self.violation(step, f"the top {self.nfeatures} of {len(vals)} features hold {100 * share:.0f}% of the "
                           f"importance (more than {100 * self.threshold:g}%) at round {step}: {shares}",
                           top[0][0], share)
        return bool(self._violations)
