"""The optimizer's step as the training step (docs/pytorch.md): optimizers found or registered, gradients
captured when the optimizer consumes them, GradScaler's skipped steps, the optimizer's state."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from tensortap import modes as _modes
from tensortap.capture.engine import OPTIMIZER_STEP
from tensortap.collection import Collection
from tensortap.exceptions import InvalidConfiguration
from tensortap.pytorch import _dtensor
from tensortap.pytorch._plan import (
    _NO_GRAD_MODES,
    _NO_STATE_KEYS,
    _PARAM_COLLECTIONS,
    OPTIMIZER_PREFIX,
    _closure_of,
    _is_compiling,
)
from tensortap.pytorch._tensors import (
    capturable,
)

logger = logging.getLogger("tensortap")


class OptimizerSteps:
    """The PyTorch hook's part that follows optimizers (mixed into `tensortap.pytorch.hook.Hook`)."""

    def register_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step is the training step (docs/pytorch.md): gradients are captured when it
        consumes them (`optimizer.step()`, after accumulation, unscaling and clipping), and its hyperparameters
        (learning rate, ...) and state (momentum buffers, ...) after it, on TRAIN steps that save the
        `optimizer_variables` collection. An optimizer of a registered module's parameters is found at its
        first step without this call; with it, the steps are the optimizer's from the first."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidConfiguration(f"register_optimizer takes a torch.optim.Optimizer, not {optimizer!r}")
        if self.disabled or self._closed:
            return
        if not self._registered_opts:
            self._opts.clear()  # (the one registered defines the step, not others found)
        self._registered_opts.add(id(optimizer))
        self._adopt_optimizer(optimizer)
        self._watch_optimizers()

    def register_scaler(self, scaler: Any) -> None:
        """A `torch.amp.GradScaler`: a step it skips (non-finite gradients) is recorded as skipped, with the
        scale (`grad_scaler/skipped`, `grad_scaler/scale`), instead of being merged into the next step; the
        scale is saved with the gradients. (Gradients are captured unscaled either way: at the optimizer's step.)
        The scaler is only read (its public state, see `ScalerWatch`), never changed."""
        if not callable(getattr(scaler, "state_dict", None)) or not callable(getattr(scaler, "get_scale", None)):
            raise InvalidConfiguration(f"register_scaler takes a torch.amp.GradScaler, not {scaler!r}")
        if self.disabled or self._closed or any(w.scaler is scaler for w in self._scalers):
            return
        self._scalers.append(ScalerWatch(scaler))

    def _adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._opts.add(id(optimizer))
        for watch in self._scalers:
            watch.look()  # (steps the scaler skipped before are not ours to count)
        self.engine.disarm()
        self._remove_plan_handles()  # (gradients now come at the optimizer's step, not from backward hooks)

    def _watch_optimizers(self) -> None:
        """Global optimizer step hooks (public torch API) that find the optimizers of the registered modules'
        parameters and capture at their steps."""
        if self._opt_handles:
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._opt_handles.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook))
        self._post_hook_on()

    def _post_hook_on(self) -> None:
        """(Re)install the global optimizer step post-hook (`_optimizer_hook`): always there but in quiet steps."""
        if len(self._opt_handles) == 1:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._opt_handles.append(register_optimizer_step_post_hook(self._optimizer_hook))

    def _ours(self, optimizer: torch.optim.Optimizer) -> bool:
        key = id(optimizer)
        if key in self._opts:
            return True
        if key in self._not_ours or self._registered_opts:
            return False
        names = self._param_names
        if any(id(p) in names for g in optimizer.param_groups for p in g["params"]):
            self._adopt_optimizer(optimizer)
            return True
        self._not_ours.add(key)
        return False

    def _optimizer_pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The optimizer is about to consume the gradients: capture them (the step's gradients)."""
        if not self._opt_stepped and not self.engine.saving and self.clock.in_step and id(optimizer) in self._opts \
                and not self._forward_unseen and not self._scalers and len(args) < 2 and not kwargs \
                and not self._opt_listened:
            # A step that saves nothing, begun at its forward, no closure (`args`: the optimizer alone): nothing to
            # begin, capture or check. What the post-hook would do is done here (the optimizer stepped: the next
            # forward begins the next step), and the post-hook is taken out until a step that is not such a one
            # (torch reads its post-hooks after the step: put back below, it runs for this step).
            self._opt_stepped = True
            if len(self._opt_handles) == 2:
                self._opt_handles.pop().remove()
            return
        self._post_hook_on()
        if self.disabled or self._closed or not self._ours(optimizer):
            return
        if self.clock.mode in _NO_GRAD_MODES:
            return
        closure = _closure_of(optimizer, args, kwargs)
        if closure is not None:
            # `step(closure)` (LBFGS, Lightning): the forward and backward run inside the step, after this hook;
            # the gradients are read after it (_optimizer_hook: torch's optimizers never change `.grad`). The
            # closure's forward begins the step, unless the model runs compiled (its forward is never seen)
            self._closure_opt = optimizer
            if self._forward_unseen:
                self._consume_gradients(begin_only=True)
            return
        self._consume_gradients()

    def _consume_gradients(self, begin_only: bool = False) -> None:
        """Begin the TRAIN step if no forward of a registered module began it, and save the gradients the
        optimizer is about to consume (or has just consumed, after a closure)."""
        try:
            if not self.clock.in_step or self._opt_stepped or self._scaler_skipped():
                # no forward of a registered module began this step: it runs compiled (or is not called)
                if self._roots and not self._forward_unseen:
                    self._roots_unseen()
                self._begin_train_step()
            if not begin_only and self.engine.saving and self._grad_targets:
                self._collect_grads()
                if self._scalers:
                    self._save_scale(float(self._scalers[0].scaler.get_scale()), False)
        except Exception as e:  # noqa: BLE001
            self._fail("optimizer step", e)

    def _loss_step_hook(self, module: nn.Module, args: Any) -> None:
        """With the model's forward unseen (compiled), a registered loss's forward begins the step."""
        if _is_compiling() or self.disabled or self._closed:
            return
        clock = self.clock
        if clock.in_step and not self._opt_stepped and clock.mode not in _NO_GRAD_MODES \
                and not self._scaler_skipped():
            return  # another forward of this optimizer step
        try:
            self._begin_train_step()
        except Exception as e:  # noqa: BLE001
            self._fail("loss pre-hook", e)

    def _begin_train_step(self) -> None:
        """Begin a TRAIN step at a registered loss's forward or the optimizer's step (the model's forward is
        unseen): a step known to save nothing, after one that saved nothing, is only counted, as at a root's
        forward (`_root_pre_hook`)."""
        if not self.engine.count_quiet():
            self.next_step()
        self._opt_stepped = False

    def _first_loss_hook(self, module: nn.Module, args: Any) -> None:
        """Before the first step: a registered loss's forward with no step begun means the registered model's
        forward was not seen (compiled after register_module, a torch.nn container whose call dynamo compiles
        whole): the first step begins here, so that it saves the loss as every later one does."""
        if _is_compiling() or self.disabled or self._closed:
            return
        self._drop_first_step_watch()
        if self.clock.in_step or not self._roots or self._forward_unseen:
            return  # (a root's forward began it: seen)
        self._roots_unseen()
        try:
            self._begin_train_step()
        except Exception as e:  # noqa: BLE001
            self._fail("loss pre-hook", e)

    def _drop_first_step_watch(self) -> None:
        for h in self._first_step_handles:
            h.remove()
        self._first_step_handles.clear()

    def _roots_unseen(self) -> None:
        """The registered modules' forwards are not seen (compiled after register_module): steps begin at the
        registered losses' forwards, else at the optimizer's step."""
        self._forward_unseen = True
        for m, _fn in self._losses:
            self._step_handles_kept.append(m.register_forward_pre_hook(self._loss_step_hook))
        names = ", ".join(r.name for r in self._roots)
        self._warn_io_missing(f"the forward of {names} runs in compiled code (torch.compile after "
                              "register_module); steps begin at the loss or the optimizer's step")
        self._remove_plan_handles()

    def _scaler_skipped(self, ending: bool = False) -> bool:
        """At a forward with gradients on (or an optimizer step) that would continue a TRAIN step in which no
        optimizer step ran, or at the end of such a step (`ending`): did a registered GradScaler skip the step
        (then it is recorded as skipped, and it ends)? Reads the scaler's state: one device sync on an
        accelerator, at such forwards only (micro-batches of gradient accumulation, a skipped step's next)."""
        if not self._scalers or not self._opts or self.disabled or self._closed \
                or self.clock.mode in _NO_GRAD_MODES or not (ending or torch.is_grad_enabled()):
            return False
        with self.guard("grad scaler"):
            for watch in self._scalers:
                scale = watch.skipped()
                if scale is not None:
                    self._save_scale(scale, True)
                    self._opt_stepped = True  # (the step is over: the next forward begins the next)
                    return True
        return False

    def _scaler_step_end(self) -> None:
        """A TRAIN step ends (set_mode, close) with no optimizer step: the scaler may have skipped it."""
        if self._scalers and not self._opt_stepped:
            self._scaler_skipped(ending=True)

    def _save_scale(self, scale: float, skipped: bool) -> None:
        if not self.engine.saving and not skipped:
            return
        if not self.active:
            return
        coll = self.collection_manager.get("grad_scaler")
        items = [("grad_scaler/scale", np.asarray(scale, dtype=np.float32), [coll])]
        if skipped:
            items.append(("grad_scaler/skipped", np.asarray(1.0, dtype=np.float32), [coll]))
        self.write_tensors(items)

    def _optimizer_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.disabled or self._closed or id(optimizer) not in self._opts:
            return
        if self._closure_opt is optimizer:
            self._closure_opt = None
            if self.clock.mode not in _NO_GRAD_MODES:
                self._consume_gradients()
        if not self._opt_stepped:
            for watch in self._scalers:
                watch.steps += 1  # (the scaler's update() after this step skips nothing)
        self._opt_stepped = True  # the next forward (or loss, or optimizer step) begins the next step
        if self.engine.listening(OPTIMIZER_STEP):
            self.engine.fire(OPTIMIZER_STEP, {"optimizer": optimizer})
        if not self.engine.saving or self.mode in (_modes.EVAL, _modes.PREDICT):
            return
        try:
            self._save_optimizer(optimizer)
        except Exception as e:  # noqa: BLE001
            self._fail("optimizer hook", e)

    def _save_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        groups, state = optimizer.param_groups, optimizer.state
        # The names an optimizer's hyperparameters and state are saved under follow from its groups' keys and its
        # state's keys: when none of them is in a collection saving now, the same shape of keys saves nothing.
        shape = (type(optimizer), tuple(map(len, groups)), tuple(map(len, state.values())))
        plan = self._step_plan
        if plan is not None and plan.optimizers_quiet.get(id(optimizer)) == shape:
            return
        if plan is not None and not self._optimizer_names_saved(optimizer):
            plan.optimizers_quiet[id(optimizer)] = shape
            return
        tensors: list[torch.Tensor] = []
        items: list[tuple[str, list[Collection]]] = []

        def add(name: str, value: Any) -> None:
            colls = self._optimizer_colls(name)
            if not colls:
                return
            if isinstance(value, torch.Tensor):
                if _dtensor.is_dtensor(value):
                    value = self._local(name, value)
                if capturable(value):
                    tensors.append(value)
                    items.append((name, colls))
            else:
                self.write_tensor(name, value, colls)

        for g, group in enumerate(groups):
            for k, v in group.items():
                if k in _NO_STATE_KEYS or isinstance(v, bool) or v is None:
                    continue
                if isinstance(v, (int, float, torch.Tensor)) or (
                    isinstance(v, tuple) and v and all(isinstance(x, (int, float)) for x in v)
                ):
                    add(f"{OPTIMIZER_PREFIX}param_group_{g}/{k}", v)
        for i, (p, st) in enumerate(state.items()):
            pname = self._param_names.get(id(p), f"param_{i}")
            for k, v in st.items():
                if isinstance(v, torch.Tensor) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                    add(f"{OPTIMIZER_PREFIX}{pname}/{k}", v)
        self._stage_or_write(tensors, items)

    def _optimizer_names_saved(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a collection saving now holds any name the optimizer's groups and state give (whatever their
        values' types)."""
        for g, group in enumerate(optimizer.param_groups):
            for k in group:
                if k not in _NO_STATE_KEYS and self._optimizer_colls(f"{OPTIMIZER_PREFIX}param_group_{g}/{k}"):
                    return True
        for i, (p, st) in enumerate(optimizer.state.items()):
            pname = self._param_names.get(id(p), f"param_{i}")
            for k in st:
                if self._optimizer_colls(f"{OPTIMIZER_PREFIX}{pname}/{k}"):
                    return True
        return False

    def _optimizer_colls(self, name: str) -> list[Collection]:
        return [c for c in self.collections_for(name) if c.name not in _PARAM_COLLECTIONS]


class ScalerWatch:
    """A registered GradScaler, read through its public state only (`state_dict()`: scale, growth tracker,
    factors, interval), never changed. `GradScaler.update()` after an iteration whose optimizer steps it ran adds
    one to the growth tracker, and every `growth_interval` such iterations multiplies the scale by `growth_factor`
    (the tracker back to 0); after an iteration it skipped (non-finite gradients: `optimizer.step()` not called),
    it multiplies the scale by `backoff_factor` (< 1) and sets the tracker to 0. So from the state at the last
    look and the optimizer steps seen since (`steps`), the state is known if the scaler skipped nothing; a tracker
    of 0 with a scale below that prediction says it skipped a step."""

    __slots__ = ("scaler", "state", "steps")

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        self.state: tuple[float, int, float, float, int] | None = None
        self.steps = 0
        self.look()

    def _read(self) -> tuple[float, int, float, float, int] | None:
        s = self.scaler.state_dict()  # ({} when the scaler is disabled: it skips nothing)
        if not s:
            return None
        return (float(s["scale"]), int(s["_growth_tracker"]), float(s["growth_factor"]),
                float(s["backoff_factor"]), int(s["growth_interval"]))

    def look(self) -> tuple[float, int, float, float, int] | None:
        """Read the state now (what later looks compare with)."""
        self.state, self.steps = self._read(), 0
        return self.state

    def skipped(self) -> float | None:
        """The scale of a step the scaler skipped since the last look, or None if it skipped none."""
        before, steps = self.state, self.steps
        now = self.look()
        if before is None or now is None:
            return None
        scale, tracker, growth, backoff, interval = before
        if interval > 0:
            tracker += steps
            for _ in range(min(tracker // interval, 64)):  # (update() keeps the scale when it would overflow)
                grown = np.float32(scale) * np.float32(growth)
                if np.isfinite(grown):
                    scale = float(grown)
            tracker %= interval
        if now[1] == 0 and now[0] < scale * (1.0 + backoff) / 2:
            return scale
        return None
