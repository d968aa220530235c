"""Parsing of rule parameters. Parameters arrive as Python values or as strings (from JSON, the CLI or
SageMaker's RuleParameters); every parser accepts both and raises InvalidConfiguration naming the rule,
the parameter, the value and what is allowed."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from tensortap import modes as _modes
from tensortap.exceptions import InvalidConfiguration
from tensortap.modes import ModeKeys

__all__ = [
    "as_float",
    "as_int",
    "as_bool",
    "as_str",
    "as_str_list",
    "as_regex_list",
    "as_float_list",
    "as_int_list",
    "as_float_pair",
    "as_mode",
    "split_top_level",
]

_NONE = ("none", "null", "")


def _err(owner: str, name: str, value: Any, what: str) -> InvalidConfiguration:
    return InvalidConfiguration(f"{owner}: {name}={value!r} {what}")


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE)


def as_float(
    value: Any,
    name: str,
    owner: str = "rule",
    *,
    optional: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:
    """A float from a number or a string holding one ("1e-7"); None allowed when `optional`."""
    if _is_none(value):
        if optional:
            return None
        raise _err(owner, name, value, "is required: give a number")
    if isinstance(value, bool):
        raise _err(owner, name, value, "must be a number, not a bool")
    try:
        f = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise _err(owner, name, value, "must be a number (or a string holding one)") from None
    if math.isnan(f):
        raise _err(owner, name, value, "must be a number, not NaN")
    if minimum is not None and f < minimum:
        raise _err(owner, name, value, f"must be >= {minimum}")
    if maximum is not None and f > maximum:
        raise _err(owner, name, value, f"must be <= {maximum}")
    return f


def as_int(
    value: Any, name: str, owner: str = "rule", *, optional: bool = False, minimum: int | None = None
) -> int | None:
    """An int from an int or a string holding one ("10", also "10.0"); None allowed when `optional`."""
    if _is_none(value):
        if optional:
            return None
        raise _err(owner, name, value, "is required: give an integer")
    if isinstance(value, bool):
        raise _err(owner, name, value, "must be an integer, not a bool")
    try:
        if isinstance(value, str):
            s = value.strip()
            f = float(s)
            if not f.is_integer():
                raise ValueError
            i = int(f)
        elif isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            i = int(value)
        else:
            i = int(value)
    except (TypeError, ValueError, OverflowError):
        raise _err(owner, name, value, "must be an integer (or a string holding one)") from None
    if minimum is not None and i < minimum:
        raise _err(owner, name, value, f"must be >= {minimum}")
    return i


def as_bool(value: Any, name: str, owner: str = "rule") -> bool:
    """A bool from a bool or "true"/"false" (any case; also "1"/"0", "yes"/"no")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "1", "yes", "y", "on"):
            return True
        if low in ("false", "0", "no", "n", "off"):
            return False
    raise _err(owner, name, value, "must be True/False or one of the strings 'true'/'false'")


def as_str(value: Any, name: str, owner: str = "rule", *, optional: bool = False) -> str | None:
    if _is_none(value):
        if optional:
            return None
        raise _err(owner, name, value, "is required: give a string")
    if not isinstance(value, str):
        raise _err(owner, name, value, f"must be a string, not {type(value).__name__}")
    return value.strip()


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside (), [] and {} (so regexes like `a{1,3}` stay whole); items stripped, empties dropped."""
    out, depth, cur = [], 0, []
    esc = False
    for ch in s:
        if esc:
            cur.append(ch)
            esc = False
            continue
        if ch == "\\":
            cur.append(ch)
            esc = True
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def as_str_list(value: Any, name: str, owner: str = "rule") -> list[str]:
    """Strings from a list or a comma-separated string; None gives []."""
    if _is_none(value):
        return []
    if isinstance(value, str):
        return split_top_level(value)
    if isinstance(value, Iterable) and not isinstance(value, bytes | dict):
        items = list(value)
        for x in items:
            if not isinstance(x, str):
                raise _err(owner, name, value, f"must hold strings; {x!r} is a {type(x).__name__}")
        return [x.strip() for x in items if x.strip()]
    raise _err(owner, name, value, "must be a comma-separated string or a list of strings")


def as_regex_list(value: Any, name: str, owner: str = "rule") -> list[str]:
    """Regexes from a list or a comma-separated string (commas inside {}, [] or () do not split)."""
    items = as_str_list(value, name, owner)
    for r in items:
        try:
            re.compile(r)
        except re.error as e:
            raise _err(owner, name, value, f"holds {r!r}, which is not a valid regular expression: {e}") from None
    return items


def _numbers(value: Any, name: str, owner: str, conv: Any) -> list:
    if _is_none(value):
        return []
    if isinstance(value, str):
        s = value.strip()
        if s[:1] in "([" and s[-1:] in ")]":
            s = s[1:-1]
        items: list[Any] = [x for x in (t.strip() for t in s.split(",")) if x]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        raise _err(owner, name, value, "must be a number, a list of numbers or a comma-separated string")
    return [conv(x, f"{name}[{i}]", owner) for i, x in enumerate(items)]


def as_float_list(value: Any, name: str, owner: str = "rule") -> list[float]:
    """Floats from a number, a list or a string such as "50" or "50, 40"."""
    return _numbers(value, name, owner, as_float)


def as_int_list(value: Any, name: str, owner: str = "rule") -> list[int]:
    """Ints from an int, a list or a string such as "0" or "0, 1"."""
    return _numbers(value, name, owner, as_int)


def as_float_pair(value: Any, name: str, owner: str = "rule") -> tuple[float, float]:
    """(low, high) from a 2-sequence or a string "(-9.5, 9.5)" / "-9.5,9.5", with low < high."""
    vals = as_float_list(value, name, owner)
    if len(vals) != 2:
        raise _err(owner, name, value, "must be a pair (low, high), e.g. '(-9.5, 9.5)'")
    lo, hi = vals
    if not lo < hi:
        raise _err(owner, name, value, "must have low < high")
    return lo, hi


def as_mode(value: Any, name: str, owner: str = "rule", *, optional: bool = True) -> ModeKeys | None:
    """A mode from a ModeKeys or its name ("TRAIN", "eval", ...); None allowed when `optional`."""
    if _is_none(value):
        if optional:
            return None
        raise _err(owner, name, value, "is required: give TRAIN, EVAL, PREDICT or GLOBAL")
    try:
        return _modes.parse_mode(value)
    except (InvalidConfiguration, ValueError):
        raise _err(owner, name, value, "must be one of TRAIN, EVAL, PREDICT, GLOBAL") from None
