"""Log action: one log record per firing."""

from __future__ import annotations

import logging
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.actions.base import Action

__all__ = ["Log"]


class Log(Action):
    """Log "rule X fired at step S: <violations>" on logger `logger_name` at `level`."""

    name = "log"

    def __init__(self, level: int | str = logging.WARNING, logger_name: str = "tensortap.rules",
                 max_calls: int | None = None):
        super().__init__(max_calls)
        if isinstance(level, str):
            lv = logging.getLevelName(level.strip().upper())
            if not isinstance(lv, int):
                raise InvalidConfiguration(f"Log: level={level!r} is not a logging level")
            level = lv
        if not isinstance(level, int) or isinstance(level, bool):
            raise InvalidConfiguration(f"Log: level={level!r} must be a logging level (an int or a name)")
        if not isinstance(logger_name, str):
            raise InvalidConfiguration(f"Log: logger_name={logger_name!r} must be a string")
        self.level = level
        self.logger = logging.getLogger(logger_name)

    def run(self, report: dict[str, Any]) -> None:
        ev = report.get("event", {})
        vs = ev.get("violations", [])
        detail = "; ".join(
            f"{v.get('tensor') or '-'}: {v.get('condition')}" for v in vs[:5]
        ) + (f" (+{len(vs) - 5} more)" if len(vs) > 5 else "")
        self.logger.log(self.level, "rule %s fired at step %s: %s", report.get("rule"), ev.get("step"), detail)
