"""The writer contract: what a hook hands its tensors to.

Two implementations: `ChunkWriter` (a writer thread in the training process; object stores, other platforms)
and `ProcessChunkWriter` (a writer process fed through a shared-memory ring; local out_dirs on Linux). A hook
uses only what `Writer` names, so a framework hook works with either.

Hand-offs, from the cheapest for the training thread:
* `reserve_batch(names, dtype, shapes, step, mode, mode_step)`: room for a batch of raw tensors of one dtype;
  the caller copies their bytes in with `Reservation.copy_in(sources)` ((address, byte count) pairs, e.g. of
  contiguous numpy arrays or CPU tensors) and then `commit()`s (or `cancel()`s) it. The writer process's room is
  in its ring (one copy, no host buffer); the writer thread's is a host buffer.
* `submit_batch(RecordBatch)`: raw tensors already on the host, one hand-off.
* `submit_scalars(ScalarRows)`: float scalars of several steps (e.g. metrics kept over several rounds), one
  hand-off.
* `submit_many(records)` / `submit(record)`: anything, with reductions computed by the writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tensortap.format.writer import Record, RecordBatch, ScalarRows

__all__ = ["Reservation", "Writer", "open_writer"]


@runtime_checkable
class Reservation(Protocol):
    """Room for one batch of raw tensors (names, dtype and shapes fixed at `reserve_batch`), filled by the caller."""

    nbytes: int  # the payload's size: the tensors' bytes, back to back

    def copy_in(self, sources: Sequence[tuple[int, int]], at: int = 0) -> None:
        """Copy each (address, byte count) back to back into the payload from byte `at` on (ValueError if they
        do not fit). The caller guarantees the addresses are readable for that many bytes."""

    def commit(self) -> None:
        """The payload is filled in: hand it to the writer."""

    def cancel(self) -> None:
        """Hand nothing over."""

    def shrink(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
               reductions: tuple | None = None) -> None:
        """Hand over only the first `len(names)` tensors (a prefix of those reserved)."""


@runtime_checkable
class Writer(Protocol):
    """Appends one worker's records to the store; every method is safe to call after a failure (it then drops
    and counts, never raises into training)."""

    dropped_records: int  # records handed over and not saved (counted, reported once)
    error: BaseException | None  # the writer failed: no more data is saved
    #: a step mark with records handed over since the last makes them readable at once, and the next mark waits
    #: for that (docs/format.md §7); False when the caller closes the writer next
    prompt_marks: bool

    @property
    def written_records(self) -> int: ...

    def batch_layout(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                     reductions: tuple | None = None) -> Any:
        """What `reserve_batch` needs of a batch layout, for callers that reserve it again and again."""

    def reserve_batch(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                      step: int, mode: int, mode_step: int, layout: Any = None,
                      reductions: tuple | None = None) -> Reservation | bool | None:
        """Room for a batch; False when it was dropped under backpressure (counted), None when the batch cannot
        be reserved (too large: hand it off with `submit_batch`). `reductions`: per tensor, the (name, abs)
        reductions the writer computes from it, off the training thread, and stores beside it."""

    def submit(self, record: Record) -> bool: ...

    def submit_many(self, records: list[Record] | tuple[Record, ...]) -> int: ...

    def submit_batch(self, batch: RecordBatch) -> int: ...

    def submit_scalars(self, rows: ScalarRows) -> int: ...

    def mark_step_passed(self, step: int, mode_steps: dict[str, int]) -> None:
        """Nothing more comes for `step` (and these mode steps); readers learn it once its records are written."""

    def set_collections(self, collections_json: dict[str, Any]) -> None: ...

    def flush(self, timeout: float | None = 30.0) -> bool: ...

    def close(self, timeout: float | None = 60.0) -> None: ...


def open_writer(kind: str, storage: Any, worker: str, **options: Any) -> Writer:
    """A writer of `kind` ("thread" or "process") for `worker` on `storage`. A writer process that cannot start
    (e.g. no memory for its ring) raises OSError; the caller then opens a thread writer. A thread writer's
    TensorBoard export is a sink the caller attaches (`exporter=`); a writer process takes `tensorboard_dir=`
    and attaches it in the child."""
    if kind == "process":
        from tensortap.transport.process_writer import ProcessChunkWriter

        return ProcessChunkWriter(storage, worker, **options)
    from tensortap.format.writer import ChunkWriter
    from tensortap.transport.copy import gather_into

    options.setdefault("gather", gather_into)
    return ChunkWriter(storage, worker, **options)
