"""TreeDepth (XGBoost)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensortap.rules.params import as_int
from tensortap.rules.rule import Rule

__all__ = ["TreeDepth"]


class TreeDepth(Rule):
    """Fires at a step where the XGBoost trees are deeper than `depth`. The measured depth is
    floor(log2(largest node id + 1)) over the `trees/Node` tensor (XGBoost numbers nodes breadth first, so
    this is the depth of the deepest node; AWS: "the base 2 logarithm of the largest node ID").
    Direction inferred (the spec marks it so): the rule fires when the measured depth is greater than `depth`,
    which is what the reference integration cases expect (max_depth=100 fires, max_depth=4 does not).
    The default `depth` is 6, XGBoost's own default max_depth (smdebug's 4 fired on every job left at XGBoost's
    defaults)."""

    description = "XGBoost trees grow deeper than depth (default 6, XGBoost's own default max_depth)."
    compares = "floor(log2(largest node id + 1)) of the trees at each saved round with depth"
    count_empty_steps = False

    def __init__(self, base_trial: Any, depth: int | str = 6, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        self.depth = as_int(depth, "depth", self.rule_name, minimum=0)
        self.set_parameters(depth=self.depth)

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(regex=[r"(^|/)trees/Node$"]):
            v = self.raw(name, step)
            if v is None:
                continue
            ids = np.asarray(v, dtype=np.float64).reshape(-1)
            ids = ids[np.isfinite(ids)]
            if not ids.size:
                continue
            largest = int(ids.max())
            measured = int(math.floor(math.log2(largest + 1))) if largest >= 0 else 0
            if measured > self.depth:
                self.violation(step, f"the trees are {measured} levels deep (largest node id {largest}), deeper than "
                               f"depth={self.depth}",
                               name, measured)
        return bool(self._violations)
