"""RankDivergence."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.analysis.ranks import DivergenceTracker
from tensortap.exceptions import TensorUnavailableForStep
from tensortap.rules.params import as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["RankDivergence"]

TOTAL_NORM = "total gradient norm"


class RankDivergence(Rule):
    """Fires at a saved TRAIN step where a worker's loss (the `losses` collection, or `tensor_regex`) or total
    gradient norm diverges from the other workers': the median of its last `window` saved values is more than
    `ratio_threshold` times apart from the median of all workers' medians (with two workers, from the other's),
    or it is non-finite while the others' is finite. With two workers, the one named is the one that moved from
    where both were before (tensortap.analysis.ranks). A job with one worker is NoData."""

    description = ("A worker's loss or gradient norm diverges from the other workers': medians of the last values "
                   "more than ratio_threshold x apart, or non-finite on some workers only.")
    compares = ("each worker's median of its last `window` saved losses and total gradient norms with the median "
                "of all workers' (with two workers, with the other's)")
    count_empty_steps = False
    needs = "two or more workers that saved losses or gradients at the same steps"

    def __init__(self, base_trial: Any, tensor_regex: Any = None, ratio_threshold: float | str = 2.0,
                 window: int | str = 5, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.ratio_threshold = as_float(ratio_threshold, "ratio_threshold", n, minimum=1.0)
        self.window = as_int(window, "window", n, minimum=1)
        self.set_parameters(tensor_regex=self.tensor_regex, ratio_threshold=self.ratio_threshold,
                            window=self.window)
        self._trackers: dict[str, DivergenceTracker] = {}
        self.report.judged = 0

    def _tracker(self, name: str) -> DivergenceTracker:
        t = self._trackers.get(name)
        if t is None:
            t = self._trackers[name] = DivergenceTracker(self.ratio_threshold, self.window)
        return t

    def _per_worker(self, name: str, step: int, norm: bool) -> dict[str, float]:
        t = self.base_trial.tensor(name)
        try:
            workers = t.workers(step)
        except TensorUnavailableForStep:
            return {}
        out = {}
        for w in workers:
            try:
                if norm:
                    v = float(t.reduction_value(step, "l2", worker=w))
                else:
                    v = float(np.mean(np.asarray(t.value(step, worker=w), dtype=np.float64)))
            except TensorUnavailableForStep:
                continue
            out[w] = v
            self.count()
        return out

    def invoke_at_step(self, step: int) -> bool:
        if len(self.base_trial.workers()) < 2:
            return False
        if self.base_trial.mode(step) not in (None, _modes.TRAIN, _modes.GLOBAL):
            return False
        judged: list[tuple[str, dict[str, float]]] = []
        for name in self.select([] if self.tensor_regex else ["losses"], self.tensor_regex):
            judged.append((name, self._per_worker(name, step, norm=False)))
        sq: dict[str, float] = {}
        counts: dict[str, int] = {}
        for name in self.select(["gradients"]):
            for w, v in self._per_worker(name, step, norm=True).items():
                sq[w] = sq.get(w, 0.0) + v * v
                counts[w] = counts.get(w, 0) + 1
        if sq:
            most = max(counts.values())
            judged.append((TOTAL_NORM, {w: math.sqrt(s) if math.isfinite(s) else math.nan
                                        for w, s in sq.items() if counts[w] == most}))
        for name, vals in judged:
            if len(vals) < 2:
                continue
            d = self._tracker(name).add(step, vals)
            if d is not None:
                what = "the total gradient norm" if name == TOTAL_NORM else f"the loss {name}"
                self.violation(step, d.describe(what), None if name == TOTAL_NORM else name,
                               {"workers": d.workers, "ratio": d.to_dict()["ratio"]})
        self.report.judged = sum(t.judged for t in self._trackers.values())
        return bool(self._violations)
