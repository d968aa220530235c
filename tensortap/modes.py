"""Training modes. Each mode counts its own steps; the global step counts every step of every mode."""

from __future__ import annotations

from enum import Enum

__all__ = ["ModeKeys", "TRAIN", "EVAL", "PREDICT", "GLOBAL", "ALLOWED_MODES", "parse_mode"]


class ModeKeys(Enum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4

    # Members are singletons compared by identity: hash them by identity too, in C (Enum's own __hash__
    # is a Python function, and mode-keyed dicts are read several times per training step).
    __hash__ = object.__hash__


TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
ALLOWED_MODES = (TRAIN, EVAL, PREDICT, GLOBAL)


def parse_mode(value: ModeKeys | str | int) -> ModeKeys:
    """A ModeKeys from a ModeKeys, its name (any case) or its number; ValueError naming the allowed ones."""
    if isinstance(value, ModeKeys):
        return value
    if isinstance(value, str):
        try:
            return ModeKeys[value.strip().upper()]
        except KeyError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return ModeKeys(value)
        except ValueError:
            pass
    from tensortap.exceptions import InvalidConfiguration

    raise InvalidConfiguration(
        f"unknown mode {value!r}: allowed are {', '.join(m.name for m in ModeKeys)} (or tensortap.modes.ModeKeys)"
    )
