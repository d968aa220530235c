"""The flight recorder of the PyTorch hook (docs/pytorch.md "The flight recorder"; the ring and its triggers are
`tensortap.capture.flight`).

Every step, whatever the save interval: each registered module's outputs (a forward hook per module that only
keeps a reference), then at the optimizer's step (its pre-hook: gradients as the optimizer consumes them, weights
as the forward used them) or, for EVAL/PREDICT steps and loops with no optimizer, when the next step's forward
begins, the statistics of all of them are computed where they live: on the CPU the norms in one pass of the C helper
(`tensortap.capture._moments.squares`) per output and one call for all weights and gradients, else in one batched
pass (`torch._foreach_norm`) brought to the host in one transfer. A step with a non-finite value names where it
first appeared: the first module in forward order whose output went non-finite, else the first parameter in backward
order (the reverse of registration) whose gradient did, else a parameter itself.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator
import sys
from array import array
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

try:  # Σx² and the non-finite count of CPU tensors in one pass (tensortap/capture/_moments.c), built at install
    from tensortap.capture._moments import squares as _c_squares
except ImportError:  # pragma: no cover - no compiler at install time: torch's norms
    _c_squares = None
#: element types `_c_squares` reads (its `kind`)
_SQUARE_KINDS = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
_DBL_MAX = sys.float_info.max
_chain = itertools.chain
_GRAD = operator.attrgetter("grad")
_DATA_PTR = torch.Tensor.data_ptr
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_PLAIN = frozenset({torch.Tensor, nn.Parameter})  # (tensor types read by address: no subclass, no None)


def _usable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.layout is torch.strided and not t.is_meta
            and t.dtype in _STORED and not _dtensor.is_dtensor(t)
            and not getattr(t, "is_nested", False))


#: the floating dtypes whose statistics are recorded, and the numpy dtype each one's are stored as
_STORED: dict[torch.dtype, np.dtype] = {torch.float32: _F32, torch.float64: _F64, torch.float16: _F64,
                                         torch.bfloat16: _F64, torch.complex64: _F64, torch.complex128: _F64}
#: a statistics row as computed, before the host finishes it: (l2,) or, with the full statistics,
#: (l2, Σ|x|, max|x|, count of non-zero elements, sqrt(Σx⁴)); its columns in the recorder's values (column 1 is
#: the non-finite count): (l2, nonfinite, l1, max|x|, zeros, l4)
_RAW_COLUMNS = {False: [0], True: [0, 2, 3, 4, 5]}
_SLOT0 = (0,)
_NF0 = (0,)
_vnorm = torch.linalg.vector_norm
_count_nonzero = torch.count_nonzero


def _stats_row(t: torch.Tensor, full: bool) -> torch.Tensor:
    """A tensor's statistics row (see `_RAW_COLUMNS`), float64, where it lives; float16/bfloat16 in float32."""
    x = t.float() if t.dtype in _LOW_PRECISION else t
    if not full:
        return _vnorm(x).to(torch.float64).reshape(1)
    if x.numel() == 0:
        return torch.zeros(5, dtype=torch.float64, device=x.device)
    a = x.abs()
    return torch.stack([_vnorm(a).double(), a.sum().double(), a.max().double(), _count_nonzero(x).double(),
                        _vnorm(a * a).double()])


def _usable_param(p: Any) -> bool:
    """A parameter (or gradient) recorded: a dense floating tensor, or a DTensor whose local shard is one (its
    statistics are the shard's, merged into the full tensor's at read time, docs/format.md §10)."""
    return _usable(_dtensor.local(p)) if _dtensor.is_dtensor(p) else _usable(p)


