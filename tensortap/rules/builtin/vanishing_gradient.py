"""VanishingGradient."""

from __future__ import annotations

from typing import Any

from tensortap.rules.builtin._stats import ABS_MEAN
from tensortap.rules.params import as_float
from tensortap.rules.rule import Rule

__all__ = ["VanishingGradient"]


class VanishingGradient(Rule):
    """Fires at a step where, for some tensor of the `gradients` collection, the mean of the absolute values
    (the saved `abs_mean` reduction when there is one) is below `threshold`."""

    description = "Gradients vanish: the mean |gradient| of a tensor in 'gradients' is below threshold."
    compares = "the mean |gradient| of each tensor in 'gradients' at each saved step with threshold"
    count_empty_steps = False

    def __init__(self, base_trial: Any, threshold: float | str = 0.0000001, *, action_str: str = "",
                 actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        self.threshold = as_float(threshold, "threshold", self.rule_name, minimum=0.0)
        self.set_parameters(threshold=self.threshold)

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(["gradients"]):
            v = self.stat(name, step, ABS_MEAN)
            if v is not None and v < self.threshold:
                self.violation(step, f"mean(|gradient|)={v:.3g} < threshold {self.threshold:g}", name, v)
        return bool(self._violations)
