"""Overfit."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["Overfit"]


class Overfit(Rule):
    """Fires when, for `patience` evaluated steps in a row, (mean validation loss - mean training loss) /
    mean training loss > `ratio_threshold`.

    Losses: the scalar tensors matching `tensor_regex`, else the `losses` collection. Training values are
    those of TRAIN steps, validation values those of EVAL steps. The means are over the current phase: the
    validation values of the current run of EVAL steps so far, and the training values of the latest run of
    TRAIN steps before it (inferred: AWS documents "the mean validation loss and mean training loss" without
    a window; phase means follow the usual train-then-validate loop). Evaluated at EVAL steps >= `start_step`
    (global) once a training phase has been seen."""

    description = "The model overfits: validation loss exceeds training loss by more than ratio_threshold."
    count_empty_steps = False
    needs = "losses at EVAL steps that follow TRAIN steps (from start_step on)"

    def __init__(self, base_trial: Any, tensor_regex: Any = None, start_step: int | str = 0, patience: int | str = 1,
                 ratio_threshold: float | str = 0.1, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.start_step = as_int(start_step, "start_step", n, minimum=0)
        self.patience = as_int(patience, "patience", n, minimum=1)
        self.ratio_threshold = as_float(ratio_threshold, "ratio_threshold", n)
        self.set_parameters(tensor_regex=self.tensor_regex, start_step=self.start_step, patience=self.patience,
                            ratio_threshold=self.ratio_threshold)
        # per tensor: [train values of the latest train phase, eval values of the current eval phase,
        #              mode of the previous value, consecutive exceedances]
        self._st: dict[str, list[Any]] = {}
        self.report.judged = 0

    def invoke_at_step(self, step: int) -> bool:
        mode = self.data().mode_of(step)
        if mode not in (_modes.TRAIN.value, _modes.EVAL.value):
            return False
        names = self.select(regex=self.tensor_regex) if self.tensor_regex else self.select(["losses"])
        for name in names:
            v = self.stat(name, step, MEAN)
            if v is None:
                continue
            st = self._st.setdefault(name, [[], [], None, 0])
            if mode == _modes.TRAIN.value:
                if st[2] != mode:
                    st[0] = []
                st[0].append(v)
            else:
                if st[2] != mode:
                    st[1] = []
                st[1].append(v)
            st[2] = mode
            if mode != _modes.EVAL.value or step < self.start_step or not st[0]:
                continue
            self.report.judged += 1
            tr, va = float(np.mean(st[0])), float(np.mean(st[1]))
            ratio = (va - tr) / abs(tr) if tr != 0 else float("inf") if va > tr else 0.0
            st[3] = st[3] + 1 if ratio > self.ratio_threshold else 0
            if st[3] >= self.patience:
                self.violation(step, f"(val {va:.4g} - train {tr:.4g}) / train = {ratio:.3g} > "
                               f"{self.ratio_threshold:g} for {st[3]} step(s)", name, ratio)
        return bool(self._violations)
