"""The job a `tensortap run` describes, from the command line or a YAML/JSON job file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from tensortap.exceptions import InvalidConfiguration

_COLLECTION_KEYS = {
    "save_interval", "start_step", "end_step", "save_steps", "include_regex", "reductions", "save_raw_tensor",
    "save_shape", "save_histogram", "train.save_interval", "eval.save_interval", "predict.save_interval",
    "train.save_steps", "eval.save_steps",
}


@dataclass
class RuleSpec:
    """One rule to run: a built-in by name (snake_case or class name) or a class from a user file."""

    name: str
    params: dict[str, str] = field(default_factory=dict)
    file: str | None = None  # path of a .py file holding the class `name`

    @property
    def label(self) -> str:
        from tensortap.rules.builtin import snake_name

        return snake_name(self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "file": self.file}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RuleSpec:
        return cls(d["name"], dict(d.get("params") or {}), d.get("file"))


@dataclass
class JobSpec:
    out_dir: str
    command: list[str] = field(default_factory=list)
    save_interval: int | None = None
    collections: dict[str, dict[str, str]] = field(default_factory=dict)
    rules: list[RuleSpec] = field(default_factory=list)
    stop_on_issue: bool = False
    grace_period: float = 30.0
    include_workers: str = "all"
    json_output: bool = False
    tensorboard_dir: str | None = None  # live TensorBoard export there (the hook's export_tensorboard)
    flight_recorder: bool = True  # the hook's flight recorder (docs/pytorch.md); --no-flight-recorder turns it off


def parse_params(text: str, what: str) -> dict[str, str]:
    """`k=v,k2=v2` → {k: v}. Values may hold commas inside brackets or quotes: `labels=[0,1],x=2`."""
    from tensortap.rules.params import split_top_level

    out: dict[str, str] = {}
    if not text.strip():
        return out
    for part in split_top_level(text, ","):
        if "=" not in part:
            raise InvalidConfiguration(f"{what}: {part!r} is not key=value (write name:key=value,key2=value2)")
        k, v = part.split("=", 1)
        k = k.strip()
        if not k:
            raise InvalidConfiguration(f"{what}: empty parameter name in {part!r}")
        out[k] = v.strip().strip("'\"")
    return out


def parse_rule(text: str) -> RuleSpec:
    """`name` or `name:key=value,...`."""
    name, _, params = text.partition(":")
    name = name.strip()
    if not name:
        raise InvalidConfiguration(f"--rule {text!r}: give a rule name, e.g. vanishing_gradient")
    return RuleSpec(name, parse_params(params, f"--rule {name}"))


def parse_rule_file(text: str) -> RuleSpec:
    """`path.py:ClassName[:key=value,...]`."""
    parts = text.split(":", 2)
    if len(parts) < 2 or not parts[0].endswith(".py") or not parts[1].strip():
        raise InvalidConfiguration(f"--rule-file {text!r}: write path/to/rules.py:ClassName[:key=value,...]")
    path, cls = parts[0], parts[1].strip()
    if not os.path.isfile(path):
        raise InvalidConfiguration(f"--rule-file {text!r}: no such file {path!r}")
    params = parse_params(parts[2], f"--rule-file {cls}") if len(parts) == 3 else {}
    return RuleSpec(cls, params, os.path.abspath(path))


def parse_collection(text: str) -> tuple[str, dict[str, str]]:
    """`name` or `name:save_interval=5,reductions=mean`."""
    name, _, params = text.partition(":")
    name = name.strip()
    if not name:
        raise InvalidConfiguration(f"--collection {text!r}: give a collection name, e.g. weights")
    p = parse_params(params, f"--collection {name}")
    bad = sorted(set(p) - _COLLECTION_KEYS)
    if bad:
        raise InvalidConfiguration(
            f"--collection {name}: unknown parameter(s) {bad}; allowed: {', '.join(sorted(_COLLECTION_KEYS))}"
        )
    return name, p


def load_job_file(path: str) -> dict[str, Any]:
    """A YAML or JSON job file as a dict (YAML needs PyYAML)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InvalidConfiguration(f"--config {path!r}: {e.strerror}") from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise InvalidConfiguration(f"--config {path!r}: YAML job files need PyYAML (pip install pyyaml)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidConfiguration(f"--config {path!r}: not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InvalidConfiguration(f"--config {path!r}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidConfiguration(f"--config {path!r}: the top level must be a mapping")
    allowed = {"out_dir", "save_interval", "collections", "rules", "rule_files", "stop_on_issue", "grace_period",
               "include_workers", "command"}
    bad = sorted(set(data) - allowed)
    if bad:
        raise InvalidConfiguration(f"--config {path!r}: unknown key(s) {bad}; allowed: {', '.join(sorted(allowed))}")
    return data


def _as_str_params(d: Any, what: str) -> dict[str, str]:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise InvalidConfiguration(f"{what}: parameters must be a mapping, not {d!r}")
    return {str(k): (json.dumps(v) if isinstance(v, list | dict) else str(v)) for k, v in d.items()}


def merge_job_file(spec: JobSpec, data: dict[str, Any]) -> None:
    """Settings from a job file; command-line settings given explicitly win (they are applied after)."""
    if "out_dir" in data and not spec.out_dir:
        spec.out_dir = str(data["out_dir"])
    if "save_interval" in data and spec.save_interval is None:
        spec.save_interval = int(data["save_interval"])
    colls = data.get("collections") or {}
    if isinstance(colls, list):
        colls = {c: {} for c in colls}
    for name, params in colls.items():
        spec.collections.setdefault(str(name), _as_str_params(params, f"collection {name}"))
    for r in data.get("rules") or []:
        if isinstance(r, str):
            spec.rules.append(parse_rule(r))
        elif isinstance(r, dict) and "name" in r:
            spec.rules.append(RuleSpec(str(r["name"]), _as_str_params(r.get("params"), f"rule {r['name']}"),
                                       os.path.abspath(r["file"]) if r.get("file") else None))
        else:
            raise InvalidConfiguration(f"job file rule {r!r}: give a name or {{name, params, file}}")
    for r in data.get("rule_files") or []:
        spec.rules.append(parse_rule_file(str(r)))
    if data.get("stop_on_issue"):
        spec.stop_on_issue = True
    if "grace_period" in data:
        spec.grace_period = float(data["grace_period"])
    if "include_workers" in data:
        spec.include_workers = str(data["include_workers"])
    if data.get("tensorboard_dir") and spec.tensorboard_dir is None:
        spec.tensorboard_dir = os.path.abspath(str(data["tensorboard_dir"]))
    if not spec.command and data.get("command"):
        cmd = data["command"]
        spec.command = cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]
