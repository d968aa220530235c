"""What to save and when: SaveConfigMode / SaveConfig (steps per mode), ReductionConfig (per tensor).

All three are immutable, validate at construction (InvalidConfiguration naming the bad value and what is
allowed) and round-trip through smdebug's JSON format (collections JSON, spec 4.1).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.modes import ALLOWED_MODES, ModeKeys, parse_mode

__all__ = [
    "DEFAULT_SAVE_INTERVAL",
    "ALLOWED_REDUCTIONS",
    "ALLOWED_NORMS",
    "SaveConfigMode",
    "SaveConfig",
    "ReductionConfig",
    "parse_bool",
    "parse_int",
    "split_list",
]

DEFAULT_SAVE_INTERVAL = 500
#: `nonfinite` is the count of NaN and ±Inf elements (tensortap's; smdebug has no such reduction)
ALLOWED_REDUCTIONS: tuple[str, ...] = ("min", "max", "mean", "std", "variance", "sum", "prod", "median", "nonfinite")
ALLOWED_NORMS: tuple[str, ...] = ("l1", "l2")
SAVE_CONFIG_KEYS: tuple[str, ...] = ("save_interval", "save_steps", "start_step", "end_step")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


# ----------------------------------------------------------------------------------------- value parsing


def parse_int(value: Any, name: str) -> int:
    """An int from an int (not a bool) or a string holding one; else InvalidConfiguration naming `name`."""
    if isinstance(value, bool):
        raise InvalidConfiguration(f"{name}={value!r} must be an integer, not a bool")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise InvalidConfiguration(f"{name}={value!r} must be an integer (or a string holding one)") from None
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidConfiguration(
            f"{name}={value!r} must be an integer (or a string holding one), not {type(value).__name__}"
        ) from None


def parse_bool(value: Any, name: str) -> bool:
    """A bool from a bool or "true"/"false" (any case; also "1"/"0", "yes"/"no"); else an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise InvalidConfiguration(f"{name}={value!r} must be a bool or one of the strings 'true'/'false'")


def split_list(value: Any, name: str) -> list[Any]:
    """Items of a comma string ("a, b" -> ["a", "b"], empty items dropped) or of a list/tuple/set."""
    if value is None:
        return []
    if isinstance(value, str):
        return [tok.strip() for tok in value.split(",") if tok.strip()]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise InvalidConfiguration(
        f"{name}={value!r} must be a comma-separated string or a list, not {type(value).__name__}"
    )


# ----------------------------------------------------------------------------------------- SaveConfigMode


@dataclass(frozen=True, init=False)
class SaveConfigMode:
    """When to save in one mode: every `save_interval` steps in [start_step, end_step), plus `save_steps`."""

    save_interval: int
    start_step: int
    end_step: int | None
    save_steps: tuple[int, ...]
    _save_steps_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        save_interval: int | str | None = None,
        start_step: int | str | None = None,
        end_step: int | str | None = None,
        save_steps: Iterable[int | str] | str | int | None = None,
    ) -> None:
        interval = DEFAULT_SAVE_INTERVAL if save_interval is None else parse_int(save_interval, "save_interval")
        if interval <= 0:
            raise InvalidConfiguration(f"save_interval={save_interval!r} must be a positive integer (>= 1)")
        start = 0 if start_step is None else parse_int(start_step, "start_step")
        if start < 0:
            raise InvalidConfiguration(f"start_step={start_step!r} must be >= 0")
        end = None if end_step is None else parse_int(end_step, "end_step")
        if end is not None and end < start:
            raise InvalidConfiguration(
                f"end_step={end_step!r} must be None (no end) or >= start_step={start} (it is exclusive)"
            )
        if isinstance(save_steps, int) and not isinstance(save_steps, bool):
            save_steps = [save_steps]
        steps: list[int] = []
        for item in split_list(save_steps, "save_steps"):
            step = parse_int(item, f"save_steps item {item!r}; save_steps")
            if step < 0:
                raise InvalidConfiguration(f"save_steps item {item!r} must be >= 0")
            if step not in steps:
                steps.append(step)
        object.__setattr__(self, "save_interval", interval)
        object.__setattr__(self, "start_step", start)
        object.__setattr__(self, "end_step", end)
        object.__setattr__(self, "save_steps", tuple(sorted(steps)))
        object.__setattr__(self, "_save_steps_set", frozenset(steps))

    def should_save_step(self, step: int) -> bool:
        """True if `step` is in save_steps, or in [start_step, end_step) and a multiple of save_interval."""
        if step in self._save_steps_set:
            return True
        if step < self.start_step or (self.end_step is not None and step >= self.end_step):
            return False
        return step % self.save_interval == 0

    def next_save_step(self, step: int) -> float:
        """The first step >= `step` that `should_save_step` (inf if none)."""
        best: float = math.inf
        for s in self.save_steps:  # (sorted)
            if s >= step:
                best = s
                break
        first = step if step > self.start_step else self.start_step
        first = -(-first // self.save_interval) * self.save_interval
        if (self.end_step is None or first < self.end_step) and first < best:
            best = first
        return best

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's form: {save_interval, save_steps, start_step, end_step}."""
        return {
            "save_interval": self.save_interval,
            "save_steps": list(self.save_steps),
            "start_step": self.start_step,
            "end_step": self.end_step,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], default_values: Mapping[str, Any] | None = None) -> SaveConfigMode:
        """Build from {save_interval, save_steps, start_step, end_step}; missing keys from default_values."""
        if isinstance(d, SaveConfigMode):
            return d
        if not isinstance(d, Mapping):
            raise InvalidConfiguration(f"a save config mode must be a dict, not {type(d).__name__}: {d!r}")
        merged = {**(default_values or {}), **d}
        unknown = sorted(set(merged) - set(SAVE_CONFIG_KEYS))
        if unknown:
            raise InvalidConfiguration(
                f"unknown save config key(s) {unknown}: allowed are {', '.join(SAVE_CONFIG_KEYS)}"
            )
        return cls(**merged)


