"""Weights, module inputs and outputs, and statistics: read once per saving step and handed to the writer
(straight into a writer process's shared memory where they can be)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from tensortap.capture.batch import BatchSpec
from tensortap.collection import Collection
from tensortap.format.records import RecordBatch
from tensortap.pytorch import _dtensor
from tensortap.pytorch._plan import (
    _SMALL,
    _STRIDED,
    INPUT_SUFFIX,
    OUTPUT_SUFFIX,
    _in_backward,
    _is_compiling,
    _Plan,
)
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


class TensorCapture:
    """The PyTorch hook's tensor capture (mixed into `tensortap.pytorch.hook.Hook`)."""

    def _io_hook(self, name: str, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if _is_compiling() or not self.engine.saving or self.disabled or _in_backward():
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
        if _is_compiling() or not self.engine.saving or self.disabled or _in_backward():
            return
        try:
            self._write_io(name, INPUT_SUFFIX, inputs)
            self._write_io(name, OUTPUT_SUFFIX, outputs)
        except Exception as e:  # noqa: BLE001
            self._fail("forward hook", e)


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
            plan.weight_prog = None  # (made again for these views: their dtypes may have changed)
            if spec is not None:
                spec.sources = None
            plan.step_layout = None  # (learned again: the parameters' shapes or dtype may have changed)
        if plan.weight_reds is False:
            plan.weight_reds = self._reductions_only(plan.weight_items)
        if plan.weight_reds is not None and not plan.some_odd:
            prog = plan.weight_prog
            if prog is None:
                prog = plan.weight_prog = ReductionProgram(views, plan.weight_reds)
                for name, colls in plan.weight_items:
                    self._note_membership(name, colls)
            if not self.dry_run:
                # (handed over with the gradients' when the step ends)
                self._weight_reduced = prog.run(views, fixed=True)
            return
        if not plan.some_odd:
            if spec is None:
                spec = plan.weight_spec = self.batch_spec(plan.weight_items)
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
        if self.engine.saving:
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

