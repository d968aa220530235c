"""SHAP values of the training data at each saving round, without recomputing the whole ensemble each time.

XGBoost's SHAP values (`predict(pred_contribs=True)`) are sums over the trees, and its cost grows with the
number of trees, so asking for them every round costs O(rounds²). For a tree booster (gbtree) the values of
round n are the values of the last saving round plus those of the trees added since (XGBoost computes
contributions of a slice of rounds, `model[a:b]`), except that every call adds the model's base value to the
bias column once: it is found once from three one- and two-round slices, then removed from each slice.
The first saving round of a training takes XGBoost's own full values; later ones differ from them only by
float32 rounding (the sum runs in float64 in a different order). dart (whose tree weights change) and
gblinear boosters, a new model or new data always take the full values.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import numpy as np

__all__ = ["ShapValues"]


class ShapValues:
    def __init__(self) -> None:
        self._model: weakref.ref | None = None
        self._data: weakref.ref | None = None
        self._gbtree = False
        self._rounds = 0
        self._acc: np.ndarray | None = None  # float64 values of `_rounds` rounds
        self._base: np.ndarray | None = None  # what each slice's bias column has on top of its trees'

    def values(self, model: Any, data: Any) -> np.ndarray:
        """`model.predict(data, pred_contribs=True)` of the model as it is now."""
        n = model.num_boosted_rounds()
        same = (self._model is not None and self._model() is model and self._data is not None
                and self._data() is data and n > self._rounds and self._acc is not None)
        if not same:
            self._model, self._data = weakref.ref(model), weakref.ref(data)
            self._gbtree = _booster_name(model) == "gbtree"
            return self._full(model, data, n)
        if not self._gbtree:
            return self._full(model, data, n)
        part = model[self._rounds:n].predict(data, pred_contribs=True)
        if self._base is None:
            self._base = _base(model, data)
        acc = self._acc
        acc += part
        acc[..., -1] -= self._base
        self._rounds = n
        return acc.astype(np.float32)

    def _full(self, model: Any, data: Any, n: int) -> np.ndarray:
        full = model.predict(data, pred_contribs=True)
        self._acc, self._rounds, self._base = full.astype(np.float64), n, None
        return full


def _base(model: Any, data: Any) -> np.ndarray:
    """What every `pred_contribs` call adds to the bias column besides its trees' expected values (the base
    score or base margin): rounds 0 and 1 apart hold it twice, together once."""
    def bias(a: int, b: int) -> np.ndarray:
        return model[a:b].predict(data, pred_contribs=True)[..., -1].astype(np.float64)

    return bias(0, 1) + bias(1, 2) - bias(0, 2)


def _booster_name(model: Any) -> str:
    try:
        return json.loads(model.save_config())["learner"]["gradient_booster"]["name"]
    except Exception:  # noqa: BLE001 - unknown: take the full values every time
        return ""
