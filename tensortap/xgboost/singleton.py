"""The current XGBoost hook of this process (smdebug's `get_hook` / `set_hook` / `del_hook`)."""

from __future__ import annotations

from typing import Any

from tensortap.hooks.singleton import CurrentHook

_current = CurrentHook("tensortap.xgboost.hook:Hook", "tensortap.xgboost.Hook")
set_hook = _current.set_hook
del_hook = _current.del_hook
get_hook = _current.get_hook


def hook_from_config(json_config_path: str | None = None) -> Any:
    """smdebug.xgboost's name for `Hook.create_from_json_file(json_config_path)`."""
    from tensortap.xgboost.hook import Hook

    return Hook.create_from_json_file(json_config_path)
