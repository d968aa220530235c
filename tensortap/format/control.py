"""The stop-request protocol: how a rule (or a person) asks a running job to stop at its next step boundary.

* A stop request is the object ``tensortap/control/stop.json`` inside the job's ``out_dir`` (written
  through the job's storage, atomically, so a reader sees all of it or nothing). It holds
  ``{"version": 1, "requested_at": <unix time>, "rule": <name>, "step": <step>, "reason": <text>,
  "report": <the rule report>}``. docs/format.md specifies it beside the rest of the out_dir.
* `request_stop(out_dir, ...)` writes it (the `StopTraining` rule action does this when its rule fires).
* `stop_requested(out_dir)` returns the request (a dict) or None. It is cheap: at most one stat of one file
  per `min_interval` seconds (default 1 s) and out_dir; the file is read only once it exists.
* Hooks check at every step boundary. When a request exists the hook closes (ends the step, flushes
  everything, marks the job ended, so readers and rules see complete data) and raises `TrainingStopped`.
* `TrainingStopped` derives from SystemExit: an unmodified training script ends there, with the message
  printed on stderr and exit status 3 (`STOP_EXIT_CODE`), not swallowed by `except Exception:` blocks in the
  script or in framework callbacks. Scripts that want to save a checkpoint first catch `TrainingStopped`.
* `clear_stop_request(out_dir)` removes a request.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

__all__ = [
    "STOP_KEY",
    "STOP_EXIT_CODE",
    "TrainingStopped",
    "StopSignal",
    "request_stop",
    "stop_requested",
    "clear_stop_request",
    "check_stop",
]

logger = logging.getLogger("tensortap")

STOP_KEY = "tensortap/control/stop.json"
STOP_EXIT_CODE = 3


class TrainingStopped(SystemExit):
    """Training was stopped on request (a rule's StopTraining action). A SystemExit: uncaught, it ends the
    process with exit status STOP_EXIT_CODE after the message has been printed."""

    def __init__(self, message: str, request: dict[str, Any] | None = None, exit_code: int = STOP_EXIT_CODE):
        super().__init__(exit_code)
        self.message = message
        self.request = request or {}

    def __str__(self) -> str:
        return self.message


def _storage(out_dir: str) -> Any:
    from tensortap.storage import open_storage

    return open_storage(out_dir)


def request_stop(out_dir: str, *, rule: str | None = None, step: int | None = None, reason: str = "",
                 report: dict[str, Any] | None = None, overwrite: bool = False) -> str:
    """Ask the job writing `out_dir` to stop at its next step boundary; returns where the request is.
    An existing request is kept (the first reason to stop is the one reported) unless `overwrite`."""
    st = _storage(out_dir)
    if not overwrite and st.size(STOP_KEY) is not None:
        return st.describe(STOP_KEY)
    body = {"version": 1, "requested_at": time.time(), "rule": rule, "step": step, "reason": reason,
            "report": report}
    st.write(STOP_KEY, json.dumps(body, allow_nan=False, default=str).encode("utf-8"))
    with _lock:
        _last_check.pop(_norm(out_dir), None)
    return st.describe(STOP_KEY)


def clear_stop_request(out_dir: str) -> None:
    """Remove a stop request, if any."""
    _storage(out_dir).delete(STOP_KEY)
    with _lock:
        _last_check.pop(_norm(out_dir), None)


_lock = threading.Lock()
_last_check: dict[str, tuple[float, dict[str, Any] | None]] = {}
_storages: dict[str, Any] = {}


def _norm(out_dir: str) -> str:
    return str(out_dir).rstrip("/")


def _read_request(out_dir: str) -> dict[str, Any] | None:
    key = _norm(out_dir)
    st = _storages.get(key)
    if st is None:
        st = _storages[key] = _storage(out_dir)
    if st.size(STOP_KEY) is None:  # one stat (local) / one HEAD (object stores)
        return None
    try:
        req = json.loads(st.read(STOP_KEY).decode("utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return req if isinstance(req, dict) else {"reason": str(req)}


def stop_requested(out_dir: str, min_interval: float = 1.0) -> dict[str, Any] | None:
    """The stop request for `out_dir`, or None. Looks at the store at most once per `min_interval` s."""
    key = _norm(out_dir)
    now = time.monotonic()
    with _lock:
        last = _last_check.get(key)
        if last is not None and (last[1] is not None or now - last[0] < min_interval):
            return last[1]
    req = _read_request(out_dir)
    with _lock:
        _last_check[key] = (now, req)
    return req


def _message(req: dict[str, Any]) -> str:
    rule = req.get("rule") or "a rule"
    step = req.get("step")
    reason = req.get("reason") or ""
    at = f" at step {step}" if step is not None else ""
    return (f"tensortap: training stopped: {rule} fired{at}" + (f" ({reason})" if reason else "")
            + "; the data saved so far is flushed and the job is marked ended")


class StopSignal:
    """Step-boundary check for one out_dir: `check()` → the request or None (cheap, rate-limited);
    `stop(hook, request)` closes the hook and raises TrainingStopped."""

    def __init__(self, out_dir: str, min_interval: float = 1.0, exit_code: int = STOP_EXIT_CODE):
        self.out_dir = str(out_dir)
        self.min_interval = float(min_interval)
        self.exit_code = exit_code

    def check(self) -> dict[str, Any] | None:
        return stop_requested(self.out_dir, self.min_interval)

    def stop(self, hook: Any | None, request: dict[str, Any]) -> None:
        msg = _message(request)
        if hook is not None:
            try:
                hook.close()
            except Exception as e:  # noqa: BLE001 - stopping must not fail on a flush problem
                logger.error("tensortap: closing the hook before stopping failed: %s", e)
        print(msg, file=sys.stderr, flush=True)
        raise TrainingStopped(msg, request, self.exit_code)

    def raise_if_requested(self, hook: Any | None = None) -> None:
        req = self.check()
        if req is not None:
            self.stop(hook, req)


def check_stop(hook: Any, min_interval: float = 1.0) -> None:
    """What a hook runs at each step boundary: if a stop was requested for `hook.out_dir`, close the hook
    (flush, mark the job ended) and raise TrainingStopped. Costs one stat per `min_interval` seconds."""
    sig = getattr(hook, "_tensortap_stop_signal", None)
    if sig is None:
        sig = StopSignal(hook.out_dir, min_interval)
        try:
            hook._tensortap_stop_signal = sig
        except AttributeError:  # pragma: no cover - hooks with __slots__
            pass
    if getattr(hook, "_closed", False):
        return
    sig.raise_if_requested(hook)
