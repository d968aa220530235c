"""Command action: run a user command with the report JSON on its stdin."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.actions.base import Action, positive_seconds

__all__ = ["Command"]


class Command(Action):
    """Run `command` (an argv list, or a string split like a shell would unless `shell=True`) with the report
    JSON on stdin and TENSORTAP_RULE_NAME / TENSORTAP_RULE_STEP / TENSORTAP_TRIAL in the environment.
    A non-zero exit status or a timeout counts as a failure."""

    name = "command"

    def __init__(self, command: str | Sequence[str], timeout: float = 60.0, shell: bool = False,
                 max_calls: int | None = None):
        super().__init__(max_calls)
        if isinstance(command, str):
            if not command.strip():
                raise InvalidConfiguration("Command: command must not be empty")
        elif not (isinstance(command, Sequence) and command and all(isinstance(c, str) for c in command)):
            raise InvalidConfiguration(f"Command: command={command!r} must be a string or a list of strings")
        if not isinstance(shell, bool):
            raise InvalidConfiguration(f"Command: shell={shell!r} must be True or False")
        self.command = command
        self.timeout = positive_seconds("Command", "timeout", timeout)
        self.shell = shell
        self.last_result: subprocess.CompletedProcess | None = None

    def run(self, report: dict[str, Any]) -> None:
        if self.shell:
            args: Any = self.command if isinstance(self.command, str) else shlex.join(self.command)
        else:
            args = shlex.split(self.command) if isinstance(self.command, str) else list(self.command)
        env = dict(os.environ)
        env["TENSORTAP_RULE_NAME"] = str(report.get("rule", ""))
        env["TENSORTAP_RULE_STEP"] = str(report.get("event", {}).get("step", ""))
        env["TENSORTAP_TRIAL"] = str(report.get("trial") or "")
        res = subprocess.run(args, input=json.dumps(report).encode("utf-8"), capture_output=True,
                             timeout=self.timeout, shell=self.shell, env=env, check=False)
        self.last_result = res
        if res.returncode != 0:
            err = res.stderr.decode("utf-8", "replace").strip()[-500:]
            raise RuntimeError(f"command {args!r} exited with status {res.returncode}: {err}")

    def __repr__(self) -> str:
        return f"<Command {self.command!r}>"
