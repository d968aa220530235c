"""GradNormSpike."""

from __future__ import annotations

import math
from typing import Any

from tensortap import modes as _modes
from tensortap.analysis.spikes import SpikeDetector, attribute_all
from tensortap.rules.builtin._norms import GradNorms, LateSteps, OutputKurtosis
from tensortap.rules.builtin.loss_spike import describe_movers
from tensortap.rules.params import as_float, as_int, as_str
from tensortap.rules.rule import Rule

__all__ = ["GradNormSpike"]


class GradNormSpike(Rule):
    """Fires at a saved TRAIN step where the total gradient norm (the L2 norm of every tensor of `collection_name`
    taken together, what gradient clipping measures) spikes, judged as LossSpike judges a loss: robust z-score of
    its log over the last `window` saved values above `z_threshold` and more than `min_ratio` times their median, or
    more than `max_factor` times the largest norm before. The message names the layers whose norm, or whose output's
    kurtosis (the flight recorder's full statistics), moved first. A step where some gradient seen before has no
    norm is not judged. Steps written after the rule passed them (the flight recorder's ring) are judged, in order,
    at the next step it is invoked at."""

    description = ("The total gradient norm spikes: robust z-score of its log over a trailing window and a ratio "
                   "to the window's median, or more than max_factor x the largest norm seen.")
    compares = ("the total L2 norm of the gradients at each saved TRAIN step with the median and median absolute "
                "deviation of the last `window` (in log), and with the largest norm before it")
    count_empty_steps = False
    needs = "gradients at more than `min_history` saved TRAIN steps"

    def __init__(self, base_trial: Any, collection_name: str = "gradients", window: int | str = 50,
                 z_threshold: float | str = 6.0, min_ratio: float | str = 2.0, max_factor: float | str = 10.0,
                 min_history: int | str = 10, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_name = as_str(collection_name, "collection_name", n)
        self.window = as_int(window, "window", n, minimum=3)
        self.z_threshold = as_float(z_threshold, "z_threshold", n, minimum=0.0)
        self.min_ratio = as_float(min_ratio, "min_ratio", n, minimum=1.0)
        self.max_factor = as_float(max_factor, "max_factor", n, minimum=1.0)
        self.min_history = as_int(min_history, "min_history", n, minimum=1)
        self.set_parameters(collection_name=self.collection_name, window=self.window, z_threshold=self.z_threshold,
                            min_ratio=self.min_ratio, max_factor=self.max_factor, min_history=self.min_history)
        self._det = SpikeDetector(self.window, self.z_threshold, self.min_ratio, self.max_factor, self.min_history)
        self._grads = GradNorms(self, self.collection_name)
        self._kurtosis = OutputKurtosis(self)
        self._late = LateSteps(self.base_trial)
        self.report.judged = 0

    def invoke_at_step(self, step: int) -> bool:
        for s in self._late.upto(step):
            if self.base_trial.mode(s) in (None, _modes.TRAIN, _modes.GLOBAL):
                self._judge(s)
        return bool(self._violations)

    def _judge(self, step: int) -> None:
        total = self._grads.read(step)
        self._kurtosis.read(step)
        if total is None or not math.isfinite(total):
            return
        sp = self._det.add(step, total)
        self.report.judged = self._det.judged
        if sp is None:
            return
        sp.movers = attribute_all(step, self._grads.layers, self._kurtosis.layers, since=sp.previous_step,
                                  window=self.window)
        self.violation(step, "the gradient norm spiked: " + sp.describe("total gradient norm")
                       + describe_movers(sp.movers), None, sp.value)
