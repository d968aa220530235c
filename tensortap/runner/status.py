"""Rule statuses as files beside the job's data: `OUT_DIR/rules/<rule>/status.json`.

Statuses follow SageMaker's: InProgress → IssuesFound / NoIssuesFound / Error (plus Stopped when the
run was interrupted). Other tools (the dashboard, a notebook) read them while the job runs.
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
FINAL = (ISSUES_FOUND, NO_ISSUES_FOUND, ERROR, STOPPED)

TRAINING_KEY = "tensortap/control/training.json"


def status_key(label: str) -> str:
    return f"rules/{label}/status.json"


def write_status(storage: Any, label: str, **fields: Any) -> dict[str, Any]:
    body = {"name": label, "updated_at": time.time(), **fields}
    storage.write(status_key(label), json.dumps(body, default=str, allow_nan=False).encode())
    return body


def read_status(storage: Any, label: str) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read(status_key(label)))
    except (FileNotFoundError, ValueError):
        return None


def write_training_ended(storage: Any, exit_code: int) -> None:
    """Tell rule workers that the training command has exited (with or without closing its hook)."""
    storage.write(TRAINING_KEY, json.dumps({"exit_code": exit_code, "time": time.time()}).encode())


def training_ended(storage: Any) -> bool:
    return storage.size(TRAINING_KEY) is not None
