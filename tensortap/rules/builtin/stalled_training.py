"""StalledTrainingRule."""

from __future__ import annotations

import time
from typing import Any

from tensortap.exceptions import StepNotYetAvailable
from tensortap.rules.actions.stop import StopTraining
from tensortap.rules.params import as_bool, as_float, as_str
from tensortap.rules.report import Verdict, Violation
from tensortap.rules.rule import Rule
from tensortap.trials.state import StepState

__all__ = ["StalledTrainingRule"]


class StalledTrainingRule(Rule):
    """Fires when the job has made no progress for `threshold` seconds: nothing new was written (no tensor,
    no finished step) while the job has not ended. Waits for each step for at most that long, then fires and
    ends the evaluation (end_of_rule). With `stop_training_on_fire`, a StopTraining action on the job's
    out_dir is added (locally the out_dir identifies the job; `training_job_name_prefix` is recorded only).
    A finished job never counts as stalled."""

    description = "Training stalls: no new data for threshold seconds (optionally stops the job)."
    compares = 'the time since the job last wrote data with threshold (seconds)'
    count_empty_steps = False

    #: how often (s) a waiting evaluation looks for progress
    poll_interval = 0.5

    def __init__(self, base_trial: Any, threshold: float | str = 1800, stop_training_on_fire: bool | str = False,
                 training_job_name_prefix: str | None = None, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.threshold = as_float(threshold, "threshold", n, minimum=0.0)
        self.stop_training_on_fire = as_bool(stop_training_on_fire, "stop_training_on_fire", n)
        self.training_job_name_prefix = as_str(training_job_name_prefix, "training_job_name_prefix", n,
                                               optional=True)
        self.set_parameters(threshold=self.threshold, stop_training_on_fire=self.stop_training_on_fire,
                            training_job_name_prefix=self.training_job_name_prefix)
        if self.stop_training_on_fire:
            a = StopTraining(training_job_prefix=self.training_job_name_prefix)
            a.bind(self)
            self._actions.actions.append(a)
        self._sig: tuple | None = None
        self._since = time.monotonic()

    def _progress(self) -> None:
        t = self.base_trial
        sig = (t.generation, t.complete_upto(), len(t.workers()))
        if sig != self._sig:
            self._sig = sig
            self._since = time.monotonic()

    def invoke_at_step(self, step: int) -> bool:  # pragma: no cover - invoke() is overridden
        return False

    def _progressed(self, step: int) -> None:
        self._violations, self._datapoints = [], 1
        self.record(step, Verdict(False))

    def invoke(self, step: int) -> None:
        t = self.base_trial
        while True:
            t.refresh_data()
            self._progress()
            if t.has_passed_step(step) == StepState.AVAILABLE or t.loaded_all_steps:
                # a step that exists, or a finished job: wait_for_steps returns or raises
                # StepUnavailable / NoMoreData at once
                t.wait_for_steps([step], timeout=0)
                return self._progressed(step)
            idle = time.monotonic() - self._since
            if idle >= self.threshold:
                self._violations = []
                self._datapoints = 1
                v = Violation(step, f"no new data for {idle:.1f} s (threshold {self.threshold:g} s) while waiting "
                              f"for step {step}", None, round(idle, 3))
                self.record(step, Verdict(True, [v], end_of_rule=True))
                return
            try:
                t.wait_for_steps([step], timeout=min(self.poll_interval, self.threshold - idle))
                return self._progressed(step)
            except StepNotYetAvailable:
                continue
