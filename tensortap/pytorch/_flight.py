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
_Tensor = torch.Tensor
_STRIDED = torch.strided
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


class _StepPlan:
    """The names and roles of a step's tensors (outputs, then weights, then gradients), for steps alike."""

    __slots__ = ("names", "dtypes", "n_out", "n_weights", "n_grads", "out_calls", "loss", "layouts", "low_precision")

    def __init__(self, names: tuple[str, ...], dtypes: tuple[np.dtype, ...], n_out: int, n_weights: int,
                 n_grads: int, out_calls: list[int], loss: int | None):
        self.names, self.dtypes, self.n_out, self.n_weights, self.n_grads = names, dtypes, n_out, n_weights, n_grads
        self.out_calls, self.loss = out_calls, loss
        self.layouts: dict[tuple, Layout] = {}  # by the tensors' shapes
        self.low_precision = False  # some tensor is float16 / bfloat16


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
        self.weights: list[nn.Parameter] = []  # the parameters recorded (dense, floating point), in order
        self.weight_names: list[str] = []
        self.plans: dict[tuple, _StepPlan] = {}
        self.handles: list[Any] = []
        # the pending step: (module index, inputs, output) of each call, in the order they ended
        self.calls: list[tuple[int, Any, Any]] = []
        self.step_id: tuple[int, int, int] | None = None
        self.wait_optimizer = False  # the pending step ends at the optimizer's step (TRAIN, optimizer known)
        self.finish_next = False  # the pending step ends when the next step's forward begins
        self.mark = 0  # the pending calls up to the last model or loss call that ended
        self.warned_unseen = False
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.handles.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook))

    # --- registration -----------------------------------------------------------------------

    def add_root(self, root_name: str, module: nn.Module, inner: nn.Module, compiled: bool) -> None:
        """Watch a registered model: every module's outputs (where they are not compiled) and every parameter."""
        try:
            self.params.extend((f"{root_name}_{n}", p) for n, p in inner.named_parameters())
            self.weight_names = [n for n, p in self.params if _usable(p)]
            self.weights = [p for _n, p in self.params if _usable(p)]
            self.plans.clear()
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
            if idx in self.roots:
                hook = self.hook
                sid = hook.step_id()
                if self.step_id is not None and sid != self.step_id:
                    # the hook began a step with no optimizer step since the pending one (a step the GradScaler
                    # skipped, a mode change): the pending step ends with the calls before this forward
                    pending, self.calls = self.calls[self.mark:], self.calls[:self.mark]
                    self.finish(False)
                    self.calls = pending
                if self.step_id is None:
                    self.step_id = sid
                    self.wait_optimizer = hook.mode not in _NO_GRAD_MODES and bool(hook._opts)
                    self.finish_next = not self.wait_optimizer
                self.mark = len(self.calls)
            elif idx in self.losses:
                self.mark = len(self.calls)
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
        self.mark = 0
        step_id = self.step_id if self.step_id is not None else self.hook.step_id()
        self.step_id = None
        self.finish_next = self.wait_optimizer = False
        if not calls and grads and not self.warned_unseen and self.modules:
            self.warned_unseen = True
            logger.warning("tensortap flight recorder: no module output was seen in step %d (the model runs "
                           "compiled?): weights and gradients are recorded, module outputs are not", step_id[0])
        # the step's tensors: outputs in the order their calls ended, the weights, the gradients there are
        tensors: list[torch.Tensor] = []
        sig: list[Any] = []
        for idx, _inputs, out in calls:
            if type(out) is _Tensor:
                tensors.append(out)
                sig.append(idx)
            else:
                outs = list(iter_tensors(out))
                tensors.extend(outs)
                sig.append((idx, len(outs)))
        n_out = len(tensors)
        keep = None
        for t in tensors:  # (cheap tests; an integer output is left out)
            if t.layout is not _STRIDED or not (t.dtype.is_floating_point or t.dtype.is_complex):
                keep = [j for j, u in enumerate(tensors) if _usable(u)]
                break
        params = self.weights  # (checked when registered)
        tensors.extend(params)
        gmask: Any = False
        gl: list[Any] = []
        if grads:
            gl = [p.grad for p in params]
            gmask = True
            for g in gl:
                if g is None or g.layout is not _STRIDED:  # (a sparse gradient is left out)
                    gmask = tuple(g is not None and g.layout is _STRIDED for g in gl)
                    break
            tensors.extend(g for g in gl if g is not None and g.layout is _STRIDED)
        if keep is not None:
            keep.extend(range(n_out, len(tensors)))
        key = (tuple(sig), gmask, keep is None or tuple(keep), tuple(t.dtype for t in tensors[:n_out]))
        plan = self.plans.get(key)
        if plan is None:
            plan = self._plan(key, calls, tensors, n_out, gl if grads else None, keep)
        if keep is not None:
            tensors = [tensors[j] for j in keep]
        if not tensors:
            return
        values = self._statistics(tensors, plan)
        shapes = tuple(t.shape for t in tensors)
        layout = plan.layouts.get(shapes)
        if layout is None:
            if len(plan.layouts) > 64:
                plan.layouts.clear()
            layout = plan.layouts[shapes] = Layout(plan.names, tuple(tuple(s) for s in shapes), plan.dtypes)
        rec = self.rec
        rec.record(step_id, layout, values)
        names = plan.names

        def raw() -> list[tuple[str, np.ndarray]]:
            return [(n, host_numpy(t.detach().cpu())) for n, t in zip(names, tensors, strict=True)]

        if values[:, 1].any():
            rec.nonfinite(step_id, self._provenance(calls, plan, tensors, values), raw)
        else:
            rec.nonfinite(step_id, None)
        if step_id[1] not in _NO_GRAD_MODE_VALUES:
            loss = float(values[plan.loss, 0]) if plan.loss is not None else None  # (|loss|: its l2)
            gnorm = None
            if plan.n_grads:
                g = values[-plan.n_grads:, 0]
                gnorm = float(np.sqrt(np.dot(g, g)))
            rec.observe(step_id, loss, gnorm, raw, names[plan.loss] if plan.loss is not None else None)
        rec.poll(step_id)

    def _plan(self, key: tuple, calls: list, tensors: list[torch.Tensor], n_out: int, grads: list | None,
              keep: list[int] | None) -> _StepPlan:
        """Names and roles of the tensors of steps whose calls and gradients look like this one's."""
        names: list[str] = []
        out_calls: list[int] = []  # per output: its call's position in `calls`
        counts: dict[int, int] = {}
        for c, (idx, _inputs, out) in enumerate(calls):
            n = 1 if type(out) is _Tensor else sum(1 for _ in iter_tensors(out))
            k = counts.get(idx, 0)
            counts[idx] = k + 1
            base = self.modules[idx] + "_output_"
            for i in range(n):
                names.append(f"{base}{k * n + i}")
                out_calls.append(c)
        names.extend(self.weight_names)
        n_grads = 0
        if grads is not None:
            for name, g in zip(self.weight_names, grads, strict=True):
                if g is not None and g.layout is _STRIDED:
                    names.append("gradient/" + name)
                    n_grads += 1
        roles = ["output"] * n_out + ["weight"] * len(self.weight_names) + ["gradient"] * n_grads
        if keep is not None:
            names = [names[j] for j in keep]
            roles = [roles[j] for j in keep]
            out_calls = [out_calls[j] for j in keep if j < n_out]
            n_grads = roles.count("gradient")
        kept = [tensors[j] for j in keep] if keep is not None else tensors
        n_out = roles.count("output")
        loss = None
        for i in range(n_out):
            idx = calls[out_calls[i]][0]
            if (idx in self.losses or (not self.losses and idx in self.roots)) and kept[i].numel() == 1:
                loss = i  # (the last loss of the step)
        plan = _StepPlan(tuple(names), tuple(_F32 if t.dtype is torch.float32 else _F64 for t in kept),
                         n_out, len(names) - n_out - n_grads, n_grads, out_calls, loss)
        plan.low_precision = any(t.dtype in _LOW_PRECISION for t in kept)
        if len(self.plans) > 256:
            self.plans.clear()
        self.plans[key] = plan
        return plan

    def _statistics(self, tensors: list[torch.Tensor], plan: _StepPlan) -> np.ndarray:
        """values[i] = (l2, non-finite count[, l1, max|x|]) of each tensor, computed where it lives, in one pass per
        statistic over all of them, one transfer to the host (the exact non-finite counts only where l2 is not
        finite)."""
        with torch.no_grad():
            if plan.low_precision:  # (norms of float16/bfloat16 tensors in float32: no overflow at 65504)
                norms = [torch.linalg.vector_norm(t, dtype=torch.float32) if t.dtype in _LOW_PRECISION
                         else torch.linalg.vector_norm(t) for t in tensors]
            else:
                norms = torch._foreach_norm(tensors, 2)
            d0 = norms[0].dtype
            for v in norms:
                if v.dtype is not d0:
                    norms = [v.double() for v in norms]
                    break
            stacked = torch.stack(norms)
            n = len(tensors)
            if self.full:
                a = torch._foreach_abs(tensors)
                mx = _FOREACH_MAX(a) if _FOREACH_MAX is not None else [x.max() if x.numel() else x.sum() for x in a]
                stacked = torch.cat([stacked, torch.stack([x.sum().to(stacked.dtype) for x in a]),
                                     torch.stack([x.to(stacked.dtype) for x in mx])])
            host = stacked.numpy() if stacked.is_cpu else stacked.cpu().numpy()  # (the one transfer)
            values = np.zeros((n, 4 if self.full else 2), dtype=np.float64)
            values[:, 0] = host[:n]
            if self.full:
                values[:, 2] = host[n:2 * n]
                values[:, 3] = host[2 * n:]
            if not np.isfinite(host[:n]).all():
                for i in np.flatnonzero(~np.isfinite(values[:, 0])).tolist():
                    # (rare: a non-finite value, or a sum of squares past the dtype's range)
                    t = tensors[i]
                    nf = int((~torch.isfinite(t)).sum())
                    values[i, 1] = nf
                    if nf == 0:
                        values[i, 0] = float(torch.linalg.vector_norm(t.double()))
        return values

    def _provenance(self, calls: list, plan: _StepPlan, tensors: list[torch.Tensor], values: np.ndarray
                    ) -> dict[str, Any]:
        """Where the step's first non-finite value appeared (docs/format.md §11)."""
        bad = values[:, 1] > 0
        names = plan.names
        n_out, n_w = plan.n_out, plan.n_weights
        inputs: list[dict[str, Any]] = []
        module = parameter = None
        first = next((i for i in range(n_out) if bad[i]), None)
        if first is not None:
            idx, ins, _out = calls[plan.out_calls[first]]
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
        t = tensors[first].detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        return {"phase": phase, "module": module, "parameter": parameter, "tensor": names[first],
                "nan": int(torch.isnan(t).sum()), "posinf": int(torch.isposinf(t).sum()),
                "neginf": int(torch.isneginf(t).sum()), "inputs": inputs}

    def _raw_now(self) -> list[tuple[str, np.ndarray]]:
        """The raw tensors of the step in progress (for an incident that is not about one step's values): the
        outputs seen so far, the weights, and in a TRAIN step the gradients there are."""
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
        if self.hook.mode not in _NO_GRAD_MODES:  # (an EVAL step has no gradients of its own)
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
