"""The current hook of a framework in this process: smdebug's `get_hook` / `set_hook` / `del_hook`, one
`CurrentHook` per framework package (its hook class named as "module:Class", imported only when needed)."""

from __future__ import annotations

import importlib
from typing import Any


class CurrentHook:
    """Holds one framework's current hook; its methods are that package's `set_hook`, `del_hook`, `get_hook`."""

    def __init__(self, hook_class: str, public_name: str, make_class: str | None = None):
        self._path = hook_class  # what set_hook accepts
        self._make = make_class or hook_class  # what get_hook(create_if_not_exists=True) makes
        self._name = public_name
        self._current: Any = None

    @staticmethod
    def _load(path: str) -> Any:
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)

    def set_hook(self, hook: Any) -> None:
        """Make `hook` the current hook."""
        if not isinstance(hook, self._load(self._path)):
            from tensortap.exceptions import InvalidConfiguration

            raise InvalidConfiguration(f"set_hook takes a {self._name}, not {type(hook).__name__}")
        self._current = hook

    def del_hook(self) -> None:
        """Forget the current hook."""
        self._current = None

    def get_hook(self, json_config_path: str | None = None, create_if_not_exists: bool = False) -> Any:
        """The current hook; if there is none and `create_if_not_exists`, one made from the JSON config
        (`json_config_path`, else $TENSORTAP_CONFIG, else $SMDEBUG_CONFIG_FILE_PATH), or None without a config."""
        if self._current is None and create_if_not_exists:
            try:
                self._load(self._make).create_from_json_file(json_config_path)  # (the constructor makes it current)
            except FileNotFoundError:
                return None
        return self._current
