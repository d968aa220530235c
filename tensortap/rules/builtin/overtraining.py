"""Overtraining."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int
from tensortap.rules.rule import Rule

__all__ = ["Overtraining"]


class Overtraining(Rule):
    """Fires when training goes on without improving a loss of the `losses` collection (early-stopping semantics):
    the validation loss has not improved on its best by more than `delta` for `patience_validation`
    evaluations, or the training loss for `patience_train` saved steps.

    Validation: one value per evaluation (a run of EVAL steps: the mean of its losses), judged once it has as
    many values as the evaluation before it. Training (TRAIN steps, or
    steps without a mode): the median of the last `window` saved values at each saved step, so a noisy
    mini-batch loss is judged by its trend; the first `window` - 1 steps are not judged. `delta` is absolute, as
    in smdebug. smdebug counted single (noisy) values and EVAL steps; tensortap counts smoothed values and
    evaluations."""

    description = "Training goes on without improving: the validation loss (per evaluation) or the training loss."
    compares = ("each evaluation's mean loss with the best earlier one (patience_validation evaluations); the "
                "median of the last `window` TRAIN losses with its best (patience_train saved steps)")
    count_empty_steps = False

    def __init__(self, base_trial: Any, patience_train: int | str = 40, patience_validation: int | str = 10,
                 delta: float | str = 0.0, window: int | str = 5, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.patience_train = as_int(patience_train, "patience_train", n, minimum=1)
        self.patience_validation = as_int(patience_validation, "patience_validation", n, minimum=1)
        self.delta = as_float(delta, "delta", n, minimum=0.0)
        self.window = as_int(window, "window", n, minimum=1)
        self.set_parameters(patience_train=self.patience_train, patience_validation=self.patience_validation,
                            delta=self.delta, window=self.window)
        # per tensor: training [recent values, best, steps since best]; validation [current evaluation's values,
        # best, evaluations since best, in an evaluation, values of the previous evaluation]
        self._train: dict[str, list[Any]] = {}
        self._val: dict[str, list[Any]] = {}

    def invoke_at_step(self, step: int) -> bool:
        mode = self.data().mode_of(step)
        if mode == _modes.PREDICT.value:
            return False
        is_val = mode == _modes.EVAL.value
        for name in self.select(["losses"]):
            v = self.stat(name, step, MEAN)
            if v is None or v != v:
                continue
            if is_val:
                self._validation(step, name, float(v))
            else:
                self._end_evaluation(name)
                self._training(step, name, float(v))
        return bool(self._violations)

    def _training(self, step: int, name: str, v: float) -> None:
        st = self._train.setdefault(name, [[], None, 0])
        st[0].append(v)
        if len(st[0]) < self.window:
            return
        del st[0][:-self.window]
        m = float(np.median(st[0]))
        if st[1] is None or m < st[1] - self.delta:
            st[1], st[2] = m, 0
            return
        st[2] += 1
        if st[2] >= self.patience_train:
            self.violation(step, f"overtraining: the training loss (median of the last {self.window} saved steps, "
                           f"now {m:.4g}) has not improved on its best {st[1]:.4g} by more than {self.delta:g} for "
                           f"{st[2]} saved steps (patience_train {self.patience_train})", name, m)

    def _validation(self, step: int, name: str, v: float) -> None:
        st = self._val.setdefault(name, [[], None, 0, False, 0])
        if not st[3]:
            st[0], st[3] = [], True
        st[0].append(v)
        if st[1] is None or len(st[0]) < st[4]:
            return  # judged once the evaluation has as many values as the one before (complete)
        m = float(np.mean(st[0]))
        since = st[2] + (0 if m < st[1] - self.delta else 1)
        if since >= self.patience_validation:
            self.violation(step, f"overtraining: the validation loss (mean of {len(st[0])} EVAL steps, now {m:.4g}) "
                           f"has not improved on its best evaluation {st[1]:.4g} by more than {self.delta:g} for "
                           f"{since} evaluations (patience_validation {self.patience_validation})", name, m)

    def _end_evaluation(self, name: str) -> None:
        st = self._val.get(name)
        if st is None or not st[3]:
            return
        st[3], st[4] = False, len(st[0])
        m = float(np.mean(st[0]))
        if st[1] is None or m < st[1] - self.delta:
            st[1], st[2] = m, 0
        else:
            st[2] += 1
