"""Counting a module's forward calls without giving it a forward hook.

Any hook on a module sends torch's `Module.__call__` down its slow path (a closure, a set, lists, a try
block and the hooks' dispatch): for the root of the MLP of bench/pytorch_overhead.py a forward pre-hook
costs 3-4 us more per forward than this counter (bench/RESULTS.md, "Speed paths kept"), 0.3-0.4% of a
step that saves nothing, where the step counter is the hook's only work. Instead, the root's
`_backward_hooks` dict, which `Module._call_impl` tests first on every call, is replaced by a
`CountingHooks` dict whose truth test counts the call when it comes from `_call_impl` itself and is
otherwise that of a plain dict: torch keeps its fast path, hooks registered on the module later go into
the dict as before.

`works()` checks once per process that this torch calls the test exactly once per forward, on both of its
paths; where it does not, the hook uses a forward pre-hook as before.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from sys import _getframe
from time import monotonic as _monotonic

from torch import nn

_CALL_IMPL = nn.Module._call_impl.__code__
logger = logging.getLogger("tensortap")


def _report(exc: BaseException) -> None:
    logger.error("tensortap: the step counter failed; it stops counting, training continues", exc_info=exc)


class CountingHooks(OrderedDict):
    """A module's `_backward_hooks` that calls `tick()` once per call of the module.

    While `left` > 0 (and the clock is before `deadline`), a call is only counted in `skipped` instead:
    the owner arms that for steps it knows will save nothing, and adds `skipped` to its step counters
    before it next reads them. When `tick` raises, the error is logged once and counting stops (`tick`
    becomes None); the forward goes on.
    """

    __slots__ = ("tick", "left", "skipped", "deadline")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tick: Callable[[], None] | None = None
        self.left = 0
        self.skipped = 0
        self.deadline = 0.0

    def __bool__(self) -> bool:
        if _getframe(1).f_code is _CALL_IMPL:
            left = self.left
            if left > 0 and _monotonic() < self.deadline:
                self.left = left - 1
                self.skipped += 1
            elif self.tick is not None:
                try:
                    self.tick()
                except Exception as e:  # noqa: BLE001 - never break the forward it sits in
                    self.tick = None
                    _report(e)
        return len(self) > 0

    def __reduce__(self):  # torch.save(model) / copy.deepcopy(model): a plain dict, no counting
        return (OrderedDict, (), None, None, iter(list(self.items())))

    def copy(self) -> OrderedDict:
        return OrderedDict(self)


@functools.cache
def works() -> bool:
    """Whether `Module._call_impl` of this torch tests `_backward_hooks` exactly once per call."""

    class _Probe(nn.Module):
        def forward(self, x):
            return x

    probe = _Probe()
    calls = []
    d = CountingHooks()
    d.tick = lambda: calls.append(1)
    probe._backward_hooks = d
    try:
        probe(0)  # fast path
        handle = probe.register_forward_hook(lambda m, a, o: None)
        probe(0)  # slow path
        handle.remove()
    except Exception:  # noqa: BLE001 - any surprise: use the forward pre-hook
        return False
    return len(calls) == 2


def install(module: nn.Module, tick: Callable[[], None]) -> CountingHooks | None:
    """Make `module`'s calls call `tick()` first; None where that cannot be done (then use a pre-hook)."""
    old = module.__dict__.get("_backward_hooks")
    # A module with backward hooks or forward pre-hooks takes the slow path anyway, and pre-hooks already
    # there (e.g. one that sets the mode) must run before the step starts, as they would with a pre-hook.
    if type(old) is not OrderedDict or old or module._forward_pre_hooks or not works():
        return None
    cls = type(module)
    if cls.__call__ is not nn.Module.__call__ or cls._call_impl is not nn.Module._call_impl:
        return None  # a class of its own way of being called: it may never reach Module._call_impl
    counter = CountingHooks()
    counter.tick = tick
    module._backward_hooks = counter
    return counter


def uninstall(module: nn.Module, counter: CountingHooks) -> None:
    """Stop counting; the module gets a plain dict back unless hooks were registered into the counter."""
    counter.tick = None
    counter.left = 0
    if module.__dict__.get("_backward_hooks") is counter and len(counter) == 0:
        module._backward_hooks = OrderedDict()