class _StepPlan:
    """The names and roles of a step's tensors (outputs, then weights, then gradients), for steps alike."""

    __slots__ = ("names", "dtypes", "n_out", "n_weights", "n_grads", "out_calls", "loss", "layouts", "batched",
                 "tensor_shapes", "kind")

    def __init__(self, names: tuple[str, ...], dtypes: tuple[np.dtype, ...], n_out: int, n_weights: int,
                 n_grads: int, out_calls: list[int], loss: int | None, batched: bool,
                 tensor_shapes: tuple[tuple[int, ...], ...], kind: int | None):
        self.names, self.dtypes, self.n_out, self.n_weights, self.n_grads = names, dtypes, n_out, n_weights, n_grads
        self.out_calls, self.loss = out_calls, loss
        self.layouts: dict[tuple, Layout] = {}  # by the outputs' shapes
        self.batched = batched  # the weights' and gradients' statistics in one foreach pass (one dtype, real, dense)
        self.tensor_shapes = tensor_shapes
        self.kind = kind  # the weights' and gradients' norms in one pass of `_c_squares` (CPU, one dtype it reads)


# One call of a watched module in the pending step, as a tuple:
#   (sig, rows, nonfinite, shapes, held, inputs, bad)
# sig: (module index, number of outputs, the recorded outputs' positions, their stored dtypes); rows: per recorded
# output its statistics row (a float (l2) or a list (full statistics) measured on the CPU, or a float64 tensor
# launched on an accelerator); nonfinite: per recorded output its non-finite count (-1: not known yet, accelerator);
# shapes: theirs; held: the accelerator outputs (kept until the step's one transfer), in order; inputs: the call's
# inputs (held with accelerator outputs); bad: the incident detail of its first non-finite CPU output, or None.
_SIG, _ROWS, _NF, _SHAPES, _HELD, _INPUTS, _BAD = range(7)


