"""The hand-off: a step's tensors, read to the host by an adapter, given to the writer in as few messages as
possible.

* `write_tensors(items)`: raw values of one dtype go as one batch (one reservation, one copy into the writer's
  room, `tensortap.capture.batch`); the rest (reductions only, other dtypes, shapes) as records.
* `write_planned(spec, sources)`: a planned batch (a `BatchSpec` kept for tensors saved at every saving step)
  copied from (address, byte count) sources straight into one reservation.
* `write_tensor(name, value, colls)`: one value as one record.
`at=step_id` saves at an earlier step whose mark is held (`StepEngine.hold_marks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tensortap.capture.batch import BatchSpec, array_sources
from tensortap.collection import NON_REDUCTION_COLLECTIONS, Collection
from tensortap.format import codec
from tensortap.format.records import Record, RecordBatch

StepId = tuple[int, int, int]


class HandOff:
    """One hook's hand-offs to its writer. `host` gives the writer (`_get_writer()`), `dry_run` and the default
    `reduction_config`; `engine` the step (`step_id()`) and the collections' dirty flag."""

    def __init__(self, host: Any, engine: Any) -> None:
        self.host = host
        self.engine = engine

    def plan(self, name: str, colls: list[Collection]) -> tuple[bool, tuple[tuple[str, bool], ...], bool]:
        """(save_raw, reductions, save_shape) for a tensor saved in `colls` now."""
        save_raw = False
        save_shape = False
        reds: list[tuple[str, bool]] = []
        default = self.host.reduction_config
        for c in colls:
            rc = c.reduction_config or default
            if c.name in NON_REDUCTION_COLLECTIONS:
                save_raw = True
                continue
            save_raw = save_raw or rc.save_raw_tensor
            save_shape = save_shape or rc.save_shape
            for r in rc.requested():
                if r not in reds:
                    reds.append(r)
        return save_raw, tuple(reds), save_shape

    def note_membership(self, name: str, colls: Iterable[Collection]) -> None:
        """`name` is a member of `colls` (told to readers with the collections)."""
        for c in colls:
            if not c.has_tensor_name(name):
                c.add_tensor_name(name)
                self.engine.collections_dirty = True

    def write_tensor(self, name: str, value: Any, colls: list[Collection],
                     reduction_values: dict[tuple[str, bool], Any] | None = None,
                     shape: tuple[int, ...] | None = None, copy: bool = True) -> None:
        save_raw, reds, save_shape = self.plan(name, colls)
        if reduction_values is not None:
            reds = tuple(r for r in reds if r not in reduction_values)
        arr = None
        if value is not None:
            arr = codec.as_storable(value)
            if copy and (arr is value or (isinstance(value, np.ndarray) and np.shares_memory(arr, value))):
                arr = arr.copy()  # the caller may mutate its array after we return
        self.note_membership(name, colls)
        if self.host.dry_run:
            return
        step, mode, mode_step = self.engine.step_id()
        self.host._get_writer().submit(
            Record(name=name, step=step, mode=mode, mode_step=mode_step,
                   value=arr, save_raw=save_raw and arr is not None, reductions=reds if arr is not None else (),
                   reduction_values=dict(reduction_values or {}), save_shape=save_shape,
                   shape=tuple(shape) if shape is not None else None)
        )

    def write_tensors(self, items: Iterable[tuple[str, Any, list[Collection]]], copy: bool = True,
                      at: StepId | None = None) -> None:
        plans: dict[tuple[int, ...], tuple[bool, tuple[tuple[str, bool], ...], bool]] = {}
        step, mode, mode_step = at if at is not None else self.engine.step_id()
        records = []
        batch: list[tuple[str, np.ndarray, tuple]] = []
        for name, value, colls in items:
            key = tuple(map(id, colls))
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = self.plan(name, colls)
            save_raw, reds, save_shape = plan
            arr = codec.as_storable(value)
            self.note_membership(name, colls)
            if save_raw and not save_shape and (not batch or arr.dtype == batch[0][1].dtype):
                batch.append((name, arr, reds))
                continue
            if copy and (arr is value or (isinstance(value, np.ndarray) and np.shares_memory(arr, value))):
                arr = arr.copy()
            records.append(Record(name=name, step=step, mode=mode, mode_step=mode_step, value=arr,
                                  save_raw=save_raw, reductions=reds, save_shape=save_shape))
        if self.host.dry_run:
            return
        writer = self.host._get_writer()
        if batch and sum(a.nbytes for _n, a, _r in batch) < writer.reserve_min_bytes:
            # (a thread writer takes small host values as they are, in one hand-off: no reservation to copy into)
            reds = tuple(r for _n, _a, r in batch)
            writer.submit_batch(RecordBatch(tuple(n for n, _a, _r in batch),
                                            [a.copy() if copy else a for _n, a, _r in batch], None,
                                            step, mode, mode_step, reds if any(reds) else None))
        elif batch and not self._send_batch(writer, batch, (step, mode, mode_step)):
            for name, arr, reds in batch:
                records.append(Record(name=name, step=step, mode=mode, mode_step=mode_step,
                                      value=arr.copy() if copy else arr, save_raw=True, reductions=reds))
        if records:
            writer.submit_many(records)

    def _send_batch(self, writer: Any, batch: list[tuple[str, np.ndarray, tuple]], at: StepId) -> bool:
        """Copy raw values of one dtype into one reservation of `writer` at step `at`; False if they cannot go
        that way (then they go as records)."""
        found = array_sources([arr for _n, arr, _r in batch])
        if found is None:
            return False
        sources, shapes = found
        reds = tuple(r for _n, _a, r in batch)
        spec = BatchSpec(tuple(n for n, _a, _r in batch), True, reds if any(reds) else None, shapes,
                         np_dtype=batch[0][1].dtype)
        return self.reserve_and_copy(writer, spec, sources, at)

    def batch_spec(self, items: list[tuple[str, list[Collection]]]) -> BatchSpec:
        """The plan of tensors saved together at every saving step with these collections (membership in them
        noted here, once per plan). Shapes and dtype are the caller's to set."""
        raw_only = True
        reductions = []
        for name, colls in items:
            save_raw, reds, save_shape = self.plan(name, colls)
            raw_only = raw_only and save_raw and not save_shape
            reductions.append(reds)
            self.note_membership(name, colls)
        return BatchSpec(tuple(name for name, _c in items), raw_only,
                         tuple(reductions) if any(reductions) else None)

    def write_planned(self, spec: BatchSpec, sources: Sequence[tuple[int, int]], at: StepId | None = None) -> bool:
        """Hand off a planned batch (`spec` raw only, with its shapes and numpy dtype; `sources` the (address, byte
        count) of its tensors' bytes, in order, readable now): False if it cannot go that way (then hand its
        tensors to `write_tensors`). `at`: as for `write_tensors`."""
        host = self.host
        if host.dry_run or not spec.raw_only:
            return False
        writer = host._writer if host._writer is not None else host._get_writer()
        if sum(n for _a, n in sources) < writer.reserve_min_bytes:
            return False
        self.engine.clock.sync()
        return self.reserve_and_copy(writer, spec, sources, at)

    def reserve_and_copy(self, writer: Any, spec: BatchSpec, sources: Sequence[tuple[int, int]],
                         at: StepId | None = None) -> bool:
        if at is None:
            res = spec.reserve(writer, self.engine.clock)
        else:
            step, mode, mode_step = at
            res = writer.reserve_batch(spec.names, spec.np_dtype, spec.shapes, step, mode, mode_step,
                                       reductions=spec.reductions)
        if res is None:
            return False
        if res:  # (False: dropped under backpressure, counted by the writer)
            res.copy_in(sources)
            res.commit()
        return True
