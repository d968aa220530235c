"""invoke_rule: evaluate a rule at every step of its base trial, offline or while the job runs."""

from __future__ import annotations

import bisect
import logging
import time
from typing import Any

from tensortap.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from tensortap.rules.report import NO_DATA, RuleReport
from tensortap.rules.rule import Rule

__all__ = ["invoke_rule"]

logger = logging.getLogger("tensortap.rules")

#: with a report path, the report is rewritten at a firing step at most this often (s); always at the end
REPORT_WRITE_INTERVAL = 1.0


class _NextStep:
    """The next saved global step after a skipped one, from the (cached) step list of the trial."""

    def __init__(self, trial: Any):
        self.trial = trial
        self._gen = -1
        self._steps: list[int] = []

    def after(self, step: int) -> int:
        t = self.trial
        if self._gen != t.generation:
            self._steps = t.steps(show_incomplete_steps=True)
            self._gen = t.generation
        i = bisect.bisect_right(self._steps, step)
        if i < len(self._steps) and t.is_step_complete(self._steps[i]):
            return self._steps[i]
        return step + 1


def invoke_rule(
    rule_obj: Rule,
    start_step: int | None = 0,
    end_step: int | None = None,
    raise_eval_cond: bool = False,
    *,
    stop_at_job_end: bool = False,
    timeout: float | None = None,
    report_path: str | None = None,
) -> RuleReport:
    """Invoke `rule_obj` at global steps start_step, start_step+1, ... up to end_step (exclusive; None:
    forever), as smdebug does: steps and tensors that do not exist are skipped, a met condition is logged
    (re-raised with `raise_eval_cond`; the loop ends if the rule says end_of_rule).

    Differences from smdebug, all opt-in or invisible: with `stop_at_job_end`, a finished job ends the loop
    cleanly instead of raising NoMoreData; `timeout` bounds each wait for a step (StepNotYetAvailable);
    unsaved steps are skipped in one jump instead of one exception each; the report (also `rule_obj.report`)
    is returned and, with `report_path` (a file or a directory), written as JSON (`report.to_json()`;
    `report.to_dict()` is plain JSON data). `report.status` is IssuesFound, NoIssuesFound, or NoData when the
    rule evaluated no data point (`report.no_data_message()` says what it looked for and what the job has).
    """
    step = int(start_step or 0)
    waiting = False
    rule_obj.wait_timeout = timeout
    nxt = _NextStep(rule_obj.base_trial)
    report = rule_obj.report
    last_write = 0.0
    reason = "end_step reached"
    try:
        while end_step is None or step < end_step:
            try:
                rule_obj.invoke(step)
            except (TensorUnavailableForStep, TensorUnavailable) as e:
                logger.debug("%s: step %d skipped: %s", rule_obj.rule_name, step, e)
            except StepUnavailable as e:
                logger.debug("%s: step %d skipped: %s", rule_obj.rule_name, step, e)
                step = nxt.after(step)
                continue
            except RuleEvaluationConditionMet as e:
                if report_path is not None and time.monotonic() - last_write >= REPORT_WRITE_INTERVAL:
                    report.write(report_path)
                    last_write = time.monotonic()
                if raise_eval_cond:
                    reason = f"condition met at step {e.step} (raised)"
                    raise
                logger.info("%s", e)
                if e.end_of_rule:
                    reason = f"rule ended after firing at step {e.step}"
                    break
            except NoMoreData:
                if stop_at_job_end:
                    reason = "training job ended"
                    break
                reason = "training job ended (NoMoreData raised)"
                raise
            step += 1
    except StepNotYetAvailable:
        waiting = True  # the caller may resume at e.step: the evaluation has not ended
        raise
    except BaseException as e:
        if not report.finished and not isinstance(e, RuleEvaluationConditionMet | NoMoreData):
            reason = f"interrupted: {type(e).__name__}"
        raise
    finally:
        if not waiting:
            _finish(rule_obj, reason, report_path)
        elif report_path is not None:
            report.write(report_path)
    return report


def _finish(rule_obj: Rule, reason: str, report_path: str | None) -> None:
    """End of an evaluation: the rule's last word, action failure counts, the NoData detail, the report."""
    report = rule_obj.report
    try:
        rule_obj.on_finish()
    except Exception as e:  # noqa: BLE001 - a failing summary must not hide the real outcome
        logger.warning("%s: on_finish failed: %s", rule_obj.rule_name, e)
    for line in rule_obj.actions.report_failures():
        report.warn(line)
    no_data = None
    if report.status == NO_DATA:
        try:
            no_data = rule_obj.no_data_detail()
        except Exception as e:  # noqa: BLE001 - the description must not hide the real outcome
            logger.debug("%s: no_data_detail failed: %s", rule_obj.rule_name, e)
    report.finish(reason, no_data)
    if report_path is not None:
        report.write(report_path)
