"""Action base class and the list of actions a rule runs when it fires."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from tensortap.exceptions import InvalidConfiguration

__all__ = ["Action", "Actions", "positive_seconds"]

logger = logging.getLogger("tensortap.rules.actions")


def positive_seconds(owner: str, name: str, value: Any) -> float:
    """`value` as a positive, finite number of seconds; InvalidConfiguration naming it otherwise."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, str):
        try:
            value, ok = float(value), True  # JSON action strings may give numbers as strings
        except ValueError:
            ok = False
    if not ok or not 0 < float(value) < float("inf"):
        raise InvalidConfiguration(f"{owner}: {name}={value!r} must be a positive number of seconds")
    return float(value)


class Action:
    """Something done when a rule fires. Subclasses implement `run(report)`; `report` is the rule's report
    dict plus an "event" entry (the firing step and its violations). `max_calls` limits how often it runs
    (None: at every firing step)."""

    name: str = "action"

    def __init__(self, max_calls: int | None = None):
        if max_calls is not None and (not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 1):
            raise InvalidConfiguration(f"{type(self).__name__}: max_calls={max_calls!r} must be a positive int or None")
        self.max_calls = max_calls
        self.calls = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.rule: Any = None

    def bind(self, rule: Any) -> None:
        """Called once when attached to `rule` (actions that need the rule's trial override)."""
        self.rule = rule

    def run(self, report: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, report: dict[str, Any]) -> bool:
        """Run the action; failures are counted, never raised. The first failure is logged at once; later
        ones are only counted (`failures_summary()` says how many, once, when the rule ends). True if it ran
        without error."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            return False
        self.calls += 1
        try:
            self.run(report)
            return True
        except Exception as e:  # noqa: BLE001 - by design: an action never breaks the rule
            self.failures += 1
            self.last_error = e
            if self.failures == 1:
                logger.error("tensortap: action %s of rule %s failed: %s (further failures are counted and "
                             "reported when the rule ends)", self.name, report.get("rule"), e)
            return False

    def failures_summary(self) -> str:
        """One line: how often the action failed and its last error ("" if it never failed)."""
        if not self.failures:
            return ""
        return (f"action {self.name} failed {self.failures} of {self.calls} time(s); last error: "
                f"{self.last_error}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


class Actions:
    """The actions of one rule; built from Action objects and/or smdebug-style JSON action strings."""

    def __init__(self, actions: Iterable[Action] | Action | str | dict | None = None, rule_name: str = "rule"):
        self.rule_name = rule_name
        self.actions: list[Action] = []
        self.add(actions)

    def add(self, actions: Iterable[Action] | Action | str | dict | list | None) -> None:
        if actions is None or actions == "":
            return
        if isinstance(actions, Action):
            self.actions.append(actions)
        elif isinstance(actions, str):
            self.add(parse_action_str(actions, self.rule_name))
        elif isinstance(actions, dict):
            a = action_from_dict(actions, self.rule_name)
            if a is not None:
                self.actions.append(a)
        elif isinstance(actions, Iterable) and not isinstance(actions, bytes | bytearray):
            for a in actions:
                self.add(a)
        else:
            raise InvalidConfiguration(f"{self.rule_name}: actions={actions!r} must be Action objects or JSON")

    def bind(self, rule: Any) -> None:
        for a in self.actions:
            a.bind(rule)

    def invoke(self, report: dict[str, Any]) -> None:
        for a in self.actions:
            a(report)

    def report_failures(self) -> list[str]:
        """Log, once, how often each action failed when it failed more than once; returns the summaries."""
        out = []
        for a in self.actions:
            line = a.failures_summary()
            if line:
                out.append(line)
                if a.failures > 1:
                    logger.error("tensortap: rule %s: %s", self.rule_name, line)
        return out

    def __len__(self) -> int:
        return len(self.actions)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.actions)


def parse_action_str(s: str, rule_name: str = "rule") -> list[Action]:
    """smdebug's action string: a JSON dict or list of dicts with a "name". Only the keys and the names are
    case-insensitive (smdebug lower-cased the whole string, breaking upper-case job prefixes)."""
    s = s.strip()
    if not s:
        return []
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise InvalidConfiguration(f"{rule_name}: action string {s!r} is not JSON: {e}") from None
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for d in items:
        if not isinstance(d, dict):
            logger.warning("tensortap: rule %s: action %r is not an object; skipped", rule_name, d)
            continue
        a = action_from_dict(d, rule_name)
        if a is not None:
            out.append(a)
    return out


def action_from_dict(d: dict[str, Any], rule_name: str = "rule") -> Action | None:
    """An action from {"name": ..., params}: stoptraining, email, sms, webhook, command, log.
    Unknown names are logged and skipped (None), as smdebug did."""
    from tensortap.rules.actions.command import Command
    from tensortap.rules.actions.email import Email
    from tensortap.rules.actions.log import Log
    from tensortap.rules.actions.stop import StopTraining
    from tensortap.rules.actions.webhook import Webhook

    d = {str(k).lower(): v for k, v in d.items()}
    name = str(d.pop("name", "")).strip().lower().replace("_", "")
    try:
        if name == "stoptraining":
            return StopTraining(out_dir=d.get("out_dir"), training_job_prefix=d.get("training_job_prefix"))
        if name == "email":
            to = d.get("endpoint") or d.get("to")
            if not to:
                raise InvalidConfiguration("email action needs an 'endpoint' (address)")
            return Email(to=to, **{k: v for k, v in d.items() if k in Email.OPTIONS})
        if name == "webhook":
            return Webhook(url=d.get("url") or d.get("endpoint"), **{k: v for k, v in d.items()
                                                                      if k in ("headers", "timeout")})
        if name == "command":
            return Command(command=d.get("command") or d.get("cmd"),
                           **{k: v for k, v in d.items() if k in ("timeout", "shell")})
        if name == "log":
            return Log(**{k: v for k, v in d.items() if k in ("level",)})
        if name == "sms":
            logger.warning("tensortap: rule %s: the sms action needs AWS SNS and is not available locally; skipped",
                           rule_name)
            return None
    except (InvalidConfiguration, TypeError) as e:
        logger.warning("tensortap: rule %s: action %r is invalid (%s); skipped", rule_name, d, e)
        return None
    logger.warning("tensortap: rule %s: unknown action %r; skipped", rule_name, name)
    return None
