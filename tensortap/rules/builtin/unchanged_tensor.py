"""UnchangedTensor."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.rules._data import Stat
from tensortap.rules.params import as_bool, as_float, as_int, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["UnchangedTensor"]


class UnchangedTensor(Rule):
    """Fires at a step s where a tensor of `collection_names` / matching `tensor_regex` (the `weights` collection
    when neither is given, as the rule's config saves) has not changed over its last `num_steps` saved steps up
    to s (which need not be consecutive): every consecutive pair is `np.allclose(rtol, atol, equal_nan)`.
    Only TRAIN steps are judged when the job has any: nothing trains in EVAL, so weights saved there are
    rightly unchanged (smdebug compared every saved step, evaluations included, and judged every tensor)."""

    description = "Tensors stop changing: allclose over the last num_steps saved TRAIN steps (weights by default)."
    compares = "each tensor with itself at its last num_steps saved TRAIN steps (np.allclose, rtol/atol)"
    count_empty_steps = False

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 num_steps: int | str = 3, rtol: float | str = 1e-05, atol: float | str = 1e-08,
                 equal_nan: bool | str = False, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.num_steps = as_int(num_steps, "num_steps", n, minimum=2)
        self.rtol = as_float(rtol, "rtol", n, minimum=0.0)
        self.atol = as_float(atol, "atol", n, minimum=0.0)
        self.equal_nan = as_bool(equal_nan, "equal_nan", n)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            num_steps=self.num_steps, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
        k, rtol_, atol_, en = self.num_steps - 1, self.rtol, self.atol, self.equal_nan

        def fn(rows: np.ndarray) -> np.ndarray:
            r = np.asarray(rows)
            m = r.shape[0]
            x = r.reshape(m, -1)
            close = np.zeros(m, dtype=np.int64)
            if m > 1:
                if x.dtype.kind in "biufc":
                    c = np.isclose(x[1:], x[:-1], rtol=rtol_, atol=atol_, equal_nan=en).all(axis=1)
                else:
                    c = (x[1:] == x[:-1]).all(axis=1)
                close[1:] = c
            cs = np.concatenate([[0], np.cumsum(close)])
            out = np.zeros(m)
            idx = np.arange(m)
            ok = idx >= k
            out[ok] = (cs[idx[ok] + 1] - cs[idx[ok] + 1 - k]) == k
            return out

        self._fn = fn
        self._stats: dict[Any, Stat] = {}
        self._colls = self.collection_names or ([] if self.tensor_regex else ["weights"])

    def _stat(self, mode: Any) -> Stat:
        st = self._stats.get(mode)
        if st is None:
            st = self._stats[mode] = Stat(f"unchanged:{self.num_steps - 1}:{self.rtol!r}:{self.atol!r}:"
                                          f"{self.equal_nan}:{mode}", self._fn, window=self.num_steps, mode=mode)
        return st

    def invoke_at_step(self, step: int) -> bool:
        mode = _modes.TRAIN if _modes.TRAIN in self.base_trial.modes() else None
        if mode is not None and self.data().mode_of(step) != mode.value:
            return False
        for name in self.select(self._colls, self.tensor_regex):
            v = self.stat(name, step, self._stat(mode))
            if v:
                self.violation(step, f"unchanged over its last {self.num_steps} saved "
                               f"{'TRAIN ' if mode is not None else ''}steps (np.allclose, rtol={self.rtol:g}, "
                               f"atol={self.atol:g})", name, True)
        return bool(self._violations)
