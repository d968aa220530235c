"""PoorWeightInitialization."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.collection import CollectionKeys
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["PoorWeightInitialization"]


class PoorWeightInitialization(Rule):
    """Judges the first `steps` saved steps of the job; fires at one of them if
    * the activation inputs (tensors matching `activation_inputs_regex`, one per layer; with the default
      regex also the `relu_input` collection, which framework hooks fill by layer type) have variances whose
      max / min across layers exceeds `threshold`; or
    * the gradients (all values of the `gradients` collection at the step, pooled) have a spread between their
      5th and 95th percentiles below `distribution_range` (inferred: pooled over the step's gradients, since
      AWS's "minimum difference between 5th and 95th percentiles of the gradient distribution" names no
      grouping); or
    * a training loss (`losses` collection, not EVAL or PREDICT steps) has not moved over the first `steps` saved
      steps: at the last of them,
      the median of its last `patience` values is not below the median of its first `patience` values (smdebug
      compared each single noisy value with the best one, which a healthy mini-batch loss fails by chance).

    The default `threshold` is 1000, not smdebug's 10: PyTorch's and Keras's default initialisations already
    shrink the activation variance several-fold per layer, so a healthy 4-layer MLP has a ratio of ~30, while a
    poor initialisation gives ratios of 1e4 and more."""

    description = "Poor initialisation: layer variances mismatch, gradients collapse, or the loss does not move."
    compares = ("in the first `steps` saved steps: activation-input variances across layers (max / min), the "
                "5th-95th percentile spread of the gradients, the median loss of the last and first `patience`")
    count_empty_steps = False

    def __init__(self, base_trial: Any, activation_inputs_regex: Any = ".*relu_input", threshold: float | str = 1000.0,
                 distribution_range: float | str = 0.001, patience: int | str = 5, steps: int | str = 10, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.activation_inputs_regex = as_regex_list(activation_inputs_regex, "activation_inputs_regex", n)
        self._act_colls = [CollectionKeys.RELU_INPUT] if self.activation_inputs_regex == [".*relu_input"] else []
        self.threshold = as_float(threshold, "threshold", n, minimum=1.0)
        self.distribution_range = as_float(distribution_range, "distribution_range", n, minimum=0.0)
        self.patience = as_int(patience, "patience", n, minimum=1)
        self.steps = as_int(steps, "steps", n, minimum=1)
        self.set_parameters(activation_inputs_regex=self.activation_inputs_regex, threshold=self.threshold,
                            distribution_range=self.distribution_range, patience=self.patience, steps=self.steps)
        self._first: list[int] = []
        self._saw_activations = False
        self._loss: dict[str, list[float]] = {}  # the loss values of the judged steps

    def _in_first_steps(self, step: int) -> bool:
        if len(self._first) < self.steps:
            self._first = self.base_trial.steps()[: self.steps]
        return step in self._first

    def invoke_at_step(self, step: int) -> bool:
        if not self._in_first_steps(step):
            return False
        # 1. activation-input variance across layers
        if self.activation_inputs_regex:
            var = {}
            for name in self.select(self._act_colls, self.activation_inputs_regex):
                x = self.raw(name, step)  # only the first steps are judged: no whole-series statistic
                if x is not None and np.size(x):
                    self._saw_activations = True
                    v = float(np.var(np.asarray(x), dtype=np.float64))
                    if v == v:
                        var[name] = v
            if len(var) >= 2:
                hi, lo = max(var, key=var.get), min(var, key=var.get)
                ratio = float("inf") if var[lo] == 0 else var[hi] / var[lo]
                if var[hi] > 0 and ratio > self.threshold:
                    self.violation(step, f"the activation-input variance differs {ratio:.3g}-fold across layers "
                                   f"({hi}: {var[hi]:.3g} / {lo}: {var[lo]:.3g}) > {self.threshold:g}", hi, ratio)
        # 2. gradient distribution
        grads = [g for g in (self.raw(n, step) for n in self.select(["gradients"])) if g is not None]
        if grads:
            pooled = np.concatenate([np.asarray(g, dtype=np.float64).reshape(-1) for g in grads])
            pooled = pooled[np.isfinite(pooled)]
            if pooled.size:
                p5, p95 = np.percentile(pooled, [5, 95])
                if p95 - p5 < self.distribution_range:
                    self.violation(step, f"gradient p95 - p5 = {p95 - p5:.3g} < distribution_range "
                                   f"{self.distribution_range:g}", "gradients", float(p95 - p5))
        # 3. loss convergence
        mode = self.data().mode_of(step)
        for name in self.select(["losses"]) if mode not in (_modes.EVAL.value, _modes.PREDICT.value) else ():
            v = self.stat(name, step, MEAN)
            if v is None:
                continue
            vals = self._loss.setdefault(name, [])
            vals.append(float(v))
            if step != self._first[-1] or len(vals) < 2 * self.patience:
                continue
            recent, start = float(np.median(vals[-self.patience:])), float(np.median(vals[:self.patience]))
            if recent >= start:
                self.violation(step, f"the loss has not moved over the first {len(vals)} saved steps: the median "
                               f"of the last {self.patience}, {recent:.4g}, is not below the median of the first "
                               f"{self.patience}, {start:.4g}", name, recent)
        return bool(self._violations)

    def on_finish(self) -> None:
        if self.activation_inputs_regex and not self._saw_activations and self.report.steps_evaluated:
            colls = f"the {self._act_colls[0]} collection or " if self._act_colls else ""
            self.report.warn(f"no activation inputs ({colls}names matching {self.activation_inputs_regex}) were "
                             f"saved: the layer-variance check judged nothing; only gradients and losses were judged")
