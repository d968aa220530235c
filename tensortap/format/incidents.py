"""Incidents: what went wrong in a training job and where, one JSON object a line (docs/format.md §11).

A hook's flight recorder writes them (`tensortap.capture.flight`); `tensortap.trials.incidents` reads them. Each
worker writes its own file, `incidents/<worker>.jsonl`, through the job's Storage: the whole file is rewritten
atomically at each incident (incidents are few; object stores have no append), so a reader sees all of a line or
none of it.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote

from tensortap.storage.base import Storage

#: the folder of the incident files, beside the store's own `tensortap/`
INCIDENTS_DIR = "incidents"
SUFFIX = ".jsonl"
KINDS = ("non_finite", "loss_spike", "grad_norm_spike", "exception", "rule", "stop")
MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
PHASES = ("forward", "backward", "loss", "weights")
#: an incident file holds at most this many incidents; later ones are counted in the last one's `dropped`
MAX_INCIDENTS = 1000


def incidents_key(worker: str) -> str:
    """The incident file of one worker (the name percent-encoded as the worker folders are)."""
    return f"{INCIDENTS_DIR}/{quote(worker, safe='')}{SUFFIX}"


def _finite_or_none(x: Any) -> Any:
    """JSON has no NaN or infinity: non-finite floats are written as strings ("nan", "inf", "-inf")."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


def make_incident(kind: str, step: int, mode: str, mode_step: int, worker: str, wall_time: float,
                  ring: tuple[int, int] | None, detail: dict[str, Any]) -> dict[str, Any]:
    """One incident, checked against the format (a ValueError names a bad field)."""
    if kind not in KINDS:
        raise ValueError(f"incident kind {kind!r}: allowed are {', '.join(KINDS)}")
    if mode not in MODES:
        raise ValueError(f"incident mode {mode!r}: allowed are {', '.join(MODES)}")
    if not isinstance(detail, dict):
        raise ValueError(f"incident detail must be a dict, not {type(detail).__name__}")
    if kind == "non_finite" and detail.get("phase") not in PHASES:
        raise ValueError(f"non_finite incident phase {detail.get('phase')!r}: allowed are {', '.join(PHASES)}")
    return {
        "kind": kind, "step": int(step), "mode": mode, "mode_step": int(mode_step), "worker": str(worker),
        "wall_time": float(wall_time),
        "ring": None if ring is None else {"first_step": int(ring[0]), "last_step": int(ring[1])},
        "detail": _finite_or_none(detail),
    }


def encode(incident: dict[str, Any]) -> bytes:
    """One line of an incident file."""
    return json.dumps(incident, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class IncidentLog:
    """The incident file of one worker, written whole at each incident (atomic on every storage)."""

    def __init__(self, storage: Storage, worker: str, max_incidents: int = MAX_INCIDENTS):
        self.storage = storage
        self.worker = worker
        self.key = incidents_key(worker)
        self.max_incidents = max_incidents
        self._lines: list[bytes] | None = None  # (read at the first append: a file of an earlier process is kept)
        self.dropped = 0  # incidents not written (past max_incidents)

    def append(self, incident: dict[str, Any]) -> bool:
        """Write `incident` after those already in the file; False when the file is full (it is counted)."""
        if self._lines is None:
            self._lines = []
            if self.storage.exists(self.key):
                self._lines = [ln + b"\n" for ln in self.storage.read(self.key).splitlines() if ln.strip()]
        if len(self._lines) >= self.max_incidents:
            self.dropped += 1
            return False
        self._lines.append(encode(incident))
        self.storage.write(self.key, b"".join(self._lines))
        return True
