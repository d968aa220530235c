"""The background writer: the training thread hands off records; one thread encodes and appends them.

Memory is bounded by `max_pending_bytes`. When storage falls behind and that bound is reached, the
policy decides: "block" (default) makes `submit` wait for room, up to `block_timeout` seconds, and then
drops; "drop" drops at once. Drops are counted (`dropped_records`) and warned about once.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap.format import codec, layout
from tensortap.format.entries import (
    INLINE_BYTES,
    NO_REDUCTION,
    RAW,
    REDUCTION,
    SHAPE,
    reduction_code,
)
from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")
_MODE_NAME = {1: "TRAIN", 2: "EVAL", 3: "PREDICT", 4: "GLOBAL"}


@dataclass
class Record:
    """One tensor of one step, as handed to the writer.

    `value` is the raw array (already on the host) or None. `reductions` lists (name, abs) to compute
    from `value` in the writer thread; `reduction_values` holds reductions computed elsewhere
    (e.g. on the GPU). `save_raw` stores the value itself; `save_shape` stores the shape alone when
    nothing else records it.
    """

    name: str
    step: int
    mode: int
    mode_step: int
    value: np.ndarray | None = None
    save_raw: bool = True
    reductions: tuple[tuple[str, bool], ...] = ()
    reduction_values: dict[tuple[str, bool], Any] = field(default_factory=dict)
    save_shape: bool = False
    shape: tuple[int, ...] | None = None

    def nbytes(self) -> int:
        return 256 + (self.value.nbytes if self.value is not None else 0)


class RecordBatch:
    """Several raw tensors of one step in one hand-off (no reductions, no shape-only entries).

    `names` is a tuple the caller keeps stable from step to step (the writer caches the block's table
    ids per names/shapes), `arrays` the host arrays in the same order. `flat`, when given, is one
    C-contiguous array of the arrays' dtype whose bytes are exactly the arrays' bytes concatenated
    in order (the arrays are views of it): the writer then appends runs of payloads with one write
    each. The caller hands the arrays over: it must not change them afterwards.
    """

    __slots__ = ("names", "arrays", "flat", "step", "mode", "mode_step", "size", "reductions")

    def __init__(self, names: tuple[str, ...], arrays: list[np.ndarray], flat: np.ndarray | None,
                 step: int, mode: int, mode_step: int, reductions: tuple | None = None):
        #: per tensor, the (name, abs) reductions the writer computes from it and stores beside it (None: none)
        self.reductions = reductions
        self.names = names
        self.arrays = arrays
        self.flat = flat
        self.step = step
        self.mode = mode
        self.mode_step = mode_step
        self.size = 256 * len(arrays) + (flat.nbytes if flat is not None else sum(a.nbytes for a in arrays))

    def nbytes(self) -> int:
        return self.size

    def records(self) -> list[Record]:
        reds = self.reductions or ((),) * len(self.names)
        return [Record(name=n, step=self.step, mode=self.mode, mode_step=self.mode_step, value=a, reductions=r)
                for n, a, r in zip(self.names, self.arrays, reds, strict=True)]


class ScalarRows:
    """Float scalars of several steps of one mode in one hand-off, each saved raw (no reductions): value
    `values[i]` of tensor `names[name[i]]` at global step `steps[i]` and mode step `mode_steps[i]`, in order.
    The caller hands the lists over: it must not change them afterwards."""

    __slots__ = ("names", "name", "steps", "mode", "mode_steps", "values")

    def __init__(self, names: list[str], name: list[int], steps: list[int], mode: int, mode_steps: list[int],
                 values: list[float]):
        self.names, self.name, self.steps, self.mode = names, name, steps, mode
        self.mode_steps, self.values = mode_steps, values

    def __len__(self) -> int:
        return len(self.values)

    def nbytes(self) -> int:
        return 64 * len(self.values) + 256

    def records(self) -> list[Record]:
        names, mode = self.names, self.mode
        return [Record(names[i], step, mode, mode_step, np.array(v, dtype=np.float64))
                for i, step, mode_step, v in zip(self.name, self.steps, self.mode_steps, self.values, strict=True)]


class HostReservation:
    """A thread writer's `Reservation` (see tensortap.capture.writer): a host buffer the caller copies a batch's
    bytes into; `commit` hands it to the writer thread as one RecordBatch."""

    __slots__ = ("nbytes", "_writer", "_names", "_dtype", "_shapes", "_flat", "_step", "_mode", "_mode_step", "_done",
                 "_reductions")

    def __init__(self, writer: ChunkWriter, names: tuple[str, ...], dtype: np.dtype,
                 shapes: tuple[tuple[int, ...], ...], step: int, mode: int, mode_step: int,
                 reductions: tuple | None = None):
        self._reductions = reductions
        count = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        self._flat = np.empty(count, dtype=dtype)
        self.nbytes = self._flat.nbytes
        self._writer, self._names, self._dtype, self._shapes = writer, names, dtype, shapes
        self._step, self._mode, self._mode_step = step, mode, mode_step
        self._done = False

    def copy_in(self, sources: list[tuple[int, int]], at: int = 0) -> None:
        if at + sum(n for _a, n in sources) > self.nbytes:
            raise ValueError("copy_in: the sources do not fit the reservation")
        self._writer.gather(self._flat.ctypes.data + at, sources)

    def shrink(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
               reductions: tuple | None = None) -> None:
        count = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        if reductions is not None:
            self._reductions = reductions
        elif self._reductions is not None:
            self._reductions = self._reductions[:len(names)]
        self._flat = self._flat[:count]
        self.nbytes = self._flat.nbytes
        self._names, self._shapes = names, shapes

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        flat = self._flat
        arrays = []
        off = 0
        for shape in self._shapes:
            k = int(np.prod(shape, dtype=np.int64))
            arrays.append(flat[off:off + k].reshape(shape))
            off += k
        self._writer.submit_batch(RecordBatch(self._names, arrays, flat, self._step, self._mode, self._mode_step,
                                              self._reductions))

    def cancel(self) -> None:
        self._done = True


def memmove_gather(address: int, sources: list[tuple[int, int]]) -> int:
    """Copy each (source address, byte count) back to back to `address`; the bytes copied. (A writer's default
    `gather`: the hooks give it tensortap.transport.copy's, with streaming stores where built.)"""
    total = 0
    for src, n in sources:
        ctypes.memmove(address + total, src, n)
        total += n
    return total


def compute_reduction(arr: np.ndarray, name: str, abs_: bool) -> np.ndarray:
    """A reduction of `arr` as a 0-d array. Norms are flattened vector norms, for every framework."""
    if name == "nonfinite":  # NaN and ±Inf elements (0 for integer and boolean tensors)
        if arr.dtype.kind in "fc" or arr.dtype.kind == "V" or arr.dtype == np.float16:
            x = arr.astype(np.float32) if arr.dtype.kind == "V" else arr
            return np.asarray(np.int64(arr.size - np.count_nonzero(np.isfinite(x))))
        return np.asarray(np.int64(0))
    x = np.abs(arr) if abs_ else arr
    if x.dtype.kind == "b" or x.dtype.kind in "iu" and name in ("mean", "std", "variance", "median", "l2"):
        x = x.astype(np.float64)
    elif x.dtype.kind == "V" or x.dtype == np.float16:
        x = x.astype(np.float32)  # bfloat16 / float16: reduce in float32 like the frameworks do
    flat = x.ravel()
    if name == "min":
        r = np.min(flat)
    elif name == "max":
        r = np.max(flat)
    elif name == "mean":
        r = np.mean(flat)
    elif name == "std":
        r = np.std(flat)
    elif name == "variance":
        r = np.var(flat)
    elif name == "sum":
        r = np.sum(flat)
    elif name == "prod":
        r = np.prod(flat)
    elif name == "median":
        r = np.median(flat)
    elif name == "l1":
        r = np.linalg.norm(flat, ord=1)
    elif name == "l2":
        r = np.linalg.norm(flat, ord=2)
    else:
        raise ValueError(f"unknown reduction {name!r}")
    return np.asarray(r)


def _byte_view(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a 1-d uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


def _write_all(f: Any, buf: Any) -> None:
    """Write all of `buf` (any C-contiguous buffer) to `f`: the write releases the GIL and copies nothing."""
    view = memoryview(buf).cast("B")
    while len(view):
        n = f.write(view)
        if n is None:  # a non-blocking raw stream: nothing written yet
            continue
        view = view[n:]


#: errors that mean the storage is full: the writer stops writing payloads and counts every record as dropped
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: set aside for the index blocks a writer still writes once the disk is full (docs/format.md §4): the block of
#: what fitted (fewer records while it does not fit, their payloads cut off the data file) and the end of the job
RESERVE_BYTES = 16 << 10
_MAX_MARKS = 4096  # step marks waiting for their records (older ones are superseded by newer ones)
#: a step mark asks for an index block at once (and the next one waits for it) at most once per this share of the
#: flush interval (50 ms by default): on the MLP of bench/pytorch_overhead.py (1 ms steps) a block and a wake-up of
#: the writer at every step cost the training thread +214 to +295 us a step (docs/format.md §7, bench/RESULTS.md)
PROMPT_GAP = 0.1


def storage_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in STORAGE_FULL_ERRNOS


_DIRECT_WRITE = 1 << 16  # payloads at least this large are written straight from their arrays
_PENDING_WRITE = 1 << 20  # smaller ones are gathered and written once this many bytes are waiting
_BLOCK_BYTES = 64 << 20  # write an index block at least once per this many payload bytes


class _Template:
    """Entries of a batch layout (names, shapes, dtype) against the current block's tables."""

    __slots__ = ("rows", "lengths", "total", "spans", "rel", "outline", "inline", "runs")

    def __init__(self, rows: np.ndarray, lengths: list[int], runs: list[tuple[int, int]]):
        self.rows = rows  # name, kind, reduction, flags, dtype, shape and length filled in
        self.lengths = lengths
        self.total = sum(lengths)
        self.spans: list[tuple[int, int]] = []  # of each payload in the batch's flat bytes
        pos = 0
        for n in lengths:
            self.spans.append((pos, pos + n))
            pos += n
        # positions of the payloads written to the data file, and of those stored inline
        self.outline = [i for i, n in enumerate(lengths) if n > INLINE_BYTES]
        self.inline = [i for i, n in enumerate(lengths) if n <= INLINE_BYTES]
        outline = self.outline
        # offsets of those payloads relative to the batch's first written byte
        rel = np.zeros(len(outline), dtype=np.uint64)
        pos = 0
        for j, i in enumerate(outline):
            rel[j] = pos
            pos += lengths[i]
        self.rel = rel
        self.runs = runs  # (first, end) positions of runs of consecutive written payloads


class _Tables:
    """Block-local tables of names, dtypes and shapes."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.dtypes: dict[str, int] = {}
        self.shapes: dict[tuple[int, ...], int] = {}

    @staticmethod
    def _id(table: dict, key: Any) -> int:
        i = table.get(key)
        if i is None:
            i = table[key] = len(table)
        return i

    def to_header(self) -> dict[str, Any]:
        return {"names": list(self.names), "dtypes": list(self.dtypes), "shapes": [list(s) for s in self.shapes]}


_STOP = object()
#: hand-offs pending past this many bytes wake the writer thread at once; smaller ones wait for its next flush (a
#: wake-up per hand-off costs both threads more than encoding a few small records)
_KICK_BYTES = 1 << 20
_RECORDS = object()  # a queue item of several records handed off together
_NEVER = float("inf")
_FLOAT64 = codec.dtype_to_str(np.dtype("<f8"))


class ChunkWriter:
    """Appends one worker's records to chunk files (`.dat` payloads + `.idx` index blocks).

    Every `flush_interval` seconds (and at `flush()`/`close()`), payloads are written and flushed to
    the data file first, then one index block describing them is appended to the index file. A
    reader therefore never finds an index entry whose payload is not on disk, and a crash loses at
    most what was not flushed yet.
    """

    def __init__(
        self,
        storage: Storage,
        worker: str,
        *,
        num_workers: int = 1,
        flush_interval: float = 0.5,
        chunk_bytes: int = 256 << 20,
        max_pending_bytes: int = 512 << 20,
        backpressure: str = "block",
        block_timeout: float = 30.0,
        seal_interval: float = 2.0,
        sealed_chunk_bytes: int = 32 << 20,
        metadata: dict[str, Any] | None = None,
        exporter: Any = None,
        first_seq: int | None = None,
        start_after: float = 0.0,
        gather: Any = None,
    ):
        """`first_seq`: the first free chunk number when the caller knows it (else the writer thread lists the
        worker's folder). `start_after`: the writer thread starts at the first hand-off or step mark at least
        this many seconds after the writer was made (or at a flush, a drain, or a backlog of `_KICK_BYTES`);
        until then hand-offs wait in the queue, and a writer closed before its thread started writes on the
        closing thread (docs/format.md §7). 0: the thread starts at once. `exporter`: a sink given every record
        written (below). `gather`: the copy a reservation's `copy_in` uses (default: `memmove_gather`)."""
        if backpressure not in ("block", "drop"):
            raise ValueError(f"backpressure must be 'block' or 'drop', not {backpressure!r}")
        if isinstance(start_after, bool) or not isinstance(start_after, int | float) or not start_after >= 0:
            raise ValueError(f"start_after must be a number of seconds >= 0, not {start_after!r}")
        #: a sink the caller attaches (the TensorBoard export, tensortap.tensorboard.export.EventExporter) that
        #: gets every record this writer persists, off the training thread: add(name, step, mode, mode_step,
        #: value, reductions), set_collections(json), flush() at each index block, close(); its `behind` is set to
        #: a function telling whether this writer has a backlog (histograms wait then)
        self.exporter = exporter
        if exporter is not None:
            exporter.behind = self._behind
        #: gather(address, sources): copies a reservation's sources in (see HostReservation.copy_in)
        self.gather = gather or memmove_gather
        self.storage = storage
        self.worker = worker
        self.num_workers = num_workers
        self.flush_interval = flush_interval
        self.chunk_bytes = chunk_bytes
        self.max_pending_bytes = max_pending_bytes
        self.backpressure = backpressure
        self.block_timeout = block_timeout
        self.seal_interval = seal_interval
        #: object stores cannot append: chunks are built in memory and published whole ("sealed")
        self.sealed_mode = not storage.supports_append
        if self.sealed_mode:
            # Object stores serve ranged GETs faster from smaller objects, and a reader lists chunks,
            # not steps: keep sealed chunks moderate.
            self.chunk_bytes = min(chunk_bytes, sealed_chunk_bytes)
        self._dat_buf = bytearray()
        self._idx_buf = bytearray()
        self._chunk_started = time.monotonic()
        self._unpublished: list[tuple[int, bytes, bytes, int]] = []  # (seq, data, index, records) awaiting upload
        self._unpublished_bytes = 0
        self._retry_at = 0.0
        self._retry_delay = 0.5
        self.outage = False  # publishing is failing; new records are dropped once the buffer is full
        self.metadata = dict(metadata or {})
        self.close_timeout = 30.0
        self.dropped_records = 0
        self.written_records = 0  # records taken into a block (in memory or written)
        self.durable_records = 0  # records in index blocks written (what a reader finds; object stores: published)
        self._sealed_records = 0  # (object stores) records in the chunks sealed so far
        self.full = False  # the storage ran out of space: no more payloads are written
        self.error: BaseException | None = None

        self._pending_bytes = 0
        self._submitted = 0  # records accepted by submit()
        self._encoded = 0  # records the writer thread has handled (taken into a block, or dropped)
        # (records submitted before the mark, the mark): every mark, so that a writer lagging behind the
        # training loop still publishes the newest one whose records it has all written
        self._marks: deque[tuple[int, dict[str, Any]]] = deque(maxlen=_MAX_MARKS)
        self._published_step = -1
        self._durable_dat = 0  # bytes of the data file that indexed payloads reach
        self._reserved = False
        self._room = threading.Condition()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._kick = threading.Event()  # wakes the writer thread before its next flush
        self._kick_bytes = min(_KICK_BYTES, max_pending_bytes // 4)
        self._seq = -1 if first_seq is None else first_seq  # the chunk being written (-1: not known yet)
        self._idx = self._dat = None
        self._dat_size = 0
        # State of the block being built (writer thread only).
        self._tables = _Tables()
        self._rows: list[tuple] = []  # entries of single records, not yet in _row_parts
        self._row_parts: list[np.ndarray] = []  # entries of the block so far, in order
        self._templates: dict[tuple, _Template] = {}  # batch layouts against the block's tables
        self._pend = bytearray()  # small payloads not yet written to the data file
        self._block_bytes = 0  # payload bytes since the last index block
        self._passed: dict[str, Any] | None = None
        self._collections: dict[str, Any] | None = None
        self._first_block = True
        self._flush_events: list[threading.Event] = []
        self._closed = False
        self._made = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"tensortap-writer-{worker}", daemon=True)
        #: time.monotonic() from which a hand-off or step mark starts the thread (inf: started)
        self._start_by = self._made + start_after
        if start_after <= 0:
            self._start()
        elif not self.sealed_mode:
            # The chunk's files are made now, right after the claim made the folder (the file system's paths are
            # warm: later, beside the training, the same calls cost ten times more).
            try:
                self._open_first_chunk()
            except BaseException as e:  # never raise into training; the hook checks .error
                self.error = e
                logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)

    def _start(self) -> None:
        if self._start_by != _NEVER:
            with self._room:
                if self._start_by != _NEVER:
                    self._start_by = _NEVER
                    self._thread.start()

    # --- training-thread side ---------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Bytes handed off and not yet taken by the writer thread (0: it has caught up)."""
        return self._pending_bytes

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until the writer thread has taken everything handed off so far (not a flush); True when
        done within `timeout`."""
        deadline = time.monotonic() + timeout
        self._start()
        self._kick.set()
        while self._pending_bytes:
            if self.error is not None or time.monotonic() >= deadline:
                return False
            time.sleep(0.0002)
        return True

    def submit(self, record: Record) -> bool:
        """Hand off a record; False if it was dropped under backpressure."""
        return self.submit_many((record,)) == 1

    def submit_many(self, records: list[Record] | tuple[Record, ...]) -> int:
        """Hand off several records at once (all or none): how many were accepted."""
        if self._closed or self.error is not None:
            return 0
        size = sum(r.nbytes() for r in records)
        if not self._reserve(size, len(records), len(records)):
            return 0
        self._queue.put(records[0] if len(records) == 1 else (_RECORDS, tuple(records), size))  # one hand-off
        if self._pending_bytes > self._kick_bytes:
            self._start()
            self._kick.set()
        elif time.monotonic() >= self._start_by:
            self._start()
        return len(records)

    def submit_batch(self, batch: RecordBatch) -> int:
        """Hand off a batch of raw tensors (all or none): how many tensors were accepted."""
        if self._closed or self.error is not None:
            return 0
        n = len(batch.arrays)
        if not self._reserve(batch.size, 1, n):
            return 0
        self._queue.put(batch)
        if self._pending_bytes > self._kick_bytes:
            self._start()
            self._kick.set()
        elif time.monotonic() >= self._start_by:
            self._start()
        return n

    def submit_scalars(self, rows: ScalarRows) -> int:
        """Hand off float scalars of several steps (all or none): how many were accepted."""
        if self._closed or self.error is not None:
            return 0
        n = len(rows)
        if not self._reserve(rows.nbytes(), 1, n):
            return 0
        self._queue.put(rows)
        if time.monotonic() >= self._start_by:
            self._start()
        return n

    def batch_layout(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                     reductions: tuple | None = None) -> Any:
        return None  # (nothing to prepare: a reservation is a host buffer)

    def reserve_batch(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                      step: int, mode: int, mode_step: int, layout: Any = None,
                      reductions: tuple | None = None) -> HostReservation | bool:
        """Room for a batch of raw tensors (see tensortap.capture.writer): a host buffer; the records count
        against `max_pending_bytes` when committed."""
        if self._closed or self.error is not None:
            return False
        return HostReservation(self, names, dtype, shapes, step, mode, mode_step, reductions)

    def mark_steps(self, step: int, train: int, eval_: int, predict: int, global_: int) -> None:
        """`mark_step_passed` with the mode steps as numbers (-1: none)."""
        passed = {n: v for n, v in (("TRAIN", train), ("EVAL", eval_), ("PREDICT", predict), ("GLOBAL", global_))
                  if v >= 0}
        self.mark_step_passed(step, passed)

    def _reserve(self, size: int, items: int, records: int) -> bool:
        with self._room:
            if self._pending_bytes + size > self.max_pending_bytes:
                self._start()
                self._kick.set()
                if self.backpressure == "block":
                    deadline = time.monotonic() + self.block_timeout
                    while self._pending_bytes + size > self.max_pending_bytes and self.error is None:
                        left = deadline - time.monotonic()
                        if left <= 0 or not self._thread.is_alive():
                            break
                        self._room.wait(min(left, 0.5))
                if self._pending_bytes + size > self.max_pending_bytes:
                    for _ in range(records):
                        self._drop()
                    return False
            self._pending_bytes += size
            self._submitted += items
        return True

    def _drop(self) -> None:
        if self.dropped_records == 0:
            logger.warning(
                "tensortap: storage is falling behind (%d bytes pending); dropping records "
                "(policy %r). Training continues.",
                self._pending_bytes,
                self.backpressure,
            )
        self.dropped_records += 1

    def mark_step_passed(self, step: int, mode_steps: dict[str, int]) -> None:
        """The worker finished global step `step` (and these mode steps): nothing more comes for them.

        Costs one attribute write on the training thread; the writer publishes the mark once every
        record submitted before it is written.
        """
        self._marks.append((self._submitted, {"step": step, "mode_steps": mode_steps}))
        if self._prompt_done < self._prompt_seq:
            self._await_prompt()  # (the step before this one handed something over: it is readable when this ends)
        if self._submitted != self._prompt_submitted and self.prompt_marks and not self._closed and (
                time.monotonic() - self._prompt_time >= self.flush_interval * PROMPT_GAP):
            # The step handed something over: readable by the time the next step ends (docs/format.md §7).
            self._prompt_time = time.monotonic()
            self._prompt_submitted = self._submitted
            self._prompt_seq += 1
            self._start()
            self._kick.set()
        elif time.monotonic() >= self._start_by:
            self._start()

    #: a step mark with records handed over since the last asks for an index block at once (False: the caller
    #: closes the writer next, which writes everything)
    prompt_marks = True
    _prompt_time = 0.0  # time.monotonic() of the last step mark that asked for an index block
    _prompt_submitted = 0  # hand-offs before the newest step mark that asked for an index block
    _prompt_seq = 0  # step marks that asked for one
    _prompt_done = 0  # ... made readable by the writer thread

    def _await_prompt(self) -> None:
        """Wait (a flush interval at most) until the writer thread has made the last prompted step readable."""
        deadline = time.monotonic() + self.flush_interval
        with self._room:
            while self._prompt_done < self._prompt_seq and self.error is None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._room.wait(left)

    def set_collections(self, collections_json: dict[str, Any]) -> None:
        self._queue.put(("collections", collections_json))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write out everything handed off so far; True when done within `timeout`."""
        ev = threading.Event()
        self._prompt_submitted = self._submitted  # (what was handed over is readable: the next mark asks for none)
        self._queue.put(("flush", ev))
        self._start()
        self._kick.set()
        return ev.wait(timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush, write the end-of-job block and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if self._start_by != _NEVER:  # (never started: what was handed off is written here)
            self._start_by = _NEVER
            self._run()
            return
        self._kick.set()
        self._thread.join(timeout)

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        last_flush = self._made  # (a thread started late writes what waited at once)
        try:
            if not self.sealed_mode and self._dat is None and not self.full:
                self._open_first_chunk()  # (beside the job's first steps, not when the first block is due)
            while True:
                timeout = max(0.0, self.flush_interval - (time.monotonic() - last_flush))
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    self._kick.wait(timeout)
                    self._kick.clear()  # (before the next get: a hand-off after it sets the event again)
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        item = None
                if item is _STOP:
                    self._write_block(end=True)
                    self._drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if isinstance(item, RecordBatch):
                    self._encode_batch(item)
                    size = item.size
                    item = None  # drop the arrays now (before the room is freed): the hook reuses their buffers
                    self._taken(size)
                elif isinstance(item, Record):
                    self._encode(item)
                    self._taken(item.nbytes())
                    item = None
                elif isinstance(item, ScalarRows):
                    self._encode_scalars(item)
                    self._taken(item.nbytes())
                    item = None
                elif isinstance(item, tuple) and item[0] is _RECORDS:
                    for r in item[1]:
                        self._encode(r)
                    self._taken(item[2])
                    item = None
                elif isinstance(item, tuple):
                    what, arg = item
                    if what == "collections":
                        self._take_collections(arg)
                    elif what == "flush":
                        self._flush_events.append(arg)
                        self._write_block()
                        last_flush = time.monotonic()
                prompt = self._prompt_seq
                if prompt != self._prompt_done and self._queue.empty():
                    # (a step mark asks for its records to be readable: every hand-off before it is encoded)
                    self._write_block()
                    last_flush = time.monotonic()
                    with self._room:
                        self._prompt_done = prompt
                        self._room.notify_all()
                elif time.monotonic() - last_flush >= self.flush_interval or self._block_bytes > _BLOCK_BYTES:
                    self._write_block()
                    last_flush = time.monotonic()
                if self._unpublished and time.monotonic() >= self._retry_at:
                    self._publish_pending()
        except BaseException as e:  # never raise into training; the hook checks .error
            self.error = e
            logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)
            with self._room:
                self._room.notify_all()
        finally:
            if self.exporter is not None:
                self.exporter.close()
            for ev in self._flush_events:
                ev.set()
            for f in (self._dat, self._idx) if not self.sealed_mode else ():
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass

    def _taken(self, size: int) -> None:
        """A hand-off of `size` bytes is encoded: its room is free again."""
        with self._room:
            self._pending_bytes -= size
            self._room.notify_all()

    def _behind(self) -> bool:
        """Whether the records waiting for this writer are a backlog: over 1/8 of what may wait."""
        return self._pending_bytes > self.max_pending_bytes // 8

    def _take_collections(self, collections_json: dict[str, Any]) -> None:
        self._collections = collections_json
        if self.exporter is not None:
            self.exporter.set_collections(collections_json)

    def _open_first_chunk(self) -> None:
        try:
            self._open_chunk()
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, 0)  # (as when the first record finds the disk full)

    def _first_free_seq(self) -> int:
        keys = self.storage.list(layout.worker_dir(self.worker) + "/")
        seqs = [p[1] for k in keys if (p := layout.parse_chunk_key(k))]
        return max(seqs) + 1 if seqs else 0

    def _open_chunk(self) -> None:
        if self._seq < 0:
            self._seq = self._first_free_seq()  # (a listing: on the writer thread)
        if self.sealed_mode:
            self._dat = self._idx = True  # marks the chunk open; bytes go to _dat_buf / _idx_buf
            self._dat_buf = bytearray()
            self._idx_buf = bytearray()
            self._chunk_started = time.monotonic()
        else:
            if not self._reserved:
                self._reserved = True
                try:
                    self.storage.reserve(layout.reserve_key(self.worker), RESERVE_BYTES)
                except OSError:
                    pass  # (already short of space: nothing to set aside)
            self._dat = self.storage.open_append(layout.chunk_key(self.worker, self._seq, layout.DATA_SUFFIX))
            self._idx = self.storage.open_append(layout.chunk_key(self.worker, self._seq, layout.INDEX_SUFFIX))
        self._dat_size = 0
        self._durable_dat = 0
        self._idx_size = 0
        self._first_block = True

    def _add_payload(self, buf: bytes | np.ndarray) -> tuple[int, int, int, bytes]:
        """(flags, offset, crc, inline) for a payload (bytes, or a 1-d uint8 view of a record's array):
        inline when small, else appended to the data file."""
        if len(buf) <= INLINE_BYTES:
            return codec.FLAG_INLINE, 0, 0, bytes(buf)
        return 0, self._append_data(buf), codec.crc32c(buf), b""

    def _append_data(self, buf: Any) -> int:
        """Append payload bytes to the data file (large ones at once, small ones gathered first); their
        offset. They are written before the index block that refers to them, and the caller's array is
        free once this returns."""
        off = self._dat_size
        view = memoryview(buf).cast("B")
        n = len(view)
        if self.sealed_mode:
            self._dat_buf += view
        elif n >= _DIRECT_WRITE:
            if self._pend:
                self._write_pending()
            _write_all(self._dat, view)
        else:
            self._pend += view
            if len(self._pend) >= _PENDING_WRITE:
                self._write_pending()
        self._dat_size += n
        self._block_bytes += n
        return off

    def _write_pending(self) -> None:
        _write_all(self._dat, self._pend)
        self._pend = bytearray()

    def _template(self, b: RecordBatch, dtype_str: str | None) -> _Template:
        t = self._tables
        arrays = b.arrays
        n = len(arrays)
        rows = np.zeros(n, dtype=codec.DISK_ENTRY_DTYPE)
        names = [t._id(t.names, name) for name in b.names]
        shapes = [t._id(t.shapes, tuple(a.shape)) for a in arrays]
        if dtype_str is not None:
            dtypes = [t._id(t.dtypes, dtype_str)] * n
        else:
            dtypes = [t._id(t.dtypes, codec.dtype_to_str(a.dtype)) for a in arrays]
        lengths = [a.nbytes for a in arrays]
        rows["name"] = names
        rows["kind"] = RAW
        rows["reduction"] = NO_REDUCTION
        rows["dtype"] = dtypes
        rows["shape"] = shapes
        rows["length"] = lengths
        runs: list[tuple[int, int]] = []
        for i in range(n):
            if lengths[i] <= INLINE_BYTES:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        tmpl = _Template(rows, lengths, runs)
        if tmpl.inline:
            rows["flags"][tmpl.inline] = codec.FLAG_INLINE
        return tmpl

    def _encode_batch(self, b: RecordBatch) -> None:
        if self.full:
            self.dropped_records += len(b.arrays)
            self._encoded += 1
            return
        try:
            self._encode_batch_rows(b)
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, len(b.arrays))
            self._encoded += 1

    def _encode_batch_rows(self, b: RecordBatch) -> None:
        if self._dat is None:
            self._open_chunk()
        arrays = b.arrays
        flat = b.flat
        dtype_str = codec.dtype_to_str(flat.dtype) if flat is not None else None
        key = (b.names, dtype_str, *[a.shape for a in arrays])
        tmpl = self._templates.get(key)
        if tmpl is None:
            tmpl = self._templates[key] = self._template(b, dtype_str)
        if flat is not None and flat.nbytes == tmpl.total:
            byte_flat = flat.reshape(-1).view(np.uint8)
            pieces = [byte_flat[i:j] for i, j in tmpl.spans]
            if not tmpl.inline:
                offsets = tmpl.rel + self._append_data(byte_flat)  # every payload, in one write
            else:
                # Each run of written payloads at the offset _append_data gives it: a writer may place a run
                # on a page boundary (the writer process's direct writes), so runs need not be contiguous.
                offsets = np.empty(len(tmpl.outline), dtype=np.uint64)
                spans = tmpl.spans
                j = 0
                for first, end in tmpl.runs:
                    start = spans[first][0]
                    at = self._append_data(byte_flat[start:spans[end - 1][1]])
                    for i in range(first, end):
                        offsets[j] = at + spans[i][0] - start
                        j += 1
        else:
            byte_flat = None
            pieces = [_byte_view(a) for a in arrays]
            offsets = np.array([self._append_data(pieces[i]) for i in tmpl.outline], dtype=np.uint64)
        crc = codec.crc32c
        crc_at = codec.crc32c_at
        if crc_at is not None and byte_flat is not None and not tmpl.inline:
            addr = byte_flat.ctypes.data  # (byte_flat keeps the memory alive)
            crcs = [crc_at(addr + i, j - i) for i, j in tmpl.spans]
        else:
            crcs = None
        rows = tmpl.rows.copy()
        rows["mode"] = b.mode
        rows["step"] = b.step
        rows["mode_step"] = b.mode_step
        if not tmpl.inline:
            rows["offset"] = offsets
            rows["crc"] = crcs if crcs is not None else [crc(p) for p in pieces]
        else:
            outline = tmpl.outline
            if outline:
                rows["offset"][outline] = offsets
                rows["crc"][outline] = [crc(pieces[i]) for i in outline]
            for i in tmpl.inline:
                rows["inline"][i] = pieces[i].tobytes().ljust(INLINE_BYTES, b"\0")
        if self._rows:
            self._row_parts.append(np.array(self._rows, dtype=codec.DISK_ENTRY_DTYPE))
            self._rows.clear()
        self._row_parts.append(rows)
        reds = b.reductions
        if reds is not None:
            for name, arr, wanted in zip(b.names, arrays, reds, strict=True):
                if wanted:
                    self._add_reductions(name, arr, b.mode, b.step, b.mode_step, wanted, {})
        if self.exporter is not None:
            mode = _MODE_NAME[b.mode]
            for i, (name, arr) in enumerate(zip(b.names, arrays, strict=True)):
                self.exporter.add(name, b.step, mode, b.mode_step, arr, self._last_reductions.get(name)
                                  if reds is not None and reds[i] else None)
        self._last_reductions = {}
        self.written_records += len(arrays)
        self._encoded += 1

    def _encode_scalars(self, rows: ScalarRows) -> None:
        if self.full or self.exporter is not None:  # (dropped and counted, or each exported)
            for r in rows.records():
                self._encode(r)
            return
        if self._dat is None:
            try:
                self._open_chunk()
            except OSError as e:
                if not storage_full(e):
                    raise
                self._storage_full(e, len(rows))
                self._encoded += 1
                return
        t = self._tables
        ids = np.array([t._id(t.names, name) for name in rows.names], dtype=np.uint32)
        n = len(rows)
        e = np.zeros(n, dtype=codec.DISK_ENTRY_DTYPE)
        e["name"] = ids[rows.name]
        e["mode"] = rows.mode
        e["kind"] = RAW
        e["reduction"] = NO_REDUCTION
        e["flags"] = codec.FLAG_INLINE
        e["dtype"] = t._id(t.dtypes, _FLOAT64)
        e["shape"] = t._id(t.shapes, ())
        e["step"] = rows.steps
        e["mode_step"] = rows.mode_steps
        e["length"] = 8
        inline = np.zeros((n, INLINE_BYTES), dtype=np.uint8)
        inline[:, :8] = np.asarray(rows.values, dtype="<f8").view(np.uint8).reshape(n, 8)
        e["inline"] = inline.view(e.dtype["inline"]).reshape(n)
        if self._rows:
            self._row_parts.append(np.array(self._rows, dtype=codec.DISK_ENTRY_DTYPE))
            self._rows.clear()
        self._row_parts.append(e)
        self.written_records += n
        self._encoded += 1

    def _encode(self, r: Record) -> None:
        if self.full:
            self.dropped_records += 1
            self._encoded += 1
            return
        try:
            self._encode_rows(r)
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, 1)
            self._encoded += 1

    def _encode_rows(self, r: Record) -> None:
        if self._dat is None:
            self._open_chunk()
        t = self._tables
        name_id = t._id(t.names, r.name)
        value = r.value
        shape = tuple(value.shape) if value is not None else tuple(r.shape or ())
        shape_id = t._id(t.shapes, shape)
        if (value is not None and r.save_raw and value.nbytes <= INLINE_BYTES and not r.reductions
                and not r.reduction_values and self.exporter is None):
            # (the usual scalar: its bytes inline in the entry, nothing else to store)
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype))
            self._rows.append((name_id, r.mode, RAW, NO_REDUCTION, codec.FLAG_INLINE, dtype_id, shape_id, r.step,
                               r.mode_step, 0, value.nbytes, 0, value.tobytes()))
            self.written_records += 1
            self._encoded += 1
            return
        wrote_any = False
        if value is not None and r.save_raw:
            buf = _byte_view(value)  # no copy: the record owns its array until the block is written
            flags, off, crc, inl = self._add_payload(buf)
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype))
            self._rows.append(
                (name_id, r.mode, RAW, NO_REDUCTION, flags, dtype_id, shape_id, r.step, r.mode_step,
                 off, len(buf), crc, inl)
            )
            wrote_any = True
        reductions = self._add_reductions(r.name, value, r.mode, r.step, r.mode_step, r.reductions,
                                          r.reduction_values, shape)
        wrote_any = wrote_any or bool(reductions)
        if self.exporter is not None:
            self._last_reductions = {}
            self.exporter.add(r.name, r.step, _MODE_NAME[r.mode], r.mode_step, value,
                              {("abs_" if a else "") + n: v for (n, a), v in reductions.items()})
        if r.save_shape and not wrote_any:
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype) if value is not None else "|V0")
            self._rows.append(
                (name_id, r.mode, SHAPE, NO_REDUCTION, 0, dtype_id, shape_id, r.step, r.mode_step, 0, 0, 0, b"")
            )
        self.written_records += 1
        self._encoded += 1

    _last_reductions: dict[str, dict[str, Any]] = {}  # of the batch being encoded, for the TensorBoard export

    def _add_reductions(self, name: str, value: np.ndarray | None, mode: int, step: int, mode_step: int,
                        wanted: tuple, given: dict, shape: tuple[int, ...] | None = None) -> dict:
        """Index entries for the reductions `wanted` of `value` (computed here) and those `given`; returns them."""
        t = self._tables
        reductions = dict(given)
        if value is not None and value.size > 0:
            for red in wanted:
                if red not in reductions:
                    try:
                        reductions[red] = compute_reduction(value, *red)
                    except (TypeError, ValueError) as e:
                        logger.debug("tensortap: reduction %s of %s skipped: %s", red, name, e)
        if not reductions:
            return reductions
        name_id = t._id(t.names, name)
        shape_id = t._id(t.shapes, tuple(value.shape) if value is not None else tuple(shape or ()))
        for (red_name, abs_), rv in reductions.items():
            rv = codec.as_storable(rv)
            buf = rv.tobytes()
            flags, off, crc, inl = self._add_payload(buf)
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(rv.dtype))
            self._rows.append(
                (name_id, mode, REDUCTION, reduction_code(red_name, abs_), flags, dtype_id, shape_id,
                 step, mode_step, off, len(buf), crc, inl)
            )
        if self.exporter is not None:
            if not self._last_reductions:
                self._last_reductions = {}
            self._last_reductions[name] = {("abs_" if a else "") + n: v for (n, a), v in reductions.items()}
        return reductions

    def _write_block(self, end: bool = False) -> None:
        if self.full and not end and not self._rows and not self._row_parts:
            # (the disk is full: the room left is for the end of the job; step marks wait for it)
            for ev in self._flush_events:
                ev.set()
            self._flush_events.clear()
            return
        try:
            self._write_block_now(end)
        except OSError as e:
            if not storage_full(e):
                raise
            if not self.full:
                self._storage_full(e, 0)
            # The block of what fitted, in the space set aside; while it does not fit, it keeps fewer records (their
            # payloads cut off the data file), down to the marks and the end alone.
            while True:
                try:
                    self._write_block_now(end)
                    break
                except OSError as e2:
                    if not storage_full(e2):
                        raise
                    if self._shed(keep_fraction=0.5):
                        continue
                    if self._collections is not None:  # (the end before a late change of the collections)
                        self._collections = None
                        continue
                    break
            for ev in self._flush_events:
                ev.set()
            self._flush_events.clear()

    def _storage_full(self, e: OSError, failed: int) -> None:
        """The storage is full: free the space set aside, keep the records of the block being built whose payloads
        are all in the data file (the rest is cut off it), and from now on count every record as dropped.
        `failed`: records of the hand-off being encoded when it happened (not yet counted as written)."""
        self.full = True
        try:
            self.storage.delete(layout.reserve_key(self.worker))
        except OSError:
            pass
        kept = self._keep_fitted()
        lost = self.written_records - self.durable_records + failed - kept
        self.written_records = self.durable_records + kept
        self.dropped_records += lost
        logger.warning("tensortap: no space left for the data of %s in %s (%s): %d records that did not fit are "
                       "dropped, and every later one is dropped and counted (dropped_records). What was saved "
                       "before stays readable. Training continues.", self.worker, self.storage.url,
                       os.strerror(e.errno or errno.ENOSPC), lost)

    def _block_entries(self) -> np.ndarray:
        """The entries of the block being built, in order, as one array (which then stands for them)."""
        if self._rows:
            self._row_parts.append(np.array(self._rows, dtype=codec.DISK_ENTRY_DTYPE))
            self._rows.clear()
        parts = self._row_parts
        if not parts:
            rows = np.empty(0, dtype=codec.DISK_ENTRY_DTYPE)
        elif len(parts) == 1:
            rows = parts[0]
        else:
            rows = np.frombuffer(b"".join([p.tobytes() for p in parts]), dtype=codec.DISK_ENTRY_DTYPE)
        self._row_parts = [rows] if len(rows) else []
        return rows

    def _keep_fitted(self) -> int:
        """Keep the block's records whose payloads all reached the data file (entries of a record go or stay
        together); cut the data file after the last of them. How many records stay."""
        if self.sealed_mode or self._dat is None:
            self._forget_block()
            return 0
        self._discard_unwritten()
        try:
            on_disk = os.fstat(self._dat.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            on_disk = self._durable_dat
        rows = self._block_entries()
        keys = rows[["name", "mode", "step"]]
        inline = (rows["flags"] & codec.FLAG_INLINE) != 0
        fits = inline | (rows["offset"] + rows["length"] <= on_disk)
        keep = ~np.isin(keys, np.unique(keys[~fits])) if not fits.all() else fits
        return self._keep_rows(rows, keep)

    def _shed(self, keep_fraction: float) -> bool:
        """Keep only the first `keep_fraction` of the block's records (the others dropped and counted): room for
        its index block. False when it holds none."""
        rows = self._block_entries()
        if not len(rows):
            return False
        keys = rows[["name", "mode", "step"]]
        _u, first = np.unique(keys, return_index=True)
        order = np.sort(first)
        stay = keys[order[:int(len(order) * keep_fraction)]]
        before = len(order)
        kept = self._keep_rows(rows, np.isin(keys, stay))
        self.written_records -= before - kept
        self.dropped_records += before - kept
        if not kept:
            self._forget_block()  # (its tables too: the header of the marks and the end alone)
        return True

    def _keep_rows(self, rows: np.ndarray, keep: np.ndarray) -> int:
        """Make `rows[keep]` the block's entries, the data file cut after their payloads; how many records they
        hold."""
        rows = rows[keep]
        self._row_parts = [rows] if len(rows) else []
        outline = rows[(rows["flags"] & codec.FLAG_INLINE) == 0]
        end = max(int((outline["offset"] + outline["length"]).max()) if len(outline) else 0, self._durable_dat)
        try:
            self._truncate_data(end)
        except OSError:
            pass
        self._dat_size = end
        return len(np.unique(rows[["name", "mode", "step"]])) if len(rows) else 0

    def _discard_unwritten(self) -> None:
        """Forget payload bytes gathered and not written yet (the disk is full: they did not fit)."""
        self._pend = bytearray()

    def _forget_block(self) -> None:
        self._rows.clear()
        self._row_parts = []
        self._pend = bytearray()
        self._tables = _Tables()
        self._templates = {}

    def _truncate_data(self, size: int) -> None:
        self._dat.flush()
        os.truncate(self._dat.name, size)

    def _write_block_now(self, end: bool = False) -> None:
        flushing = bool(self._flush_events)
        marks = self._marks
        mark = None
        while marks and marks[0][0] <= self._encoded:  # the newest mark whose records are all handled
            mark = marks.popleft()
        if mark is not None and mark[1]["step"] > self._published_step:
            self._passed = mark[1]
            self._published_step = mark[1]["step"]
        if not self._rows and not self._row_parts and self._passed is None and self._collections is None and not end:
            if self.sealed_mode and self._idx_buf and (self._seal_due() or flushing):
                self._seal()
            for ev in self._flush_events:
                ev.set()
            self._flush_events.clear()
            return
        if self._dat is None:
            self._open_chunk()
        header: dict[str, Any] = self._tables.to_header()
        header["worker"] = self.worker
        header["num_workers"] = self.num_workers
        header["time"] = time.time()
        if self._first_block:
            header["format_version"] = codec.FORMAT_VERSION
            header["metadata"] = self.metadata
        if self._passed is not None:
            header["passed"] = self._passed
        if self._collections is not None:
            header["collections"] = self._collections
        if end:
            header["end"] = True
        entries = self._block_entries()  # (np.concatenate of structured arrays is slow: it joins their bytes)
        # Payloads first (most are written already), then the index block that points at them.
        block = codec.encode_block(header, entries)
        if self.sealed_mode:
            self._idx_buf += block
        else:
            if self._pend:
                self._write_pending()
            self._dat.flush()
            start = self._idx_size
            try:
                _write_all(self._idx, block)  # one append (a short write is continued)
            except OSError:
                self._idx.flush()
                os.truncate(self._idx.name, start)  # no torn block before the ones written later
                raise
            self._idx_size = start + len(block)
        self._first_block = False
        if not self.sealed_mode:
            self.durable_records = self.written_records
        self._durable_dat = self._dat_size
        if self.exporter is not None:
            self.exporter.flush()
        self._rows.clear()
        self._row_parts = []
        self._block_bytes = 0
        self._tables = _Tables()
        self._templates = {}
        self._collections = None
        self._passed = None
        if self.sealed_mode:
            if end or flushing or self._dat_size >= self.chunk_bytes or self._seal_due():
                self._seal()
        elif self._dat_size >= self.chunk_bytes and not end:
            self._dat.close()
            self._idx.close()
            self._seq += 1
            self._open_chunk()
        for ev in self._flush_events:
            ev.set()
        self._flush_events.clear()

    # --- sealed chunks (object stores) ---------------------------------------------------------

    def _seal_due(self) -> bool:
        return time.monotonic() - self._chunk_started >= self.seal_interval

    def _seal(self) -> None:
        """Close the in-memory chunk and publish it (data object first, then its index)."""
        dat, idx = bytes(self._dat_buf), bytes(self._idx_buf)
        records, self._sealed_records = self.written_records - self._sealed_records, self.written_records
        if self._unpublished and self._unpublished_bytes + len(dat) + len(idx) > self.max_pending_bytes:
            # (the store has been down for a while: what waits for it is bounded; this chunk is lost, counted)
            self.dropped_records += records
            logger.warning("tensortap: %s is still unreachable and %d bytes wait for it: %d records dropped "
                           "(dropped_records)", self.storage.url, self._unpublished_bytes, records)
            records = 0
        else:
            self._unpublished.append((self._seq, dat, idx, records))
            with self._room:
                self._unpublished_bytes += len(dat) + len(idx)
        self._seq += 1
        self._dat = self._idx = None  # the next record opens a new chunk
        self._dat_buf = bytearray()
        self._idx_buf = bytearray()
        self._publish_pending()

    def _publish_pending(self) -> None:
        """Upload sealed chunks in order; on failure keep them and retry later with backoff."""
        while self._unpublished:
            seq, dat, idx, records = self._unpublished[0]
            try:
                if dat:
                    self.storage.write(layout.chunk_key(self.worker, seq, layout.DATA_SUFFIX), dat)
                self.storage.write(layout.chunk_key(self.worker, seq, layout.INDEX_SUFFIX), idx)
            except Exception as e:  # noqa: BLE001 - the store is unreachable: buffer and retry
                if not self.outage:
                    logger.warning("tensortap: cannot write to %s (%s); buffering up to %d bytes and retrying",
                                   self.storage.url, e, self.max_pending_bytes)
                self.outage = True
                self._retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, 10.0)
                return
            self._unpublished.pop(0)
            self.durable_records += records
            with self._room:
                self._unpublished_bytes -= len(dat) + len(idx)
                self._room.notify_all()
            if self.outage:
                logger.warning("tensortap: %s is reachable again; buffered data uploaded", self.storage.url)
            self.outage = False
            self._retry_delay = 0.5

    def _drain_unpublished(self, deadline: float) -> None:
        while self._unpublished and time.monotonic() < deadline:
            self._publish_pending()
            if self._unpublished:
                time.sleep(min(self._retry_delay, max(0.0, deadline - time.monotonic())))
        if self._unpublished:
            lost = sum(r for _s, _d, _i, r in self._unpublished)
            self.dropped_records += lost
            logger.error("tensortap: %d chunks (%d records) could not be written to %s and are lost (counted in "
                         "dropped_records)", len(self._unpublished), lost, self.storage.url)
            self._unpublished.clear()
