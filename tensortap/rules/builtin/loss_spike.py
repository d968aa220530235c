"""LossSpike."""

from __future__ import annotations

from typing import Any

from tensortap import modes as _modes
from tensortap.analysis.spikes import SpikeDetector, attribute_all
from tensortap.rules.builtin._norms import L2, GradNorms, LateSteps, OutputKurtosis
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_float, as_int, as_mode, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["LossSpike", "describe_movers"]


def describe_movers(movers: list[Any]) -> str:
    """'; moved first: the gradient norm of gradient/fc3.weight (x41 at step 118), the activation kurtosis of
    fc2_output_0 (x9 at step 117), ...' or ''."""
    if not movers:
        return ""
    parts = []
    for m in movers:
        how = "non-finite" if m.ratio == float("inf") else f"x{m.ratio:.3g}"
        parts.append(f"the {m.statistic} of {m.tensor} ({how} at step {m.step})")
    return "; moved first: " + ", ".join(parts)


class LossSpike(Rule):
    """Fires at a saved step where a loss spikes: against the last `window` saved values of that loss (at least
    `min_history`), its robust z-score (of the log, the spread a median absolute deviation) is above `z_threshold`
    and it is more than `min_ratio` times their median; or it is more than `max_factor` times the largest loss seen
    before (Megatron-LM's check). The message names the layers whose gradient norm moved first (when the job saved
    gradients), or whose output's kurtosis did (the flight recorder's full statistics). Steps of `mode` (default:
    TRAIN and steps saved without a mode); the first worker's values (RankDivergence compares workers). Steps
    written after the rule passed them (the flight recorder's ring) are judged, in order, at the next step it is
    invoked at."""

    description = ("A loss spikes: robust z-score of its log over a trailing window and a ratio to the window's "
                   "median, or more than max_factor x the largest loss seen.")
    compares = ("each saved loss with the median and median absolute deviation of the last `window` saved values "
                "(in log), and with the largest value before it")
    count_empty_steps = False
    needs = "losses: more than `min_history` finite saved values of one mode"

    def __init__(self, base_trial: Any, tensor_regex: Any = None, mode: Any = None, window: int | str = 50,
                 z_threshold: float | str = 6.0, min_ratio: float | str = 2.0, max_factor: float | str = 10.0,
                 min_history: int | str = 10, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.mode = as_mode(mode, "mode", n)
        self.window = as_int(window, "window", n, minimum=3)
        self.z_threshold = as_float(z_threshold, "z_threshold", n, minimum=0.0)
        self.min_ratio = as_float(min_ratio, "min_ratio", n, minimum=1.0)
        self.max_factor = as_float(max_factor, "max_factor", n, minimum=1.0)
        self.min_history = as_int(min_history, "min_history", n, minimum=1)
        self.set_parameters(tensor_regex=self.tensor_regex, mode=self.mode, window=self.window,
                            z_threshold=self.z_threshold, min_ratio=self.min_ratio, max_factor=self.max_factor,
                            min_history=self.min_history)
        self._detectors: dict[str, SpikeDetector] = {}
        self._grads = GradNorms(self)
        self._kurtosis = OutputKurtosis(self)
        self._late = LateSteps(self.base_trial)
        self.report.judged = 0

    def _judged_mode(self, step: int) -> bool:
        m = self.base_trial.mode(step)
        if self.mode is None:
            return m is None or m in (_modes.TRAIN, _modes.GLOBAL)
        return m == self.mode

    def invoke_at_step(self, step: int) -> bool:
        for s in self._late.upto(step):
            if self._judged_mode(s):
                self._judge(s)
        return bool(self._violations)

    def _judge(self, step: int) -> None:
        self._grads.read(step)
        self._kurtosis.read(step)
        names = self.select([] if self.tensor_regex else ["losses"], self.tensor_regex)
        for name in names:
            det = self._detectors.get(name)
            if det is None:
                det = self._detectors[name] = SpikeDetector(self.window, self.z_threshold, self.min_ratio,
                                                            self.max_factor, self.min_history)
            v = self.stat(name, step, MEAN)
            if v is None and not det.has_nonpositive:
                # a step only the flight recorder's ring has: its l2 is |loss|, the loss itself while it is > 0
                v = self.stat(name, step, L2)
            if v is None:
                continue
            sp = det.add(step, float(v))
            self.report.judged = sum(d.judged for d in self._detectors.values())
            if sp is None:
                continue
            sp.movers = attribute_all(step, self._grads.layers, self._kurtosis.layers, since=sp.previous_step,
                                      window=self.window)
            self.violation(step, "the loss spiked: " + sp.describe("loss") + describe_movers(sp.movers), name,
                           sp.value)
