"""The hook JSON config in smdebug's format (LocalPath, HookParameters, CollectionConfigurations; spec 4.2).

Differences from smdebug (its bugs, fixed): save_steps may be a JSON list; save_raw_tensor / save_shape may
be "true"/"false" strings and are read even without `reductions`; median, bare l1/l2 and abs_l1/abs_l2 are
accepted; dry_run is read; LocalPath is required. A key tensortap does not know is ignored, as smdebug does,
with a warning naming it (once per process): configs written for SageMaker carry keys of their own.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensortap.collection import Collection
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode, parse_bool, split_list
from tensortap.exceptions import InvalidConfiguration
from tensortap.modes import ALLOWED_MODES, ModeKeys

__all__ = [
    "ENV_CONFIG_PATH",
    "ENV_SMDEBUG_CONFIG_PATH",
    "DEFAULT_SAGEMAKER_CONFIG_PATH",
    "HOOK_PARAMETER_KEYS",
    "COLLECTION_PARAMETER_KEYS",
    "HookConfig",
    "config_path_from_env",
    "parse_hook_config",
    "load_hook_config",
]

ENV_CONFIG_PATH = "TENSORTAP_CONFIG"
ENV_SMDEBUG_CONFIG_PATH = "SMDEBUG_CONFIG_FILE_PATH"
DEFAULT_SAGEMAKER_CONFIG_PATH = "/opt/ml/input/config/debughookconfig.json"
ENV_TRAINING_JOB_NAME = "TRAINING_JOB_NAME"
ENV_TENSORBOARD_CONFIG_PATH = "TENSORBOARD_CONFIG_FILE_PATH"
DEFAULT_SAGEMAKER_TENSORBOARD_CONFIG_PATH = "/opt/ml/input/config/tensorboardoutputconfig.json"

_SAVE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = {mode.name.lower(): mode for mode in ALLOWED_MODES}
_PREFIXED_SAVE_KEYS = tuple(f"{p}.{k}" for p in _MODE_PREFIXES for k in _SAVE_KEYS)
_REDUCTION_KEYS = ("reductions", "save_raw_tensor", "save_shape")

HOOK_PARAMETER_KEYS: tuple[str, ...] = (
    "save_all",
    "include_regex",
    "include_workers",
    *_SAVE_KEYS,
    *_PREFIXED_SAVE_KEYS,
    *_REDUCTION_KEYS,
    "export_tensorboard",
    "tensorboard_dir",
    "dry_run",
)
COLLECTION_PARAMETER_KEYS: tuple[str, ...] = (
    "include_regex",
    *_SAVE_KEYS,
    *_PREFIXED_SAVE_KEYS,
    *_REDUCTION_KEYS,
    "save_histogram",
)
INCLUDE_WORKERS = ("one", "all")
#: the top-level keys read (S3OutputPath / S3Path: where SageMaker uploads LocalPath; nothing for the hook to do)
TOP_LEVEL_KEYS: tuple[str, ...] = ("LocalPath", "HookParameters", "CollectionConfigurations", "export_tensorboard",
                                   "tensorboard_dir", "S3OutputPath", "S3Path")

logger = logging.getLogger("tensortap")
_warned_keys: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class HookConfig:
    """A parsed hook JSON config: the Hook's constructor arguments plus per-collection settings."""

    out_dir: str
    save_config: SaveConfig = field(default_factory=SaveConfig)
    reduction_config: ReductionConfig | None = None
    include_regex: list[str] | None = None
    include_collections: list[str] = field(default_factory=list)
    save_all: bool = False
    include_workers: str = "one"
    export_tensorboard: bool = False
    tensorboard_dir: str | None = None
    dry_run: bool = False
    collection_configs: dict[str, Collection] = field(default_factory=dict)

    def hook_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a Hook constructor (include_collections None when the config names none)."""
        return {
            "out_dir": self.out_dir,
            "save_config": self.save_config,
            "reduction_config": self.reduction_config,
            "include_regex": list(self.include_regex) if self.include_regex is not None else None,
            "include_collections": list(self.include_collections) or None,
            "save_all": self.save_all,
            "include_workers": self.include_workers,
            "export_tensorboard": self.export_tensorboard,
            "tensorboard_dir": self.tensorboard_dir,
            "dry_run": self.dry_run,
        }


def _known(params: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """`params` without the keys not in `allowed`; each left out is warned about once per process."""
    known = {}
    for k, v in params.items():
        if k in allowed:
            known[k] = v
        elif (where, str(k)) not in _warned_keys:
            _warned_keys.add((where, str(k)))
            logger.warning("tensortap: hook config: unknown key %r in %s is ignored (known keys: %s)",
                           k, where, ", ".join(allowed))
    return known


def _save_values_per_mode(params: Mapping[str, Any]) -> dict[ModeKeys, dict[str, Any]]:
    """{mode: {save key: raw value}}: unprefixed keys, overridden per mode by `<mode>.` prefixed ones."""
    base = {k: params[k] for k in _SAVE_KEYS if k in params}
    out = {}
    for prefix, mode in _MODE_PREFIXES.items():
        out[mode] = {**base, **{k: params[f"{prefix}.{k}"] for k in _SAVE_KEYS if f"{prefix}.{k}" in params}}
    return out


def _save_config(
    values: Mapping[ModeKeys, Mapping[str, Any]], defaults: Mapping[str, Any] | None, where: str
) -> SaveConfig:
    modes: dict[ModeKeys, SaveConfigMode] = {}
    for mode, vals in values.items():
        try:  # save_steps may be a comma string or a JSON list; values may be numeric strings
            modes[mode] = SaveConfigMode.from_dict(vals, defaults)
        except InvalidConfiguration as e:
            raise InvalidConfiguration(f"{where}, mode {mode.name}: {e}") from None
    return SaveConfig(modes)


def _reduction_config(params: Mapping[str, Any], where: str) -> ReductionConfig | None:
    """A ReductionConfig if any of reductions/save_raw_tensor/save_shape is given, else None.

    save_raw_tensor defaults to False when `reductions` is given (as in smdebug), else to True.
    """
    if not any(k in params for k in _REDUCTION_KEYS):
        return None
    reductions = params.get("reductions")
    try:
        raw_default = not split_list(reductions, "reductions")
        return ReductionConfig.from_string(
            reductions if reductions is not None else "",
            save_raw_tensor=parse_bool(params.get("save_raw_tensor", raw_default), "save_raw_tensor"),
            save_shape=parse_bool(params.get("save_shape", False), "save_shape"),
        )
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"{where}: {e}") from None


def _regex_list(value: Any, where: str) -> list[str]:
    items = split_list(value, f"{where} include_regex")
    for item in items:
        if not isinstance(item, str):
            raise InvalidConfiguration(f"{where} include_regex item {item!r} must be a string")
    return items


def _optional_bool(params: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    if key not in params or params[key] is None:
        return default
    try:
        return parse_bool(params[key], key)
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"{where}: {e}") from None


def _sagemaker_tensorboard() -> dict[str, Any] | None:
    """In a SageMaker training job ($TRAINING_JOB_NAME set), TensorBoard is on exactly when SageMaker's
    TensorBoard config file exists, writing to its LocalPath; the config's own keys are ignored (spec 4.2).
    None outside SageMaker."""
    if not os.environ.get(ENV_TRAINING_JOB_NAME):
        return None
    path = os.environ.get(ENV_TENSORBOARD_CONFIG_PATH) or DEFAULT_SAGEMAKER_TENSORBOARD_CONFIG_PATH
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        return {"export_tensorboard": False}
    except (OSError, ValueError) as e:
        raise InvalidConfiguration(f"SageMaker's TensorBoard config {path!r} is not readable JSON: {e}") from None
    local = d.get("LocalPath") if isinstance(d, Mapping) else None
    if not isinstance(local, str) or not local:
        raise InvalidConfiguration(f"SageMaker's TensorBoard config {path!r} needs 'LocalPath', got {local!r}")
    return {"export_tensorboard": True, "tensorboard_dir": local}


def parse_hook_config(d: Mapping[str, Any], default_save_config: Mapping[str, Any] | None = None) -> HookConfig:
    """Parse a hook config dict in smdebug's format.

    default_save_config ({save_interval, start_step, end_step, save_steps}) fills save keys the config leaves
    out, e.g. XGBoost's {"save_interval": 10}.
    """
    if not isinstance(d, Mapping):
        raise InvalidConfiguration(f"the hook config must be a JSON object, not {type(d).__name__}")
    out_dir = d.get("LocalPath")
    if not isinstance(out_dir, str) or not out_dir:
        raise InvalidConfiguration(
            f"the hook config needs 'LocalPath' (the out_dir), a non-empty string; got {out_dir!r}"
        )
    if default_save_config is not None:
        SaveConfigMode.from_dict(default_save_config)  # validate once, with its own message

    d = _known(d, TOP_LEVEL_KEYS, "the config's top level")
    hook_params = d.get("HookParameters") or {}
    if not isinstance(hook_params, Mapping):
        raise InvalidConfiguration(f"'HookParameters' must be an object, not {type(hook_params).__name__}")
    hook_params = _known(hook_params, HOOK_PARAMETER_KEYS, "HookParameters")

    hook_modes = _save_values_per_mode(hook_params)
    save_config = _save_config(hook_modes, default_save_config, "HookParameters")
    reduction_config = _reduction_config(hook_params, "HookParameters")
    include_regex = (
        _regex_list(hook_params["include_regex"], "HookParameters") if "include_regex" in hook_params else None
    )
    include_workers = hook_params.get("include_workers", "one")
    if not isinstance(include_workers, str) or include_workers.strip().lower() not in INCLUDE_WORKERS:
        raise InvalidConfiguration(f"include_workers={include_workers!r} must be one of {', '.join(INCLUDE_WORKERS)}")
    include_workers = include_workers.strip().lower()
    # smdebug reads the TensorBoard keys at the top level; HookParameters wins when both are given.
    tb_params = {k: d[k] for k in ("export_tensorboard", "tensorboard_dir") if k in d}
    tb_params.update({k: hook_params[k] for k in ("export_tensorboard", "tensorboard_dir") if k in hook_params})
    sagemaker_tb = _sagemaker_tensorboard()
    if sagemaker_tb is not None:
        tb_params = sagemaker_tb
    tensorboard_dir = tb_params.get("tensorboard_dir")
    if tensorboard_dir is not None and not isinstance(tensorboard_dir, str):
        raise InvalidConfiguration(f"tensorboard_dir={tensorboard_dir!r} must be a string")

    collection_configs: dict[str, Collection] = {}
    coll_list = d.get("CollectionConfigurations") or []
    if not isinstance(coll_list, list):
        raise InvalidConfiguration(f"'CollectionConfigurations' must be a list, not {type(coll_list).__name__}")
    for i, entry in enumerate(coll_list):
        if not isinstance(entry, Mapping) or "CollectionName" not in entry:
            raise InvalidConfiguration(f"CollectionConfigurations[{i}] has no 'CollectionName': {entry!r}")
        name = entry["CollectionName"]
        if not isinstance(name, str) or not name:
            raise InvalidConfiguration(f"CollectionConfigurations[{i}] 'CollectionName'={name!r} must be a string")
        _known(entry, ("CollectionName", "CollectionParameters"), f"CollectionConfigurations entry {name!r}")
        where = f"CollectionParameters of {name!r}"
        params = entry.get("CollectionParameters") or {}
        if not isinstance(params, Mapping):
            raise InvalidConfiguration(f"{where} must be an object, not {type(params).__name__}")
        params = _known(params, COLLECTION_PARAMETER_KEYS, where)
        coll_modes = _save_values_per_mode(params)
        merged = {mode: {**hook_modes[mode], **coll_modes[mode]} for mode in ALLOWED_MODES}
        coll = collection_configs.get(name) or Collection(name)
        coll.save_config = _save_config(merged, default_save_config, where)
        rc = _reduction_config(params, where)
        if rc is not None:
            coll.reduction_config = rc
        if "include_regex" in params:
            try:
                coll.include(_regex_list(params["include_regex"], where))
            except InvalidConfiguration as e:
                raise InvalidConfiguration(f"{where}: {e}") from None
        coll.save_histogram = _optional_bool(params, "save_histogram", coll.save_histogram, where)
        collection_configs[name] = coll

    return HookConfig(
        out_dir=out_dir,
        save_config=save_config,
        reduction_config=reduction_config,
        include_regex=include_regex,
        include_collections=list(collection_configs),
        save_all=_optional_bool(hook_params, "save_all", False, "HookParameters"),
        include_workers=include_workers,
        export_tensorboard=_optional_bool(tb_params, "export_tensorboard", False, "HookParameters"),
        tensorboard_dir=tensorboard_dir,
        dry_run=_optional_bool(hook_params, "dry_run", False, "HookParameters"),
        collection_configs=collection_configs,
    )


def config_path_from_env() -> str | None:
    """The hook config path named by $TENSORTAP_CONFIG, else $SMDEBUG_CONFIG_FILE_PATH, else None."""
    for var in (ENV_CONFIG_PATH, ENV_SMDEBUG_CONFIG_PATH):
        value = os.environ.get(var)
        if value:
            return value
    return None


def load_hook_config(
    path: str | os.PathLike[str] | None = None, default_save_config: Mapping[str, Any] | None = None
) -> HookConfig:
    """Read and parse a hook config: `path`, else the env (config_path_from_env), else SageMaker's default.

    FileNotFoundError if the file is missing; InvalidConfiguration naming the file if it is not valid.
    """
    chosen = os.fspath(path) if path is not None else (config_path_from_env() or DEFAULT_SAGEMAKER_CONFIG_PATH)
    try:
        with open(chosen, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        how = (
            "given explicitly"
            if path is not None
            else f"from ${ENV_CONFIG_PATH} / ${ENV_SMDEBUG_CONFIG_PATH}, or SageMaker's default"
        )
        raise FileNotFoundError(errno.ENOENT, f"hook config file does not exist ({how})", chosen) from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidConfiguration(f"hook config file {chosen!r} is not valid JSON: {e}") from None
    try:
        return parse_hook_config(d, default_save_config)
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"hook config file {chosen!r}: {e}") from None
