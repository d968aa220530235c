"""The StopTraining rule action: asks the job its rule watches to stop (the protocol is
`tensortap.format.control`'s, re-exported here for the names rules and scripts already use)."""

from __future__ import annotations

import logging
from typing import Any

from tensortap.format.control import (
    STOP_EXIT_CODE,
    STOP_KEY,
    StopSignal,
    TrainingStopped,
    check_stop,
    clear_stop_request,
    request_stop,
    stop_requested,
)
from tensortap.rules.actions.base import Action

logger = logging.getLogger("tensortap")

__all__ = [
    "STOP_KEY",
    "STOP_EXIT_CODE",
    "TrainingStopped",
    "StopSignal",
    "StopTraining",
    "request_stop",
    "stop_requested",
    "clear_stop_request",
    "check_stop",
]


class StopTraining(Action):
    """Stop the training job this rule watches: writes the stop request into the job's out_dir (default:
    the rule's base trial path). The job's hook ends training at its next step boundary (see the module
    docstring). `training_job_prefix` is SageMaker's way of naming the job; it is kept in the request for
    information only, since the out_dir identifies the job locally. A job that has ended (the rule's trial
    says so, e.g. an offline evaluation of a finished job) has nothing to stop: nothing is written into it
    and `skipped` counts such firings."""

    name = "stoptraining"

    def __init__(self, out_dir: str | None = None, training_job_prefix: str | None = None,
                 max_calls: int | None = None):
        super().__init__(max_calls)
        self.out_dir = out_dir
        self.training_job_prefix = training_job_prefix
        self.location: str | None = None
        self.skipped = 0

    def _job_ended(self) -> bool:
        trial = getattr(self.rule, "base_trial", None)
        if trial is None or str(trial.path).rstrip("/") != str(self.out_dir).rstrip("/"):
            return False
        try:
            trial.refresh_data()
            return bool(trial.loaded_all_steps)
        except Exception:  # noqa: BLE001 - when in doubt, ask the job to stop
            return False

    def bind(self, rule: Any) -> None:
        super().bind(rule)
        if self.out_dir is None and rule is not None:
            self.out_dir = rule.base_trial.path

    def run(self, report: dict[str, Any]) -> None:
        if not self.out_dir:
            raise RuntimeError("StopTraining has no out_dir: give one or attach the action to a rule")
        if self._job_ended():
            if not self.skipped:
                logger.info("tensortap: %s fired on a job that has ended: no stop request written",
                            report.get("rule"))
            self.skipped += 1
            return
        ev = report.get("event", {})
        vs = ev.get("violations", [])
        reason = "; ".join(f"{v.get('tensor') or '-'}: {v.get('condition')}" for v in vs[:3])
        if self.training_job_prefix:
            reason = f"{reason} [job prefix {self.training_job_prefix}]".strip()
        self.location = request_stop(self.out_dir, rule=report.get("rule"), step=ev.get("step"), reason=reason,
                                     report=report)

    def __repr__(self) -> str:
        return f"<StopTraining {self.out_dir}>"
