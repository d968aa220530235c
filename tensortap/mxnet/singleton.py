"""The current MXNet hook of this process (smdebug's `get_hook` / `set_hook` / `del_hook`)."""

from __future__ import annotations

from tensortap.hooks.singleton import CurrentHook

_current = CurrentHook("tensortap.mxnet.hook:Hook", "tensortap.mxnet.Hook")
set_hook = _current.set_hook
del_hook = _current.del_hook
get_hook = _current.get_hook
