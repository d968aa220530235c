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


class _Call:
    """One call of a watched module in the pending step: which of its outputs are recorded (`slots`), their norms
    (floats measured on the CPU; 0-d tensors on an accelerator, `held` with their outputs and `inputs`), the
    non-finite counts of CPU outputs, and `bad`: the first non-finite CPU output's incident detail."""

    __slots__ = ("idx", "n", "slots", "norms", "nonfinite", "held", "inputs", "bad", "shapes", "dtypes", "numels",
                 "sig")

    def __init__(self, idx: int, n: int):
        self.idx, self.n = idx, n
        self.slots: list[int] = []
        self.norms: list[Any] = []  # per slot: (l2[, l1, max|x|]) floats, or a tensor of them (accelerator)
        self.nonfinite: list[int] = []  # per slot; -1: not known yet (accelerator)
        self.held: list[torch.Tensor] = []
        self.inputs: Any = None
        self.bad: dict[str, Any] | None = None
        self.shapes: tuple = ()
        self.dtypes: list[np.dtype] = []
        self.numels: list[int] = []
        self.sig: tuple = ()


class TorchFlight:
    """The flight recorder of one PyTorch hook."""

    def __init__(self, hook: Any, config: FlightConfig):
        self.hook = hook
        self.rec = FlightRecorder(config, hook, self._raw_now, self._flush)
        self.full = config.statistics == "full"
        self.modules: list[str] = []  # forward-hook index: the module's name (a root by its class name)
        self.roots: set[int] = set()  # indices of registered roots (their forward ends a model call)
        self.losses: set[int] = set()  # indices of registered loss modules
        self.params: list[tuple[str, nn.Parameter]] = []
        self.weights: list[nn.Parameter] = []  # the parameters recorded (dense, floating point), in order
        self.weight_names: list[str] = []
        self.plans: dict[tuple, _StepPlan] = {}
        self.own_params: dict[int, list[str]] = {}  # module index: the names of its own (direct) parameters
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
                targets = [("", module)] if module is not inner else []
                self.warned_unseen = True
            else:
                targets = list(inner.named_modules())
            which = self.rec.config.outputs
            for n, m in targets:
                is_root = m is inner or m is module
                if not is_root and (which == "none" or (
                        which == "parameterized" and next(m.parameters(recurse=False), None) is None)):
                    continue
                idx = len(self.modules)
                self.modules.append(n if n else root_name)
                self.own_params[idx] = [f"{root_name}_{n + '.' if n else ''}{pn}"
                                        for pn, _p in m.named_parameters(recurse=False)]
                if is_root:
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
            self.calls.append(self._measure(idx, inputs, output))
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

    def _measure(self, idx: int, inputs: Any, output: Any) -> _Call:
        """One call's outputs: on the CPU their statistics now, while they are in the cache (no reference is kept:
        the memory of an output autograd does not keep is freed as without the recorder), and where one is not
        finite what the incident needs (its counts, its module's inputs, its value); on an accelerator statistics
        launched now, the output kept until the step's one transfer."""
        outs = (output,) if type(output) is _Tensor else tuple(iter_tensors(output))
        call = _Call(idx, len(outs))
        full = self.full
        shapes = []
        with torch.no_grad():
            for i, t in enumerate(outs):
                if t.layout is not _STRIDED or not (t.dtype.is_floating_point or t.dtype.is_complex) or \
                        not _usable(t):
                    continue
                call.slots.append(i)
                shapes.append(t.shape)
                call.dtypes.append(_F32 if t.dtype is torch.float32 else _F64)
                call.numels.append(t.numel())
                v = torch.linalg.vector_norm(t, dtype=torch.float32) if t.dtype in _LOW_PRECISION else \
                    torch.linalg.vector_norm(t)
                if full:
                    a = t.abs()
                    stats = [v, a.sum(), a.max() if t.numel() else a.sum()]
                if not t.is_cpu:
                    call.norms.append(torch.stack([x.to(torch.float64) for x in stats]) if full else v)
                    call.nonfinite.append(-1)
                    call.held.append(t)
                    call.inputs = inputs
                    continue
                x = v.item()
                nf = 0
                if not math.isfinite(x):
                    nf = int((~torch.isfinite(t)).sum())
                    if nf == 0:  # (a sum of squares past the dtype's range)
                        x = float(torch.linalg.vector_norm(t.double()))
                    elif call.bad is None:
                        call.bad = _bad_output(self.modules[idx], i, inputs, t)
                call.norms.append((x, float(stats[1]), float(stats[2])) if full else (x,))
                call.nonfinite.append(nf)
        call.shapes = tuple(shapes)
        call.sig = (idx, call.n, tuple(call.slots), tuple(call.dtypes))
        return call

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

    def _flush(self) -> None:
        if not self.rec.off and (self.calls or self.step_id is not None):
            self.finish(False)

    def close(self) -> None:
        try:
            self._flush()
            self.rec.on_close()
        except Exception as e:  # noqa: BLE001
            self.rec.fail("close", e)
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.calls = []

    # --- a step's statistics ----------------------------------------------------------------

    def finish(self, grads: bool) -> None:
        """Record the pending step: its outputs' statistics (measured per call), the weights' and (at the optimizer's
        step) the gradients' in one batched pass; keep them in the ring, and look for what went wrong."""
        calls, self.calls = self.calls, []
        self.mark = 0
        step_id = self.step_id if self.step_id is not None else self.hook.step_id()
        self.step_id = None
        self.finish_next = self.wait_optimizer = False
        if not calls and grads and not self.warned_unseen and self.modules:
            self.warned_unseen = True
            logger.warning("tensortap flight recorder: no module output was seen in step %d (the model runs "
                           "compiled?): weights and gradients are recorded, module outputs are not", step_id[0])
        k = 4 if self.full else 2
        sig: list[Any] = []
        out_stats: list[Any] = []  # per recorded output: a tuple of floats (CPU) or a tensor (accelerator)
        out_nf: list[int] = []  # its non-finite count (-1: not known yet)
        held: list[tuple[int, torch.Tensor]] = []  # (position, output) of the accelerator outputs
        for c in calls:
            sig.append(c.sig)
            if c.held:
                j = 0
                for v, nf in zip(c.norms, c.nonfinite, strict=True):
                    if nf < 0:
                        held.append((len(out_stats), c.held[j]))
                        j += 1
                    out_stats.append(v)
                    out_nf.append(nf)
            else:
                out_stats.extend(c.norms)
                out_nf.extend(c.nonfinite)
        n_out = len(out_stats)
        tensors: list[torch.Tensor] = list(self.weights)  # (checked when registered)
        gmask: Any = False
        gl: list[Any] = []
        if grads:
            gl = [p.grad for p in self.weights]
            gmask = True
            for g in gl:
                if g is None or g.layout is not _STRIDED:  # (a sparse gradient is left out)
                    gmask = tuple(g is not None and g.layout is _STRIDED for g in gl)
                    break
            tensors.extend(g for g in gl if g is not None and g.layout is _STRIDED)
        key = (tuple(sig), gmask)
        plan = self.plans.get(key)
        if plan is None:
            plan = self._plan(key, calls, tensors, n_out, gl if grads else None)
        if n_out + len(tensors) == 0:
            return
        values = np.zeros((n_out + len(tensors), k), dtype=np.float64)
        dev = [out_stats[i] for i, _t in held]
        host = self._statistics(tensors, plan, dev)
        if n_out:
            for (i, _t), row in zip(held, host[len(tensors):], strict=True):
                out_stats[i] = (row[0],) if k == 2 else (row[0], row[2], row[3])
            if k == 2:
                values[:n_out, :1] = out_stats
            else:
                values[:n_out, 0] = [st[0] for st in out_stats]
                values[:n_out, 2] = [st[1] for st in out_stats]
                values[:n_out, 3] = [st[2] for st in out_stats]
            values[:n_out, 1] = out_nf
            for i, t in held:
                if not math.isfinite(values[i, 0]):
                    values[i, 1] = nf = int((~torch.isfinite(t)).sum())
                    if nf == 0:
                        values[i, 0] = float(torch.linalg.vector_norm(t.double()))
                else:
                    values[i, 1] = 0
        values[n_out:] = host[:len(tensors)]
        shapes = tuple([c.shapes for c in calls])
        layout = plan.layouts.get(shapes)
        if layout is None:
            if len(plan.layouts) > 64:
                plan.layouts.clear()
            out_shapes = [sh for c in calls for sh in c.shapes]
            layout = plan.layouts[shapes] = Layout(plan.names, tuple(out_shapes) + tuple(tuple(t.shape)
                                                                                          for t in tensors),
                                                   plan.dtypes)
        rec = self.rec
        rec.record(step_id, layout, values)
        names = plan.names
        bad_value = None
        if values[:, 1].any():
            detail, bad_value = self._provenance(calls, plan, tensors, values, held)
        else:
            detail = None

        def raw() -> list[tuple[str, np.ndarray]]:
            items = [(n, host_numpy(t.detach().cpu())) for n, t in zip(names[n_out:], tensors, strict=True)]
            items += [(names[i], host_numpy(t.detach().cpu())) for i, t in held]
            if bad_value is not None:
                items.append(bad_value)
            return items

        rec.nonfinite(step_id, detail, raw)
        if step_id[1] not in _NO_GRAD_MODE_VALUES:
            loss = float(values[plan.loss, 0]) if plan.loss is not None else None  # (|loss|: its l2)
            gnorm = None
            if plan.n_grads:
                g = values[-plan.n_grads:, 0]
                gnorm = float(np.sqrt(np.dot(g, g)))
            rec.observe(step_id, loss, gnorm, raw, names[plan.loss] if plan.loss is not None else None)
        rec.poll(step_id)

    def _plan(self, key: tuple, calls: list[_Call], tensors: list[torch.Tensor], n_out: int,
              grads: list | None) -> _StepPlan:
        """Names and roles of the tensors of steps whose calls and gradients look like this one's."""
        names: list[str] = []
        out_calls: list[int] = []  # per output: its call's position in `calls`
        counts: dict[int, int] = {}
        dtypes: list[np.dtype] = []
        for c_pos, c in enumerate(calls):
            k = counts.get(c.idx, 0)
            counts[c.idx] = k + 1
            base = self.modules[c.idx] + "_output_"
            for i in c.slots:
                names.append(f"{base}{k * c.n + i}")
                out_calls.append(c_pos)
            dtypes.extend(c.dtypes)
        names.extend(self.weight_names)
        n_grads = 0
        if grads is not None:
            for name, g in zip(self.weight_names, grads, strict=True):
                if g is not None and g.layout is _STRIDED:
                    names.append("gradient/" + name)
                    n_grads += 1
        dtypes.extend(_F32 if t.dtype is torch.float32 else _F64 for t in tensors)
        loss = None
        i = 0
        for c in calls:
            for numel in c.numels:
                if (c.idx in self.losses or (not self.losses and c.idx in self.roots)) and numel == 1:
                    loss = i  # (the last loss of the step)
                i += 1
        plan = _StepPlan(tuple(names), tuple(dtypes), n_out, len(self.weight_names), n_grads, out_calls, loss)
        plan.low_precision = any(t.dtype in _LOW_PRECISION for t in tensors)
        if len(self.plans) > 256:
            self.plans.clear()
        self.plans[key] = plan
        return plan

    def _statistics(self, tensors: list[torch.Tensor], plan: _StepPlan, dev: list[torch.Tensor]) -> np.ndarray:
        """Rows (l2, non-finite count[, l1, max|x|]) of each of `tensors` (the weights and gradients), computed where
        they live in one pass per statistic over all of them, then one row per accelerator output's statistics
        tensor in `dev`, all brought to the host in one transfer (the exact non-finite counts only where l2 is not
        finite)."""
        k = 4 if self.full else 2
        n = len(tensors)
        out = np.zeros((n + len(dev), k), dtype=np.float64)
        if not n and not dev:
            return out
        with torch.no_grad():
            parts = []
            if n:
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
                cols = [torch.stack(norms)]
                if self.full:
                    a = torch._foreach_abs(tensors)
                    mx = _FOREACH_MAX(a) if _FOREACH_MAX is not None else [x.max() if x.numel() else x.sum()
                                                                             for x in a]
                    cols.append(torch.stack([x.sum().to(cols[0].dtype) for x in a]))
                    cols.append(torch.stack([x.to(cols[0].dtype) for x in mx]))
                parts.append(torch.stack(cols, 1) if self.full else cols[0].reshape(-1, 1))
            if dev:
                parts.append(torch.stack([d.reshape(-1).to(torch.float64) for d in dev]))
            if len(parts) > 1 and parts[0].device != parts[1].device:
                parts = [p.cpu() for p in parts]
            if len(parts) > 1:
                parts = [p.to(torch.float64) for p in parts]
            stacked = torch.cat(parts) if len(parts) > 1 else parts[0]
            host = stacked.numpy() if stacked.is_cpu else stacked.cpu().numpy()  # (the one transfer)
            out[:, 0] = host[:, 0]
            if self.full:
                out[:, 2:] = host[:, 1:]
            if not np.isfinite(host[:n, 0]).all():
                for i in np.flatnonzero(~np.isfinite(out[:n, 0])).tolist():
                    # (rare: a non-finite value, or a sum of squares past the dtype's range)
                    t = tensors[i]
                    nf = int((~torch.isfinite(t)).sum())
                    out[i, 1] = nf
                    if nf == 0:
                        out[i, 0] = float(torch.linalg.vector_norm(t.double()))
        return out

    def _provenance(self, calls: list[_Call], plan: _StepPlan, tensors: list[torch.Tensor], values: np.ndarray,
                    held: list[tuple[int, torch.Tensor]]) -> tuple[dict[str, Any], tuple[str, np.ndarray] | None]:
        """Where the step's first non-finite value appeared (docs/format.md §11), and (name, value) of the first
        non-finite CPU output (not held, kept when it was made)."""
        bad = values[:, 1] > 0
        names = plan.names
        n_out, n_w = plan.n_out, plan.n_weights
        first = next((i for i in range(n_out) if bad[i]), None)
        if first is not None:
            call = calls[plan.out_calls[first]]
            module = self.modules[call.idx]
            if call.bad is not None:  # (a CPU output: described when it was made)
                detail = {k: v for k, v in call.bad.items() if k != "value"}
            else:
                t = dict(held)[first]
                detail = {"tensor": names[first], **_counts(t),
                          "inputs": [_input_stats(f"{module}_input_{j}", x)
                                     for j, x in enumerate(x for x in iter_tensors(call.inputs) if _usable(x))]}
            detail.update(phase="loss" if call.idx in self.losses else "forward", module=module, parameter=None,
                          tensor=names[first])
            own = set(self.own_params.get(call.idx, ()))
            bad_own = next((i for i in range(n_out, n_out + n_w) if bad[i] and names[i] in own), None)
            if bad_own is not None:  # the module computed with a non-finite parameter of its own
                detail.update(phase="weights", parameter=names[bad_own], tensor=names[bad_own],
                              **_counts(tensors[bad_own - n_out]))
            return _ordered(detail), ((names[first], call.bad["value"]) if call.bad is not None else None)
        n = len(names)
        first = next((i for i in range(n - 1, n_out + n_w - 1, -1) if bad[i]), None)  # backward order
        if first is not None:
            phase, parameter = "backward", names[first][len("gradient/"):]
        else:
            first = next(i for i in range(n_out, n_out + n_w) if bad[i])
            phase, parameter = "weights", names[first]
        return _ordered({"phase": phase, "module": None, "parameter": parameter, "tensor": names[first],
                         **_counts(tensors[first - n_out]), "inputs": []}), None

    def _raw_now(self) -> list[tuple[str, np.ndarray]]:
        """The raw tensors of the step in progress (for an incident that is not about one step's values): the
        weights, in a TRAIN step the gradients there are, and the outputs held (accelerator outputs; CPU outputs
        are not kept)."""
        out: list[tuple[str, np.ndarray]] = []
        for name, p in self.params:
            if _usable(p):
                out.append((name, host_numpy(p.detach().cpu())))
        if self.hook.mode not in _NO_GRAD_MODES:  # (an EVAL step has no gradients of its own)
            for name, p in self.params:
                if p.grad is not None and _usable(p.grad):
                    out.append(("gradient/" + name, host_numpy(p.grad.detach().cpu())))
        counts: dict[int, int] = {}
        for c in self.calls:
            k = counts.get(c.idx, 0)
            counts[c.idx] = k + 1
            for i, t in zip([i for i, nf in zip(c.slots, c.nonfinite, strict=True) if nf < 0], c.held, strict=True):
                out.append((f"{self.modules[c.idx]}_output_{k * c.n + i}", host_numpy(t.detach().cpu())))
        return out


_KEYS = ("phase", "module", "parameter", "tensor", "nan", "posinf", "neginf", "inputs")


def _ordered(detail: dict[str, Any]) -> dict[str, Any]:
    return {k: detail[k] for k in _KEYS}


def _counts(t: torch.Tensor) -> dict[str, int]:
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    return {"nan": int(torch.isnan(x).sum()), "posinf": int(torch.isposinf(x).sum()),
            "neginf": int(torch.isneginf(x).sum())}


def _bad_output(module: str, i: int, inputs: Any, t: torch.Tensor) -> dict[str, Any]:
    """What an incident says of a non-finite CPU output, taken when it was made (its value kept for the dump)."""
    return {"tensor": None, **_counts(t), "value": host_numpy(t.detach().clone()),
            "inputs": [_input_stats(f"{module}_input_{j}", x)
                       for j, x in enumerate(x for x in iter_tensors(inputs) if _usable(x))]}


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
