"""The Rule base class (smdebug's `Rule`): a check evaluated at each step of one or more trials.

Subclasses implement `invoke_at_step(step)` and return a truthy value (or a Verdict) when the condition is
met; optionally `set_required_tensors(step)`. Deciding is kept apart from acting: `invoke` records the
verdict in the report, then runs the actions and raises RuleEvaluationConditionMet.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from tensortap import modes
from tensortap.analysis.utils import no_refresh
from tensortap.exceptions import (
    InvalidConfiguration,
    RuleEvaluationConditionMet,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from tensortap.rules._data import Stat, TrialData, data_for
from tensortap.rules.actions.base import Action, Actions
from tensortap.rules.report import RuleReport, Verdict, Violation, jsonable
from tensortap.rules.req_tensors import RequiredTensors
from tensortap.trials.state import StepState

__all__ = ["Rule", "as_trial", "as_trials"]

_MISSING_EXC = (TensorUnavailableForStep, StepUnavailable, TensorUnavailable)
#: constructor arguments that are not rule parameters
_NOT_PARAMS = ("self", "base_trial", "action_str", "actions", "args", "kwargs")


def as_trial(t: Any, owner: str = "rule") -> Any:
    """A Trial from a Trial or a path / URL string."""
    if isinstance(t, str):
        from tensortap.trials import create_trial

        return create_trial(t)
    if hasattr(t, "tensor_names") and hasattr(t, "wait_for_steps"):
        return t
    raise InvalidConfiguration(f"{owner}: {t!r} is not a trial (give a Trial or a path)")


def as_trials(ts: Any, owner: str = "rule") -> list[Any]:
    """Trials from None, a Trial, a path, a comma-separated string of paths, or a list of those."""
    if ts is None or ts == "":
        return []
    if isinstance(ts, str):
        return [as_trial(p.strip(), owner) for p in ts.split(",") if p.strip()]
    if isinstance(ts, Iterable) and not hasattr(ts, "tensor_names"):
        return [as_trial(t, owner) for t in ts]
    return [as_trial(ts, owner)]


class Rule:
    """A rule over `base_trial` (and `other_trials`). `action_str` is smdebug's JSON action string;
    `actions` are Action objects (or JSON dicts) run when the rule fires."""

    #: one line saying what the rule detects (shown by `tensortap rules list`)
    description: ClassVar[str] = ""
    #: whether a step at which the rule examined no value (no datapoint) counts as evaluated in the report;
    #: built-in rules say False, so steps without their tensors are not counted
    count_empty_steps: ClassVar[bool] = True
    #: what the rule needs beyond matching tensors, said when it saw no data (e.g. "EVAL steps after TRAIN steps")
    needs: ClassVar[str] = ""
    #: what the rule compares, in a phrase (shown by `tensortap rules list`)
    compares: ClassVar[str] = ""

    def __init__(
        self,
        base_trial: Any,
        action_str: str | None = "",
        other_trials: Any = None,
        *,
        actions: Iterable[Action | dict] | Action | None = None,
    ):
        self.rule_name = type(self).__name__
        self.base_trial = as_trial(base_trial, self.rule_name)
        self.other_trials = as_trials(other_trials, self.rule_name)
        self.trials = [self.base_trial, *self.other_trials]
        self.req_tensors = RequiredTensors(self.base_trial, self.other_trials)
        self.logger = logging.getLogger(f"tensortap.rules.{self.rule_name}")
        self._actions = Actions(rule_name=self.rule_name)
        self._actions.add(action_str or None)
        self._actions.add(actions)
        self._actions.bind(self)
        self.report = RuleReport(self.rule_name, trial=str(self.base_trial.path),
                                 other_trials=[str(t.path) for t in self.other_trials])
        #: seconds invoke() waits for a step before StepNotYetAvailable (None: forever)
        self.wait_timeout: float | None = None
        #: seconds between looks for a step that is not there yet (None: the trial's backoff, up to 0.5 s);
        #: a real-time rule sets it small, so a verdict follows the data within that much
        self.wait_poll_interval: float | None = None
        self._violations: list[Violation] = []
        self._datapoints = 0

    # --- to override ------------------------------------------------------------------------

    def set_required_tensors(self, step: int) -> None:
        """Declare, with `self.req_tensors.add(name, [steps], trial=...)`, what the evaluation at `step` needs."""

    def invoke_at_step(self, step: int) -> Any:
        """Evaluate the rule at global `step`; a truthy value (or Verdict(fired=True)) means the condition is met."""
        raise NotImplementedError

    def on_finish(self) -> None:
        """Called once when invoke_rule ends, before the report is finished (e.g. to add warnings)."""

    # --- evaluation -------------------------------------------------------------------------

    @property
    def actions(self) -> Actions:
        return self._actions

    def _wait_for_step(self, step: int) -> None:
        t = self.base_trial
        state = t.has_passed_step(step)
        if state == StepState.AVAILABLE:
            return
        if self.wait_poll_interval is None or state == StepState.UNAVAILABLE:
            t.wait_for_steps([step], timeout=self.wait_timeout)  # raises StepUnavailable / NoMoreData as due
            return
        deadline = None if self.wait_timeout is None else time.monotonic() + self.wait_timeout
        while True:
            t.refresh_data()
            state = t.has_passed_step(step)
            if state == StepState.AVAILABLE:
                return
            if state == StepState.UNAVAILABLE:
                t.wait_for_steps([step], timeout=0)
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise StepNotYetAvailable(step, modes.GLOBAL)
            time.sleep(self.wait_poll_interval)

    def invoke(self, step: int) -> None:
        """Wait for `step`, evaluate, record; when the condition is met run the actions and raise
        RuleEvaluationConditionMet. Missing data raises TensorUnavailableForStep / StepUnavailable."""
        self._wait_for_step(step)
        with no_refresh(self.trials):
            self.req_tensors.clear()
            self.set_required_tensors(step)
            self.req_tensors.fetch(self.wait_timeout)
            self._violations = []
            self._datapoints = self.req_tensors.count()
            val = self.invoke_at_step(step)
        self.record(step, self._to_verdict(step, val))

    def record(self, step: int, verdict: Verdict) -> None:
        """Put the verdict at `step` in the report; if it fired, run the actions and raise
        RuleEvaluationConditionMet. Unless `count_empty_steps`, a step where nothing was examined (no
        datapoint) and nothing fired does not count as evaluated."""
        if self._datapoints or verdict or self.count_empty_steps:
            self.report.evaluated(step, self._datapoints)
        if verdict:
            self.report.fired(step, verdict.violations)
            if len(self._actions):
                self._actions.invoke(self.report.event(step, verdict))
            raise RuleEvaluationConditionMet(self.rule_name, step, end_of_rule=verdict.end_of_rule)

    def _to_verdict(self, step: int, val: Any) -> Verdict:
        if isinstance(val, Verdict):
            if val.fired and not val.violations:
                val.violations = list(self._violations) or [Violation(step, "condition met")]
            return val
        if val:
            return Verdict(True, list(self._violations) or [Violation(step, "condition met")])
        return Verdict(False)

    # --- helpers for rules ------------------------------------------------------------------

    def set_parameters(self, **params: Any) -> None:
        """Record the (parsed) parameters in the report."""
        self.report.parameters.update({k: jsonable(v) for k, v in params.items()})

    def violation(self, step: int, condition: str, tensor: str | None = None, value: Any = None,
                  trial: Any = None) -> None:
        """Note one reason the rule fires at `step` (shown in the report and passed to actions)."""
        self._violations.append(
            Violation(step, condition, tensor, jsonable(value), None if trial is None else str(trial.path))
        )

    def count(self, n: int = 1) -> None:
        """Count `n` datapoints (tensor values) examined."""
        self._datapoints += n

    def data(self, trial: Any = None) -> TrialData:
        """The shared bulk-read cache of `trial` (default the base trial)."""
        if trial is None:
            d = self.__dict__.get("_base_data")
            if d is None:
                d = self._base_data = data_for(self.base_trial)
            return d
        return data_for(trial)

    def select(self, collections: Iterable[str] = (), regex: Iterable[str] = (), trial: Any = None,
               all_if_empty: bool = False) -> list[str]:
        """Tensor names in any of `collections` or matching any of `regex` (noted in the report's
        `looked_for` / `matched`, which say what a rule that saw no data was looking for)."""
        collections, regex = tuple(collections), tuple(regex)
        names = self.data(trial).names(collections, regex, all_if_empty=all_if_empty)
        noted = self.__dict__.setdefault("_noted", {})
        key = (collections, regex)
        if noted.get(key) is not names:  # the cache hands out the same list until the names change
            noted[key] = names
            self.report.looking_for(collections, regex, names)
        return names

    def no_data_detail(self) -> dict[str, Any]:
        """What the rule looked for, what matched, and what the job has: the report's `no_data` entry when
        the rule evaluated no data point."""
        t = self.base_trial
        try:
            t.refresh_data()
        except Exception:  # noqa: BLE001 - a description must not fail the rule
            pass
        names = list(t.tensor_names())
        looked_for = {k: list(v) for k, v in self.report.looked_for.items()}
        if not any(looked_for.values()):  # it never got to look (no step came): say what it would have read
            looked_for = self._declared_data()
        return {
            "needs": self.needs,
            "looked_for": looked_for,
            "matched": list(self.report.matched[:100]),
            "job_steps": len(t.steps(show_incomplete_steps=True)),
            "job_collections": sorted(c for c in t.collections() if t.tensor_names(collection=c)),
            "job_tensors": names[:20],
            "job_tensor_count": len(names),
        }

    def stat(self, name: str, step: int, stat: Stat, trial: Any = None) -> Any:
        """`stat` of tensor `name` at `step`, or None if there is no value (or not enough history)."""
        try:
            v = self.data(trial).stat(name, step, stat)
        except _MISSING_EXC:
            return None
        if v is not None:
            self._datapoints += 1
        return v

    def raw(self, name: str, step: int, trial: Any = None) -> Any:
        """The raw value of `name` at `step`, or None if it was not saved there."""
        try:
            v = self.data(trial).raw(name, step)
        except _MISSING_EXC:
            return None
        self._datapoints += 1
        return v

    def _declared_data(self) -> dict[str, list[str]]:
        """The collections and regexes a built-in rule's config (tensortap.rules.configs) says it reads."""
        from tensortap.rules.builtin import RULES

        out: dict[str, list[str]] = {"collections": [], "regex": []}
        if RULES.get(type(self).__name__) is not type(self):
            return out
        from tensortap.rules.configs import config_for

        params = {k: v for k, v in self.report.parameters.items() if v is not None}
        try:
            cfg = config_for(type(self), **params)
        except Exception:  # noqa: BLE001 - parameters the config does not take: the defaults still say what
            try:
                cfg = config_for(type(self))
            except Exception:  # noqa: BLE001
                return out
        for c in cfg.collections:
            out["collections"].append(c.name)
            out["regex"].extend(r for r in c.include_regex if r not in out["regex"])
        return out

    # --- introspection ----------------------------------------------------------------------

    @classmethod
    def parameters(cls) -> list[tuple[str, Any]]:
        """(name, default) of every rule parameter, in constructor order; default `inspect.Parameter.empty`
        for required ones."""
        sig = inspect.signature(cls.__init__)
        return [(p.name, p.default) for p in sig.parameters.values()
                if p.name not in _NOT_PARAMS and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def __repr__(self) -> str:
        return f"<{self.rule_name} on {self.base_trial.path!r} {self.report.parameters}>"
