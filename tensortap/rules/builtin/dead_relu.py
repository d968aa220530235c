"""DeadRelu."""

from __future__ import annotations

from typing import Any

from tensortap.collection import CollectionKeys
from tensortap.rules._data import Stat
from tensortap.rules.builtin._stats import unit_inactive_pct
from tensortap.rules.params import as_float, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["DeadRelu"]

RELU_OUTPUT = CollectionKeys.RELU_OUTPUT


class DeadRelu(Rule):
    """Fires at a step where, in a ReLU output tensor, more than `threshold_layer` percent of the units are
    dead: active (output > 0) for less than
    `threshold_inactivity` percent of the batch. Axis 0 of an output with 2+ axes is the batch; every other
    element is a unit. Tensors: by default the `relu_output` collection (framework hooks put the outputs of
    their ReLU layers there, found by the layer's type) and, as a fallback, names matching `.*relu_output`
    (smdebug's default); with `tensor_regex`, the names matching it."""

    description = "ReLUs die: too many units of a layer are (almost) never active."
    compares = ('per ReLU output: the % of units active in less than threshold_inactivity % of the batch, with '
                'threshold_layer')
    count_empty_steps = False

    def __init__(self, base_trial: Any, tensor_regex: Any = None, threshold_inactivity: float | str = 1.0,
                 threshold_layer: float | str = 50.0, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n) or [".*relu_output"]
        self.collection_names = [] if tensor_regex else [RELU_OUTPUT]
        self.threshold_inactivity = as_float(threshold_inactivity, "threshold_inactivity", n, minimum=0.0,
                                             maximum=100.0)
        self.threshold_layer = as_float(threshold_layer, "threshold_layer", n, minimum=0.0, maximum=100.0)
        self.set_parameters(tensor_regex=self.tensor_regex, collection_names=self.collection_names,
                            threshold_inactivity=self.threshold_inactivity,
                            threshold_layer=self.threshold_layer)
        self._stat = Stat(f"dead_pct:{self.threshold_inactivity!r}",
                          unit_inactive_pct(lambda x: x > 0, self.threshold_inactivity))

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(self.collection_names, self.tensor_regex):
            pct = self.stat(name, step, self._stat)
            if pct is not None and pct == pct and pct > self.threshold_layer:
                self.violation(step, f"{pct:.3g}% of the units are dead (> {self.threshold_layer:g}%)", name, pct)
        return bool(self._violations)
