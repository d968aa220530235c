"""The PyTorch hook: captures weights, gradients, losses, module inputs/outputs and optimizer state.

Names follow smdebug's PyTorch naming: parameters `<RootClass>_<param>`, gradients
`gradient/<RootClass>_<param>`, module I/O `<module>_input_<i>` / `<module>_output_<i>` (the root
module is named by its class), losses `<LossClass>_output_0`. Optimizer state is saved as
`optimizer/param_group_<g>/<key>` and `optimizer/<RootClass>_<param>/<state key>`.

Steps known to save nothing cost one truth test in C per forward of the root module, made without a module
hook (see `_step_counter`); per-module forward hooks and per-parameter gradient hooks are only installed for
steps that save them. With the writer process, a saving step hands its weights, gradients and loss over in
one message of shared memory (`tensortap.capture.batch.StepLayout`).
"""

from __future__ import annotations

import functools
import logging
import os as _os
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from tensortap import modes as _modes
from tensortap.capture.batch import BatchSpec, StepLayout
from tensortap.collection import ACTIVATION_COLLECTIONS, Collection, CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.format.records import RecordBatch, StatisticsRows
from tensortap.hooks.base import Hook as BaseHook
from tensortap.hooks.base import rank_in_env
from tensortap.pytorch import _dtensor, _step_counter, singleton
from tensortap.pytorch._step_counter import CountingHooks
from tensortap.pytorch._tensors import (
    HostBatch,
    Reduced,
    ReductionProgram,
    capturable,
    device_reductions,
    host_numpy,
    iter_tensors,
    numpy_dtype,
    ring_sources,
)

logger = logging.getLogger("tensortap")

INPUT_SUFFIX = "_input_"
OUTPUT_SUFFIX = "_output_"
GRADIENT_PREFIX = "gradient/"
OPTIMIZER_PREFIX = "optimizer/"

K = CollectionKeys
_PARAM_COLLECTIONS = frozenset({K.WEIGHTS, K.BIASES, K.GRADIENTS})
# Collections that need no per-module forward hooks (losses come from registered loss modules).
_NOT_IO = frozenset({K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.SCALARS, K.OPTIMIZER_VARIABLES})
_NO_STATE_KEYS = frozenset({"params"})
#: the module types of each activation collection (functional calls such as F.relu are not modules: not found)
_ACTIVATION_TYPES = {"relu": (nn.ReLU, nn.ReLU6), "sigmoid": (nn.Sigmoid,), "tanh": (nn.Tanh,)}
_INF = float("inf")
_MAX_SKIP = 1 << 62
_STRIDED = torch.strided
_SMALL = 4096  # elements: a lone tensor this small is copied directly
# Module hooks of a saving plan stay installed over a quiet gap of at most this many steps (longer gaps: the
# calls they cost on quiet steps outweigh removing and installing them again).
_KEEP_HANDLES = 8
_NO_GRAD_MODES = (_modes.EVAL, _modes.PREDICT)  # modes whose steps save no gradients


def _hook_id() -> int:
    """A key for a hook put straight into a module's hook dict (no handle object per saving step), reserved
    among torch's hook handles' ids."""
    return RemovableHandle(OrderedDict()).id


def _is_compiled(module: nn.Module) -> bool:
    return hasattr(module, "_orig_mod") and type(module).__name__ == "OptimizedModule"


def _class_name(module: nn.Module) -> str:
    """The module's class name, as the user wrote it (FSDP2 renames the class of a sharded module)."""
    name = module._get_name()
    if name.startswith("FSDP") and torch.distributed.is_available():
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover
            return name
        if isinstance(module, FSDPModule):
            return name[4:]
    return name


def _unwrap_ddp(module: nn.Module) -> nn.Module:
    """The module a DistributedDataParallel wrapper holds (its names are the module's own)."""
    if torch.distributed.is_available() and isinstance(module, nn.parallel.DistributedDataParallel):
        return module.module
    return module


def _in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread (activation checkpointing recomputes
    forwards there: they were captured when they first ran)."""
    return _graph_task_id() != -1


def _closure_of(optimizer: Any, args: Any, kwargs: Any) -> Any:
    """The closure of `optimizer.step(closure)` as an optimizer step hook sees the call (torch passes the
    optimizer itself first among `args`), or None."""
    closure = kwargs.get("closure") if kwargs else None
    if closure is None:
        for a in args or ():
            if a is not optimizer and callable(a):
                return a
    return closure


def _no_graph_task() -> int:
    return -1


_graph_task_id = getattr(torch._C, "_current_graph_task_id", _no_graph_task)
_is_compiling = torch.compiler.is_compiling


def _detect_rank() -> tuple[int | None, int | None]:
    """(rank, world size) from torch.distributed, else Horovod (if imported), else (None, None)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (ImportError, RuntimeError, ValueError):
        pass
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None:
        try:
            if hvd.is_initialized():
                return hvd.rank(), hvd.size()
        except Exception:  # noqa: BLE001 - an odd Horovod build must not stop the job
            pass
    return None, None


def _no_distributed() -> bool:
    return False


#: torch.distributed is initialized: its wrappers (DDP, FSDP) queue autograd callbacks of their own
_distributed = torch.distributed.is_initialized if torch.distributed.is_available() else _no_distributed


