"""Batches: a step's raw tensors of one dtype handed to the writer as one message, copied straight into the
writer's room (a `Reservation`) with no host copy in between.

Framework-neutral: a batch's tensors are given as (address, byte count) sources and shapes, with a numpy dtype;
each framework finds those of its own tensors (`array_sources` does it for numpy arrays). A `BatchSpec` is the
plan of a fixed list of tensors saved at every saving step (names, reductions, last shapes and sources), so a
step that saves them again costs one reservation and one copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensortap.capture.clock import StepClock


def pad(reductions: tuple | None, n: int) -> tuple:
    """Per-tensor reductions for `n` tensors: `reductions`, then none for the rest."""
    reductions = reductions or ()
    return reductions + ((),) * (n - len(reductions))


@dataclass
class BatchSpec:
    """A fixed list of tensors saved together at every saving step: their names, whether they are saved raw
    (only then do they go as one batch), and per tensor the reductions the writer computes from them."""

    names: tuple[str, ...]
    raw_only: bool
    reductions: tuple | None = None  # per tensor, (name, abs) pairs; None: none at all
    shapes: tuple[tuple[int, ...], ...] | None = None  # as last reserved
    dtype: Any = None  # ... their dtype as the framework names it (a key), and as numpy's
    np_dtype: Any = None
    sources: list[tuple[int, int]] | None = None  # (address, bytes) of tensors that stay (e.g. weights)
    # (writer, shapes, np_dtype, writer.batch_layout() of them): what reserving `names` again needs
    layout: tuple[Any, Any, Any, Any] | None = None

    def reserve(self, writer: Any, clock: StepClock, names: tuple[str, ...] | None = None) -> Any:
        """Room for this batch at the clock's step (see `Writer.reserve_batch`); `names`: of the tensors when
        more than `self.names` (the extra ones saved raw only)."""
        reds = self.reductions
        mode = clock.mode
        if not names:
            layout = self.layout
            if layout is None or layout[0] is not writer or layout[1] is not self.shapes \
                    or layout[2] is not self.np_dtype:
                layout = self.layout = (writer, self.shapes, self.np_dtype,
                                        writer.batch_layout(self.names, self.np_dtype, self.shapes, reds))
            return writer.reserve_batch(self.names, self.np_dtype, self.shapes, clock.step, mode._value_,
                                        clock.mode_steps[mode], layout[3], reds)
        if reds is not None:
            reds = pad(reds, len(names))
        return writer.reserve_batch(names, self.np_dtype, self.shapes, clock.step, mode._value_,
                                    clock.mode_steps[mode], reductions=reds)


@dataclass
class StepLayout:
    """One message per saving step for tensors known at its start (the weights, copied then) and what its end
    adds (gradients, a loss): learned from a step that sent them separately, used while they stay alike."""

    names: tuple[str, ...]  # the head's then the tail's
    shapes: tuple[tuple[int, ...], ...]
    tail_names: tuple[str, ...]
    tail_shapes: tuple[tuple[int, ...], ...]
    head_bytes: int  # where the tail starts in the payload
    reductions: tuple | None = None  # per tensor, what the writer computes from it (None: nothing)
    writer: Any = None  # the writer of `writer_layout`, its batch_layout() of names and shapes
    writer_layout: Any = None

    @classmethod
    def join(cls, head: BatchSpec, tail: BatchSpec, tail_names: tuple[str, ...]) -> StepLayout | None:
        """The layout of `head` then `tail` (whose names, with small tensors after them, are `tail_names`) in one
        message, or None when they cannot share one (dtypes differ, the head's sources are not fixed)."""
        if (head.sources is None or head.shapes is None or tail.shapes is None or head.dtype is not tail.dtype
                or head.np_dtype is None):
            return None
        reds = None
        if head.reductions is not None or tail.reductions is not None:
            reds = pad(head.reductions, len(head.names)) + pad(tail.reductions, len(tail_names))
        return cls(head.names + tail_names, head.shapes + tail.shapes, tail_names, tail.shapes,
                   sum(n for _a, n in head.sources), reds)

    def reserve(self, writer: Any, clock: StepClock, np_dtype: Any) -> Any:
        if self.writer is not writer:
            self.writer_layout = writer.batch_layout(self.names, np_dtype, self.shapes, self.reductions)
            self.writer = writer
        mode = clock.mode
        return writer.reserve_batch(self.names, np_dtype, self.shapes, clock.step, mode._value_,
                                    clock.mode_steps[mode], self.writer_layout, self.reductions)


def array_sources(arrays: Sequence[np.ndarray]) -> tuple[list[tuple[int, int]], tuple[tuple[int, ...], ...]] | None:
    """(address, byte count) and shape of each array when they are C-contiguous numpy arrays of one dtype that
    owns its byte layout (no object dtype), else None."""
    dtype = arrays[0].dtype
    if dtype.hasobject:
        return None
    sources = []
    for a in arrays:
        if a.dtype != dtype or not a.flags.c_contiguous:
            return None
        sources.append((a.ctypes.data, a.nbytes))
    return sources, tuple(a.shape for a in arrays)
