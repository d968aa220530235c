"""The PyTorch hook's steady saving cycle: the same saving steps in fewer, shorter calls.

Once a saving step has gone the usual way (the weights, the gradients and a loss in one message to the writer
process, see `hook._StepLayout`) and the schedule, the collections and the model stay as they were, the next
saving steps are run by a `SteadyCycle`: the step counter's tick, the root's and the loss's forward hooks, the
output's gradient hook and the end-of-backward callback each do only what such a step needs, with the tests
that tell it still is one. Anything else (a parameter moved, a gradient that is not a dense contiguous
tensor, a second loss call, a mode change, a stop check due, ...) hands the call to the hook's general code,
which finds the hook's state just as its own calls would have left it.

Why: a saving step every N steps runs with the CPU's caches full of the training step's data and code, where
each call and each attribute read costs 5-10 times what it costs warm (measured on the MLP benchmark: the ring
reservation ~17 us in context against ~2 us warm). Less Python per saving step is the remaining way to a
lower overhead at save_interval 10 and 100 (bench/pytorch_floor.py measures the floor under it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from tensortap import modes as _modes
from tensortap.pytorch._tensors import gather_into

if TYPE_CHECKING:
    from tensortap.pytorch.hook import Hook, _Plan

_Tensor = torch.Tensor
_STRIDED = torch.strided
_GLOBAL, _TRAIN, _EVAL, _PREDICT = _modes.GLOBAL, _modes.TRAIN, _modes.EVAL, _modes.PREDICT
_INF = float("inf")
_MAX_SKIP = 1 << 62
_monotonic = time.monotonic


class SteadyCycle:
    """The saving steps of one plan, mode and schedule, while they stay alike (see the module's docstring)."""

    __slots__ = (
        "hook", "module", "counter", "mode", "uniform", "now", "plan", "interval", "cfg", "writer",
        "writer_layout", "weight_sources", "params", "ptrs", "grads", "weight_bytes", "dtype", "small",
        "loss_name", "loss_inputs", "loss_in_key", "loss_out_key", "loss_out", "loss_colls", "loss_gen",
        "hook_entries", "plan_hooks", "out_key", "distributed", "keep_handles", "small_limit", "queue",
    )

    def __init__(self, hook: Hook, plan: _Plan, loss: tuple | None, root_hooks: Any, grad_hook_id: int,
                 distributed: Callable[[], bool], keep_handles: int, small_limit: int) -> None:
        """`loss`: the registered loss module whose output the step's message carries, as (its name, its
        forward-hook dict, its key there, and what `hook._io_fast` learned of it: (`_for_gen`, input count,
        input key, output key, output name, collections)), or None."""
        self.hook = hook
        root = hook._roots[0]
        self.module = root.module
        self.counter = root.counter
        mode = self.mode = hook.mode
        self.uniform = hook._uniform[mode]
        self.now = self.uniform[1]
        self.plan = plan
        self.cfg = self.uniform[0]
        self.interval = self.cfg.save_interval  # (of a schedule `usable` accepts)
        layout = plan.step_layout
        self.writer = layout.writer
        self.writer_layout = layout.writer_layout
        self.weight_sources = plan.weight_spec.sources
        self.params = [p for _n, p, _c in plan.weights]
        self.ptrs = list(plan.param_ptrs)
        self.dtype = plan.weight_spec.dtype
        itemsize = self.dtype.itemsize
        self.grads = []
        for (p, _n, _c), shape in zip(plan.grad_list, layout.tail_shapes, strict=False):
            k = itemsize
            for d in shape:
                k *= d
            self.grads.append((p, k))
        self.weight_bytes = layout.weight_bytes
        n_small = len(layout.tail_names) - len(plan.grad_list)
        # the loss's (name, shape) in the message, after the gradients
        self.small = (layout.tail_names[-1], layout.tail_shapes[-1]) if n_small else None
        self.loss_gen = None
        if loss is not None:
            (self.loss_name, loss_hooks, loss_key, (self.loss_gen, self.loss_inputs, self.loss_in_key,
                                                    self.loss_out_key, self.loss_out, self.loss_colls)) = loss
        self.out_key = hook._output_hook_id
        entries = [(root_hooks, grad_hook_id, self.root_hook)]
        if loss is not None:
            entries.append((loss_hooks, loss_key, self.loss_hook))
        self.hook_entries = entries
        self.plan_hooks = [(d, key) for d, key, _fn in entries]
        self.distributed = distributed
        self.keep_handles = keep_handles
        self.small_limit = small_limit
        self.queue = torch.autograd.Variable._execution_engine.queue_callback

    @staticmethod
    def usable(cfg: Any) -> bool:
        """Whether a schedule suits a steady cycle: every `save_interval` (2 or more) steps from its start
        on, nothing else (then the next saving step is arithmetic, and each leaves quiet steps after it)."""
        return cfg.save_interval >= 2 and not cfg.save_steps and cfg.end_step is None

    # --- the step counter's tick: a saving step begins, or the step after it (a quiet one) ---------

    def tick(self) -> None:
        h = self.hook
        try:
            done = self._end(h) if h._saving else self._begin(h)
        except Exception as e:  # noqa: BLE001 - never break training
            h._fail("forward pre-hook", e)
            return
        if not done:
            h._root_pre_hook(self.module, ())  # (what the counter calls when there is no steady cycle)

    def _alike(self, h: Hook) -> bool:
        return (h._steady is self and not h.disabled and not h._closed and h.mode is self.mode and h._in_step
                and h._writer is self.writer
                and not (h._stop_checks and h._stop_watch and _monotonic() >= h._next_stop_check))

    def _begin(self, h: Hook) -> bool:
        """What `_root_pre_hook` and `on_step_begin` do when a saving step begins; False: not such a step."""
        if not self._alike(h) or h._uniform.get(self.mode) is not self.uniform or h._for_now is not self.now:
            return False
        if self.loss_gen is not None and h._for_gen != self.loss_gen:
            # (the saved collections' cache was renewed, e.g. by steps of another mode: the general code
            # learns the loss's shortcut again, and a new cycle follows)
            h._drop_steady()
            return False
        counter = self.counter
        n = counter.skipped
        mode = self.mode
        steps = h._mode_steps
        mode_step = steps[mode] + n + 1
        if mode_step != h._quiet_until:
            return False
        i = 0
        ptrs = self.ptrs
        for p in self.params:  # (a loop, no generator: every parameter keeps its storage)
            if p.data_ptr() != ptrs[i]:
                h._drop_steady()  # (the general code learns the new storage; a new cycle may follow)
                return False
            i += 1
        # the step is one: count it and save as `on_step_begin` would
        counter.skipped = 0
        counter.left = 0
        step = h._step = h._step + n + 1
        steps[mode] = mode_step
        steps[_GLOBAL] = step
        h._save_now = self.now  # (_set_save_now: `now` is the list saved last)
        h._save_step = step
        h._save_mode = mode
        h._quiet_until = -1
        h._saving = True
        interval = self.interval
        h._quiet_after = ((mode_step // interval + 1) * interval if mode_step >= self.cfg.start_step
                          else self.cfg.next_save_step(mode_step + 1))
        if h._io_counts:
            h._io_counts.clear()
        plan = h._step_plan = self.plan
        res = self.writer.reserve_step(self.writer_layout, step, mode._value_, mode_step, self.weight_sources)
        if res:
            h._step_res = res
        elif res is None:  # (the message does not fit in the ring: the general way)
            h._save_params(plan)
        h._grad_targets = plan.grads
        h._param_hooks_on = False
        if h._handles_plan is not plan:
            if h._handles_plan is not None:
                h._remove_plan_handles()
            for d, key, fn in self.hook_entries:
                d[key] = fn
            h._plan_hooks.extend(self.plan_hooks)
            h._handles_plan = plan
        return True

    def _end(self, h: Hook) -> bool:
        """What `_root_pre_hook` does when the step after a saving one begins and saves nothing: the saving
        step's message sent, the step marked as passed, the next quiet steps left to the counter."""
        if not self._alike(h) or h._step_plan is not self.plan:
            return False
        counter = self.counter
        if counter.skipped:
            return False
        mode = self.mode
        steps = h._mode_steps
        mode_step = steps[mode] + 1
        res = h._grad_res
        if (mode_step >= h._quiet_after or res is None or res is not h._step_res or h._step_handles or h._staged
                or h._grad_batch is not None or h._pending_grads or len(h._small) != h._small_in_res
                or h._collections_dirty):
            return False
        h._grad_targets = {}
        h._grad_res = h._step_res = None
        h._small = []
        h._small_in_res = h._grad_off = 0
        h._saving = False
        h._step_plan = None
        step = h._step
        w = self.writer
        w.commit(res)
        w.mark_steps(step, steps[_TRAIN], steps[_EVAL], steps[_PREDICT], step)
        until = h._quiet_until = h._quiet_after
        kept = h._handles_plan
        if kept is not None and (kept.io or until - mode_step > self.keep_handles):
            h._remove_plan_handles()
        h._step = step + 1
        steps[mode] = mode_step
        steps[_GLOBAL] = step + 1
        left = until - mode_step - 1
        if left > 0:
            counter.left = left if left < _MAX_SKIP else _MAX_SKIP
            counter.deadline = h._next_stop_check if h._stop_checks and h._stop_watch else _INF
        return True

    # --- the saving step's hooks --------------------------------------------------------------------

    def loss_hook(self, module: Any, inputs: Any, outputs: Any) -> None:
        """The loss's forward hook: its output held (cloned) for the step's message."""
        h = self.hook
        if not h._saving or h.disabled:
            return
        try:
            t = outputs
            counts = h._io_counts
            # (what hook._io_hook does on its fast path, where the step has recorded nothing yet)
            if (h._steady is self and not counts and type(t) is _Tensor and type(inputs) is tuple
                    and len(inputs) == self.loss_inputs and h._for_gen == self.loss_gen and t.is_cpu
                    and t.layout is _STRIDED and not t.is_nested and t.numel() <= self.small_limit):
                for x in inputs:
                    if type(x) is not _Tensor:
                        break
                else:
                    counts[self.loss_in_key] = self.loss_inputs
                    counts[self.loss_out_key] = 1
                    h._small.append((self.loss_out, t.detach().clone(), self.loss_colls))
                    return
        except Exception as e:  # noqa: BLE001
            h._fail("forward hook", e)
            return
        h._io_hook(self.loss_name, module, inputs, outputs)

    def root_hook(self, module: Any, inputs: Any, outputs: Any) -> None:
        """The root's forward hook: the output's gradient hook starts the reading of the gradients."""
        h = self.hook
        if not h._saving or h.disabled or not h._grad_targets:
            return
        try:
            t = outputs
            if h._steady is self and type(t) is _Tensor and t._backward_hooks is None:
                fn = t.grad_fn
                if fn is not None:
                    # (what Tensor.register_hook does, without a handle: see hook._grad_root_hook)
                    t._backward_hooks = OrderedDict(((self.out_key, self.output_grad_hook),))
                    fn._register_hook_dict(t)
                    return
        except Exception as e:  # noqa: BLE001
            h._fail("gradient hook", e)
            return
        h._grad_root_hook(module, inputs, outputs)

    def output_grad_hook(self, grad: torch.Tensor) -> None:
        h = self.hook
        if h.disabled or h._grad_cb_queued:
            return
        try:
            h._grad_cb_queued = True
            self.queue(h._after_backward if self.distributed() else self.collect)
        except Exception as e:  # noqa: BLE001
            h._fail("gradient hook", e)

    def collect(self) -> None:
        """At the end of the backward pass: the gradients and the loss into the step's message."""
        h = self.hook
        h._grad_cb_queued = False
        if h.disabled or not h._saving:
            return
        try:
            res = h._step_res
            # (a cycle dropped in this step, e.g. by a change of collections, leaves it to the general code)
            if (h._steady is self and res is not None and h._grad_res is None and h._step_plan is self.plan
                    and h._writer is self.writer):
                sources = []
                for p, nbytes in self.grads:
                    # A gradient has its parameter's shape, dtype and device (autograd and the .grad setter
                    # see to that), and the parameters kept their storage (tested at the step's start; a
                    # parameter reshaped onto the same storage is not told apart, as in the general code).
                    g = p.grad
                    if g is None or g.layout is not _STRIDED or not g.is_contiguous():
                        break
                    sources.append((g.data_ptr(), nbytes))
                else:
                    small = h._small
                    expected = self.small
                    if expected is None:
                        ok = not small
                    else:
                        ok = len(small) == 1
                        if ok:
                            name, t, _c = small[0]  # (a held clone of a CPU tensor)
                            ok = (name == expected[0] and t.dtype is self.dtype and t.shape == expected[1]
                                  and t.is_contiguous())
                            if ok:
                                sources.append((t.data_ptr(), t.nbytes))
                    if ok:
                        gather_into(self.writer.ring_address + res.offset + self.weight_bytes, sources)
                        if h._pending_grads:
                            h._pending_grads = {}
                        h._grad_res = res
                        h._grad_off = self.weight_bytes
                        h._small_in_res = len(small)
                        return
        except Exception as e:  # noqa: BLE001
            h._fail("gradient capture", e)
            return
        h._collect_grads()
