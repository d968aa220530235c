"""Rule statuses as files beside the job's data: `OUT_DIR/rules/<rule>/status.json`.

Statuses follow SageMaker's: InProgress → IssuesFound / NoIssuesFound / Error, plus NoData (the rule
evaluated no data point: it says nothing about the job, so it is never NoIssuesFound) and Stopped (the run
was interrupted). Other tools (the dashboard, a notebook) read them while the job runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

IN_PROGRESS = "InProgress"
ISSUES_FOUND = "IssuesFound"
NO_ISSUES_FOUND = "NoIssuesFound"
ERROR = "Error"
STOPPED = "Stopped"
NO_DATA = "NoData"
FINAL = (ISSUES_FOUND, NO_ISSUES_FOUND, NO_DATA, ERROR, STOPPED)

TRAINING_KEY = "tensortap/control/training.json"
#: the run's claim on the out_dir, created exclusively before anything starts: only the runner that created it
#: starts rules and training there and writes the job's control files (TRAINING_KEY, rule statuses)
RUN_CLAIM_KEY = "tensortap/control/run.json"


def rule_dir(label: str, offline: bool = False) -> str:
    """Where a rule's status.json and report.json go: `rules/<label>/` for the rules of a live run,
    `rules/<label>/offline/` for `tensortap rules run` (beside the live ones, never over them)."""
    return f"rules/{label}/offline/" if offline else f"rules/{label}/"


def status_key(label: str, offline: bool = False) -> str:
    return rule_dir(label, offline) + "status.json"


def report_key(label: str, offline: bool = False) -> str:
    return rule_dir(label, offline) + "report.json"


def write_status(storage: Any, label: str, offline: bool = False, **fields: Any) -> dict[str, Any]:
    body = {"name": label, "updated_at": time.time(), **fields}
    storage.write(status_key(label, offline), json.dumps(body, default=str, allow_nan=False).encode())
    return body


def read_status(storage: Any, label: str, offline: bool = False) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read(status_key(label, offline)))
    except (FileNotFoundError, ValueError):
        return None


def write_training_ended(storage: Any, exit_code: int) -> None:
    """Tell rule workers that the training command has exited (with or without closing its hook)."""
    storage.write(TRAINING_KEY, json.dumps({"exit_code": exit_code, "time": time.time()}).encode())


def claim_run(storage: Any, out_dir: str) -> None:
    """Claim `out_dir` for this run (exclusive create); another run's claim refuses this one."""
    import os
    import platform

    from tensortap.exceptions import InvalidConfiguration

    body = json.dumps({"pid": os.getpid(), "host": platform.node(), "time": time.time()}).encode()
    if not storage.create_exclusive(RUN_CLAIM_KEY, body):
        raise InvalidConfiguration(f"--out-dir {out_dir!r} already holds a job (another tensortap run claimed it: "
                                   f"{storage.describe(RUN_CLAIM_KEY)}): use a new directory")


def training_ended(storage: Any) -> bool:
    return storage.size(TRAINING_KEY) is not None
