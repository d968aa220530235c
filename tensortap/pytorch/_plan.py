"""The PyTorch hook's names, helpers and plans: what a registered root is and what a saving step captures."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tensortap import modes as _modes
from tensortap.capture.batch import BatchSpec, StepLayout
from tensortap.collection import Collection, CollectionKeys
from tensortap.format.records import StatisticsLayout
from tensortap.pytorch._tensors import (
    ReductionProgram,
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
_STRIDED = torch.strided
_SMALL = 4096  # elements: a lone tensor this small is copied directly
# Module hooks of a saving plan stay installed over a quiet gap of at most this many steps (longer gaps: the
# calls they cost on quiet steps outweigh removing and installing them again).
_KEEP_HANDLES = 8
_NO_GRAD_MODES = (_modes.EVAL, _modes.PREDICT)  # modes whose steps save no gradients


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


def _detect_rank() -> tuple[int, int] | None:
    """(rank, world size) from torch.distributed, else Horovod (if imported), else None."""
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
    return None


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
    io_hooks: list[tuple[nn.Module, Any]]  # (module, forward hook) for steps saving I/O
    compiled: bool
    handles: list[Any] = field(default_factory=list)

    def unhook(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


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
    # id(optimizer): the shape of its groups' and state's keys (see _save_optimizer) at which it saved nothing
    optimizers_quiet: dict[int, tuple] = field(default_factory=dict)
    # the one statistics message of a step saving its weights' and gradients' statistics: ((weights' program, the
    # gradients', the vectors' dtypes), its layout)
    statistics_layout: tuple[tuple, StatisticsLayout] | None = None
    small_spec: BatchSpec | None = None  # of the small tensors held until the step ends (a loss), saved raw
