"""Gradients read at the end of the backward pass (loops with no optimizer known) or at the optimizer's step,
and handed over with the step's other tensors in as few messages as possible."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from tensortap.capture.batch import StepLayout
from tensortap.collection import Collection
from tensortap.exceptions import InvalidConfiguration
from tensortap.pytorch import _dtensor
from tensortap.pytorch._plan import (
    _STRIDED,
    _distributed,
    _is_compiling,
    _Plan,
)
from tensortap.pytorch._tensors import (
    HostBatch,
    ReductionProgram,
    capturable,
    host_numpy,
    iter_tensors,
    ring_sources,
    step_statistics,
)

logger = logging.getLogger("tensortap")


class GradientCapture:
    """The PyTorch hook's gradient capture (mixed into `tensortap.pytorch.hook.Hook`)."""

    def _grad_root_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        # Gradients are read once the backward pass ends. A hook on the output starts that; a model
        # whose output does not require grad gets a hook on each parameter instead.
        if _is_compiling() or not self.engine.saving or self.disabled or not self._grad_targets or self._opts:
            return
        try:
            found = False
            for t in (outputs,) if type(outputs) is torch.Tensor else iter_tensors(outputs):
                if t.requires_grad and t.grad_fn is not None:
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
        if self.disabled or not self.engine.saving:
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
                        if prog is None or prog.dtypes != tuple([g.dtype for g in grads]):
                            prog = plan.grad_prog = ReductionProgram(grads, plan.grad_reds)
                            for name, colls in plan.grad_items:
                                self._note_membership(name, colls)
                        self._grad_reduced = prog.run(grads)
                        return
                    # the usual case: every gradient, in one copy (a later backward of this step replaces it)
                    self._pending_grads = {}
                    if plan.grad_spec is None:
                        plan.grad_spec = self.batch_spec(plan.grad_items)
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

    def _hand_off_grads(self) -> None:
        if (self._grad_res is None and self._grad_batch is None and not self._pending_grads and not self._small
                and self._step_res is None and self._grad_reduced is None and not self._reduced_records
                and self._weight_reduced is None):
            return  # (every step that saved no gradients)
        reduced, self._grad_reduced = self._grad_reduced, None
        weights, self._weight_reduced = self._weight_reduced, None
        active = self.engine.saving and not self.disabled and not self._closed  # (writes: it made `res`)
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
        try:  # (what guard() does, without a generator per step)
            if (weights is not None or reduced is not None) and plan is not None:
                w = self._writer if self._writer is not None else self._get_writer()
                w.submit_statistics(step_statistics(plan, weights, reduced, self.step_id()))
            if self._reduced_records:
                rows, self._reduced_records = self._reduced_records, []
                for r in rows:
                    self._get_writer().submit_statistics(r)
            if small:
                self._write_small(plan, small)
        except InvalidConfiguration:
            raise
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._fail("statistics", e)
        if batch is not None or pending:
            with self.guard("gradients"):
                if batch is not None and plan is not None:
                    if plan.grad_spec is None:
                        plan.grad_spec = self.batch_spec(plan.grad_items)
                    self._write_batch(batch, plan.grad_items, plan.grad_spec)
                if pending:
                    self.write_tensors([(name, arr, colls) for name, (arr, colls) in pending.items()], copy=False)


    def _write_small(self, plan: _Plan | None, small: list[tuple[str, torch.Tensor, list[Collection]]]) -> None:
        """The step's small tensors held until its end (a loss): one batch, planned once per plan, when they are
        saved raw alone, else one hand-off of records."""
        if plan is not None and not self._force_async_copies:
            spec = plan.small_spec
            if spec is None or len(spec.names) != len(small) or any(
                    n != m for n, (m, _t, _c) in zip(spec.names, small, strict=True)):
                spec = plan.small_spec = self.batch_spec([(name, colls) for name, _t, colls in small])
            res = self._ring_batch([t for _n, t, _c in small], spec)
            if res is not None:
                if res:
                    res.commit()
                return
        self.write_tensors([(name, host_numpy(t), colls) for name, t, colls in small], copy=False)