class TorchFlight:
    """The flight recorder of one PyTorch hook."""

    def __init__(self, hook: Any, config: FlightConfig):
        self.hook = hook
        self.rec = FlightRecorder(config, hook, self._raw_now, self._flush)
        self.full = config.statistics == "full"
        #: the dtypes whose norms `_c_squares` takes on the CPU (none with the full statistics: torch's passes)
        self.square_kinds = _SQUARE_KINDS if _c_squares is not None and not self.full else {}
        self.squares_out = array("d", (0.0, 0.0))  # (Σx², non-finite count) of one CPU output
        self.w_ptrs: list[int] | None = None  # the weights' addresses when `w_kind` was found
        self.w_kind: int | None = None  # the C helper's kind that reads every weight (None: not all of them)
        self.w_numels: list[int] = []
        self.modules: list[str] = []  # forward-hook index: the module's name (a root by its class name)
        self.roots: set[int] = set()  # indices of registered roots (their forward ends a model call)
        self.losses: set[int] = set()  # indices of registered loss modules
        self.params: list[tuple[str, nn.Parameter]] = []
        self.weights: list[nn.Parameter] = []  # the parameters recorded (dense, floating point), in order
        self.weight_names: list[str] = []
        self.sharded: list[int] = []  # positions in `weights` of DTensors (FSDP2): their local shards are measured
        self.plans: dict[tuple, _StepPlan] = {}
        self.own_params: dict[int, list[str]] = {}  # module index: the names of its own (direct) parameters
        self.handles: list[Any] = []
        self.calls: list[tuple] = []  # the pending step's calls, in the order they ended
        self.sig1: dict[tuple[int, torch.dtype], tuple] = {}  # (module index, dtype): sig of one tensor output
        self.step_id: tuple[int, int, int] | None = None
        self.wait_optimizer = False  # the pending step ends at the optimizer's step (TRAIN, optimizer known)
        self.finish_next = False  # the pending step ends when the next step's forward begins
        self.mark = 0  # the pending calls up to the last model or loss call that ended
        self.warned_unseen = False
        self.ended_at_optimizer = False  # the last step recorded ended at its optimizer's step
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.handles.append(register_optimizer_step_pre_hook(self._optimizer_pre_hook))

    # --- registration -----------------------------------------------------------------------

    def add_root(self, root_name: str, module: nn.Module, inner: nn.Module, compiled: bool) -> None:
        """Watch a registered model: every module's outputs (where they are not compiled) and every parameter."""
        try:
            self.params.extend((f"{root_name}_{n}", p) for n, p in inner.named_parameters())
            self.weight_names = [n for n, p in self.params if _usable_param(p)]
            self.weights = [p for _n, p in self.params if _usable_param(p)]
            self.sharded = [i for i, p in enumerate(self.weights) if _dtensor.is_dtensor(p)]
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
            call = None
            if type(output) is _Tensor and output.is_cpu and output.layout is _STRIDED and not output.is_nested:
                # (the common case, measured here without the general walk: one dense CPU tensor)
                dt = output.dtype
                kind = self.square_kinds.get(dt)
                if kind is not None and (output.is_contiguous() or _dense(output)):
                    sq = self.squares_out
                    _c_squares(kind, ((output.data_ptr(), output.numel()),), sq)
                    if sq[0] <= _DBL_MAX:  # (not inf or NaN)
                        call = (self.sig1.get((idx, dt)) or self._sig1(idx, dt), (math.sqrt(sq[0]),), _NF0,
                                (output.shape,), (), None, None)
                elif dt in _STORED:
                    t = output.detach()
                    if self.full:
                        row = _stats_row(t, True).tolist()
                        ok = math.isfinite(row[0]) and math.isfinite(row[4]) and math.isfinite(row[1])
                    else:
                        row = (_vnorm(t, dtype=torch.float32) if dt in _LOW_PRECISION else _vnorm(t)).item()
                        ok = math.isfinite(row)
                    if ok:
                        call = (self.sig1.get((idx, dt)) or self._sig1(idx, dt), (row,), _NF0, (output.shape,), (),
                                None, None)
            self.calls.append(call if call is not None else self._measure(idx, inputs, output))
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

    def _sig1(self, idx: int, dt: torch.dtype) -> tuple:
        """The signature of a call of module `idx` whose output is one tensor of dtype `dt`."""
        sig = self.sig1[(idx, dt)] = (idx, 1, _SLOT0, (_STORED[dt],))
        return sig

    def _measure(self, idx: int, inputs: Any, output: Any) -> tuple:
        """One call's outputs: on the CPU their statistics now, while they are in the cache (no reference is kept:
        the memory of an output autograd does not keep is freed as without the recorder), and where one is not
        finite what the incident needs (its counts, its module's inputs, its value); on an accelerator statistics
        launched now, the output kept until the step's one transfer."""
        outs = (output,) if type(output) is _Tensor else tuple(iter_tensors(output))
        full = self.full
        slots, rows, nfs, shapes, dtypes, held = [], [], [], [], [], []
        keep_inputs = None
        bad = None
        for i, t in enumerate(outs):
            stored = _STORED.get(t.dtype)
            if stored is None or t.layout is not _STRIDED or not _usable(t):
                continue
            slots.append(i)
            shapes.append(t.shape)
            dtypes.append(stored)
            if not t.is_cpu:
                rows.append(_stats_row(t.detach(), full))
                nfs.append(-1)
                held.append(t)
                keep_inputs = inputs
                continue
            kind = self.square_kinds.get(t.dtype)
            if kind is not None and (t.is_contiguous() or _dense(t)):
                sq = self.squares_out
                _c_squares(kind, ((t.data_ptr(), t.numel()),), sq)
                row = [math.sqrt(sq[0])]
            else:
                row = _stats_row(t.detach(), full).tolist()
            nf = 0
            if not all(math.isfinite(v) for v in row):
                nf = int((~torch.isfinite(t)).sum())
                if nf == 0:  # (a sum of powers past the dtype's range)
                    row = _stats_row(t.detach().double(), full).tolist()
                elif bad is None:
                    bad = _bad_output(self.modules[idx], i, inputs, t)
            rows.append(row if full else row[0])
            nfs.append(nf)
        return ((idx, len(outs), tuple(slots), tuple(dtypes)), rows, nfs, tuple(shapes), held, keep_inputs, bad)

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
        self.ended_at_optimizer = grads
        self.mark = 0
        step_id = self.step_id if self.step_id is not None else self.hook.step_id()
        self.step_id = None
        self.finish_next = self.wait_optimizer = False
        if not calls and grads and not self.warned_unseen and self.modules:
            self.warned_unseen = True
            logger.warning("tensortap flight recorder: no module output was seen in step %d (the model runs "
                           "compiled?): weights and gradients are recorded, module outputs are not", step_id[0])
        full = self.full
        held: list[tuple[int, torch.Tensor]] = []  # (position, output) of the accelerator outputs
        # per call its fields, then per recorded output its row, non-finite count (-1: not known yet) and shape
        sig, c_rows, c_nfs, c_shapes, c_held, _inputs, _bad = zip(*calls, strict=True) if calls else ((),) * 7
        rows: list[Any] = list(_chain(*c_rows))
        nfs = list(_chain(*c_nfs))
        shapes = tuple(_chain(*c_shapes))
        if any(c_held):  # (accelerator outputs)
            pos = 0
            for c in calls:
                it = iter(c[_HELD])
                for j, nf in enumerate(c[_NF]):
                    if nf < 0:
                        held.append((pos + j, next(it)))
                pos += len(c[_NF])
        n_out = len(rows)
        cols = _RAW_COLUMNS[full]
        weights = self.weights
        gl: list[Any] = list(map(_GRAD, weights)) if grads else []
        # the common case: CPU weights and gradients of one dtype, read by the C helper in one call from addresses
        # checked cheaply (`_sources`), for steps whose plan is known
        sources = self._sources(gl if grads else None) if self.square_kinds and not held and not self.sharded \
            else None
        plan = self.plans.get((sig, grads)) if sources is not None else None
        if plan is not None and plan.kind == self.w_kind:
            tensors: list[torch.Tensor] = weights + gl
            n_t = len(tensors)
            values = np.zeros((n_out + n_t, 2), dtype=np.float64)
            t_bad = _c_squares(plan.kind, sources, values[n_out:])
            _roots(values[n_out:], t_bad, tensors)
            done = True
        else:
            t_bad = None  # (not known: read from `values`)
            # (as they are: torch's statistics detach them, `_statistics`; checked when registered)
            tensors = list(weights)
            sharded = self.sharded
            if sharded:  # (a DTensor's local shard, where it lies noted for the reader)
                local = self.hook._local
                for i in sharded:
                    tensors[i] = local(self.weight_names[i], weights[i])
            gmask: Any = False
            if grads:
                gmask = True
                for g in gl:
                    if g is None or g.layout is not _STRIDED:  # (a sparse gradient is left out)
                        gmask = tuple(g is not None and g.layout is _STRIDED for g in gl)
                        break
                gd = list(gl)
                for i in sharded:
                    if gl[i] is not None:
                        gd[i] = local("gradient/" + self.weight_names[i], gl[i])
                if gmask is True:
                    tensors += gd
                else:
                    tensors.extend(d for d, ok in zip(gd, gmask, strict=True) if ok)
            key = (sig, gmask)
            plan = self.plans.get(key)
            if plan is None:
                plan = self._plan(key, calls, tensors, n_out, shapes, gl if grads else None)
            n_t = len(tensors)
            if n_out + n_t == 0:
                return
            values = np.zeros((n_out + n_t, 6 if full else 2), dtype=np.float64)
            # the weights' and gradients' statistics: on the CPU in one call of the C helper, else (and with the
            # accelerator outputs' rows) torch's in one transfer
            done = not n_t or (plan.kind is not None and not held and self._squares(tensors, plan, values[n_out:]))
        if not done or held:
            host, t_nf = self._statistics(tensors if not done else [], plan, [rows[i] for i, _t in held])
            n_h = 0 if done else n_t
            for (i, t), row in zip(held, host[n_h:], strict=True):
                nfs[i] = _nonfinite(t, row, full) if not np.isfinite(row).all() else 0
                rows[i] = row if full else row[0]
            if not done:
                if full:
                    values[n_out:, cols] = host[:n_t]
                else:
                    values[n_out:, 0] = host[:n_t, 0]
                values[n_out:, 1] = t_nf
        if n_out:
            if full:
                values[:n_out, cols] = rows
            else:
                values[:n_out, 0] = rows
            values[:n_out, 1] = nfs
        layout = plan.layouts.get(shapes)
        if layout is None:
            if len(plan.layouts) > 64:
                plan.layouts.clear()
            layout = plan.layouts[shapes] = Layout(plan.names, shapes + plan.tensor_shapes, plan.dtypes)
        if full:  # (count of non-zero elements -> of zeros; sqrt(Σx⁴) -> l4)
            values[:, 4] = layout.numels - values[:, 4]
            np.sqrt(values[:, 5], out=values[:, 5])
        rec = self.rec
        rec.record(step_id, layout, values)
        names = plan.names
        bad_value = None
        if any(nfs) or ((t_bad is None or t_bad) and values[n_out:, 1].any()):
            detail, bad_value = self._provenance(calls, plan, tensors, values, held)
        else:
            detail = None

        def raw() -> list[tuple[str, np.ndarray]]:
            items = [(n, host_numpy(t.cpu())) for n, t in zip(names[n_out:], tensors, strict=True)]
            items += [(names[i], host_numpy(t.detach().cpu())) for i, t in held]
            if bad_value is not None:
                items.append(bad_value)
            return items

        rec.nonfinite(step_id, detail, raw)
        if step_id[1] not in _NO_GRAD_MODE_VALUES:
            loss = float(values[plan.loss, 0]) if plan.loss is not None else None  # (|loss|: its l2)
            gnorm = None
            if plan.n_grads:
                gnorm = math.hypot(*values[-plan.n_grads:, 0].tolist())
            rec.observe(step_id, loss, gnorm, raw, names[plan.loss] if plan.loss is not None else None)
        rec.poll(step_id)

    def _plan(self, key: tuple, calls: list[tuple], tensors: list[torch.Tensor], n_out: int, shapes: list[Any],
              grads: list | None) -> _StepPlan:
        """Names and roles of the tensors of steps whose calls and gradients look like this one's."""
        names: list[str] = []
        out_calls: list[int] = []  # per output: its call's position in `calls`
        counts: dict[int, int] = {}
        dtypes: list[np.dtype] = []
        loss = None
        for c_pos, c in enumerate(calls):
            idx, n, slots, c_dtypes = c[_SIG]
            k = counts.get(idx, 0)
            counts[idx] = k + 1
            base = self.modules[idx] + "_output_"
            is_loss = idx in self.losses or (not self.losses and idx in self.roots)
            for i, shape in zip(slots, c[_SHAPES], strict=True):
                if is_loss and math.prod(shape) == 1:
                    loss = len(names)  # (the last loss of the step)
                names.append(f"{base}{k * n + i}")
                out_calls.append(c_pos)
            dtypes.extend(c_dtypes)
        names.extend(self.weight_names)
        n_grads = 0
        if grads is not None:
            for name, g in zip(self.weight_names, grads, strict=True):
                if g is not None and g.layout is _STRIDED:
                    names.append("gradient/" + name)
                    n_grads += 1
        dtypes.extend(_STORED[t.dtype] for t in tensors)
        batched = (len({t.dtype for t in tensors}) <= 1 and len({t.device for t in tensors}) <= 1
                   and all(t.dtype in (torch.float32, torch.float64) and t.numel() for t in tensors))
        kinds = {self.square_kinds.get(t.dtype) for t in tensors}
        kind = kinds.pop() if len(kinds) == 1 and all(t.is_cpu for t in tensors) else None
        plan = _StepPlan(tuple(names), tuple(dtypes), n_out, len(self.weight_names), n_grads, out_calls, loss,
                         batched, tuple(tuple(t.shape) for t in tensors), kind)
        if len(self.plans) > 256:
            self.plans.clear()
        self.plans[key] = plan
        return plan

    def _statistics(self, tensors: list[torch.Tensor], plan: _StepPlan, dev: list[torch.Tensor]
                    ) -> tuple[np.ndarray, Any]:
        """The statistics rows (see `_RAW_COLUMNS`) of each of `tensors` (the weights and gradients), computed
        where they live in one pass per statistic over all of them (`torch._foreach_*`), then the rows of the
        accelerator outputs (`dev`, launched when they were made), all brought to the host in one transfer; and
        the non-finite counts of `tensors` (computed exactly only where a statistic is not finite)."""
        full = self.full
        n = len(tensors)
        parts = []
        if n:
            tensors = [t.detach() for t in tensors]  # (create_graph=True: a gradient requires grad)
            if not plan.batched:
                parts.append(torch.stack([_stats_row(t, full) for t in tensors]))
            elif not full:
                parts.append(torch.stack(torch._foreach_norm(tensors)).unsqueeze(1))
            else:
                a = torch._foreach_abs(tensors)
                mx = _FOREACH_MAX(a) if _FOREACH_MAX is not None else [x.max() for x in a]
                sq = torch._foreach_norm(torch._foreach_mul(a, a))
                columns = (torch._foreach_norm(a), [x.sum() for x in a], mx,
                           [_count_nonzero(t) for t in tensors], sq)
                parts.append(torch.stack([torch.stack(c).double() for c in columns], 1))
        if dev:
            parts.append(torch.stack(dev))
        if len(parts) > 1:
            if parts[0].device != parts[1].device:
                parts = [p.cpu() for p in parts]
            stacked = torch.cat([p.to(torch.float64) for p in parts])
        else:
            stacked = parts[0]
        host = stacked.numpy() if stacked.is_cpu else stacked.cpu().numpy()  # (the one transfer)
        nf: Any = 0
        if n and not np.isfinite(host[:n]).all():
            # (rare: a non-finite value, or a sum of powers past the dtype's range)
            host = host.astype(np.float64)
            nf = np.zeros(n)
            for i in np.flatnonzero(~np.isfinite(host[:n]).all(axis=1)).tolist():
                nf[i] = _nonfinite(tensors[i], host[i], full)
        return host, nf

    def _squares(self, tensors: list[torch.Tensor], plan: _StepPlan, out: np.ndarray) -> bool:
        """The norms and non-finite counts of `tensors` (CPU, of the one dtype `plan.kind` names) into `out` (one row
        each, C-contiguous) in one call of the C helper: float64 Σx², then its root. False (nothing done) where a
        tensor is not such a tensor (then torch's, for this plan from now on)."""
        kept = []  # (contiguous copies of the rare tensor that is not: alive until the call is over)
        sources = []
        dtype = tensors[0].dtype
        for t in tensors:
            if not t.is_cpu or t.dtype is not dtype:
                plan.kind = None  # (moved to a device, or another dtype)
                return False
            if not t.is_contiguous() and not _dense(t):
                t = t.contiguous()
                kept.append(t)
            sources.append((t.data_ptr(), t.numel()))
        _roots(out, _c_squares(plan.kind, sources, out), tensors)
        return True

    def _sources(self, gl: list[Any] | None) -> list[tuple[int, int]] | None:
        """(address, element count) of each weight, then of each gradient in `gl` (None: none), where the weights
        are dense CPU tensors of one dtype the C helper reads (checked again when an address changes: `.data` set,
        moved, converted), and every gradient is a dense tensor (torch gives a parameter's gradient its dtype,
        device and shape); else None."""
        ptrs = list(map(_DATA_PTR, self.weights))
        if ptrs != self.w_ptrs:
            self._check_weights(ptrs)
        if self.w_kind is None:
            return None
        sources = list(zip(ptrs, self.w_numels, strict=True))
        if gl is not None:
            if not set(map(type, gl)) <= _PLAIN:  # (a gradient is None, or not a plain tensor)
                return None
            if not all(map(_IS_CONTIGUOUS, gl)) and not all(
                    g.layout is _STRIDED and (g.is_contiguous() or _dense(g)) for g in gl):  # (sparse, strided)
                return None
            sources += zip(map(_DATA_PTR, gl), self.w_numels, strict=True)
        return sources

    def _check_weights(self, ptrs: list[int]) -> None:
        """`w_kind`: the kind of the C helper that reads all weights (None: none does), for weights at `ptrs`."""
        ws = self.weights
        self.w_ptrs, self.w_kind = ptrs, None
        if not ws or not all(type(w) in _PLAIN and w.is_cpu and (w.is_contiguous() or _dense(w)) for w in ws):
            return
        kinds = {self.square_kinds.get(w.dtype) for w in ws}
        if len(kinds) == 1:
            self.w_numels = [w.numel() for w in ws]
            self.w_kind = kinds.pop()

    def _provenance(self, calls: list[tuple], plan: _StepPlan, tensors: list[torch.Tensor], values: np.ndarray,
                    held: list[tuple[int, torch.Tensor]]) -> tuple[dict[str, Any], tuple[str, np.ndarray] | None]:
        """Where the step's first non-finite value appeared (docs/format.md §11), and (name, value) of the first
        non-finite CPU output (not held, kept when it was made)."""
        bad = values[:, 1] > 0
        names = plan.names
        n_out, n_w = plan.n_out, plan.n_weights
        first = next((i for i in range(n_out) if bad[i]), None)
        if first is not None:
            call = calls[plan.out_calls[first]]
            idx = call[_SIG][0]
            module = self.modules[idx]
            if call[_BAD] is not None:  # (a CPU output: described when it was made)
                detail = {k: v for k, v in call[_BAD].items() if k != "value"}
            else:
                t = dict(held)[first]
                detail = {"tensor": names[first], **_counts(t),
                          "inputs": [_input_stats(f"{module}_input_{j}", x)
                                     for j, x in enumerate(x for x in iter_tensors(call[_INPUTS]) if _usable(x))]}
            detail.update(phase="loss" if idx in self.losses else "forward", module=module, parameter=None,
                          tensor=names[first])
            own = set(self.own_params.get(idx, ()))
            bad_own = next((i for i in range(n_out, n_out + n_w) if bad[i] and names[i] in own), None)
            if bad_own is not None:  # the module computed with a non-finite parameter of its own
                detail.update(phase="weights", parameter=names[bad_own], tensor=names[bad_own],
                              **_counts(tensors[bad_own - n_out]))
            return _ordered(detail), ((names[first], call[_BAD]["value"]) if call[_BAD] is not None else None)
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
        are not kept). None when the step was recorded at its optimizer's step and the next has not begun: the
        weights are then already updated for a step that has no id yet, and the ring has this step's."""
        ring = self.rec.ring
        if self.ended_at_optimizer and not self.calls and self.step_id is None and ring \
                and ring[-1][1] == self.hook.step_id():
            return []
        out: list[tuple[str, np.ndarray]] = []
        local = self.hook._local  # (a DTensor's local shard)
        for name, p in self.params:
            if _usable_param(p):
                out.append((name, host_numpy(local(name, p).cpu())))
        if self.hook.mode not in _NO_GRAD_MODES:  # (an EVAL step has no gradients of its own)
            for name, p in self.params:
                if p.grad is not None and _usable_param(p.grad):
                    out.append(("gradient/" + name, host_numpy(local("gradient/" + name, p.grad).cpu())))
        counts: dict[int, int] = {}
        for c in self.calls:
            idx, n, slots, _dt = c[_SIG]
            k = counts.get(idx, 0)
            counts[idx] = k + 1
            kept = [i for i, nf in zip(slots, c[_NF], strict=True) if nf < 0]
            for i, t in zip(kept, c[_HELD], strict=True):
                out.append((f"{self.modules[idx]}_output_{k * n + i}", host_numpy(t.detach().cpu())))
        return out


