"""Checks of the arguments of trial and tensor queries: a bad one raises InvalidConfiguration naming it."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.format.entries import reduction_code


def step(value: Any, what: str = "step") -> int:
    """A step number: a non-negative int (numpy ints too, not bool)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise InvalidConfiguration(f"{what}={value!r} must be a non-negative int")


def steps(value: Any, what: str = "required_steps") -> list[int]:
    """A collection of step numbers (a list, tuple, range, set or array of non-negative ints)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidConfiguration(f"{what}={value!r} must be a list of non-negative ints")
    items = list(value)
    for s in items:
        if not (isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0):
            raise InvalidConfiguration(f"{what}={value!r} must be a list of non-negative ints; {s!r} is not one")
    return [int(s) for s in items]


def timeout(value: Any) -> float | None:
    """None (wait without limit) or a non-negative number of seconds."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise InvalidConfiguration(f"timeout={value!r} must be None or a non-negative number of seconds")


def worker(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidConfiguration(f"worker={value!r} must be a worker name (str) or None")


def name(value: Any, what: str = "name") -> str:
    if isinstance(value, str):
        return value
    raise InvalidConfiguration(f"{what}={value!r} must be a str")


def reduction(value: Any, abs: Any = False) -> int:
    """The code of reduction `value` (min, max, mean, std, variance, sum, prod, median, l1, l2)."""
    if not isinstance(abs, bool):
        raise InvalidConfiguration(f"abs={abs!r} must be True or False")
    if not isinstance(value, str):
        raise InvalidConfiguration(f"reduction_name={value!r} must be a reduction name (str)")
    try:
        return reduction_code(value, abs)
    except ValueError as e:
        raise InvalidConfiguration(str(e)) from None


def regexes(value: Any) -> list[re.Pattern]:
    """One regex or a list of them, compiled."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, bytes) or not isinstance(items, Iterable):
        raise InvalidConfiguration(f"regex={value!r} must be a regex (str) or a list of them")
    out = []
    for r in items:
        if not isinstance(r, str):
            raise InvalidConfiguration(f"regex={value!r}: {r!r} is not a str")
        try:
            out.append(re.compile(r))
        except re.error as e:
            raise InvalidConfiguration(f"regex={r!r} is not a valid regular expression: {e}") from None
    return out
