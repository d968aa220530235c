"""The report of a rule's evaluation: what it looked at, when it fired and why. Serialises to JSON."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Violation", "Verdict", "RuleReport", "jsonable", "ISSUES_FOUND", "NO_ISSUES_FOUND", "NO_DATA"]

#: the verdict of a rule's report: SageMaker's statuses plus NoData (the rule evaluated no data point, so it
#: can say nothing about the job; it is never reported as NoIssuesFound)
ISSUES_FOUND = "IssuesFound"
NO_ISSUES_FOUND = "NoIssuesFound"
NO_DATA = "NoData"

#: at most this many fired steps and violations per firing step are kept in a report
MAX_FIRED_STEPS = 1000
MAX_VIOLATIONS_PER_STEP = 50


def jsonable(x: Any) -> Any:
    """`x` as plain JSON data: numpy scalars/arrays to Python, non-finite floats to "nan"/"inf"/"-inf"."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist()) if x.size <= 64 else {"shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, str | int | bool) or x is None:
        return x
    if hasattr(x, "name") and hasattr(x, "value"):  # enums (modes)
        return x.name
    return str(x)


@dataclass
class Violation:
    """One reason a rule fired: the tensor (if any), the step, the offending value and the condition."""

    step: int
    condition: str
    tensor: str | None = None
    value: Any = None
    trial: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"step": int(self.step), "tensor": self.tensor, "value": jsonable(self.value), "condition": self.condition}
        if self.trial is not None:
            d["trial"] = self.trial
        return d


@dataclass
class Verdict:
    """What `invoke_at_step` decided. Truthy iff the rule fired; `end_of_rule` ends invoke_rule after firing."""

    fired: bool
    violations: list[Violation] = field(default_factory=list)
    end_of_rule: bool = False

    def __bool__(self) -> bool:
        return bool(self.fired)


