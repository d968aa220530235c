"""Reading a job's incidents (docs/format.md §11): what the flight recorder saw go wrong, per worker.

`read_incidents(storage)` reads every worker's `incidents/<worker>.jsonl`; `Trial.incidents()` and
`Trial.first_nonfinite()` are the trial's view of it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.format.incidents import INCIDENTS_DIR, KINDS, SUFFIX
from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")

__all__ = ["KINDS", "check_kind", "first_nonfinite", "read_incidents"]

_warned: set[tuple[str, str, int]] = set()


def _natural(s: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def _sort_key(inc: dict[str, Any]) -> tuple:
    return (inc.get("step", 0), _natural(str(inc.get("worker", ""))))


def check_kind(kind: str | None) -> None:
    """A one-line error for a kind that is not an incident kind."""
    if kind is not None and kind not in KINDS:
        raise InvalidConfiguration(f"incident kind {kind!r}: allowed are {', '.join(KINDS)} (or None for all)")


def read_incidents(storage: Storage, kind: str | None = None) -> list[dict[str, Any]]:
    """Every incident of the job in `storage` (of `kind` only, when given), sorted by step, then worker (in
    natural order), then as each worker wrote them. A line that is not an incident (a damaged file) is skipped
    with one warning naming the file and the line."""
    check_kind(kind)
    out: list[dict[str, Any]] = []
    for key in storage.list(INCIDENTS_DIR + "/"):
        if not key.endswith(SUFFIX) or key.count("/") != 1:
            continue
        try:
            data = storage.read(key)
        except FileNotFoundError:
            continue  # (removed since it was listed)
        for n, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                inc = json.loads(line)
                ok = isinstance(inc, dict) and isinstance(inc.get("kind"), str) and isinstance(inc.get("step"), int)
            except ValueError:
                ok = False
            if not ok:
                where = (storage.url, key, n)
                if where not in _warned:
                    _warned.add(where)
                    logger.warning("tensortap: %s line %d is not an incident: skipped", storage.describe(key), n)
                continue
            if kind is None or inc["kind"] == kind:
                out.append(inc)
    out.sort(key=_sort_key)  # (stable: each worker's own order within a step is kept)
    return out


#: at one step, where a non-finite value appeared first across workers: in a forward pass (the loss's included),
#: then in the weights, then in a backward pass (data parallelism all-reduces one rank's non-finite gradients to
#: every rank: the rank whose forward made them is where they came from)
_PHASE_ORDER = {"forward": 0, "loss": 0, "weights": 1, "backward": 2}


def first_nonfinite(incidents: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest `non_finite` incident over all workers, or None: the lowest step; at that step one whose value
    appeared in a forward pass, then in the weights, then in a backward pass; then the first worker."""
    best = None
    for inc in incidents:  # (sorted by step, then worker)
        if inc.get("kind") != "non_finite":
            continue
        if best is not None and inc["step"] != best["step"]:
            break
        if best is None or _phase(inc) < _phase(best):
            best = inc
    return best


def _phase(inc: dict[str, Any]) -> int:
    detail = inc.get("detail")
    return _PHASE_ORDER.get(detail.get("phase") if isinstance(detail, dict) else None, 3)
