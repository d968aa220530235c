"""ClassImbalance."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.rules.builtin._labels import class_ids
from tensortap.rules.params import as_bool, as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["ClassImbalance"]


class ClassImbalance(Rule):
    """Fires once at least `samples` labels have been seen (accumulated over the evaluated steps) and either
    the most frequent class has more than `threshold_imbalance` times the labels of the least frequent one,
    or the fraction of mispredicted labels of an under-represented class (fewer than half the labels an even
    split would give it) exceeds `threshold_misprediction`.

    The classes are 0..K-1 with K = the width of probability-vector predictions (`argmax=True`), else the
    largest label or prediction + 1, so a class that never occurs among the labels counts as 0 samples (an
    infinite imbalance). Tensors: those matching `labels_regex` and `predictions_regex`, paired in name order.

    The imbalance counts every label seen, judged once `samples` were seen. The mispredictions count the latest
    `samples` labels, judged once `samples` more followed the first `samples` (a warm-up), so a model that has
    learnt is not blamed for the guesses of its first steps (smdebug counted from step 0). A job that never had
    `samples` labels is NoData."""

    description = "Classes are imbalanced, or an under-represented class is mostly mispredicted."
    compares = ("label counts per class (max / min) over all saved labels once `samples` were seen; mispredicted "
                "fraction of each under-represented class over the latest `samples` labels, after the first `samples`")
    needs = "at least `samples` saved labels with their predictions"
    count_empty_steps = False

    def __init__(self, base_trial: Any, threshold_imbalance: float | str = 10,
                 threshold_misprediction: float | str = 0.7,
                 samples: int | str = 500, argmax: bool | str = False, labels_regex: str = ".*labels",
                 predictions_regex: str = ".*predictions", *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.threshold_imbalance = as_float(threshold_imbalance, "threshold_imbalance", n, minimum=1.0)
        self.threshold_misprediction = as_float(threshold_misprediction, "threshold_misprediction", n,
                                                minimum=0.0, maximum=1.0)
        self.samples = as_int(samples, "samples", n, minimum=1)
        self.argmax = as_bool(argmax, "argmax", n)
        self.labels_regex = as_regex_list(labels_regex, "labels_regex", n)
        self.predictions_regex = as_regex_list(predictions_regex, "predictions_regex", n)
        self.set_parameters(threshold_imbalance=self.threshold_imbalance,
                            threshold_misprediction=self.threshold_misprediction, samples=self.samples,
                            argmax=self.argmax, labels_regex=self.labels_regex,
                            predictions_regex=self.predictions_regex)
        self.counts = np.zeros(0, dtype=np.int64)
        self.wrong = np.zeros(0, dtype=np.int64)
        self.seen = 0
        self.k = 0
        self._recent: list[tuple[np.ndarray, np.ndarray]] = []  # (labels, predictions) of the latest steps
        self._recent_n = 0
        self.report.judged = 0

    def _grow(self, k: int) -> None:
        if k > len(self.counts):
            self.counts = np.concatenate([self.counts, np.zeros(k - len(self.counts), dtype=np.int64)])
            self.wrong = np.concatenate([self.wrong, np.zeros(k - len(self.wrong), dtype=np.int64)])
        self.k = max(self.k, k)

    def invoke_at_step(self, step: int) -> bool:
        ls = self.select(regex=self.labels_regex)
        ps = self.select(regex=self.predictions_regex)
        ps = [p for p in ps if p not in ls]
        for ln, pn in zip(ls, ps, strict=False):
            y, p = self.raw(ln, step), self.raw(pn, step)
            if y is None or p is None:
                continue
            try:
                y, p, k = class_ids(y, p, self.argmax)
            except ValueError as e:
                self.report.warn(f"{ln}/{pn}: {e}")
                continue
            if not y.size or y.min() < 0 or p.min() < 0:
                continue
            self._grow(max(k or 0, int(y.max()) + 1, int(p.max()) + 1))
            self.counts += np.bincount(y, minlength=len(self.counts))
            self._recent.append((y, p))
            self._recent_n += y.size
            while self._recent_n - self._recent[0][0].size >= self.samples:
                self._recent_n -= self._recent.pop(0)[0].size
            self.seen += y.size
            self.count(y.size)
        if self.seen < self.samples or self.k == 0:
            return False
        self.report.judged += 1
        self.counts_recent = np.zeros(self.k, dtype=np.int64)
        self.wrong = np.zeros(self.k, dtype=np.int64)
        for y, p in self._recent:
            self.counts_recent += np.bincount(y, minlength=self.k)[: self.k]
            self.wrong += np.bincount(y[y != p], minlength=self.k)[: self.k]
        cmax, cmin = int(self.counts.max()), int(self.counts.min())
        ratio = float("inf") if cmin == 0 else cmax / cmin
        if ratio > self.threshold_imbalance:
            self.violation(step, f"classes are imbalanced: the largest has {ratio:.3g} times the labels of the "
                           f"smallest ({cmax} / {cmin} of {self.seen} labels), more than "
                           f"{self.threshold_imbalance:g} times", None, {"counts": self.counts.tolist()})
        minority = self.counts < 0.5 * self.counts.sum() / max(1, self.k)
        for c in np.flatnonzero(self.counts_recent) if self.seen >= 2 * self.samples else ():
            if not minority[c]:
                continue
            frac = self.wrong[c] / self.counts_recent[c]
            if frac > self.threshold_misprediction:
                self.violation(step, f"under-represented class {int(c)} is mostly mispredicted: {100 * frac:.0f}% "
                               f"of its {int(self.counts_recent[c])} labels among the latest {self._recent_n} "
                               f"(more than {100 * self.threshold_misprediction:g}%)", None, float(frac))
        return bool(self._violations)