def _roots(out: np.ndarray, bad: int, tensors: list[torch.Tensor]) -> None:
    """`out` (per tensor Σx² and the non-finite count, from the C helper; `bad`: how many Σx² are not finite) to
    the tensors' norms: where a float64 tensor's Σx² passed its range, computed again by torch in float64."""
    col = out[:, 0]
    if bad:
        for i in np.flatnonzero(~(col <= _DBL_MAX)).tolist():
            if out[i, 1] == 0:
                col[i] = float(_stats_row(tensors[i].detach().double(), False)) ** 2
    np.sqrt(col, out=col)


def _dense(t: torch.Tensor) -> bool:
    """Whether the elements of `t` are the `t.numel()` consecutive ones from `t.data_ptr()` in some order (its
    strides a permutation of a contiguous tensor's: a transposed or channels-last tensor)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=_by_stride):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def _by_stride(size_stride: tuple[int, int]) -> int:
    return size_stride[1]


def _nonfinite(t: torch.Tensor, row: np.ndarray, full: bool) -> int:
    """The non-finite count of `t`, whose statistics `row` has a non-finite value; where it has none (a sum of
    powers past the dtype's range) `row` is recomputed in float64, in place."""
    nf = int((~torch.isfinite(t)).sum())
    if nf == 0:
        row[:] = _stats_row(t.detach().double(), full).cpu().numpy()
    return nf


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