class RuleReport:
    """Running record of one rule's evaluation (see to_dict for the JSON fields)."""

    def __init__(self, rule_name: str, parameters: dict[str, Any] | None = None, trial: str | None = None,
                 other_trials: list[str] | None = None):
        self.rule_name = rule_name
        self.parameters: dict[str, Any] = dict(parameters or {})
        self.trial = trial
        self.other_trials = list(other_trials or [])
        self.steps_evaluated = 0
        self.first_step_evaluated: int | None = None
        self.last_step_evaluated: int | None = None
        self.datapoints = 0
        self.violations = 0  # firing steps
        self.first_fired_step: int | None = None
        self.fired_steps: list[int] = []
        self.first_violations: list[Violation] = []
        self.last_violations: list[Violation] = []
        self.warnings: list[str] = []
        self.started_at = time.time()
        self.updated_at = self.started_at
        self.finished = False
        self.end_reason: str | None = None
        #: what the rule looked for ({"collections": [...], "regex": [...]}) and which tensors matched
        self.looked_for: dict[str, list[str]] = {"collections": [], "regex": []}
        self.matched: list[str] = []
        #: with status NoData: what was looked for, what matched, and what the job has
        self.no_data: dict[str, Any] | None = None
        #: judgements made, for rules whose evaluated steps are not all judgements (a loss rule that reads a
        #: loss at every step but compares only some); None for the others. 0 means NoData.
        self.judged: int | None = None

    # --- recording ----------------------------------------------------------------------------

    def evaluated(self, step: int, datapoints: int) -> None:
        self.steps_evaluated += 1
        if self.first_step_evaluated is None:
            self.first_step_evaluated = step
        self.last_step_evaluated = step
        self.datapoints += datapoints
        self.updated_at = time.time()

    def fired(self, step: int, violations: list[Violation]) -> None:
        self.violations += 1
        if self.first_fired_step is None:
            self.first_fired_step = step
            self.first_violations = violations[:MAX_VIOLATIONS_PER_STEP]
        self.last_violations = violations[:MAX_VIOLATIONS_PER_STEP]
        if len(self.fired_steps) < MAX_FIRED_STEPS:
            self.fired_steps.append(step)
        self.updated_at = time.time()

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def looking_for(self, collections: Any = (), regex: Any = (), matched: Any = ()) -> None:
        """Note the collections / regexes the rule asked for and the tensor names they matched."""
        for key, items in (("collections", collections), ("regex", regex)):
            have = self.looked_for[key]
            for x in items:
                if x not in have:
                    have.append(str(x))
        if matched and not set(matched) <= set(self.matched):
            self.matched = sorted(set(self.matched).union(matched))

    def finish(self, reason: str, no_data: dict[str, Any] | None = None) -> None:
        self.finished = True
        self.end_reason = reason
        self.no_data = no_data if self.status == NO_DATA else None
        self.updated_at = time.time()

    # --- output -------------------------------------------------------------------------------

    @property
    def triggered(self) -> bool:
        return self.violations > 0

    @property
    def status(self) -> str:
        """IssuesFound if the rule fired; NoData if it evaluated no data point (or made no judgement, for
        rules that count them); else NoIssuesFound."""
        if self.violations:
            return ISSUES_FOUND
        if self.steps_evaluated == 0 or self.judged == 0:
            return NO_DATA
        return NO_ISSUES_FOUND

    def no_data_message(self) -> str:
        """One line saying what the rule looked for and what the job has (empty unless status is NoData)."""
        if self.status != NO_DATA:
            return ""
        d = self.no_data or {}
        looked = d.get("looked_for") or self.looked_for
        parts = []
        if looked.get("collections"):
            parts.append(f"collections {looked['collections']}")
        if looked.get("regex"):
            parts.append(f"regexes {looked['regex']}")
        what = " and ".join(parts) or "its data"
        matched = d.get("matched", self.matched)
        if matched:
            msg = (f"no data: {what} matched {len(matched)} tensor(s) ({', '.join(matched[:5])}) but the rule "
                   f"could judge none of their values")
        else:
            msg = f"no data: {what} matched no tensor"
        if d.get("needs"):
            msg += f"; the rule needs {d['needs']}"
        if "job_steps" in d:
            names = d.get("job_tensors") or []
            more = d.get("job_tensor_count", len(names)) - len(names)
            shown = ", ".join(names) + (f", ... ({more} more)" if more > 0 else "")
            msg += (f"; the job has {d['job_steps']} saved step(s), collections {d.get('job_collections', [])}"
                    f" and tensors [{shown}]")
        return msg

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: rule, status (IssuesFound / NoIssuesFound / NoData), parameters, trial,
        steps_evaluated, datapoints, violations (firing steps), triggered, first_fired_step, fired_steps,
        first_violations / last_violations (tensor, step, value, condition), warnings, looked_for / matched
        (collections and regexes asked for, tensors they matched), no_data and message (with status NoData:
        what was looked for and what the job has), timestamps."""
        return {
            "rule": self.rule_name,
            "status": self.status,
            "parameters": jsonable(self.parameters),
            "trial": self.trial,
            "other_trials": self.other_trials,
            "steps_evaluated": self.steps_evaluated,
            "first_step_evaluated": self.first_step_evaluated,
            "last_step_evaluated": self.last_step_evaluated,
            "datapoints": self.datapoints,
            "judged": self.judged,
            "violations": self.violations,
            "triggered": self.triggered,
            "first_fired_step": self.first_fired_step,
            "fired_steps": list(self.fired_steps),
            "first_violations": [v.to_dict() for v in self.first_violations],
            "last_violations": [v.to_dict() for v in self.last_violations],
            "warnings": list(self.warnings),
            "looked_for": {k: list(v) for k, v in self.looked_for.items()},
            "matched": list(self.matched[:100]),
            "no_data": jsonable(self.no_data) if self.status == NO_DATA else None,
            "message": self.no_data_message(),
            "finished": self.finished,
            "end_reason": self.end_reason,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def write(self, path: str) -> str:
        """Write the JSON to `path` (a file, or a directory to hold `<rule>.json`) atomically; returns the file."""
        if os.path.isdir(path) or path.endswith(os.sep):
            path = os.path.join(path, f"{self.rule_name}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.partial"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)
        return path

    def as_smdebug(self) -> dict[str, Any]:
        """smdebug's `rule.report` dict: RuleTriggered, Violations, Details, Datapoints, RuleParameters."""
        return {
            "RuleTriggered": self.violations,
            "Violations": self.violations,
            "Details": {"first_fired_step": self.first_fired_step,
                        "violations": [v.to_dict() for v in self.first_violations]},
            "Datapoints": self.datapoints,
            "RuleParameters": "\n".join(f"{k}:{jsonable(v)}" for k, v in self.parameters.items()),
        }

    def event(self, step: int, verdict: Verdict) -> dict[str, Any]:
        """What actions receive when the rule fires at `step`: the report plus this firing."""
        d = self.to_dict()
        d["event"] = {"step": int(step), "violations": [v.to_dict() for v in verdict.violations],
                      "time": time.time()}
        return d

    def __repr__(self) -> str:
        return (f"<RuleReport {self.rule_name} {self.status} evaluated={self.steps_evaluated} "
                f"violations={self.violations} "
                f"first_fired_step={self.first_fired_step}>")
