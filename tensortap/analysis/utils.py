"""Context managers that turn a trial's automatic refresh off or on, and restore it afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any


def _as_list(trials: Any) -> list:
    return list(trials) if isinstance(trials, Iterable) else [trials]


@contextlib.contextmanager
def _set_refresh(trials: Any, value: bool) -> Iterator[None]:
    ts = _as_list(trials)
    before = [t.dynamic_refresh for t in ts]
    for t in ts:
        t.dynamic_refresh = value
    try:
        yield
    finally:
        for t, b in zip(ts, before, strict=True):
            t.dynamic_refresh = b


def no_refresh(trials: Any) -> contextlib.AbstractContextManager[None]:
    """Inside the block the trial(s) read no new data (consistent view); the previous setting comes back after."""
    return _set_refresh(trials, False)


def refresh(trials: Any) -> contextlib.AbstractContextManager[None]:
    """Inside the block the trial(s) refresh automatically; the previous setting comes back after."""
    return _set_refresh(trials, True)
