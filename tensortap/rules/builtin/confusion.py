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
    """Fires at a step whose confusion matrix is poor. conf[label][prediction] counts the step's
    (label, prediction) pairs over `category_no` classes (default: largest label or prediction + 1).
    Each column (one predicted class) is normalised to sum 1 (inferred: the spec and the tests point to
    column normalisation; AWS's formula has a typo); the rule fires if a diagonal entry is < `min_diag` or an
    off-diagonal entry is > `max_off_diag`. Columns with no predictions are not judged.

    Tensors: `labels` / `predictions` when tensors of those names exist, else the tensors of
    `labels_collection` / `predictions_collection`, else tensors whose names contain `labels` / `predictions`
    (paired in name order). Probability-vector predictions are reduced with argmax."""

    description = "The confusion matrix is poor: a normalised diagonal < min_diag or off-diagonal > max_off_diag."
    count_empty_steps = False

    def __init__(self, base_trial: Any, category_no: int | str | None = None, labels: str = "labels",
                 predictions: str = "predictions", labels_collection: str = "labels",
                 predictions_collection: str = "predictions", min_diag: float | str = 0.9,
                 max_off_diag: float | str = 0.1, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.category_no = as_int(category_no, "category_no", n, optional=True, minimum=2)
        self.labels = as_str(labels, "labels", n)
        self.predictions = as_str(predictions, "predictions", n)
        self.labels_collection = as_str(labels_collection, "labels_collection", n)
        self.predictions_collection = as_str(predictions_collection, "predictions_collection", n)
        self.min_diag = as_float(min_diag, "min_diag", n, minimum=0.0, maximum=1.0)
        self.max_off_diag = as_float(max_off_diag, "max_off_diag", n, minimum=0.0, maximum=1.0)
        self.set_parameters(category_no=self.category_no, labels=self.labels, predictions=self.predictions,
                            labels_collection=self.labels_collection,
                            predictions_collection=self.predictions_collection, min_diag=self.min_diag,
                            max_off_diag=self.max_off_diag)

    def _names(self, exact: str, coll: str) -> list[str]:
        t = self.base_trial
        if t.has_tensor(exact):
            return [exact]
        names = self.select([coll])
        return names if names else self.select(regex=[re.escape(exact)])

    def invoke_at_step(self, step: int) -> bool:
        ls = self._names(self.labels, self.labels_collection)
        ps = self._names(self.predictions, self.predictions_collection)
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
            k = self.category_no or k_pred or int(max(y.max(), p.max())) + 1
            ok = (y >= 0) & (y < k) & (p >= 0) & (p < k)
            conf = np.zeros((k, k))
            np.add.at(conf, (y[ok], p[ok]), 1)
            col = conf.sum(axis=0)
            with np.errstate(invalid="ignore", divide="ignore"):
                norm = conf / col
            for c in range(k):
                if col[c] == 0:
                    continue
                if norm[c, c] < self.min_diag:
                    self.violation(step, f"class {c}: normalised diagonal {norm[c, c]:.3g} < min_diag "
                                   f"{self.min_diag:g}", f"{ln}|{pn}", float(norm[c, c]))
                off = [(r, norm[r, c]) for r in range(k) if r != c and norm[r, c] > self.max_off_diag]
                for r, v in off:
                    self.violation(step, f"label {r} predicted as {c}: normalised {v:.3g} > max_off_diag "
                                   f"{self.max_off_diag:g}", f"{ln}|{pn}", float(v))
        return bool(self._violations)
