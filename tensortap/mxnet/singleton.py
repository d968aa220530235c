"""The current MXNet hook of this process (smdebug's `get_hook` / `set_hook` / `del_hook`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensortap.mxnet.hook import Hook

_current: Hook | None = None


def set_hook(hook: Hook) -> None:
    """Make `hook` the current hook."""
    from tensortap.mxnet.hook import Hook

    if not isinstance(hook, Hook):
        from tensortap.exceptions import InvalidConfiguration

        raise InvalidConfiguration(f"set_hook takes a tensortap.mxnet.Hook, not {type(hook).__name__}")
    global _current
    _current = hook


def del_hook() -> None:
    """Forget the current hook."""
    global _current
    _current = None


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = False) -> Hook | None:
    """The current hook; if there is none and `create_if_not_exists`, one made from the JSON config
    (`json_config_path`, else $TENSORTAP_CONFIG, else $SMDEBUG_CONFIG_FILE_PATH), or None without a config."""
    if _current is None and create_if_not_exists:
        from tensortap.mxnet.hook import Hook

        try:
            Hook.create_from_json_file(json_config_path)  # the constructor makes it current
        except FileNotFoundError:
            return None
    return _current
