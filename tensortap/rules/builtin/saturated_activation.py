"""SaturatedActivation."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.collection import CollectionKeys
from tensortap.rules._data import Stat
from tensortap.rules.builtin._stats import unit_inactive_pct
from tensortap.rules.params import as_float, as_float_pair, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["SaturatedActivation"]

TANH_INPUT, SIGMOID_INPUT = CollectionKeys.TANH_INPUT, CollectionKeys.SIGMOID_INPUT


class SaturatedActivation(Rule):
    """Fires at a step where more than `threshold_layer` percent of the units of a tanh or sigmoid layer are
    saturated. Tensors: the inputs of the activations: the `tanh_input` and `sigmoid_input` collections (framework
    hooks put the inputs of their tanh / sigmoid layers there, found by the layer's type), plus
    `collection_names` and names matching `tensor_regex` (smdebug's default `.*tanh_input|.*sigmoid_input`). A
    tensor of `tanh_input` is judged against `threshold_tanh`, one of `sigmoid_input` against
    `threshold_sigmoid`; any other by its name ("tanh" or "sigmoid" in it). A unit is
    saturated when its input lies inside the (low, high) range for less than `threshold_inactivity` percent of
    the batch (axis 0 of an input with 2+ axes)."""

    description = "tanh/sigmoid activations saturate: too many units have inputs outside the active range."
    compares = ('per tanh/sigmoid input: the % of units inside the active range for less than threshold_inactivity % '
                'of the batch, with threshold_layer')
    count_empty_steps = False

    def __init__(self, base_trial: Any, collection_names: Any = None,
                 tensor_regex: Any = ".*tanh_input|.*sigmoid_input",
                 threshold_tanh: Any = (-9.4999, 9.4999), threshold_sigmoid: Any = (-23, 16.99999),
                 threshold_inactivity: float | str = 1.0, threshold_layer: float | str = 50.0, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.threshold_tanh = as_float_pair(threshold_tanh, "threshold_tanh", n)
        self.threshold_sigmoid = as_float_pair(threshold_sigmoid, "threshold_sigmoid", n)
        self.threshold_inactivity = as_float(threshold_inactivity, "threshold_inactivity", n, minimum=0.0,
                                             maximum=100.0)
        self.threshold_layer = as_float(threshold_layer, "threshold_layer", n, minimum=0.0, maximum=100.0)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            threshold_tanh=self.threshold_tanh, threshold_sigmoid=self.threshold_sigmoid,
                            threshold_inactivity=self.threshold_inactivity, threshold_layer=self.threshold_layer)
        self._stats = {kind: self._make(kind, rng) for kind, rng in
                       (("tanh", self.threshold_tanh), ("sigmoid", self.threshold_sigmoid))}

    def _make(self, kind: str, rng: tuple[float, float]) -> Stat:
        lo, hi = rng
        return Stat(f"saturated:{kind}:{lo!r}:{hi!r}:{self.threshold_inactivity!r}",
                    unit_inactive_pct(lambda x: (x >= lo) & (x <= hi) & ~np.isnan(x), self.threshold_inactivity))

    def invoke_at_step(self, step: int) -> bool:
        tanh = set(self.select([TANH_INPUT]))
        sigmoid = set(self.select([SIGMOID_INPUT]))
        for name in sorted(set(self.select(self.collection_names, self.tensor_regex)) | tanh | sigmoid):
            low = name.lower()
            kind = ("tanh" if name in tanh else "sigmoid" if name in sigmoid
                    else "tanh" if "tanh" in low else "sigmoid" if "sigmoid" in low else None)
            if kind is None:
                self.report.warn(f"{name}: in neither tanh_input nor sigmoid_input, and neither tanh nor sigmoid in "
                                 f"the name; not judged")
                continue
            pct = self.stat(name, step, self._stats[kind])
            if pct is not None and pct == pct and pct > self.threshold_layer:
                self.violation(step, f"{pct:.3g}% of the {kind} units are saturated (> {self.threshold_layer:g}%)",
                               name, pct)
        return bool(self._violations)