# ----------------------------------------------------------------------------------------- SaveConfig


class SaveConfig:
    """A SaveConfigMode per mode (TRAIN, EVAL, PREDICT, GLOBAL); a mode may be None until merged."""

    __slots__ = ("_modes",)
    _modes: tuple[SaveConfigMode | None, ...]

    def __init__(
        self,
        mode_save_configs: Mapping[ModeKeys | str, SaveConfigMode | Mapping[str, Any] | None] | None = None,
        save_interval: int | str | None = None,
        start_step: int | str | None = None,
        end_step: int | str | None = None,
        save_steps: Iterable[int | str] | str | None = None,
    ) -> None:
        if mode_save_configs is None:
            one = SaveConfigMode(save_interval, start_step, end_step, save_steps)
            modes: list[SaveConfigMode | None] = [one] * len(ALLOWED_MODES)
        else:
            given = {
                k: v
                for k, v in (
                    ("save_interval", save_interval),
                    ("start_step", start_step),
                    ("end_step", end_step),
                    ("save_steps", save_steps),
                )
                if v is not None
            }
            if given:
                raise InvalidConfiguration(
                    f"pass either mode_save_configs or {', '.join(given)}, not both (got {given!r})"
                )
            if not isinstance(mode_save_configs, Mapping):
                raise InvalidConfiguration(
                    "mode_save_configs must be a dict {mode: SaveConfigMode | dict | None}, "
                    f"not {type(mode_save_configs).__name__}"
                )
            by_mode: dict[ModeKeys, SaveConfigMode | None] = {}
            for key, value in mode_save_configs.items():
                mode = parse_mode(key)
                if mode in by_mode:
                    raise InvalidConfiguration(f"mode {mode.name} is given twice in mode_save_configs")
                if value is None or isinstance(value, SaveConfigMode):
                    by_mode[mode] = value
                elif isinstance(value, Mapping):
                    by_mode[mode] = SaveConfigMode.from_dict(value)
                else:
                    raise InvalidConfiguration(
                        f"save config of mode {mode.name} must be a SaveConfigMode, a dict or None, "
                        f"not {type(value).__name__}: {value!r}"
                    )
            modes = [by_mode.get(m) for m in ALLOWED_MODES]
        object.__setattr__(self, "_modes", tuple(modes))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"SaveConfig is immutable (cannot set {name!r}): give the collection or hook a new one, "
                             f"e.g. collection.save_config = SaveConfig({name}=...)")

    def __reduce__(self) -> tuple[Any, ...]:
        return (SaveConfig, (self.mode_save_configs,))

    @property
    def mode_save_configs(self) -> dict[ModeKeys, SaveConfigMode | None]:
        """A copy of the per-mode configs (None for a mode not yet merged)."""
        return dict(zip(ALLOWED_MODES, self._modes, strict=True))

    def get_save_config(self, mode: ModeKeys | str) -> SaveConfigMode:
        """The SaveConfigMode of `mode`; a mode left None gives the default SaveConfigMode()."""
        cfg = self._modes[ALLOWED_MODES.index(parse_mode(mode))]
        return cfg if cfg is not None else SaveConfigMode()

    def is_complete(self) -> bool:
        """True if every mode has its own SaveConfigMode (nothing left to merge)."""
        return all(m is not None for m in self._modes)

    def should_save_step(self, mode: ModeKeys | str, mode_step: int) -> bool:
        """Whether step `mode_step` of `mode` (the mode's own counter) is saved."""
        return self.get_save_config(mode).should_save_step(mode_step)

    def merge_default(self, default: SaveConfig | None) -> SaveConfig:
        """A SaveConfig whose None modes come from `default` (or SaveConfigMode() where that is None too)."""
        if default is not None and not isinstance(default, SaveConfig):
            default = SaveConfig.coerce(default)
        merged = {}
        for i, mode in enumerate(ALLOWED_MODES):
            own = self._modes[i]
            if own is None and default is not None:
                own = default._modes[i]
            merged[mode] = own if own is not None else SaveConfigMode()
        return SaveConfig(merged)

    def to_json_dict(self) -> dict[str, dict[str, Any] | None]:
        """smdebug's form: {"TRAIN": {...} | None, "EVAL": ..., "PREDICT": ..., "GLOBAL": ...}."""
        return {
            mode.name: (cfg.to_json_dict() if cfg is not None else None)
            for mode, cfg in zip(ALLOWED_MODES, self._modes, strict=True)
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(
        cls,
        d: Mapping[ModeKeys | str, SaveConfigMode | Mapping[str, Any] | None],
        default_values: Mapping[str, Any] | None = None,
    ) -> SaveConfig:
        """Parse {mode (name or ModeKeys): dict | SaveConfigMode | None}; missing keys from default_values."""
        if not isinstance(d, Mapping):
            raise InvalidConfiguration(f"a save config must be a dict of modes, not {type(d).__name__}: {d!r}")
        modes = {
            k: (SaveConfigMode.from_dict(v, default_values) if isinstance(v, Mapping) else v) for k, v in d.items()
        }
        return cls(mode_save_configs=modes)

    @classmethod
    def from_json(cls, s: str) -> SaveConfig:
        return cls.from_dict(json.loads(s))

    @classmethod
    def coerce(cls, x: SaveConfig | SaveConfigMode | Mapping[Any, Any] | None) -> SaveConfig:
        """A SaveConfig from None (defaults), a SaveConfig, a SaveConfigMode (all modes), or a dict.

        The dict is either per mode ({mode: SaveConfigMode | dict | None}) or flat
        ({save_interval, start_step, end_step, save_steps}, applied to all modes).
        """
        if x is None:
            return cls()
        if isinstance(x, SaveConfig):
            return x
        if isinstance(x, SaveConfigMode):
            return cls({m: x for m in ALLOWED_MODES})
        if isinstance(x, Mapping):
            if x and all(isinstance(k, str) and k in SAVE_CONFIG_KEYS for k in x):
                return cls(**x)
            return cls.from_dict(x)
        raise InvalidConfiguration(
            f"save_config={x!r} must be None, a SaveConfig, SaveConfigMode or dict, not {type(x).__name__}"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SaveConfig):
            return NotImplemented
        return self._modes == other._modes

    def __hash__(self) -> int:
        return hash(self._modes)

    def __repr__(self) -> str:
        if len(set(self._modes)) == 1 and self._modes[0] is not None:
            return f"SaveConfig(all modes: {self._modes[0]!r})"
        inner = ", ".join(f"{m.name}={c!r}" for m, c in zip(ALLOWED_MODES, self._modes, strict=True))
        return f"SaveConfig({inner})"


# ---------------------------------------------------------------------------------------- ReductionConfig


def _names(value: Any, field_name: str, allowed: tuple[str, ...], strip_norm: bool = False) -> tuple[str, ...]:
    out: list[str] = []
    for item in split_list(value, field_name):
        if not isinstance(item, str):
            raise InvalidConfiguration(f"{field_name} item {item!r} must be a string, one of {', '.join(allowed)}")
        name = item.strip().lower()
        if strip_norm and name.endswith("_norm"):
            name = name[: -len("_norm")]
        if name not in allowed:
            hint = " (l1/l2 are norms: pass them as norms)" if name in ALLOWED_NORMS else ""
            raise InvalidConfiguration(f"unknown {field_name} item {item!r}: allowed are {', '.join(allowed)}{hint}")
        if name not in out:
            out.append(name)
    return tuple(out)


@dataclass(frozen=True, init=False)
class ReductionConfig:
    """Reductions and norms to save per tensor (optionally of abs(tensor)); whether to save raw and shape."""

    reductions: tuple[str, ...]
    abs_reductions: tuple[str, ...]
    norms: tuple[str, ...]
    abs_norms: tuple[str, ...]
    save_raw_tensor: bool
    save_shape: bool

    def __init__(
        self,
        reductions: Iterable[str] | str | None = None,
        abs_reductions: Iterable[str] | str | None = None,
        norms: Iterable[str] | str | None = None,
        abs_norms: Iterable[str] | str | None = None,
        save_raw_tensor: bool = False,
        save_shape: bool = False,
    ) -> None:
        for flag_name, flag in (("save_raw_tensor", save_raw_tensor), ("save_shape", save_shape)):
            if not isinstance(flag, bool):
                raise InvalidConfiguration(f"{flag_name}={flag!r} must be a bool (True or False)")
        object.__setattr__(self, "reductions", _names(reductions, "reductions", ALLOWED_REDUCTIONS))
        object.__setattr__(self, "abs_reductions", _names(abs_reductions, "abs_reductions", ALLOWED_REDUCTIONS))
        object.__setattr__(self, "norms", _names(norms, "norms", ALLOWED_NORMS, strip_norm=True))
        object.__setattr__(self, "abs_norms", _names(abs_norms, "abs_norms", ALLOWED_NORMS, strip_norm=True))
        object.__setattr__(self, "save_raw_tensor", save_raw_tensor)
        object.__setattr__(self, "save_shape", save_shape)

    def requested(self) -> list[tuple[str, bool]]:
        """(name, abs) of every reduction then norm ("l1"/"l2"), de-duplicated, in a stable order."""
        out: list[tuple[str, bool]] = []
        for names, is_abs in (
            (self.reductions, False),
            (self.norms, False),
            (self.abs_reductions, True),
            (self.abs_norms, True),
        ):
            for name in names:
                if (name, is_abs) not in out:
                    out.append((name, is_abs))
        return out

    def reductions_string(self) -> str:
        """smdebug's comma list: mean, ..., l1_norm, ..., abs_mean, ..., abs_l2_norm."""
        return ",".join(
            [*self.reductions]
            + [f"{n}_norm" for n in self.norms]
            + [f"abs_{r}" for r in self.abs_reductions]
            + [f"abs_{n}_norm" for n in self.abs_norms]
        )

    @classmethod
    def from_string(
        cls, s: str | Iterable[str], save_raw_tensor: bool = False, save_shape: bool = False
    ) -> ReductionConfig:
        """Parse smdebug's comma list ("min,abs_mean,l2_norm,abs_l1_norm"); bare l1, l2, abs_l1 are norms."""
        kinds: dict[str, list[str]] = {"reductions": [], "abs_reductions": [], "norms": [], "abs_norms": []}
        for item in split_list(s, "reductions"):
            if not isinstance(item, str):
                raise InvalidConfiguration(f"reductions item {item!r} must be a string")
            tok = item.strip().lower()
            is_abs = tok.startswith("abs_")
            base = tok[len("abs_") :] if is_abs else tok
            is_norm = base.endswith("_norm") or base in ALLOWED_NORMS
            if base.endswith("_norm"):
                base = base[: -len("_norm")]
            if (is_norm and base not in ALLOWED_NORMS) or (not is_norm and base not in ALLOWED_REDUCTIONS):
                raise InvalidConfiguration(
                    f"unknown reduction {item!r}: allowed are {', '.join(ALLOWED_REDUCTIONS)}, norms "
                    f"{', '.join(ALLOWED_NORMS)} (written l1_norm or l1), each optionally prefixed abs_"
                )
            key = ("abs_" if is_abs else "") + ("norms" if is_norm else "reductions")
            kinds[key].append(base)
        return cls(**kinds, save_raw_tensor=save_raw_tensor, save_shape=save_shape)

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's form: {save_raw_tensor, reductions: "<comma list>", save_shape}."""
        return {
            "save_raw_tensor": self.save_raw_tensor,
            "reductions": self.reductions_string(),
            "save_shape": self.save_shape,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReductionConfig:
        """Parse smdebug's form; bools may be "true"/"false"; `reductions` may be a comma string or a list.

        The structured keys abs_reductions, norms and abs_norms are accepted too.
        """
        if isinstance(d, ReductionConfig):
            return d
        if not isinstance(d, Mapping):
            raise InvalidConfiguration(f"a reduction config must be a dict, not {type(d).__name__}: {d!r}")
        allowed = ("reductions", "abs_reductions", "norms", "abs_norms", "save_raw_tensor", "save_shape")
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise InvalidConfiguration(f"unknown reduction config key(s) {unknown}: allowed are {', '.join(allowed)}")
        raw = parse_bool(d.get("save_raw_tensor", False), "save_raw_tensor")
        shape = parse_bool(d.get("save_shape", False), "save_shape")
        parsed = cls.from_string(d.get("reductions") or "")
        return cls(
            reductions=parsed.reductions,
            abs_reductions=parsed.abs_reductions
            + _names(d.get("abs_reductions"), "abs_reductions", ALLOWED_REDUCTIONS),
            norms=parsed.norms + _names(d.get("norms"), "norms", ALLOWED_NORMS, strip_norm=True),
            abs_norms=parsed.abs_norms + _names(d.get("abs_norms"), "abs_norms", ALLOWED_NORMS, strip_norm=True),
            save_raw_tensor=raw,
            save_shape=shape,
        )

    @classmethod
    def from_json(cls, s: str) -> ReductionConfig:
        return cls.from_dict(json.loads(s))
