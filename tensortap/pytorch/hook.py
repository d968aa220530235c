"""The PyTorch hook: captures weights, gradients, losses, module inputs/outputs and optimizer state.

Names follow smdebug's PyTorch naming: parameters `<RootClass>_<param>`, gradients
`gradient/<RootClass>_<param>`, module I/O `<module>_input_<i>` / `<module>_output_<i>` (the root
module is named by its class), losses `<LossClass>_output_0`. Optimizer state is saved as
`optimizer/param_group_<g>/<key>` and `optimizer/<RootClass>_<param>/<state key>`.

Steps known to save nothing cost one forward pre-hook call on the root module, which only counts them
(`StepEngine.count_quiet`), and one optimizer step pre-hook call, which returns at once; per-module forward
hooks and per-parameter gradient hooks are only installed for steps that save them. With the writer process, a
saving step hands its weights, gradients and loss over in one message of shared memory
(`tensortap.capture.batch.StepLayout`).
"""

from __future__ import annotations

import functools
import logging
import os as _os
from typing import Any

import torch
from torch import nn

from tensortap.capture.batch import BatchSpec
from tensortap.capture.engine import BACKWARD_END, FORWARD_END, OPTIMIZER_STEP, Tally, TensorSpec
from tensortap.collection import ACTIVATION_COLLECTIONS, Collection, CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.format.records import StatisticsRows
from tensortap.hooks.base import Hook as BaseHook
from tensortap.pytorch import _dtensor, singleton
from tensortap.pytorch._capture import TensorCapture
from tensortap.pytorch._grads import GradientCapture
from tensortap.pytorch._optim import OptimizerSteps, ScalerWatch
from tensortap.pytorch._plan import (
    _ACTIVATION_TYPES,
    _KEEP_HANDLES,
    _NO_GRAD_MODES,
    _NOT_IO,
    GRADIENT_PREFIX,
    INPUT_SUFFIX,
    OPTIMIZER_PREFIX,
    OUTPUT_SUFFIX,
    K,
    _class_name,
    _detect_rank,
    _distributed,
    _in_backward,
    _is_compiled,
    _is_compiling,
    _Plan,
    _Root,
    _unwrap_ddp,
)
from tensortap.pytorch._tensors import HostBatch, Reduced, capturable, host_numpy, iter_tensors, ring_sources

__all__ = ["GRADIENT_PREFIX", "INPUT_SUFFIX", "OPTIMIZER_PREFIX", "OUTPUT_SUFFIX", "Hook", "ring_sources"]

logger = logging.getLogger("tensortap")


