"""The hooks of this process that write each out_dir, so that a reader made in the same process reads what they
were handed (`create_trial` right after a training loop, without close()): the reader asks them to make it
readable first. Only the thread that trains may end a step, so a hook settles only when asked from that thread."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

_LOCK = threading.Lock()
_WRITING: dict[str, list[tuple[weakref.ref, int]]] = {}


def _key(url: str) -> str:
    url = os.fspath(url).strip()
    if "://" in url and not url.startswith("file://"):
        return url.rstrip("/")
    if url.startswith("file://"):
        url = url[len("file://"):]
    return os.path.realpath(os.path.expanduser(url))


def register(url: str, settle: Callable[[], None]) -> None:
    """`settle` (a bound method: held weakly) makes what its writer of `url` was handed readable; it is called
    only from the thread registering it."""
    ref = weakref.WeakMethod(settle) if hasattr(settle, "__self__") else weakref.ref(settle)
    with _LOCK:
        found = _WRITING.setdefault(_key(url), [])
        found[:] = [(r, t) for r, t in found if r() is not None]
        found.append((ref, threading.get_ident()))


def settle(url: str) -> None:
    """Make everything handed to this process's writers of `url` readable (those registered by this thread)."""
    with _LOCK:
        found = list(_WRITING.get(_key(url), ()))
    me = threading.get_ident()
    for ref, thread in found:
        fn = ref()
        if fn is not None and thread == me:
            fn()
