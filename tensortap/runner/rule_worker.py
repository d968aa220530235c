"""One rule, evaluated in its own process, in real time, as the job's data grows.

`python -m tensortap.runner.rule_worker JOB.json` where the JSON holds {out_dir, label, rule: RuleSpec,
stop_on_issue, offline}. Writes OUT_DIR/rules/<label>/status.json as it goes and the rule's report beside it
(`rules/<label>/offline/` with offline: `tensortap rules run` never overwrites a live run's statuses).
Exit status: 0 NoIssuesFound, 1 IssuesFound, 2 Error, 3 NoData.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import signal
import sys
import threading
import time
import traceback
from typing import Any

from tensortap.runner import status as st
from tensortap.runner.spec import RuleSpec

STATUS_INTERVAL = 0.5
#: seconds between a live rule's looks for the next step: with the writer's 0.5 s flush this keeps the time
#: from data written to verdict well under a second (a look costs one read of the new index bytes)
POLL_INTERVAL = 0.05
#: the same on an object store (s3://), where each look is a request
REMOTE_POLL_INTERVAL = 0.5


def load_rule_class(spec: RuleSpec) -> type:
    """The rule class of `spec`: a built-in by name, or class `spec.name` from the file `spec.file`."""
    if spec.file is None:
        from tensortap.rules.builtin import get_rule

        return get_rule(spec.name)
    from tensortap.exceptions import InvalidConfiguration
    from tensortap.rules import Rule

    mod_spec = importlib.util.spec_from_file_location(f"tensortap_user_rules_{abs(hash(spec.file))}", spec.file)
    if mod_spec is None or mod_spec.loader is None:
        raise InvalidConfiguration(f"cannot import rules from {spec.file!r}")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    cls = getattr(module, spec.name, None)
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        found = sorted(
            n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Rule) and v is not Rule
        )
        raise InvalidConfiguration(f"{spec.file}: no Rule subclass {spec.name!r}; found {found}")
    return cls


def build_rule(spec: RuleSpec, trial: Any, stop_on_issue: bool = False) -> Any:
    """An instance of the rule over `trial` with its parameters (strings are parsed by the rule)."""
    cls = load_rule_class(spec)
    actions = []
    if stop_on_issue:
        from tensortap.rules.actions import StopTraining

        actions.append(StopTraining(out_dir=trial.path))
    try:
        return cls(trial, actions=actions, **spec.params)
    except TypeError as e:
        from tensortap.exceptions import InvalidConfiguration

        names = [n for n, _ in cls.parameters()] if hasattr(cls, "parameters") else []
        raise InvalidConfiguration(f"rule {spec.name}: {e}; its parameters are {names}") from None


def run(job: dict[str, Any]) -> int:
    from tensortap.exceptions import RuleEvaluationConditionMet, StepNotYetAvailable
    from tensortap.rules import invoke_rule
    from tensortap.storage import open_storage
    from tensortap.trials import create_trial

    out_dir, label = job["out_dir"], job["label"]
    spec = RuleSpec.from_json(job["rule"])
    storage = open_storage(out_dir)
    offline = bool(job.get("offline"))
    state: dict[str, Any] = {"status": st.IN_PROGRESS, "last_step": None, "first_step": None, "message": ""}
    last_write = [0.0]

    def publish(force: bool = False, **changes: Any) -> None:
        state.update(changes)
        if force or time.monotonic() - last_write[0] >= STATUS_INTERVAL:
            st.write_status(storage, label, offline, rule=spec.name, params=spec.params, **state)
            last_write[0] = time.monotonic()

    stop_requested = [False]

    def on_term(signum: int, frame: Any) -> None:
        stop_requested[0] = True
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():  # not in a thread of a Dask worker (tensortap.dask)
        signal.signal(signal.SIGTERM, on_term)
    rule: Any = None
    publish(force=True)
    try:
        trial = create_trial(out_dir)
        if job.get("offline"):
            trial.assume_ended()  # evaluate what is saved now, then finish
        rule = build_rule(spec, trial, job.get("stop_on_issue", False))
        rule.wait_poll_interval = None if offline else REMOTE_POLL_INTERVAL if "://" in out_dir else POLL_INTERVAL
        publish(force=True, ready=True)  # imports done, rule built: the runner may start training
        original = rule.invoke

        def invoke(step: int) -> None:
            original(step)
            publish(last_step=step)

        rule.invoke = invoke
        step = 0
        while True:
            try:
                invoke_rule(rule, start_step=step, raise_eval_cond=True, stop_at_job_end=True, timeout=0.5)
                break  # the job ended and every step was evaluated
            except StepNotYetAvailable as e:
                step = e.step
                if st.training_ended(storage):
                    # Training exited without closing its hook: what it wrote is all there will be.
                    trial.assume_ended()
        report = rule.report.to_dict()
        _write_report(storage, label, rule, offline)
        if rule.report.status == st.NO_DATA:
            publish(force=True, status=st.NO_DATA, message=rule.report.no_data_message(), report=report)
            return 3
        publish(force=True, status=st.NO_ISSUES_FOUND, message="no issues found", report=report)
        return 0
    except RuleEvaluationConditionMet as e:
        report = rule.report.to_dict()
        _write_report(storage, label, rule, offline)
        viol = report.get("first_violations") or []
        detail = "; ".join(str(v.get("condition", v)) for v in viol[:2]) if viol else ""
        msg = f"{spec.name} fired at step {e.step}" + (f": {detail}" if detail else "")
        publish(force=True, status=st.ISSUES_FOUND, first_step=e.step, last_step=e.step, message=msg, report=report)
        return 1
    except KeyboardInterrupt:
        return _stopped(rule, publish)
    except Exception as e:  # noqa: BLE001 - any failure of the rule is its status, not a crash of the run
        if stop_requested[0]:  # (the stop, raised inside code that turned it into another exception)
            return _stopped(rule, publish)
        publish(force=True, status=st.ERROR, message=f"{type(e).__name__}: {e}",
                traceback=traceback.format_exc(limit=8))
        return 2


def _stopped(rule: Any, publish: Any) -> int:
    """Publish Stopped, with what the rule had judged when stopped; the exit status of an interrupted rule."""
    judged = {}
    if rule is not None:
        judged = {"report": rule.report.to_dict()}
    publish(force=True, status=st.STOPPED, message="stopped before the job ended", **judged)
    return 2


def _write_report(storage: Any, label: str, rule: Any, offline: bool) -> None:
    storage.write(st.report_key(label, offline), rule.report.to_json().encode())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    return run(job)


if __name__ == "__main__":
    sys.exit(main())