@dataclass
class _Root:
    """A registered module whose forward starts a step."""

    module: nn.Module  # the module registered (gets the forward pre-hook)
    name: str  # class name of the (uncompiled) module
    params: list[tuple[str, nn.Parameter]]
    io_hooks: list[tuple[nn.Module, Any, int]]  # (module, forward hook, its key) for steps saving I/O
    compiled: bool
    handles: list[Any] = field(default_factory=list)
    counter: CountingHooks | None = None  # counts the module's calls instead of a forward pre-hook

    def unhook(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.counter is not None:
            _step_counter.uninstall(self.module, self.counter)
            self.counter = None


@dataclass
class _Plan:
    """What a step saving a given set of collections captures."""

    weights: list[tuple[str, nn.Parameter, list[Collection]]]
    grads: dict[int, tuple[nn.Parameter, str, list[Collection]]]
    io: bool
    weight_items: list[tuple[str, list[Collection]]] = field(default_factory=list)
    some_odd: bool = False  # some parameter may not be capturable (sparse, meta, ...)
    param_views: list[torch.Tensor] | None = None
    param_ptrs: list[int] | None = None  # the views' data_ptr()s
    grad_list: list[tuple[nn.Parameter, str, list[Collection]]] = field(default_factory=list)
    grad_items: list[tuple[str, list[Collection]]] = field(default_factory=list)
    weight_spec: BatchSpec | None = None
    grad_spec: BatchSpec | None = None
    step_layout: StepLayout | None = None  # of one message for weights and gradients, once learned
    sharded: bool = False  # some parameter is a DTensor: its local shard is saved (see _dtensor)
    # the reductions of each weight / gradient when they are all saved as reductions only (statistics
    # computed where the tensors live, see device_reductions), else None; False: not yet known
    weight_reds: Any = False
    grad_reds: Any = False
    weight_prog: ReductionProgram | None = None
    grad_prog: ReductionProgram | None = None


class Hook(BaseHook):
    """Captures a PyTorch training job; `register_module(model)` and `register_loss(loss_fn)` hook it up."""

    builtin_collections = (
        K.ALL, K.DEFAULT, K.SCALARS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.INPUTS, K.OUTPUTS,
        K.OPTIMIZER_VARIABLES, *(c for pair in ACTIVATION_COLLECTIONS.values() for c in pair),
    )
    default_include_collections = (K.LOSSES, K.SCALARS)
    always_include_collections = (K.LOSSES,)
    _scalars_wait_for_step = True  # (steps begin at the model's forward)

    def __init__(self, out_dir: str, *args: Any, rank: int | None = None, world_size: int | None = None,
                 flight_recorder: Any = None, **kwargs: Any):
        """`flight_recorder`: True, a number of steps (default 256) or a `tensortap.capture.flight.FlightConfig`
        keeps cheap statistics of every tensor at every step and writes them when something goes wrong
        (docs/pytorch.md, "The flight recorder"); on by default under `tensortap run`."""
        from tensortap.capture.flight import FlightConfig

        flight = FlightConfig.coerce(flight_recorder, under_runner=_os.environ.get("TENSORTAP_AUTO") == "1")
        given = rank is not None or world_size is not None
        if not given:
            rank, world_size = _detect_rank()
        # Made before the process group, with no rank given or in the environment (e.g. a process started
        # by torch.multiprocessing.spawn that calls init_process_group itself): the group's rank is taken
        # at the first step if the group exists by then (see _prepare), and the worker's folder is claimed
        # then, before anything is written.
        self._rank_later = self._claim_later = not given and rank is None and rank_in_env() is None
        super().__init__(out_dir, *args, rank=rank, world_size=world_size, **kwargs)
        self._roots: list[_Root] = []
        self._module_ids: set[int] = set()  # every module inside a registered root
        self._param_names: dict[int, str] = {}
        self._losses: list[tuple[nn.Module, Any, int]] = []  # (loss module, forward hook for saving steps, key)
        self._opt_handles: list[Any] = []
        self._plans: dict[tuple[int, ...], _Plan] = {}
        self._next_save: float = -1  # after a step that saves nothing, the next mode step that saves
        self._saving = False  # the current step saves something
        self._step_handles: list[Any] = []  # hooks installed for this step only
        self._plan_handles: list[Any] = []  # parameter hooks of the saving plan `_handles_plan`
        self._plan_hooks: list[tuple[dict, int]] = []  # (hook dict, key): its module hooks
        self._grad_hook_id = _hook_id()  # of the forward hook on roots in steps saving gradients
        self._output_hook_id = _hook_id()  # of the hook on a saving step's model output
        self._plan_key: tuple | None = None  # (collections saving now, train?) of `_plan_for`'s last plan
        self._plan_last: _Plan | None = None
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
        self._opt_consumed = False  # the optimizer's pre-hook ran (during a GradScaler step)
        self._forward_seen = False  # a registered module's forward ran in the current saving step
        self._module_io_seen = False  # a module input/output hook ran in the current saving step
        self._forward_unseen = False  # registered modules run compiled: their forwards are never seen
        self._closure_opt: Any = None  # an optimizer inside `step(closure)`: gradients read after it
        self._scalers: list[Any] = []
        self._grad_reduced: Reduced | None = None  # the step's gradient statistics, computed at capture
        self._reduced_records: list[StatisticsRows] = []  # the step's statistics, handed over when it ends
        self._step_handles_kept: list[Any] = []  # hooks kept until close
        self._activation_keys: dict[str, str] = {}  # "<module>_output_": its activation collection
        self._flight = None  # the flight recorder (tensortap.pytorch._flight), when on
        if flight is not None and not self.disabled:
            from tensortap.pytorch._flight import TorchFlight

            self._flight = TorchFlight(self, flight)
        singleton.set_hook(self)

    def _prepare(self) -> None:
        if self._rank_later:
            self._rank_later = False
            self._adopt_group_rank()
            self._claim_late()
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

    def _adopt_group_rank(self) -> None:
        """Take the rank and world size of a process group created after this hook."""
        rank, world_size = _detect_rank()
        if rank is None or world_size is None or self._writer is not None:
            return
        named = self.worker == f"worker_{self.rank}"  # (else a name the caller chose)
        self.rank, self.world_size = rank, world_size
        if named:
            self.worker = f"worker_{rank}"
        self.num_workers = world_size if self.include_workers == "all" else 1
        self.collection_manager.set_num_workers(self.num_workers)
        self._collections_dirty = True
        self.writes = self.include_workers == "all" or rank == 0

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
        self._config_changed()  # (the per-save-set plans too; it invalidates the base's caches)

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
        self._disarm()
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
        io_hooks: list[tuple[nn.Module, Any, int]] = []
        if _is_compiled(module):  # (outside the compiled code)
            io_hooks.append((module, functools.partial(self._io_hook, root_name), _hook_id()))
        elif not compiled:
            for n, m in inner.named_modules():
                io_hooks.append((m, functools.partial(self._io_hook, n if n else root_name), _hook_id()))
                self._note_activation(n if n else root_name, m)
        root = _Root(module, root_name, params, io_hooks, compiled)
        # (Kept out of torch.compile: a module compiled after registering calls these from inside compiled code.)
        pre_hook = torch.compiler.disable(self._root_pre_hook)
        if not compiled:
            root.counter = _step_counter.install(module, functools.partial(pre_hook, module, ()))
        if root.counter is None:
            root.handles.append(module.register_forward_pre_hook(pre_hook))
        self._roots.append(root)
        # One root: its counter may skip known-quiet steps (with several, each counts through the hook).
        self.clock.tally = self._roots[0].counter if len(self._roots) == 1 else None
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
        if any(m is loss_module for m, _fn, _k in self._losses):
            return
        self._losses.append((loss_module, functools.partial(self._loss_hook, name), _hook_id()))
        if self._flight is not None:
            self._flight.add_loss(name, loss_module)
        self._remove_plan_handles()  # the next saving step installs its hook
        if self._forward_unseen:
            self._step_handles_kept.append(loss_module.register_forward_pre_hook(self._loss_step_hook))

    def _hook_loss_now(self, loss_module: nn.Module) -> None:
        """In a saving step, capture a registered loss module's calls from now on in this step too."""
        if self._saving:
            for m, fn, _key in self._losses:
                if m is loss_module:
                    self._step_handles.append(m.register_forward_hook(fn))

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
        scale is saved with the gradients. (Gradients are captured unscaled either way: at the optimizer's step.)"""
        step = getattr(scaler, "step", None)
        if not callable(step) or not callable(getattr(scaler, "get_scale", None)):
            raise InvalidConfiguration(f"register_scaler takes a torch.amp.GradScaler, not {scaler!r}")
        if self.disabled or self._closed or any(sc is scaler for sc in self._scalers):
            return
        self._scalers.append(scaler)
        hook = self

        @functools.wraps(step)
        def scaler_step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            hook._opt_consumed = False
            out = step(optimizer, *args, **kwargs)
            if not hook._opt_consumed and id(optimizer) in hook._opts:
                hook._skipped_step(scaler)
            return out

        scaler.step = scaler_step  # (an attribute of this scaler: the class is left alone)

    def _adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._opts.add(id(optimizer))
        self._disarm()
        self._remove_plan_handles()  # (gradients now come at the optimizer's step, not from backward hooks)

    def _watch_optimizers(self) -> None:
        """Global optimizer step hooks (public torch API) that find the optimizers of the registered modules'
        parameters and capture at their steps."""
        if self._opt_handles:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._opt_handles.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook))
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
        if self.disabled or self._closed or not self._ours(optimizer):
            return
        self._opt_consumed = True
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
            if not self.clock.in_step or self._opt_stepped:
                # no forward of a registered module began this step: it runs compiled (or is not called)
                if self._roots and not self._forward_unseen:
                    self._roots_unseen()
                self._begin_train_step()
            if not begin_only and self._saving and self._grad_targets:
                self._collect_grads()
                if self._scalers:
                    self._save_scale(self._scalers[0], False)
        except Exception as e:  # noqa: BLE001
            self._fail("optimizer step", e)

    def _loss_step_hook(self, module: nn.Module, args: Any) -> None:
        """With the model's forward unseen (compiled), a registered loss's forward begins the step."""
        if _is_compiling() or self.disabled or self._closed:
            return
        clock = self.clock
        if clock.in_step and not self._opt_stepped and clock.mode not in _NO_GRAD_MODES:
            return  # another forward of this optimizer step
        try:
            self._begin_train_step()
        except Exception as e:  # noqa: BLE001
            self._fail("loss pre-hook", e)

    def _begin_train_step(self) -> None:
        self.next_step()
        self._opt_stepped = False

    def _roots_unseen(self) -> None:
        """The registered modules' forwards are not seen (compiled after register_module): steps begin at the
        registered losses' forwards, else at the optimizer's step."""
        self._forward_unseen = True
        for m, _fn, _key in self._losses:
            self._step_handles_kept.append(m.register_forward_pre_hook(self._loss_step_hook))
        names = ", ".join(r.name for r in self._roots)
        self._warn_io_missing(f"the forward of {names} runs in compiled code (torch.compile after "
                              "register_module); steps begin at the loss or the optimizer's step")
        self._remove_plan_handles()

    def _skipped_step(self, scaler: Any) -> None:
        """The GradScaler skipped the optimizer's step (non-finite gradients): recorded, and the step ends."""
        if self.disabled or self._closed or self.clock.mode in _NO_GRAD_MODES:
            return
        with self.guard("grad scaler"):
            if not self.clock.in_step or self._opt_stepped:
                self._begin_train_step()
            self._save_scale(scaler, True)
            self._opt_stepped = True

    def _save_scale(self, scaler: Any, skipped: bool) -> None:
        if not self._saving and not skipped:
            return
        if not self.active:
            return
        coll = self.collection_manager.get("grad_scaler")
        scale = float(scaler.get_scale())
        items = [("grad_scaler/scale", np.asarray(scale, dtype=np.float32), [coll])]
        if skipped:
            items.append(("grad_scaler/skipped", np.asarray(1.0, dtype=np.float32), [coll]))
        self.write_tensors(items)

    # --- callbacks ---------------------------------------------------------------------------

    def _root_pre_hook(self, module: nn.Module, args: Any) -> None:
        """A forward of a registered root begins a step. A step after a step that saved nothing, itself known to
        save nothing, is only counted: readers learn it passed when a later step ends."""
        if self.disabled or self._closed:
            return
        clock = self.clock
        if self._opts and clock.in_step and not self._opt_stepped and clock.mode not in _NO_GRAD_MODES:
            self._forward_seen = True
            return  # another forward of this optimizer step (accumulation, a second call, an eval pass)
        self._opt_stepped = False
        try:
            clock.sync()
            if (clock.in_step and not self._saving and clock.mode_steps[clock.mode] + 1 < self._next_save
                    and time.monotonic() < self.counting_deadline()):
                clock.advance()
            else:
                self.next_step()
            counter = clock.tally
            if counter is not None and not self._saving and clock.in_step and not self._opts:
                # the forwards before the next saving step only count (in C, see _step_counter)
                left = self._next_save - clock.mode_steps[clock.mode] - 1
                if left > 0:
                    counter.left = left if left < _MAX_SKIP else _MAX_SKIP
                    counter.deadline = self.counting_deadline()
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("forward pre-hook", e)
        self._forward_seen = True

    def _disarm(self) -> None:
        """Every later forward goes through `_root_pre_hook` again (the step, mode or plan changes)."""
        counter = self.clock.tally
        if counter is not None:
            counter.left = 0
            self.clock.sync()

    def end_step(self) -> None:
        self._disarm()
        super().end_step()

    def _step_is_over(self) -> bool:
        """A step ends at the next forward pass; `create_trial` in the training thread after the loop ends it
        (issue #35) once it saves nothing more: it saves nothing, saves no gradients, or its gradients were read."""
        return (not self._saving or not self._grad_targets or self._grad_res is not None or bool(self._pending_grads)
                or self._grad_batch is not None)

    def _io_hook(self, name: str, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if _is_compiling() or not self._saving or self.disabled or _in_backward():
            return  # (traced by torch.compile / recomputed by activation checkpointing: not captured there)
        self._module_io_seen = True
        try:
            self._write_io(name, INPUT_SUFFIX, inputs)
            self._write_io(name, OUTPUT_SUFFIX, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("forward hook", e)

    # A loss module's inputs and outputs are saved the same way. (Reading the gradients through a hook on the
    # loss's output instead of the model's, which would spare the model torch's slow call path in saving
    # steps, misses a second backward pass of a step that does not go through the loss: not done.)
    def _loss_hook(self, name: str, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if _is_compiling() or not self._saving or self.disabled or _in_backward():
            return
        try:
            self._write_io(name, INPUT_SUFFIX, inputs)
            self._write_io(name, OUTPUT_SUFFIX, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("forward hook", e)

    def _grad_root_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        # Gradients are read once the backward pass ends. A hook on the output starts that; a model
        # whose output does not require grad gets a hook on each parameter instead.
        if _is_compiling() or not self._saving or self.disabled or not self._grad_targets or self._opts:
            return
        try:
            found = False
            for t in (outputs,) if type(outputs) is torch.Tensor else iter_tensors(outputs):
                fn = t.grad_fn if t.requires_grad else None  # (each read makes a new Python object)
                if fn is not None:
                    if type(t) is torch.Tensor and t._backward_hooks is None:
                        # What Tensor.register_hook does, without a handle: the output and its hook go
                        # with the step's graph.
                        t._backward_hooks = OrderedDict(((self._output_hook_id, self._output_grad_hook),))
                        fn._register_hook_dict(t)
                    else:
                        self._step_handles.append(t.register_hook(self._output_grad_hook))
                    found = True
            if not found and not self._param_hooks_on:
                self._param_hooks_on = True
                for p, _name, _colls in self._grad_targets.values():
                    self._step_handles.append(p.register_post_accumulate_grad_hook(self._param_grad_hook))
        except Exception as e:  # noqa: BLE001
            self._fail("gradient hook", e)

    def _output_grad_hook(self, grad_or_param: torch.Tensor) -> None:
        """The backward pass reached the model output (or a parameter's gradient was accumulated)."""
        if self.disabled or self._grad_cb_queued or self._opts:
            return
        try:
            self._grad_cb_queued = True
            # Distributed wrappers queue callbacks later in this backward (DDP's gradient reduction):
            # then the gradients are read from a callback queued after theirs (see _after_backward).
            torch.autograd.Variable._execution_engine.queue_callback(
                self._after_backward if _distributed() else self._collect_grads)
        except Exception as e:  # noqa: BLE001
            self._fail("gradient hook", e)

    _param_grad_hook = _output_grad_hook

    def _after_backward(self) -> None:
        # Queue once more so that callbacks queued later in this backward (DDP's gradient
        # reduction) run before the gradients are read.
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._collect_grads)
        except Exception as e:  # noqa: BLE001
            self._grad_cb_queued = False
            self._fail("gradient hook", e)

    def _collect_grads(self) -> None:
        self._grad_cb_queued = False
        if self.disabled or not self._saving:
            return
        try:
            plan = self._step_plan
            if plan is not None and plan.sharded:
                plan = None  # (the generic path below takes each gradient's local shard)
            if self._step_res is not None and self._grad_res is None and plan is not None:
                # The usual case: the gradients and small tensors (a loss) go into the step's message that holds
                # the weights when they are what its layout expects (else it goes out with the weights alone).
                layout = plan.step_layout
                small = self._small
                tensors = [p.grad for p, _n, _c in plan.grad_list] + [t for _n, t, _c in small]
                found = None
                if (all(t is not None for t in tensors) and tensors[0].dtype is plan.weight_spec.dtype
                        and layout.tail_names[len(plan.grad_list):] == tuple(n for n, _t, _c in small)):
                    found = ring_sources(tensors, layout.tail_shapes)
                if found is not None and found[1] is layout.tail_shapes:
                    self._step_res.copy_in(found[0], layout.head_bytes)
                    self._pending_grads = {}
                    self._grad_res = self._step_res
                    self._grad_off = layout.head_bytes
                    self._small_in_res = len(small)
                    return
                self._split_step_res()
            if plan is not None and plan.grad_list:
                grads = []
                usual = True
                for p, _n, _c in plan.grad_list:  # (what capturable() tests)
                    g = p.grad
                    if g is None or g.layout is not _STRIDED or g.is_meta or g.is_nested:
                        usual = False
                        break
                    grads.append(g)
                if usual:
                    if plan.grad_reds is False:
                        plan.grad_reds = self._reductions_only(plan.grad_items)
                    if plan.grad_reds is not None:
                        # statistics only: computed now, where the gradients live (a later call replaces them)
                        self._pending_grads = {}
                        prog = plan.grad_prog
                        if prog is None or prog.dtypes != tuple(g.dtype for g in grads):
                            prog = plan.grad_prog = ReductionProgram(grads, plan.grad_reds)
                        self._grad_reduced = prog.run(grads)
                        return
                    # the usual case: every gradient, in one copy (a later backward of this step replaces it)
                    self._pending_grads = {}
                    if plan.grad_spec is None:
                        plan.grad_spec = self._batch_spec(plan.grad_items)
                    res = self._grad_res
                    extra = self._small[:self._small_in_res if res is not None else len(self._small)]
                    for _n, t, _c in extra:
                        if t.dtype != grads[0].dtype:
                            extra = []
                            break
                    names = plan.grad_spec.names
                    tensors = grads
                    if extra:
                        tensors = grads[:]
                        extra_names = []
                        for n, t, _c in extra:
                            tensors.append(t)
                            extra_names.append(n)
                        names = names + tuple(extra_names)
                    res = self._ring_batch(tensors, plan.grad_spec, res, names, at=self._grad_off)
                    if res is not None:
                        if res and self._grad_res is None:
                            self._small_in_res = len(extra)
                            self._learn_step_layout(plan, names)
                        self._grad_res = res or None
                        return
                    self._cancel_grad_res()
                    self._grad_batch = HostBatch(grads, self._force_async_copies)
                    return
            self._cancel_grad_res()
            self._expand_grad_batch()
            items: list[tuple[str, list[Collection]]] = []
            tensors: list[torch.Tensor] = []
            for p, name, colls in self._grad_targets.values():
                g = p.grad
                if g is not None and _dtensor.is_dtensor(g):
                    g = self._local(name, g)
                if g is not None and capturable(g):
                    items.append((name, colls))
                    tensors.append(g)
            if tensors:
                arrays = HostBatch(tensors, self._force_async_copies).arrays()
                for (name, colls), arr in zip(items, arrays, strict=True):
                    self._pending_grads[name] = (arr, colls)  # a later backward of this step replaces it
        except Exception as e:  # noqa: BLE001
            self._fail("gradient capture", e)

    def _cancel_grad_res(self) -> None:
        res, self._grad_res = self._grad_res, None
        self._small_in_res = 0
        self._grad_off = 0
        if res is not None:
            if res is self._step_res:
                self._split_step_res()  # (the weights in it stay)
            else:
                res.cancel()

    def _learn_step_layout(self, plan: _Plan, tail_names: tuple[str, ...]) -> None:
        """After the weights and the gradients of a step went to the writer in two messages: one next time."""
        if plan.step_layout is None and self._defer_small and plan.weight_spec is not None and plan.grad_spec:
            plan.step_layout = StepLayout.join(plan.weight_spec, plan.grad_spec, tail_names)

    def _split_step_res(self, send: bool = True) -> None:
        """The step's message goes out with the weights alone (its gradients did not come, or not as its
        layout expects; `send` False: not at all)."""
        res, self._step_res = self._step_res, None
        if res is None or res is self._grad_res:
            return
        plan = self._step_plan
        if not send or plan is None or plan.weight_spec is None:
            res.cancel()
            return
        ws = plan.weight_spec
        res.shrink(ws.names, ws.np_dtype, ws.shapes, ws.reductions)
        res.commit()

    def _expand_grad_batch(self) -> None:
        """Turn a pending batch of every gradient into per-name pending gradients."""
        batch, self._grad_batch = self._grad_batch, None
        if batch is not None and self._step_plan is not None:
            for (name, colls), arr in zip(self._step_plan.grad_items, batch.arrays(), strict=True):
                self._pending_grads[name] = (arr, colls)

    def _optimizer_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.disabled or self._closed or id(optimizer) not in self._opts:
            return
        if self._closure_opt is optimizer:
            self._closure_opt = None
            if self.clock.mode not in _NO_GRAD_MODES:
                self._consume_gradients()
        self._opt_stepped = True  # the next forward (or loss, or optimizer step) begins the next step
        if not self._saving or self.mode in (_modes.EVAL, _modes.PREDICT):
            return
        try:
            self._save_optimizer(optimizer)
        except Exception as e:  # noqa: BLE001
            self._fail("optimizer hook", e)

    # --- steps -------------------------------------------------------------------------------

    def on_step_begin(self) -> None:
        self._saving = False
        if not self.active:
            self._next_save = _INF
            self._remove_plan_handles()
            return
        now = self.collections_to_save()
        if not now:
            self._next_save = self.next_saving_step()
            kept = self._handles_plan
            if kept is not None and (kept.io or self._next_save - self.clock.mode_step > _KEEP_HANDLES):
                self._remove_plan_handles()  # (I/O hooks sit on every module: never kept over quiet steps)
            return
        self._saving = True
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
        hooks = self._plan_hooks
        if plan.grads and not self._opts:
            for root in self._roots:
                if root.compiled and not _is_compiled(root.module):
                    # model.compile(): a forward hook would run inside the compiled code. Parameter
                    # hooks run in autograd, outside it.
                    for _pname, p in root.params:
                        if id(p) in plan.grads:
                            handles.append(p.register_post_accumulate_grad_hook(self._param_grad_hook))
                else:
                    d = root.module._forward_hooks
                    d[self._grad_hook_id] = self._grad_root_hook
                    hooks.append((d, self._grad_hook_id))
        for m, fn, key in self._losses:
            d = m._forward_hooks
            d[key] = fn
            hooks.append((d, key))
        if plan.io and not self._forward_unseen:
            for root in self._roots:
                for m, fn, key in root.io_hooks:
                    d = m._forward_hooks
                    d[key] = fn
                    hooks.append((d, key))
        self._handles_plan = plan

    def _remove_plan_handles(self) -> None:
        if self._plan_hooks:
            for d, key in self._plan_hooks:
                d.pop(key, None)
            self._plan_hooks.clear()
        if self._plan_handles:
            for h in self._plan_handles:
                h.remove()
            self._plan_handles.clear()
        self._handles_plan = None

    def on_step_end(self) -> None:
        if not self._saving:
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
        self._saving = False
        self._step_plan = None

    def __exit__(self, *exc: Any) -> None:
        if self._flight is not None and len(exc) > 1 and exc[1] is not None:
            self._flight.rec.on_exception(exc[1])  # (an exception leaving the hook's `with` block)
        super().__exit__(*exc)

    def on_close(self) -> None:
        if self._flight is not None:
            self._flight.close()
        self._disarm()
        self.clock.tally = None
        for root in self._roots:
            root.unhook()
        for h in self._opt_handles + self._step_handles + self._step_handles_kept:
            h.remove()
        self._step_handles_kept.clear()
        self._remove_plan_handles()
        self._roots.clear()
        self._losses.clear()
        self._opt_handles.clear()
        self._step_handles.clear()

    def _config_changed(self) -> None:
        self._disarm()
        self._plans.clear()
        self._plan_key = None
        self._raw_only_cache.clear()
        self._invalidate_caches()
        self._next_save = -1

    def _plan_for(self, now: list[Collection]) -> _Plan:
        train = self.mode not in _NO_GRAD_MODES
        last = self._plan_key
        if last is not None and last[0] is now and last[1] == train:  # (the same list while the set stays)
            return self._plan_last
        key = (train, *(id(c) for c in now))
        plan = self._plans.get(key)
        if plan is None:
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
            plan = self._plans[key] = _Plan(
                weights, grads, io and bool(self._roots), [(n, c) for n, _p, c in weights],
                sharded or any(not capturable(p) for _n, p, _c in weights),
                grad_list=list(grads.values()), grad_items=[(n, c) for _p, n, c in grads.values()],
                sharded=sharded,
            )
            if len(self._plans) > 64:
                self._plans.clear()
        self._plan_key = (now, train)
        self._plan_last = plan
        return plan

    # --- capture -----------------------------------------------------------------------------

    def _save_params(self, plan: _Plan) -> None:
        if plan.sharded:
            views = [self._local(n, p) for n, p, _c in plan.weights]
            keep = [i for i, v in enumerate(views) if capturable(v)]
            self._stage_or_write([views[i] for i in keep], [plan.weight_items[i] for i in keep])
            return
        # Detached views of the parameters, cached while every parameter keeps its storage.
        views = plan.param_views
        if views is not None:
            i = 0
            ptrs = plan.param_ptrs
            for _n, p, _c in plan.weights:
                if ptrs[i] != p.data_ptr():
                    views = None
                    break
                i += 1
        spec = plan.weight_spec
        if views is None:
            views = plan.param_views = [p.detach() for _n, p, _c in plan.weights]
            plan.param_ptrs = [v.data_ptr() for v in views]
            if spec is not None:
                spec.sources = None
            plan.step_layout = None  # (learned again: the parameters' shapes or dtype may have changed)
        if plan.weight_reds is False:
            plan.weight_reds = self._reductions_only(plan.weight_items)
        if plan.weight_reds is not None and not plan.some_odd:
            prog = plan.weight_prog
            if prog is None or prog.dtypes != tuple(v.dtype for v in views):
                prog = plan.weight_prog = ReductionProgram(views, plan.weight_reds)
            self._write_reduced(prog.run(views), plan.weight_items)
            return
        if not plan.some_odd:
            if spec is None:
                spec = plan.weight_spec = self._batch_spec(plan.weight_items)
            layout = plan.step_layout
            if layout is not None and spec.sources is not None and self._defer_small and self._writer is not None:
                # one message for the weights and, at the end of the backward pass, the gradients
                res = layout.reserve(self._writer, self.clock, spec.np_dtype)
                if res is not None:
                    if res:
                        res.copy_in(spec.sources)
                        self._step_res = res
                    return
            self._stage_or_write(views, plan.weight_items, spec, reuse=True)
        else:
            keep = [i for i, v in enumerate(views) if capturable(v)]
            self._stage_or_write([views[i] for i in keep], [plan.weight_items[i] for i in keep])

    def _stage_or_write(self, tensors: list[torch.Tensor], items: list[tuple[str, list[Collection]]],
                        spec: BatchSpec | None = None, reuse: bool = False, reds: Any = False) -> None:
        if not tensors:
            return
        if spec is None or not spec.raw_only:
            if reds is False:
                reds = self._reductions_only(items)
            if reds is not None:
                self._write_reduced(device_reductions(tensors, reds), items)
                return
        if spec is not None:
            res = self._ring_batch(tensors, spec, reuse=reuse)
            if res is not None:
                if res:
                    res.commit()
                return
        batch = HostBatch(tensors, self._force_async_copies)
        if self._force_async_copies or any(t.device.type != "cpu" for t in tensors):
            self._staged.append((batch, items, spec))  # copied asynchronously; written at the end of the step
            return
        self._write_batch(batch, items, spec)

    def _ring_batch(self, tensors: list[torch.Tensor], spec: BatchSpec, res: Any = None,
                    names: tuple[str, ...] | None = None, reuse: bool = False, at: int = 0) -> Any:
        """Copy CPU tensors of one dtype straight into the shared memory of a writer process (one copy,
        no host buffer in between): the reservation to commit, False if the writer dropped the batch,
        None if this path does not apply. `res`: an open reservation of the same tensors to refill;
        `names`: of the tensors when not `spec.names`; `reuse`: the tensors are those of the last call
        with `reuse` unless `spec.sources` was cleared; `at`: where they go in `res`'s payload."""
        if not spec.raw_only or self.dry_run or self._force_async_copies:
            return None
        w = self._writer
        if w is None:
            w = self._get_writer()
        shapes = spec.shapes
        sources = spec.sources if reuse else None
        if sources is None:
            found = ring_sources(tensors, shapes)
            if found is None:
                return None
            sources, new_shapes = found
            if new_shapes is not shapes:
                if res is not None:
                    return None  # (the open reservation is laid out for other shapes)
                spec.shapes = shapes = new_shapes
            if reuse:
                spec.sources = sources
        if res is None:
            dtype = tensors[0].dtype
            if dtype is not spec.dtype:
                spec.np_dtype = numpy_dtype(dtype)
                spec.dtype = dtype
            if spec.np_dtype is None:
                return None
            res = spec.reserve(w, self.clock, names)  # (the small tensors after `spec.names`: raw only)
            if not res:
                return res
        res.copy_in(sources, at)
        return res

    def flush(self, timeout: float | None = 30.0) -> None:
        """Make everything saved so far visible to readers, the current step's gradients as they are now
        included (readers keep the first record of a tensor in a step)."""
        self._hand_off_grads()
        super().flush(timeout)

    def _hand_off_grads(self) -> None:
        if (self._grad_res is None and self._grad_batch is None and not self._pending_grads and not self._small
                and self._step_res is None and self._grad_reduced is None and not self._reduced_records):
            return  # (every step that saved no gradients)
        reduced, self._grad_reduced = self._grad_reduced, None
        active = self._saving and not self.disabled and not self._closed  # (writes: it made `res`)
        if self._step_res is not None:
            self._split_step_res(send=active)  # (unless it holds the gradients: then it is `res`)
            self._step_res = None
        self._grad_off = 0
        res, self._grad_res = self._grad_res, None
        batch, self._grad_batch = self._grad_batch, None
        pending, self._pending_grads = self._pending_grads, {}
        small, self._small = self._small, []
        in_res, self._small_in_res = self._small_in_res, 0
        plan = self._step_plan
        if res is not None:
            if active:
                res.commit()
                small = small[in_res:]
            else:
                res.cancel()
        if not active or not self.writes:
            self._reduced_records = []
            return
        if reduced is not None and plan is not None:
            with self.guard("gradients"):
                self._write_reduced(reduced, plan.grad_items)
        if self._reduced_records:
            rows, self._reduced_records = self._reduced_records, []
            with self.guard("statistics"):
                for r in rows:
                    self._get_writer().submit_statistics(r)
        if small:
            with self.guard("small tensors"):
                self.write_tensors([(name, host_numpy(t), colls) for name, t, colls in small], copy=False)
        if batch is not None or pending:
            with self.guard("gradients"):
                if batch is not None and plan is not None:
                    if plan.grad_spec is None:
                        plan.grad_spec = self._batch_spec(plan.grad_items)
                    self._write_batch(batch, plan.grad_items, plan.grad_spec)
                if pending:
                    self.write_tensors([(name, arr, colls) for name, (arr, colls) in pending.items()], copy=False)

    def _write_batch(self, batch: HostBatch, items: list[tuple[str, list[Collection]]], spec: BatchSpec | None) -> None:
        """Hand the host copies in `batch` to the writer: one hand-off for a fixed list saved raw only."""
        arrays = batch.arrays()
        if spec is None or not spec.raw_only:
            self.write_tensors([(name, arr, colls) for (name, colls), arr in zip(items, arrays, strict=True)],
                               copy=False)
            return
        if self.dry_run:
            return
        mode = self.mode
        self._get_writer().submit_batch(
            RecordBatch(spec.names, arrays, batch.flat(), self.step, mode.value, self.mode_steps[mode],
                        spec.reductions)
        )

    def _write_io(self, prefix: str, suffix: str, obj: Any) -> None:
        key = prefix + suffix
        start = idx = self._io_counts.get(key, 0)
        if start and key in self._activation_keys:
            self._note_later_call(key, start)
        if type(obj) is torch.Tensor:
            objs: Any = (obj,)
        elif type(obj) is tuple:
            objs = obj  # e.g. a loss module's (input, target)
            for t in obj:
                if not isinstance(t, torch.Tensor):
                    objs = list(iter_tensors(obj))
                    break
        elif isinstance(obj, torch.Tensor):
            objs = (obj,)
        else:
            objs = list(iter_tensors(obj))
        n = len(objs)
        skip = (key, start, n)
        # What these names did the last time: (the schedule's generation then, None if none of them is saved
        # now, else (name, collections) of a lone small tensor saved raw). (The generation is current: this
        # runs in saving steps, which began with collections_to_save().)
        seen = self._io_skip.get(skip)
        if seen is not None and seen[0] == self.schedule.generation:
            lone = seen[1]
            if lone is None:
                self._io_counts[key] = start + n
                return
            t = objs[0]
            if self._defer_small and t.is_cpu and t.layout is _STRIDED and not t.is_nested and t.numel() <= _SMALL:
                # e.g. a loss: sent with this step's gradients (one hand-off for both), else at step end
                self._io_counts[key] = start + 1
                self._small.append((lone[0], t.detach().clone(), lone[1]))
                return
        tensors: list[torch.Tensor] = []
        items: list[tuple[str, list[Collection]]] = []
        wanted = False
        for t in objs:
            name = f"{key}{idx}"
            idx += 1
            colls = self.collections_for(name)
            if colls:
                wanted = True
                if _dtensor.is_dtensor(t):
                    t = self._local(name, t)
                if capturable(t):
                    tensors.append(t.detach())
                    items.append((name, colls))
        self._io_counts[key] = idx
        if len(self._io_skip) > 4096:
            self._io_skip.clear()
        if not wanted:
            self._io_skip[skip] = (self.schedule.generation, None)
            return
        if len(tensors) == 1 and tensors[0].numel() <= _SMALL and tensors[0].is_cpu:
            name, colls = items[0]
            if self._raw_only(name, colls):
                self._note_membership(name, colls)
                if n == 1:
                    self._io_skip[skip] = (self.schedule.generation, (name, colls))
                if self._defer_small:
                    self._small.append((name, tensors[0].clone(), colls))
                    return
            self.write_tensor(name, host_numpy(tensors[0]), colls)  # copied here
        else:
            self._stage_or_write(tensors, items)

    def _local(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t` detached; of a DTensor its local shard, with where it lies in the full tensor noted under `name`
        in the collections' `_meta.shards` (docs/format.md §10)."""
        if not _dtensor.is_dtensor(t):
            return t.detach()
        meta = _dtensor.shard_meta(t)
        if self._shards.get(name) != meta:
            self._shards[name] = meta
            self.collection_manager._meta["shards"] = self._shards
            self._collections_dirty = True
        return _dtensor.local(t)

    def _note_later_call(self, key: str, index: int) -> None:
        """A later call of an activation module in this step: its tensor (`<module>_output_<k>`, k counting on
        over the step's calls) joins the module's activation collection."""
        coll = self.collection_manager.get(self._activation_keys[key])
        name = f"{key}{index}"
        if not coll.has_tensor_name(name):
            coll.add_tensor_name(name)
            self._collections_dirty = True
            self._raw_only_cache.clear()
            self._io_skip.clear()
            self._invalidate_caches()

    def _reductions_only(self, items: list[tuple[str, list[Collection]]]) -> list[tuple] | None:
        """The reductions of each item when every item is saved as reductions alone (no raw value, no shape),
        else None."""
        out = []
        for name, colls in items:
            save_raw, reds, save_shape = self._plan(name, colls)
            if save_raw or save_shape or not reds:
                return None
            out.append(reds)
        return out

    def _write_reduced(self, values: Reduced, items: list[tuple[str, list[Collection]]]) -> None:
        """Reductions computed here (device_reductions) to the writer, as one packed hand-off."""
        for name, colls in items:
            self._note_membership(name, colls)
        if self.dry_run:
            return
        rows = values.rows(tuple(name for name, _c in items), *self.step_id())
        if self._saving:
            self._reduced_records.append(rows)  # (handed over with the step's other statistics when it ends)
        else:
            self._get_writer().submit_statistics(rows)

    def _raw_only(self, name: str, colls: list[Collection]) -> bool:
        key = (name, tuple(map(id, colls)))
        hit = self._raw_only_cache.get(key)
        if hit is None:
            save_raw, reds, _shape = self._plan(name, colls)
            hit = self._raw_only_cache[key] = save_raw and not reds
        return hit

    def _save_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        tensors: list[torch.Tensor] = []
        items: list[tuple[str, list[Collection]]] = []

        def add(name: str, value: Any) -> None:
            colls = [c for c in self.collections_for(name) if c.name not in _PARAM_COLLECTIONS]
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

        for g, group in enumerate(optimizer.param_groups):
            for k, v in group.items():
                if k in _NO_STATE_KEYS or isinstance(v, bool) or v is None:
                    continue
                if isinstance(v, (int, float, torch.Tensor)) or (
                    isinstance(v, tuple) and v and all(isinstance(x, (int, float)) for x in v)
                ):
                    add(f"{OPTIMIZER_PREFIX}param_group_{g}/{k}", v)
        for i, (p, state) in enumerate(optimizer.state.items()):
            pname = self._param_names.get(id(p), f"param_{i}")
            for k, v in state.items():
                if isinstance(v, torch.Tensor) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
                    add(f"{OPTIMIZER_PREFIX}{pname}/{k}", v)
        self._stage_or_write(tensors, items)

    # --- user API ----------------------------------------------------------------------------

    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor) -> None:
        """Save a tensor computed outside modules (e.g. a functional loss) as `<tensor_name>_output_0`."""
        if not isinstance(tensor_value, torch.Tensor):
            raise InvalidConfiguration(f"tensor_value must be a torch.Tensor, not {type(tensor_value).__name__}")
        if not self.active:
            return
        with self.guard("record_tensor_value"):
            self._ensure_step()
            if self._saving:
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
