"""The flight recorder of the PyTorch hook (docs/pytorch.md "The flight recorder"; the ring and its triggers are
`tensortap.capture.flight`).

Every step, whatever the save interval: each registered module's outputs (a forward hook per module that only
keeps a reference), then at the optimizer's step (its pre-hook: gradients as the optimizer consumes them, weights
as the forward used them) or, for EVAL/PREDICT steps and loops with no optimizer, when the next step's forward
begins, the statistics of all of them are computed where they live in one batched pass (`torch._foreach_norm`) and
brought to the host in one transfer. A step with a non-finite value names where it first appeared: the first
module in forward order whose output went non-finite, else the first parameter in backward order (the reverse of
registration) whose gradient did, else a parameter itself.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from tensortap import modes as _modes
from tensortap.capture.flight import FlightConfig, FlightRecorder, Layout
from tensortap.pytorch import _dtensor
from tensortap.pytorch._tensors import host_numpy, iter_tensors

logger = logging.getLogger("tensortap")

_is_compiling = torch.compiler.is_compiling
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_FOREACH_MAX = getattr(torch, "_foreach_max", None)
_NO_GRAD_MODES = (_modes.EVAL, _modes.PREDICT)  # modes whose steps have no gradients (TRAIN and GLOBAL have)
_NO_GRAD_MODE_VALUES = tuple(m.value for m in _NO_GRAD_MODES)


def _no_graph_task() -> int:
    return -1


_graph_task_id = getattr(torch._C, "_current_graph_task_id", _no_graph_task)


def _usable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout is torch.strided and not t.is_meta
            and (t.dtype.is_floating_point or t.dtype.is_complex) and not _dtensor.is_dtensor(t)
            and not getattr(t, "is_nested", False))


class TorchFlight:
    """The flight recorder of one PyTorch hook."""

    def __init__(self, hook: Any, config: FlightConfig):
        self.hook = hook
        self.rec = FlightRecorder(config, hook, self._raw_now)
        self.full = config.statistics == "full"
        self.modules: list[str] = []  # forward-hook index: the module's name (a root by its class name)
        self.roots: set[int] = set()  # indices of registered roots (their forward ends a model call)
        self.losses: set[int] = set()  # indices of registered loss modules
        self.params: list[tuple[str, nn.Parameter]] = []
        self.handles: list[Any] = []
        # the pending step: (module index, inputs, output) of each call, in the order they ended
        self.calls: list[tuple[int, Any, Any]] = []
        self.step_id: tuple[int, int, int] | None = None
        self.wait_optimizer = False  # the pending step ends at the optimizer's step (TRAIN, optimizer known)
        self.finish_next = False  # the pending step ends when the next step's forward begins
        self.layouts: dict[tuple, Layout] = {}
        self.warned_unseen = False
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.handles.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook))

    # --- registration -----------------------------------------------------------------------

    def add_root(self, root_name: str, module: nn.Module, inner: nn.Module, compiled: bool) -> None:
        """Watch a registered model: every module's outputs (where they are not compiled) and every parameter."""
        try:
            self.params.extend((f"{root_name}_{n}", p) for n, p in inner.named_parameters())
            if compiled:
                logger.warning("tensortap flight recorder: %s is compiled: the outputs of the modules inside it are "
                               "not seen (weights and gradients are)", root_name)
                targets = [(root_name, module)] if module is not inner else []
                self.warned_unseen = True
            else:
                targets = [(n if n else root_name, m) for n, m in inner.named_modules()]
            for name, m in targets:
                idx = len(self.modules)
                self.modules.append(name)
                if m is inner or m is module:
                    self.roots.add(idx)
                self.handles.append(m.register_forward_hook(functools.partial(self._forward_hook, idx)))
        except Exception as e:  # noqa: BLE001
            self.rec.fail("registering a module", e)

    def add_loss(self, name: str, module: nn.Module) -> None:
        idx = len(self.modules)
        self.modules.append(name)
        self.losses.add(idx)
        self.handles.append(module.register_forward_hook(functools.partial(self._forward_hook, idx)))

    # --- per call ---------------------------------------------------------------------------

    def _forward_hook(self, idx: int, module: nn.Module, inputs: Any, output: Any) -> None:
        if _is_compiling() or self.rec.off or _graph_task_id() != -1:
            return  # (traced by torch.compile / recomputed by activation checkpointing: not captured there)
        try:
            if self.finish_next and idx not in self.losses:
                self.finish(False)  # a new step's forward: the last one (EVAL, or no optimizer) is complete
            self.calls.append((idx, inputs, output))
            if idx in self.roots and self.step_id is None:
                hook = self.hook
                self.step_id = hook.step_id()
                self.wait_optimizer = hook.mode not in _NO_GRAD_MODES and bool(hook._opts)
                self.finish_next = not self.wait_optimizer
        except Exception as e:  # noqa: BLE001
            self.rec.fail("forward hook", e)

    def _optimizer_pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        hook = self.hook
        if self.rec.off or hook.disabled or hook._closed or not self.params:
            return
        try:
            if not hook._ours(optimizer) or hook.mode in _NO_GRAD_MODES:
                return
            self.finish(True)
        except Exception as e:  # noqa: BLE001
            self.rec.fail("optimizer step", e)

    def close(self) -> None:
        try:
            if not self.rec.off and (self.calls or self.step_id is not None):
                self.finish(False)
            self.rec.on_close()
        except Exception as e:  # noqa: BLE001
            self.rec.fail("close", e)
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.calls = []

    # --- a step's statistics ----------------------------------------------------------------

    def finish(self, grads: bool) -> None:
        """Compute the pending step's statistics (with the gradients, at the optimizer's step), keep them in the
        ring, and look for what went wrong."""
        calls, self.calls = self.calls, []
        step_id = self.step_id if self.step_id is not None else self.hook.step_id()
        self.step_id = None
        self.finish_next = self.wait_optimizer = False
        if not calls and grads and not self.warned_unseen and self.modules:
            self.warned_unseen = True
            logger.warning("tensortap flight recorder: no module output was seen in step %d (the model runs "
                           "compiled?): weights and gradients are recorded, module outputs are not", step_id[0])
        names: list[str] = []
        tensors: list[torch.Tensor] = []
        out_calls: list[int] = []  # per output tensor: its position in `calls`
        counts: dict[int, int] = {}
        modules = self.modules
        for c, (idx, _inputs, out) in enumerate(calls):
            outs = (out,) if type(out) is torch.Tensor else list(iter_tensors(out))
            k = counts.get(idx, 0)
            counts[idx] = k + 1
            base = modules[idx] + "_output_"
            n = len(outs)
            for i, t in enumerate(outs):
                if _usable(t):
                    names.append(f"{base}{k * n + i}")
                    tensors.append(t.detach())
                    out_calls.append(c)
        n_out = len(tensors)
        for name, p in self.params:
            if _usable(p):
                names.append(name)
                tensors.append(p.detach())
        n_w = len(tensors) - n_out
        if grads:
            for name, p in self.params:
                g = p.grad
                if g is not None and _usable(g):
                    names.append("gradient/" + name)
                    tensors.append(g)
        if not tensors:
            return
        values = self._statistics(tensors)
        key = (tuple(names), tuple(t.shape for t in tensors))
        layout = self.layouts.get(key)
        if layout is None:
            if len(self.layouts) > 256:
                self.layouts.clear()
            layout = self.layouts[key] = Layout(key[0], tuple(tuple(s) for s in key[1]),
                                                tuple(_F32 if t.dtype is torch.float32 else _F64 for t in tensors))
        rec = self.rec
        rec.record(step_id, layout, values)
        bad = values[:, 1] > 0

        def raw() -> list[tuple[str, np.ndarray]]:
            return [(n, host_numpy(t.detach().cpu())) for n, t in zip(names, tensors, strict=True)]

        if bad.any():
            rec.nonfinite(step_id, self._provenance(calls, names, tensors, values, n_out, n_w, out_calls), raw)
        else:
            rec.nonfinite(step_id, None)
        if step_id[1] not in _NO_GRAD_MODE_VALUES:
            loss = loss_name = None
            for i in range(n_out):
                c = out_calls[i]
                idx = calls[c][0]
                if (idx in self.losses or (not self.losses and idx in self.roots)) and tensors[i].numel() == 1:
                    loss, loss_name = float(values[i, 0]), names[i]  # (|loss|: its l2)
            gnorm = None
            if grads and len(tensors) > n_out + n_w:
                gnorm = float(np.sqrt(np.sum(np.square(values[n_out + n_w:, 0]))))
            rec.observe(step_id, loss, gnorm, raw, loss_name)
        rec.poll(step_id)

    def _statistics(self, tensors: list[torch.Tensor]) -> np.ndarray:
        """values[i] = (l2, non-finite count[, l1, max|x|]) of each tensor, computed where it lives, in one pass per
        statistic over all of them, one transfer to the host (the exact non-finite counts only where l2 is not
        finite)."""
        low = [i for i, t in enumerate(tensors) if t.dtype in _LOW_PRECISION]
        if low:
            rest = [i for i, t in enumerate(tensors) if t.dtype not in _LOW_PRECISION]
            order = rest + low
            norms = list(torch._foreach_norm([tensors[i] for i in rest], 2)) if rest else []
            norms += torch._foreach_norm([tensors[i] for i in low], 2, dtype=torch.float32)
            by_pos: list[Any] = [None] * len(tensors)
            for pos, v in zip(order, norms, strict=True):
                by_pos[pos] = v
            norms = by_pos
        else:
            norms = torch._foreach_norm(tensors, 2)
        parts = [torch.stack([v.to(torch.float64) for v in norms]) if len({v.dtype for v in norms}) > 1
                 else torch.stack(list(norms))]
        if self.full:
            a = torch._foreach_abs(tensors)
            parts.append(torch.stack([x.sum().to(parts[0].dtype) for x in a]))
            mx = _FOREACH_MAX(a) if _FOREACH_MAX is not None else [x.max() if x.numel() else x.sum() for x in a]
            parts.append(torch.stack([x.to(parts[0].dtype) for x in mx]))
        host = torch.stack([p.to(parts[0].dtype) for p in parts]).cpu().numpy().astype(np.float64, copy=False)
        n = len(tensors)
        k = 4 if self.full else 2
        values = np.zeros((n, k), dtype=np.float64)
        values[:, 0] = host[0]
        if self.full:
            values[:, 2] = host[1]
            values[:, 3] = host[2]
        bad = np.flatnonzero(~np.isfinite(values[:, 0]))
        for i in bad.tolist():  # (rare: a non-finite value, or a sum of squares past the dtype's range)
            t = tensors[i]
            nf = int((~torch.isfinite(t)).sum())
            values[i, 1] = nf
            if nf == 0:
                values[i, 0] = float(torch.linalg.vector_norm(t.double()))
        return values

    def _provenance(self, calls: list, names: list[str], tensors: list[torch.Tensor], values: np.ndarray,
                    n_out: int, n_w: int, out_calls: list[int]) -> dict[str, Any]:
        """Where the step's first non-finite value appeared (docs/format.md §11)."""
        bad = values[:, 1] > 0
        inputs: list[dict[str, Any]] = []
        module = parameter = None
        first = next((i for i in range(n_out) if bad[i]), None)
        if first is not None:
            idx, ins, _out = calls[out_calls[first]]
            module = self.modules[idx]
            phase = "loss" if idx in self.losses else "forward"
            for j, t in enumerate(t for t in iter_tensors(ins) if _usable(t)):
                inputs.append(_input_stats(f"{module}_input_{j}", t))
        else:
            n = len(tensors)
            first = next((i for i in range(n - 1, n_out + n_w - 1, -1) if bad[i]), None)  # backward order
            if first is not None:
                phase = "backward"
                parameter = names[first][len("gradient/"):]
            else:
                first = next(i for i in range(n_out, n_out + n_w) if bad[i])
                phase = "weights"
                parameter = names[first]
        t = tensors[first]
        if t.is_complex():
            t = torch.view_as_real(t)
        return {"phase": phase, "module": module, "parameter": parameter, "tensor": names[first],
                "nan": int(torch.isnan(t).sum()), "posinf": int(torch.isposinf(t).sum()),
                "neginf": int(torch.isneginf(t).sum()), "inputs": inputs}

    def _raw_now(self) -> list[tuple[str, np.ndarray]]:
        """The raw tensors of the step in progress (for an incident that is not about one step's values): the
        outputs seen so far, the weights, the gradients there are."""
        out: list[tuple[str, np.ndarray]] = []
        counts: dict[int, int] = {}
        for idx, _inputs, o in self.calls:
            outs = (o,) if type(o) is torch.Tensor else list(iter_tensors(o))
            k = counts.get(idx, 0)
            counts[idx] = k + 1
            out.extend((f"{self.modules[idx]}_output_{k * len(outs) + i}", host_numpy(t.detach().cpu()))
                       for i, t in enumerate(outs) if _usable(t))
        for name, p in self.params:
            if _usable(p):
                out.append((name, host_numpy(p.detach().cpu())))
        for name, p in self.params:
            if p.grad is not None and _usable(p.grad):
                out.append(("gradient/" + name, host_numpy(p.grad.detach().cpu())))
        return out


def _input_stats(name: str, t: torch.Tensor) -> dict[str, Any]:
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    x = x.double()
    finite = torch.isfinite(x)
    count = x.numel()
    nonfinite = int(count - int(finite.sum()))
    f = x[finite]
    l2 = float(torch.linalg.vector_norm(f)) if f.numel() else 0.0
    max_abs = float(f.abs().max()) if f.numel() else 0.0
    mean_abs = float(f.abs().mean()) if f.numel() else 0.0
    return {"name": name, "count": count, "nonfinite": nonfinite, "l2": l2, "max_abs": max_abs,
            "mean_abs": mean_abs if math.isfinite(mean_abs) else 0.0}
