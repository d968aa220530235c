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
    """Fires when the model overfits: for `patience` evaluations in a row, the validation loss is more than
    `ratio_threshold` above the training loss ((val - train) / train), is no better than its best earlier
    evaluation, and either rose more than `ratio_threshold` above that best or the training loss fell to less
    than half of what it was at that best (the model memorises the training data while validation stalls).

    Losses: the scalar tensors matching `tensor_regex`, else the `losses` collection. An evaluation is a run of
    EVAL steps; its validation loss is the mean of its values, judged once it has as many values as the
    evaluation before it (a complete evaluation). The training loss is the median of the last `train_window`
    TRAIN values saved before that evaluation. Judged at EVAL steps >= `start_step` (global) from the
    `min_evaluations`-th evaluation on (the first ones give the best to compare with). A gap alone is
    generalisation, not overfitting: smdebug fired on the gap of one evaluation (its training loss one mini-batch's),
    tensortap also asks that validation stops improving while training goes on. A job with fewer evaluations is
    NoData, never NoIssuesFound."""

    description = "The model overfits: the validation loss rises above its best and pulls away from the training loss."
    compares = ("per evaluation (a run of EVAL steps): its mean loss with the median of the last train_window TRAIN "
                "losses before it, and with the best earlier evaluation")
    count_empty_steps = False
    needs = "losses at EVAL steps after TRAIN steps, in at least min_evaluations evaluations (from start_step on)"

    def __init__(self, base_trial: Any, tensor_regex: Any = None, start_step: int | str = 0, patience: int | str = 2,
                 ratio_threshold: float | str = 0.1, train_window: int | str = 10, min_evaluations: int | str = 3, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.start_step = as_int(start_step, "start_step", n, minimum=0)
        self.patience = as_int(patience, "patience", n, minimum=1)
        self.ratio_threshold = as_float(ratio_threshold, "ratio_threshold", n, minimum=0.0)
        self.train_window = as_int(train_window, "train_window", n, minimum=1)
        self.min_evaluations = as_int(min_evaluations, "min_evaluations", n, minimum=2)
        self.set_parameters(tensor_regex=self.tensor_regex, start_step=self.start_step, patience=self.patience,
                            ratio_threshold=self.ratio_threshold, train_window=self.train_window,
                            min_evaluations=self.min_evaluations)
        self._st: dict[str, _Series] = {}
        self.report.judged = 0

    def invoke_at_step(self, step: int) -> bool:
        mode = self.data().mode_of(step)
        if mode not in (_modes.TRAIN.value, _modes.EVAL.value):
            return False
        names = self.select(regex=self.tensor_regex) if self.tensor_regex else self.select(["losses"])
        for name in names:
            v = self.stat(name, step, MEAN)
            if v is None or v != v:
                continue
            s = self._st.setdefault(name, _Series())
            if mode == _modes.TRAIN.value:
                if s.in_eval:
                    s.close_eval()
                s.train.append(float(v))
                continue
            if not s.in_eval:
                if not s.train:
                    continue  # an evaluation before any training says nothing about overfitting
                s.open_eval(float(np.median(s.train[-self.train_window:])))
            s.cur.append(float(v))
            if step < self.start_step or len(s.evals) + 1 < self.min_evaluations or len(s.cur) < s.sizes[-1]:
                continue
            self.report.judged += 1
            val, tr = float(np.mean(s.cur)), s.cur_train
            ib = int(np.argmin(s.evals))
            best, tr_at_best = s.evals[ib], s.trains[ib]
            gap = (val - tr) / abs(tr) if tr else (float("inf") if val > tr else 0.0)
            rise = (val - best) / abs(best) if best else (float("inf") if val > best else 0.0)
            memorises = tr < 0.5 * tr_at_best
            bad = gap > self.ratio_threshold and val >= best and (rise > self.ratio_threshold or memorises)
            s.cur_bad = bad
            run = (s.bad_run + 1) if bad else 0
            if run >= self.patience:
                why = (f"{100 * rise:.0f}% above its best evaluation ({best:.4g})" if rise > self.ratio_threshold else
                       f"no better than its best evaluation ({best:.4g}) while the training loss fell from "
                       f"{tr_at_best:.4g} to less than half")
                self.violation(step, f"overfitting: the validation loss {val:.4g} (evaluation {len(s.evals) + 1}, "
                               f"mean of {len(s.cur)} EVAL steps) is {100 * gap:.0f}% above the training loss "
                               f"{tr:.4g} (median of the last {min(len(s.train), self.train_window)} saved TRAIN "
                               f"steps; threshold {100 * self.ratio_threshold:g}%) and {why}, for {run} "
                               f"evaluation(s) in a row", name, gap)
        return bool(self._violations)


class _Series:
    """One loss: its TRAIN values, the mean of each finished evaluation, and the current evaluation."""

    def __init__(self) -> None:
        self.train: list[float] = []
        self.evals: list[float] = []
        self.trains: list[float] = []  # the training loss each finished evaluation was compared with
        self.sizes: list[int] = [0]  # EVAL values of each finished evaluation
        self.cur: list[float] = []
        self.cur_train = 0.0
        self.cur_bad = False
        self.bad_run = 0  # finished evaluations in a row that were over the thresholds
        self.in_eval = False

    def open_eval(self, train: float) -> None:
        self.in_eval, self.cur, self.cur_train, self.cur_bad = True, [], train, False

    def close_eval(self) -> None:
        self.evals.append(float(np.mean(self.cur)))
        self.trains.append(self.cur_train)
        self.sizes.append(len(self.cur))
        self.bad_run = self.bad_run + 1 if self.cur_bad else 0
        self.in_eval = False
