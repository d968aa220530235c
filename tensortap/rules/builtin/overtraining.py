"""Overtraining."""

from __future__ import annotations

from typing import Any

from tensortap import modes as _modes
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int
from tensortap.rules.rule import Rule

__all__ = ["Overtraining"]


class Overtraining(Rule):
    """Fires when a loss of the `losses` collection stopped improving: the training loss (TRAIN steps, or
    steps without a mode) has not dropped below its best value minus `delta` for `patience_train` saved steps,
    or the validation loss (EVAL steps) for `patience_validation` saved steps (early-stopping semantics;
    `delta` is absolute)."""

    description = "Training goes on without improving the training or validation loss (by delta)."
    count_empty_steps = False

    def __init__(self, base_trial: Any, patience_train: int | str = 5, patience_validation: int | str = 10,
                 delta: float | str = 0.1, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.patience_train = as_int(patience_train, "patience_train", n, minimum=1)
        self.patience_validation = as_int(patience_validation, "patience_validation", n, minimum=1)
        self.delta = as_float(delta, "delta", n, minimum=0.0)
        self.set_parameters(patience_train=self.patience_train, patience_validation=self.patience_validation,
                            delta=self.delta)
        self._st: dict[tuple[str, bool], list[float]] = {}  # (tensor, is_val) -> [best, steps since]

    def invoke_at_step(self, step: int) -> bool:
        is_val = self.data().mode_of(step) == _modes.EVAL.value
        if self.data().mode_of(step) == _modes.PREDICT.value:
            return False
        patience = self.patience_validation if is_val else self.patience_train
        for name in self.select(["losses"]):
            v = self.stat(name, step, MEAN)
            if v is None:
                continue
            st = self._st.get((name, is_val))
            if st is None:
                self._st[(name, is_val)] = [v, 0]
                continue
            if v < st[0] - self.delta:
                st[0], st[1] = v, 0
            else:
                st[1] += 1
            if st[1] >= patience:
                kind = "validation" if is_val else "training"
                self.violation(step, f"{kind} loss has not improved by {self.delta:g} on its best {st[0]:.4g} for "
                               f"{int(st[1])} steps (patience {patience})", name, v)
        return bool(self._violations)
