"""The writer contract: what a hook hands its tensors to.

Two implementations wrap the same synchronous encoder (`tensortap.format.writer.ChunkEncoder`):
`tensortap.transport.thread_writer.ChunkWriter` (a writer thread in the training process; object stores, other
platforms) and `tensortap.transport.process_writer.ProcessChunkWriter` (a writer process fed through a
shared-memory ring; local out_dirs on Linux). A hook gets one from `open_writer` and uses only what `Writer`
names, its declared capabilities included (`reserve_min_bytes`), so a framework hook works with either.

Hand-offs, from the cheapest for the training thread:
* `reserve_batch(names, dtype, shapes, step, mode, mode_step)`: room for a batch of raw tensors of one dtype;
  the caller copies their bytes in with `Reservation.copy_in(sources)` ((address, byte count) pairs, e.g. of
  contiguous numpy arrays or CPU tensors) and then `commit()`s (or `cancel()`s) it. The writer process's room is
  in its ring (one copy, no host buffer); the writer thread's is a host buffer.
* `submit_batch(RecordBatch)`: raw tensors already on the host, one hand-off.
* `submit_scalars(ScalarRows)`: float scalars of several steps (e.g. metrics kept over several rounds), one
  hand-off.
* `submit_statistics(StatisticsRows)`: the statistics of a step's tensors, computed by the caller where the
  tensors live, as one vector (its `StatisticsLayout` built once and kept): one hand-off per step.
* `submit_many(records)` / `submit(record)`: anything, with reductions computed by the writer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tensortap.format.records import Record, RecordBatch, ScalarRows, StatisticsRows

logger = logging.getLogger("tensortap")

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
    #: "thread" or "process"
    kind: str
    #: capability: a batch of fewer bytes is cheaper handed over as host arrays (`submit_batch`) than through
    #: `reserve_batch` (a writer thread's reservation is a host buffer: one copy more)
    reserve_min_bytes: int

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

    def submit_statistics(self, rows: StatisticsRows) -> int:
        """The statistics of a step's tensors in one hand-off (all or none): how many records were accepted."""

    def mark_step_passed(self, step: int, mode_steps: dict[str, int]) -> None:
        """Nothing more comes for `step` (and these mode steps); readers learn it once its records are written."""

    def mark_steps(self, step: int, train: int, eval_: int, predict: int, global_: int) -> None:
        """`mark_step_passed` with the mode steps as numbers (a negative one: that mode has not begun)."""

    def set_collections(self, collections_json: dict[str, Any]) -> None: ...

    def flush(self, timeout: float | None = 30.0) -> bool: ...

    def close(self, timeout: float | None = 60.0) -> None: ...


def open_writer(kind: str, storage: Any, worker: str, *, tensorboard_dir: str | None = None,
                first_seq: int | None = None, start_after: float = 0.0, **options: Any) -> Writer:
    """A writer of `kind` ("thread" or "process") for `worker` on `storage`: the one way hooks make theirs.

    A writer process needs ordered shared counters (the C helper, or an x86-64 CPU) and room for its ring; where
    it cannot start, one warning and a writer thread instead (`Writer.kind` says which). `tensorboard_dir`: the
    TensorBoard export, a sink attached to the encoder (in the writer process, by the child). `first_seq` is the
    writer thread's (see `ChunkWriter`); `start_after` (seconds: a late start of the writer thread, or of the writer
    process, see `ProcessChunkWriter`) and `options` are both writers' (num_workers,
    flush_interval, chunk_bytes, max_pending_bytes, backpressure, metadata, ...)."""
    if kind not in ("thread", "process"):
        raise ValueError(f"writer must be 'thread' or 'process', not {kind!r}")
    if kind == "process":
        from tensortap.transport.copy import ORDERED

        if not ORDERED:
            logger.warning("tensortap: writer='process' needs ordered shared counters (the C helper, or an x86-64 "
                           "CPU); writing from a thread instead")
        else:
            from tensortap.transport.process_writer import ProcessChunkWriter

            try:
                return ProcessChunkWriter(storage, worker, tensorboard_dir=tensorboard_dir, start_after=start_after,
                                          **options)
            except OSError as e:  # e.g. /dev/shm too small, no way to start a process: the thread
                logger.warning("tensortap: cannot start the writer process (%s); writing from a thread instead", e)
    from tensortap.transport.copy import gather_into
    from tensortap.transport.thread_writer import ChunkWriter

    exporter = options.pop("exporter", None)  # (a sink of the caller's own)
    if tensorboard_dir and exporter is None:
        from tensortap.tensorboard.export import EventExporter

        exporter = EventExporter(tensorboard_dir, worker)
    options.setdefault("gather", gather_into)
    return ChunkWriter(storage, worker, first_seq=first_seq, start_after=start_after, exporter=exporter, **options)