class _Eager:
    """A hook of a registered root that runs in eager code only (its forward hook while the lifecycle is listened
    to; `_StepStart` below). Code that dynamo traces (a model compiled after registering) reads `is_compiling()` as
    a constant and skips the call, so compiled code never calls into the hook and no graph breaks; eager code pays
    one call, without the cost of a `torch.compiler.disable` wrapper (which switches the frame evaluator at every
    call).

    A copy of the module (`copy.deepcopy`, a whole-model `torch.save`) gets `{}.get` in its place, which returns
    the forward's inputs unchanged: the copy's forwards are not the job's steps, and loading a saved model does not
    need tensortap."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        if not _is_compiling():
            self.fn(*args)

    def __reduce__(self) -> tuple:
        return getattr, ({}, "get")


class _StepStart(_Eager):
    """A registered root's forward pre-hook (eager only, as `_Eager`): each forward begins a step
    (`Hook._root_pre_hook`), except that a new step (the optimizer stepped, or no optimizer is followed) in the
    engine's quiet window is only counted, on the tally the engine armed (what `engine.count_quiet()` would do; the
    engine closes the window when the step, mode or plan changes or the hook turns off)."""

    __slots__ = ("hook", "quiet")

    def __init__(self, hook: Any) -> None:
        super().__init__(hook._root_pre_hook)
        self.hook = hook
        self.quiet = hook._quiet

    def __call__(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        hook = self.hook
        if (hook._opt_stepped or not hook._opts) and self.quiet.take():
            hook._opt_stepped = False
            hook._forward_seen = True
            return
        self.fn(module, args)


class Hook(OptimizerSteps, GradientCapture, TensorCapture, BaseHook):
    """Captures a PyTorch training job; `register_module(model)` and `register_loss(loss_fn)` hook it up."""

    builtin_collections = (
        K.ALL, K.DEFAULT, K.SCALARS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.INPUTS, K.OUTPUTS,
        K.OPTIMIZER_VARIABLES, *(c for pair in ACTIVATION_COLLECTIONS.values() for c in pair),
    )
    default_include_collections = (K.LOSSES, K.SCALARS)
    always_include_collections = (K.LOSSES,)
    _scalars_wait_for_step = True  # (steps begin at the model's forward)

    # (a hook made before the process group, e.g. in a process of torch.multiprocessing.spawn that calls
    # init_process_group itself, takes the group's rank at the first step: the engine's late identity)
    identity_source = staticmethod(_detect_rank)

    def __init__(self, out_dir: str, *args: Any, flight_recorder: Any = None, **kwargs: Any):
        """`flight_recorder`: True, a number of steps (default 256) or a `tensortap.capture.flight.FlightConfig`
        keeps cheap statistics of every tensor at every step and writes them when something goes wrong
        (docs/pytorch.md, "The flight recorder"); on by default under `tensortap run`."""
        from tensortap.capture.flight import FlightConfig

        flight = FlightConfig.coerce(flight_recorder, under_runner=_os.environ.get("TENSORTAP_AUTO") == "1")
        super().__init__(out_dir, *args, **kwargs)
        self._roots: list[_Root] = []
        self._module_ids: set[int] = set()  # every module inside a registered root
        self._param_names: dict[int, str] = {}
        self._losses: list[tuple[nn.Module, Any]] = []  # (loss module, its forward hook in saving steps)
        self._opt_handles: list[Any] = []  # the global optimizer step pre-hook, then its post-hook (not in quiet steps)
        self._opt_listened = False  # someone listens to the lifecycle's optimizer_step
        self._step_handles: list[Any] = []  # hooks installed for this step only
        self._plan_handles: list[Any] = []  # module and parameter hooks of the saving plan `_handles_plan`
        self._handles_plan: _Plan | None = None
        self._io_counts: dict[str, int] = {}
        self._grad_targets: dict[int, tuple[nn.Parameter, str, list[Collection]]] = {}
        self._param_hooks_on = False
        self._grad_cb_queued = False
        self._pending_grads: dict[str, tuple[Any, list[Collection]]] = {}
        self._grad_batch: HostBatch | None = None  # every planned gradient, copied at once
        self._grad_res: Any = None  # ... or copied straight into the writer's shared memory, sent at step end
        # Small raw tensors of a step that also saves gradients through a writer process (a loss): held
        # (cloned) and sent in the gradients' message; the first `_small_in_res` are in `_grad_res`.
        self._small: list[tuple[str, torch.Tensor, list[Collection]]] = []
        self._small_in_res = 0
        self._grad_off = 0  # where the gradients start in `_grad_res`'s payload
        # The saving step's message holding the weights and room for its gradients (see StepLayout), while
        # they are not in it; it is `_grad_res` once they are.
        self._step_res: Any = None
        self._defer_small = False
        self._raw_only_cache: dict[tuple, bool] = {}
        self._io_skip: dict[tuple[str, int, int], tuple[int, Any]] = {}  # see _write_io
        self._step_plan: _Plan | None = None  # of the current saving step
        self._staged: list[tuple[HostBatch, list[tuple[str, list[Collection]]], BatchSpec | None]] = []
        #: testing aid: copy CPU tensors through the asynchronous (accelerator) path
        self._force_async_copies = False
        self._shards: dict[str, dict[str, Any]] = {}  # tensor name: where this worker's shard lies
        # The optimizer's step (docs/pytorch.md): ids of the optimizers whose steps are the training steps
        self._opts: set[int] = set()
        self._registered_opts: set[int] = set()  # given to register_optimizer (then no others are adopted)
        self._not_ours: set[int] = set()
        self._opt_stepped = True  # the optimizer stepped since the current TRAIN step began
        self._forward_seen = False  # a registered module's forward ran in the current saving step
        self._module_io_seen = False  # a module input/output hook ran in the current saving step
        self._forward_unseen = False  # registered modules run compiled: their forwards are never seen
        self._closure_opt: Any = None  # an optimizer inside `step(closure)`: gradients read after it
        self._scalers: list[ScalerWatch] = []  # registered GradScalers (register_scaler)
        self._grad_reduced: Reduced | None = None  # the step's gradient statistics, computed at capture
        self._weight_reduced: Reduced | None = None  # ... and its weights', computed when it began
        self._reduced_records: list[StatisticsRows] = []  # the step's statistics, handed over when it ends
        self._step_handles_kept: list[Any] = []  # hooks kept until close
        self._first_step_handles: list[Any] = []  # the registered losses' watch for the first step
        self._activation_keys: dict[str, str] = {}  # "<module>_output_": its activation collection
        # the lifecycle's forward_end and backward_end, seen while someone listens (StepEngine.add_listener)
        self._lifecycle_hook = _Eager(self._forward_end_hook)
        # the quiet window's steps, counted at the roots' forwards (`_root_pre_hook`; armed by `on_step_begin`)
        self._quiet = Tally()
        self.clock.tally = self._quiet
        self._lifecycle_handles: list[Any] = []
        self._backward_queued = False
        self.engine.watch_listeners(self._listeners_changed)
        self._flight = None  # the flight recorder (tensortap.pytorch._flight), when on
        if flight is not None and not self.disabled:
            from tensortap.pytorch._flight import TorchFlight

            self._flight = TorchFlight(self, flight)
        singleton.set_hook(self)

    def _prepare(self) -> None:
        self._name_added_modules(warn=True)
        super()._prepare()

    def _name_added_modules(self, warn: bool = False) -> None:
        """Name the modules given to `Collection.add_module_tensors` as their inputs/outputs are named (the
        registered models' submodules; a root by its class)."""
        pending = [c for c in self.collection_manager if c.pending_modules()]
        if not pending:
            return
        names: dict[int, str] = {}
        for root in self._roots:
            if not root.compiled:
                inner = root.module._orig_mod if _is_compiled(root.module) else root.module
                names.update((id(m), n if n else root.name) for n, m in inner.named_modules())
            names[id(root.module)] = root.name
        for coll in pending:
            for module, _inputs, _outputs in coll.pending_modules():
                if id(module) in names:
                    coll.name_module(module, names[id(module)])
                elif warn:
                    self._warn_once(f"unnamed-module:{id(module)}", f"tensortap: {coll.name}.add_module_tensors("
                                    f"{type(module).__name__}): the module is in no registered (uncompiled) model; "
                                    "its inputs/outputs are not saved")
        self._collections_changed()
        self._collections_dirty = True

    def _init_builtin_collections(self) -> None:
        get = self.collection_manager.get
        get(K.WEIGHTS).include("^(?!gradient).*weight")
        get(K.BIASES).include("^(?!gradient).*bias")
        get(K.GRADIENTS).include("^gradient")
        get(K.LOSSES).include("[Ll]oss_(?!input).*output")
        get(K.INPUTS).include(r"_input_\d+$")
        get(K.OUTPUTS).include(r"_output_\d+$")
        get(K.OPTIMIZER_VARIABLES).include("^optimizer/")

    def _programmatic_collections(self) -> set[str]:
        return set(self.builtin_collections)

    def _collections_changed(self) -> None:
        self._raw_only_cache.clear()
        super()._collections_changed()  # (the engine's plans, quiet window and the schedule's answers)

    _config_changed = _collections_changed

    # --- registration ------------------------------------------------------------------------

    def register_module(self, module: nn.Module) -> None:
        """Hook `module` (usually the whole model): its forward starts a step; parameters, gradients and
        module inputs/outputs become capturable. A submodule of a registered module is already covered."""
        if not isinstance(module, nn.Module):
            raise InvalidConfiguration(f"register_module takes a torch.nn.Module, not {type(module).__name__}")
        if self.disabled or self._closed:
            return
        module = _unwrap_ddp(module)
        inner = _unwrap_ddp(module._orig_mod) if _is_compiled(module) else module
        self.engine.disarm()
        if id(module) in self._module_ids or id(inner) in self._module_ids:
            logger.debug("tensortap: %s is already registered (or inside a registered module)", inner._get_name())
            return
        # A registered module inside the new one stops being a root: the new one starts the steps.
        for old in [r for r in self._roots if any(m is r.module for m in inner.modules()) or r.module is module]:
            old.unhook()
            self._roots.remove(old)
            for m in old.module.modules():
                self._module_ids.discard(id(m))
        compiled = _is_compiled(module) or getattr(module, "_compiled_call_impl", None) is not None
        root_name = _class_name(inner)
        params = [(f"{root_name}_{n}", p) for n, p in inner.named_parameters()]
        io_hooks: list[tuple[nn.Module, Any]] = []
        if _is_compiled(module):  # (outside the compiled code)
            io_hooks.append((module, functools.partial(self._io_hook, root_name)))
        elif not compiled:
            for n, m in inner.named_modules():
                io_hooks.append((m, functools.partial(self._io_hook, n if n else root_name)))
                self._note_activation(n if n else root_name, m)
        root = _Root(module, root_name, params, io_hooks, compiled)
        root.handles.append(module.register_forward_pre_hook(_StepStart(self)))
        self._roots.append(root)
        if self._lifecycle_handles:
            self._lifecycle_handles.append(module.register_forward_hook(self._lifecycle_hook))
        self._module_ids.add(id(module))
        self._module_ids.update(id(m) for m in inner.modules())
        for pname, p in params:
            self._param_names[id(p)] = pname
        self._name_added_modules()
        self._config_changed()
        self._watch_optimizers()
        if self._flight is not None:
            self._flight.add_root(root_name, module, inner, compiled)
        if compiled:
            self._warn_io_missing(f"{root_name} is compiled (torch.compile)")

    def _warn_io_missing(self, why: str) -> None:
        """One warning: module inputs/outputs inside compiled code are not captured (that would break the graph)."""
        io = [c for c in self.include_collections if c not in _NOT_IO]
        what = f"the collections {', '.join(io)} will miss them" if io else "no included collection needs them"
        self._warn_once("compiled-io", f"tensortap: {why}: the inputs and outputs of the modules inside it are not "
                        f"captured ({what}); weights, gradients, losses and the compiled module's own output are")

    def _note_activation(self, name: str, module: nn.Module) -> None:
        """A ReLU / sigmoid / tanh module's input and output go into the activation collections (found by the
        module's type, whatever its name), saved when such a collection is included."""
        for kind, types in _ACTIVATION_TYPES.items():
            if isinstance(module, types):
                inputs, outputs = ACTIVATION_COLLECTIONS[kind]
                self.collection_manager.get(inputs).add_tensor_name(f"{name}{INPUT_SUFFIX}0")
                self.collection_manager.get(outputs).add_tensor_name(f"{name}{OUTPUT_SUFFIX}0")
                self._activation_keys[f"{name}{INPUT_SUFFIX}"] = inputs
                self._activation_keys[f"{name}{OUTPUT_SUFFIX}"] = outputs
                return

    register_block = register_module
    register_hook = register_module

    def register_loss(self, loss_module: nn.Module) -> None:
        """Hook a loss module (e.g. `nn.CrossEntropyLoss()`): its output is saved as `<LossClass>_output_0`."""
        if not isinstance(loss_module, nn.Module):
            raise InvalidConfiguration(f"register_loss takes a torch.nn.Module, not {type(loss_module).__name__}")
        if self.disabled or self._closed:
            return
        name = loss_module._get_name()
        if any(m is loss_module for m, _fn in self._losses):
            return
        self._losses.append((loss_module, functools.partial(self._loss_hook, name)))
        if self._flight is not None:
            self._flight.add_loss(name, loss_module)
        self._remove_plan_handles()  # the next saving step installs its hook
        if self._forward_unseen:
            self._step_handles_kept.append(loss_module.register_forward_pre_hook(self._loss_step_hook))
        elif not self._prepared:  # (until the first step: is the model's forward seen?)
            self._first_step_handles.append(loss_module.register_forward_pre_hook(self._first_loss_hook))

    def _hook_loss_now(self, loss_module: nn.Module) -> None:
        """In a saving step, capture a registered loss module's calls from now on in this step too."""
        if self.engine.saving:
            for m, fn in self._losses:
                if m is loss_module:
                    self._step_handles.append(m.register_forward_hook(fn))

    # --- callbacks ---------------------------------------------------------------------------

    def _root_pre_hook(self, module: nn.Module, args: Any) -> None:
        """A forward of a registered root begins a step. A step after a step that saved nothing, itself known to
        save nothing, is only counted (here or by `_StepStart`): readers learn it passed when a later step ends."""
        if self.disabled or self._closed:
            return
        clock = self.clock
        if self._opts and clock.in_step and not self._opt_stepped and clock.mode not in _NO_GRAD_MODES \
                and not self._scaler_skipped():
            self._forward_seen = True
            return  # another forward of this optimizer step (accumulation, a second call, an eval pass)
        try:
            if not self.engine.count_quiet():  # (a step known to save nothing, after one that saved nothing: counted)
                self.next_step()
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("forward pre-hook", e)
        self._opt_stepped = False
        self._forward_seen = True

    def tensor_specs(self) -> list[TensorSpec]:
        """The registered models' parameters and their gradients (those that require one), as `TensorSpec`s."""
        specs = []
        for root in self._roots:
            for pname, p in root.params:
                dtype = str(p.dtype).removeprefix("torch.")
                specs.append(TensorSpec(pname, dtype, tuple(p.shape), "weight"))
                if p.requires_grad:
                    specs.append(TensorSpec(GRADIENT_PREFIX + pname, dtype, tuple(p.shape), "gradient"))
        return specs

    def _listeners_changed(self, events: frozenset[str]) -> None:
        """Install what it takes to see forward_end and backward_end while they are listened to (a forward hook on
        each registered root: torch's slower call path for those modules), remove it when nobody listens."""
        self._opt_listened = OPTIMIZER_STEP in events
        want = FORWARD_END in events or BACKWARD_END in events
        if want and not self._lifecycle_handles:
            for root in self._roots:
                self._lifecycle_handles.append(root.module.register_forward_hook(self._lifecycle_hook))
            self._lifecycle_handles.append(None)  # (installed, with or without roots yet)
        elif not want and self._lifecycle_handles:
            for h in self._lifecycle_handles:
                if h is not None:
                    h.remove()
            self._lifecycle_handles.clear()

    def _forward_end_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.disabled or self._closed or _in_backward():
            return
        engine = self.engine
        try:
            engine.fire(FORWARD_END, {"module": module, "output": output})
            if engine.listening(BACKWARD_END) and not self._backward_queued and torch.is_grad_enabled():
                for t in (output,) if isinstance(output, torch.Tensor) else iter_tensors(output):
                    if t.requires_grad:
                        t.register_hook(self._backward_reached)
                        break
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("forward_end", e)

    def _backward_reached(self, grad: torch.Tensor) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self._backward_end_later if _distributed() else self._backward_end)

    def _backward_end_later(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)  # (after DDP's reduction)

    def _backward_end(self) -> None:
        self._backward_queued = False
        if not self.disabled and not self._closed:
            self.engine.fire(BACKWARD_END)

    def _step_is_over(self) -> bool:
        """A step ends at the next forward pass; `create_trial` in the training thread after the loop ends it
        (issue #35) once it saves nothing more: it saves nothing, saves no gradients, or its gradients were read."""
        return (not self.engine.saving or not self._grad_targets or self._grad_res is not None
                or bool(self._pending_grads) or self._grad_batch is not None)

    # --- steps -------------------------------------------------------------------------------

    def on_step_begin(self) -> None:
        engine = self.engine
        if not engine.saving:
            engine.arm(self._quiet)  # (the steps after this one that save nothing either: counted by the roots)
            kept = self._handles_plan
            if kept is not None and (kept.io or not self.active
                                     or engine.next_save - self.clock.mode_step > _KEEP_HANDLES):
                self._remove_plan_handles()  # (I/O hooks sit on every module: never kept over quiet steps)
            return
        now = engine.now
        self._module_io_seen = False
        self._forward_seen = False
        if self._io_counts:
            self._io_counts.clear()
        plan = self._step_plan = self._plan_for(now)
        self._defer_small = not self.dry_run
        if plan.weights:
            self._save_params(plan)
        if plan.grads:
            self._grad_targets = plan.grads
            self._param_hooks_on = False
        if self._handles_plan is not plan:
            # Module hooks for this plan stay installed while consecutive steps save with it.
            if self._handles_plan is not None:
                self._remove_plan_handles()
            self._install_plan_handles(plan)

    def _install_plan_handles(self, plan: _Plan) -> None:
        handles = self._plan_handles
        if plan.grads and not self._opts:
            for root in self._roots:
                if root.compiled and not _is_compiled(root.module):
                    # model.compile(): a forward hook would run inside the compiled code. Parameter
                    # hooks run in autograd, outside it.
                    for _pname, p in root.params:
                        if id(p) in plan.grads:
                            handles.append(p.register_post_accumulate_grad_hook(self._param_grad_hook))
                else:
                    handles.append(root.module.register_forward_hook(self._grad_root_hook))
        for m, fn in self._losses:
            handles.append(m.register_forward_hook(fn))
        if plan.io and not self._forward_unseen:
            for root in self._roots:
                for m, fn in root.io_hooks:
                    handles.append(m.register_forward_hook(fn))
        self._handles_plan = plan

    def _remove_plan_handles(self) -> None:
        if self._plan_handles:
            for h in self._plan_handles:
                h.remove()
            self._plan_handles.clear()
        self._handles_plan = None

    def on_step_end(self) -> None:
        if self._scalers:
            self._scaler_step_end()
        if not self.engine.saving:
            return  # (everything below is set up by saving steps only)
        plan = self._step_plan
        if plan is not None and plan.io and self._forward_seen and not self._module_io_seen and \
                self._handles_plan is plan:
            # the module hooks were in place and none ran in a forward of the model: it runs compiled
            names = ", ".join(r.name for r in self._roots)
            self._warn_io_missing(f"the forward of {names} runs in compiled code (torch.compile after "
                                  "register_module)")
        if self._step_handles:
            for h in self._step_handles:
                h.remove()
            self._step_handles.clear()
        self._grad_targets = {}
        staged, self._staged = self._staged, []
        if staged and self.active:
            try:
                for batch, items, spec in staged:
                    self._write_batch(batch, items, spec)
            except Exception as e:  # noqa: BLE001
                self._fail("step end", e)
        self._hand_off_grads()
        self._step_plan = None

    def __exit__(self, *exc: Any) -> None:
        if self._flight is not None and len(exc) > 1 and exc[1] is not None:
            self._flight.rec.on_exception(exc[1])  # (an exception leaving the hook's `with` block)
        super().__exit__(*exc)

    def on_close(self) -> None:
        if self._flight is not None:
            self._flight.close()
        self.engine.disarm()
        for root in self._roots:
            root.unhook()
        self._drop_first_step_watch()
        for h in self._opt_handles + self._step_handles + self._step_handles_kept + self._lifecycle_handles:
            if h is not None:
                h.remove()
        self._lifecycle_handles.clear()
        self._step_handles_kept.clear()
        self._remove_plan_handles()
        self._roots.clear()
        self._losses.clear()
        self._opt_handles.clear()
        self._step_handles.clear()

    def _plan_for(self, now: list[Collection]) -> _Plan:
        """The plan of a step saving `now` (the engine's cache, by the schedule's answer and TRAIN or not)."""
        return self.engine.plans.get(now, self.mode not in _NO_GRAD_MODES, self._make_plan)

    def _make_plan(self, now: list[Collection], train: bool) -> _Plan:
        weights = []
        grads: dict[int, tuple[nn.Parameter, str, list[Collection]]] = {}
        for root in self._roots:
            for pname, p in root.params:
                colls = self.collections_for(pname)
                if colls:
                    weights.append((pname, p, colls))
                gname = GRADIENT_PREFIX + pname
                colls = self.collections_for(gname) if train and p.requires_grad else []
                if colls:
                    grads[id(p)] = (p, gname, colls)
        io = any(
            c.name not in _NOT_IO
            and (c.include_regex or any(INPUT_SUFFIX in n or OUTPUT_SUFFIX in n for n in c.tensor_names))
            for c in now
        )
        sharded = any(_dtensor.is_dtensor(p) for _n, p, _c in weights) or any(
            _dtensor.is_dtensor(p) for p, _n, _c in grads.values())
        if sharded and self.engine.identity.include_workers == "one" and self.world_size > 1:
            self._warn_once("one-worker-shards", "tensortap: include_workers='one' with sharded parameters "
                            "(FSDP2/DTensor): only worker_0 saves, and it holds only its own shards, so the sharded "
                            "weights and gradients cannot be read whole; use include_workers='all' (each worker "
                            "saves its shards and the trial assembles the full tensors)")
        return _Plan(
            weights, grads, io and bool(self._roots), [(n, c) for n, _p, c in weights],
            sharded or any(not capturable(p) for _n, p, _c in weights),
            grad_list=list(grads.values()), grad_items=[(n, c) for _p, n, c in grads.values()],
            sharded=sharded,
        )

    def flush(self, timeout: float | None = 30.0) -> None:
        """Make everything saved so far visible to readers, the current step's gradients as they are now
        included (readers keep the first record of a tensor in a step)."""
        self._hand_off_grads()
        super().flush(timeout)

    # --- user API ----------------------------------------------------------------------------

    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor) -> None:
        """Save a tensor computed outside modules (e.g. a functional loss) as `<tensor_name>_output_0`."""
        if not isinstance(tensor_value, torch.Tensor):
            raise InvalidConfiguration(f"tensor_value must be a torch.Tensor, not {type(tensor_value).__name__}")
        if not self.active:
            return
        with self.guard("record_tensor_value"):
            self._ensure_step()
            if self.engine.saving:
                self._write_io(tensor_name, OUTPUT_SUFFIX, tensor_value)

    def save_tensor(self, tensor_name: str, tensor_value: Any,
                    collections_to_write: str | list[str] = CollectionKeys.DEFAULT) -> None:
        """Save a tensor (torch or numpy) at the current step in the named collections."""
        if isinstance(tensor_value, torch.Tensor) and self.active:
            if self._too_large(tensor_name, tensor_value):
                return
            with self.guard("save_tensor"):
                t = self._local(tensor_name, tensor_value)
                if t.device.type != "cpu":
                    self._ensure_step()
                    names = [collections_to_write] if isinstance(collections_to_write, str) else collections_to_write
                    if not any(self._collection_saves_now(self.collection_manager.get(n)) for n in names):
                        return  # spare the device-to-host copy
                    t = t.cpu()
                tensor_value = host_numpy(t)
        n_included = len(self.include_collections)
        super().save_tensor(tensor_name, tensor_value, collections_to_write)
        if len(self.include_collections) != n_included:
            self._config_changed()

    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar (a number or a one-element tensor) as `scalar/<name>`, whatever the save config."""
        if isinstance(value, torch.Tensor) and value.numel() == 1:  # (another: skipped and counted by the base)
            value = value.detach().reshape(()).cpu().item()
        super().save_scalar(name, value, sm_metric, timestamp)
