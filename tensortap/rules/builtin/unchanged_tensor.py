"""UnchangedTensor."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.rules._data import Stat
from tensortap.rules.params import as_bool, as_float, as_int, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["UnchangedTensor"]


class UnchangedTensor(Rule):
    """Fires at a step s where a tensor of `collection_names` / matching `tensor_regex` (every tensor when
    neither is given) has not changed over its last `num_steps` saved steps up to s (which need not be
    consecutive): every consecutive pair is `np.allclose(rtol, atol, equal_nan)`."""

    description = "Tensors stop changing: allclose over the last num_steps saved steps."
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

        self._stat = Stat(f"unchanged:{k}:{rtol_!r}:{atol_!r}:{en}", fn, window=self.num_steps)

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(self.collection_names, self.tensor_regex, all_if_empty=True):
            v = self.stat(name, step, self._stat)
            if v:
                self.violation(step, f"unchanged (allclose rtol={self.rtol:g}, atol={self.atol:g}) over its last "
                               f"{self.num_steps} saved steps", name, True)
        return bool(self._violations)
