"""Confusion."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tensortap.rules.builtin._labels import class_ids
from tensortap.rules.params import as_float, as_int, as_str
from tensortap.rules.rule import Rule

__all__ = ["Confusion"]


class Confusion(Rule):
    """Fires when the confusion matrix of the latest `samples` labels is poor. conf[label][prediction] counts the
    (label, prediction) pairs over `category_no` classes (default: largest label or prediction + 1). Each column
    (one predicted class) is normalised to sum 1 (inferred: the spec and the tests point to column normalisation;
    AWS's formula has a typo); the rule fires if a diagonal entry is < `min_diag` or an off-diagonal entry is >
    `max_off_diag`. Columns with fewer than 10 predictions are not judged.

    Method: the pairs of each mode (TRAIN, EVAL, PREDICT) are pooled on their own; once a mode has `samples` pairs
    beyond its first `samples` (a warm-up: a model's first guesses are not its verdict), every saved step of that
    mode judges the latest `samples` pairs (smdebug judged each step's batch from step 0, so every model fired
    while it learnt). Defaults min_diag 0.5 and max_off_diag 0.5 (smdebug's 0.9 and 0.1 fired on every healthy
    model below 90% precision per class): a predicted class that is mostly wrong, or mostly one other class.

    Tensors: `labels` / `predictions` when tensors of those names exist, else the tensors of
    `labels_collection` / `predictions_collection`, else tensors whose names contain `labels` / `predictions`
    (paired in name order). Probability-vector predictions are reduced with argmax. A job that never had
    2 * `samples` pairs in one mode is NoData."""

    description = "The confusion matrix is poor: a predicted class is mostly wrong or mostly one other class."
    compares = ("per mode, the column-normalised confusion matrix of the latest `samples` labels and predictions "
                "(after the first `samples`) with min_diag and max_off_diag")
    count_empty_steps = False
    needs = "2 * samples saved labels with their predictions in one mode (the first samples are a warm-up)"
    #: columns with fewer predictions are not judged
    MIN_COLUMN = 10

    def __init__(self, base_trial: Any, category_no: int | str | None = None, labels: str = "labels",
                 predictions: str = "predictions", labels_collection: str = "labels",
                 predictions_collection: str = "predictions", min_diag: float | str = 0.5,
                 max_off_diag: float | str = 0.5, samples: int | str = 500, *, action_str: str = "",
                 actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.category_no = as_int(category_no, "category_no", n, optional=True, minimum=2)
        self.labels = as_str(labels, "labels", n)
        self.predictions = as_str(predictions, "predictions", n)
        self.labels_collection = as_str(labels_collection, "labels_collection", n)
        self.predictions_collection = as_str(predictions_collection, "predictions_collection", n)
        self.min_diag = as_float(min_diag, "min_diag", n, minimum=0.0, maximum=1.0)
        self.max_off_diag = as_float(max_off_diag, "max_off_diag", n, minimum=0.0, maximum=1.0)
        self.samples = as_int(samples, "samples", n, minimum=1)
        self.set_parameters(category_no=self.category_no, labels=self.labels, predictions=self.predictions,
                            labels_collection=self.labels_collection,
                            predictions_collection=self.predictions_collection, min_diag=self.min_diag,
                            max_off_diag=self.max_off_diag, samples=self.samples)
        # per mode: [pairs seen, latest (labels, predictions) arrays, their count]
        self._pool: dict[Any, list[Any]] = {}
        self.report.judged = 0

    def _names(self, exact: str, coll: str) -> list[str]:
        t = self.base_trial
        if t.has_tensor(exact):
            return [exact]
        names = self.select([coll])
        return names if names else self.select(regex=[re.escape(exact)])

    def invoke_at_step(self, step: int) -> bool:
        ls = self._names(self.labels, self.labels_collection)
        ps = self._names(self.predictions, self.predictions_collection)
        pool = self._pool.setdefault(self.data().mode_of(step), [0, [], 0])
        got = False
        for ln, pn in zip(ls, ps, strict=False):
            y, p = self.raw(ln, step), self.raw(pn, step)
            if y is None or p is None:
                continue
            try:
                y, p, k_pred = class_ids(y, p, argmax=False)
            except ValueError as e:
                self.report.warn(f"{ln}/{pn}: {e}")
                continue
            if not y.size:
                continue
            got = True
            pool[0] += y.size
            pool[1].append((y, p, k_pred))
            pool[2] += y.size
            while pool[2] - pool[1][0][0].size >= self.samples:
                pool[2] -= pool[1].pop(0)[0].size
        if not got or pool[0] < 2 * self.samples:
            return False
        self.report.judged += 1
        y = np.concatenate([a for a, _, _ in pool[1]])
        p = np.concatenate([b for _, b, _ in pool[1]])
        k_pred = max((k for _, _, k in pool[1] if k), default=None)
        k = self.category_no or k_pred or int(max(y.max(), p.max())) + 1
        ok = (y >= 0) & (y < k) & (p >= 0) & (p < k)
        conf = np.zeros((k, k))
        np.add.at(conf, (y[ok], p[ok]), 1)
        col = conf.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            norm = conf / col
        what = f"of the latest {int(ok.sum())} labels"
        for c in range(k):
            if col[c] < min(self.MIN_COLUMN, self.samples):
                continue
            if norm[c, c] < self.min_diag:
                self.violation(step, f"class {c}: only {100 * norm[c, c]:.0f}% of the {int(col[c])} predictions of "
                               f"class {c} {what} are right (min_diag {100 * self.min_diag:g}%)",
                               f"{ls[0]}|{ps[0]}", float(norm[c, c]))
            for r in range(k):
                if r != c and norm[r, c] > self.max_off_diag:
                    self.violation(step, f"label {r} predicted as {c}: {100 * norm[r, c]:.0f}% of the {int(col[c])} "
                                   f"predictions of class {c} {what} are label {r} (max_off_diag "
                                   f"{100 * self.max_off_diag:g}%)", f"{ls[0]}|{ps[0]}", float(norm[r, c]))
        return bool(self._violations)
