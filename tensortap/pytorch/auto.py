"""Zero-script-change capture for PyTorch, used by `tensortap run` (TENSORTAP_AUTO=1).

When the training script imports torch, `attach` installs global module hooks that find the model(s)
being trained and the loss modules, without any tensortap code in the script:

* the first top-level forward of a module with parameters registers it with a Hook built from the
  runner's config ($TENSORTAP_CONFIG); `model.train()` / `model.eval()` select the TRAIN / EVAL mode;
* TRAIN steps are counted at optimizer steps: a training forward starts a new step only once
  `optimizer.step()` has run since the last one, so gradient accumulation (several forwards per
  optimizer step) is one step; every EVAL forward is a step;
* top-level loss modules (subclasses of `torch.nn.modules.loss._Loss`) are registered as losses;
* the first `optimizer.step()` ends discovery: the global module hooks are removed (no per-module
  cost afterwards) and the optimizer is registered when `optimizer_variables` is saved;
* a `torch.amp.GradScaler` is registered (`Hook.register_scaler`) at its first `step()`, so a step it skips
  is recorded as skipped (`GradScaler.step` is wrapped on the class, in this process only: docs/internals.md).

If the script builds its own tensortap hook, that hook is used (with the runner's config) and nothing
is attached automatically.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

logger = logging.getLogger("tensortap")

_state: _Auto | None = None


def attach(torch_module: Any = None) -> None:
    """Install the discovery hooks (once per process)."""
    global _state
    from tensortap.hooks.base import disabled_by_env

    if _state is not None or disabled_by_env():
        return
    _state = _Auto()


def detach() -> None:
    global _state
    if _state is not None:
        _state.remove_global_hooks()
        _state = None


class _Auto:
    def __init__(self) -> None:
        import torch
        from torch.nn.modules import module as mod

        self.torch = torch
        self.tls = threading.local()
        self.hook: Any = None
        self.gave_up = False
        self.roots: set[int] = set()
        self.losses: set[int] = set()
        self.handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post, always_call=True),
        ]
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.opt_handle = register_optimizer_step_post_hook(self._after_optimizer_step)
        self.optimizers: set[int] = set()
        self.stepped = True  # an optimizer step happened since the current TRAIN step began
        self._wrap_grad_scaler()

    # --- discovery ----------------------------------------------------------------------------

    def _get_hook(self) -> Any:
        if self.hook is not None or self.gave_up:
            return self.hook
        from tensortap.pytorch import singleton
        from tensortap.pytorch.hook import Hook

        existing = singleton.get_hook()
        if existing is not None:
            # The script made its own hook (it uses the runner's config): leave the capture to it.
            self.gave_up = True
            self.remove_global_hooks()
            return None
        self.hook = Hook.create_from_json_file()
        self.hook._tensortap_auto = True
        return self.hook

    def _pre(self, module: Any, args: Any) -> None:
        depth = getattr(self.tls, "depth", 0)
        self.tls.depth = depth + 1
        if depth or self.gave_up:
            return
        try:
            self._discover(module, args)
        except Exception as e:  # noqa: BLE001 - never break training
            logger.error("tensortap: automatic capture is off: %s", e, exc_info=True)
            self.gave_up = True
            self.remove_global_hooks()

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self.tls.depth = max(0, getattr(self.tls, "depth", 1) - 1)

    def _discover(self, module: Any, args: Any) -> None:
        from torch.nn.modules.loss import _Loss

        key = id(module)
        if key in self.roots or key in self.losses:
            return
        if isinstance(module, _Loss):
            hook = self._get_hook()
            if hook is not None:
                self.losses.add(key)
                hook.register_loss(module)
                hook._hook_loss_now(module)  # found in the middle of a saving step: capture this call too
            return
        if next(iter(module.parameters()), None) is None:
            return  # a parameter-free module called on its own (an activation, a pooling layer)
        hook = self._get_hook()
        if hook is None:
            return
        self.roots.add(key)
        if not hasattr(self, "_step_pre_hook"):
            # The hook's forward pre-hook starts a step; here it may do so only at optimizer-step boundaries.
            self._step_pre_hook = hook._root_pre_hook
            hook._root_pre_hook = self._gated_step
        # Runs before the hook's own pre-hook: the module's train/eval state picks the mode.
        module.register_forward_pre_hook(self._mode_hook, prepend=True)
        hook.register_module(module)
        # torch fixed this call's pre-hooks before ours ran: start the step as the new hooks would have.
        self._mode_hook(module, args)
        hook._root_pre_hook(module, args)

    def _gated_step(self, module: Any, args: Any) -> None:
        from tensortap import modes

        hook = self.hook
        if hook.mode is modes.TRAIN and not self.stepped and hook._in_step:
            return  # another forward of the same optimizer step (gradient accumulation)
        self.stepped = False
        self._step_pre_hook(module, args)

    def _mode_hook(self, module: Any, args: Any) -> None:
        hook = self.hook
        if hook is None or hook.disabled:
            return
        from tensortap import modes

        want = modes.TRAIN if module.training else modes.EVAL
        if hook.mode is not want:
            hook.set_mode(want)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped = True
        if id(optimizer) in self.optimizers:
            return
        self.optimizers.add(id(optimizer))
        try:
            hook = self.hook
            if hook is not None and "optimizer_variables" in hook.include_collections:
                hook.register_optimizer(optimizer)
            if self.roots:
                self.remove_global_hooks()
        except Exception as e:  # noqa: BLE001
            logger.error("tensortap: automatic capture of the optimizer failed: %s", e)

    def _wrap_grad_scaler(self) -> None:
        """Register each GradScaler with the hook at its first `step()` (`register_scaler` only reads it)."""
        scaler_cls = getattr(getattr(self.torch, "amp", None), "GradScaler", None)
        if scaler_cls is None or not callable(getattr(scaler_cls, "step", None)):
            return
        original = scaler_cls.step
        auto = self
        self.scalers: weakref.WeakSet = weakref.WeakSet()

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            hook = auto.hook
            if hook is not None and scaler not in auto.scalers:
                auto.scalers.add(scaler)
                try:
                    hook.register_scaler(scaler)
                except Exception as e:  # noqa: BLE001 - never break training
                    logger.error("tensortap: could not register the GradScaler: %s", e)
            return original(scaler, optimizer, *args, **kwargs)

        step.__wrapped__ = original  # type: ignore[attr-defined]
        scaler_cls.step = step

    def remove_global_hooks(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
