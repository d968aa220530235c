"""The writer thread: the training thread hands off records into a queue; one thread runs the encoder.

Memory is bounded by `max_pending_bytes`. When storage falls behind and that bound is reached, the
policy decides: "block" (default) makes `submit` wait for room, up to `block_timeout` seconds, and then
drops; "drop" drops at once. Drops are counted (`dropped_records`) and warned about once.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from tensortap.format.records import Record, RecordBatch, ScalarRows, StatisticsRows
from tensortap.format.writer import BLOCK_BYTES, ChunkEncoder
from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")

_MAX_MARKS = 4096  # step marks waiting for their records (older ones are superseded by newer ones)
#: a step mark asks for an index block at once (and the next one waits for it) at most once per this share of the
#: flush interval (50 ms by default): on the MLP of bench/pytorch_overhead.py (1 ms steps) a block and a wake-up of
#: the writer at every step cost the training thread +214 to +295 us a step (docs/format.md §7, bench/RESULTS.md)
PROMPT_GAP = 0.1
#: hand-offs pending past this many bytes wake the writer thread at once; smaller ones wait for its next flush (a
#: wake-up per hand-off costs both threads more than encoding a few small records)
_KICK_BYTES = 1 << 20
#: a batch of fewer bytes goes to the writer thread as the host arrays themselves (`submit_batch`): a reservation
#: here is a host buffer, one copy more
_RESERVE_MIN_BYTES = 4096
_STOP = object()
_RECORDS = object()  # a queue item of several records handed off together
_NEVER = float("inf")


def memmove_gather(address: int, sources: list[tuple[int, int]]) -> int:
    """Copy each (source address, byte count) back to back to `address`; the bytes copied. (A writer's default
    `gather`: the hooks give it tensortap.transport.copy's, one C call for all sources where built.)"""
    total = 0
    for src, n in sources:
        ctypes.memmove(address + total, src, n)
        total += n
    return total


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


class ChunkWriter:
    """A `Writer` (tensortap.capture.writer) whose encoder runs on a thread of the training process.

    Every `flush_interval` seconds (and at `flush()`/`close()`), payloads are written and flushed to
    the data file first, then one index block describing them is appended to the index file. A
    reader therefore never finds an index entry whose payload is not on disk, and a crash loses at
    most what was not flushed yet.
    """

    kind = "thread"
    #: batches of fewer bytes are cheaper handed over as host arrays (`submit_batch`) than reserved
    reserve_min_bytes = _RESERVE_MIN_BYTES

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
        this many seconds after the writer was made (or at a drain, or a backlog of `_KICK_BYTES`); until then
        hand-offs wait in the queue, a flush or a step mark that asks for an index block writes them on the
        calling thread, and a writer closed before its thread started writes on the closing thread
        (docs/format.md §7). 0: the thread starts at once. `exporter`: a sink the caller attaches
        (the TensorBoard export, tensortap.tensorboard.export.EventExporter) given every record written, off the
        training thread; its `behind` is set to a function telling whether this writer has a backlog.
        `gather`: the copy a reservation's `copy_in` uses (default: `memmove_gather`)."""
        if backpressure not in ("block", "drop"):
            raise ValueError(f"backpressure must be 'block' or 'drop', not {backpressure!r}")
        if isinstance(start_after, bool) or not isinstance(start_after, int | float) or not start_after >= 0:
            raise ValueError(f"start_after must be a number of seconds >= 0, not {start_after!r}")
        self.encoder = ChunkEncoder(storage, worker, num_workers=num_workers, chunk_bytes=chunk_bytes,
                                    max_pending_bytes=max_pending_bytes, seal_interval=seal_interval,
                                    sealed_chunk_bytes=sealed_chunk_bytes, metadata=metadata, sink=exporter,
                                    first_seq=first_seq)
        self.exporter = exporter
        if exporter is not None:
            exporter.behind = self._behind
        #: gather(address, sources): copies a reservation's sources in (see HostReservation.copy_in)
        self.gather = gather or memmove_gather
        self.storage = storage
        self.worker = worker
        self.num_workers = num_workers
        self.flush_interval = flush_interval
        self._prompt_time = time.monotonic()  # (the first step mark that asks for an index block: as later ones)
        self.max_pending_bytes = max_pending_bytes
        self.backpressure = backpressure
        self.block_timeout = block_timeout
        self.close_timeout = 30.0
        self.error: BaseException | None = None
        self._dropped = 0  # records refused under backpressure (the encoder counts its own)
        self._pending_bytes = 0
        self._submitted = 0  # hand-offs accepted
        self._handled = 0  # hand-offs the writer thread has encoded (or dropped)
        # (hand-offs before the mark, the mark): every mark, so that a writer lagging behind the training loop
        # still publishes the newest one whose records it has all written
        self._marks: deque[tuple[int, dict[str, Any]]] = deque(maxlen=_MAX_MARKS)
        self._room = threading.Condition()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._kick = threading.Event()  # wakes the writer thread before its next flush
        self._kick_bytes = min(_KICK_BYTES, max_pending_bytes // 4)
        self._flush_events: list[threading.Event] = []
        self._closed = False
        self._made = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"tensortap-writer-{worker}", daemon=True)
        #: time.monotonic() from which a hand-off or step mark starts the thread (inf: started)
        self._start_by = self._made + start_after
        if start_after <= 0:
            self._start()
        else:
            # The chunk's files are made now, right after the claim made the folder (the file system's paths are
            # warm: later, beside the training, the same calls cost ten times more).
            try:
                self.encoder.open_first_chunk()
            except BaseException as e:  # never raise into training; the hook checks .error
                self.error = e
                logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)

    def _start(self) -> None:
        if self._start_by != _NEVER:
            with self._room:
                if self._start_by != _NEVER:
                    self._start_by = _NEVER
                    self._thread.start()

    # --- what the encoder counts ------------------------------------------------------------

    @property
    def dropped_records(self) -> int:
        return self._dropped + self.encoder.dropped_records

    @property
    def written_records(self) -> int:
        return self.encoder.written_records

    @property
    def durable_records(self) -> int:
        return self.encoder.durable_records

    @property
    def full(self) -> bool:
        return self.encoder.full

    @property
    def outage(self) -> bool:
        return self.encoder.outage

    @property
    def sealed_mode(self) -> bool:
        return self.encoder.sealed_mode

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

    def _hand(self, item: Any, size: int, records: int, kick: bool = True) -> int:
        """Queue one hand-off of `records` records (all or none): how many were accepted."""
        if self._closed or self.error is not None:
            return 0
        if not self._reserve(size, records):
            return 0
        self._queue.put(item)
        if kick and self._pending_bytes > self._kick_bytes:
            self._start()
            self._kick.set()
        elif time.monotonic() >= self._start_by:
            self._start()
        return records

    def submit(self, record: Record) -> bool:
        """Hand off a record; False if it was dropped under backpressure."""
        return self.submit_many((record,)) == 1

    def submit_many(self, records: list[Record] | tuple[Record, ...]) -> int:
        """Hand off several records at once (all or none): how many were accepted."""
        size = sum(r.nbytes() for r in records)
        return self._hand(records[0] if len(records) == 1 else (_RECORDS, tuple(records), size), size, len(records))

    def submit_batch(self, batch: RecordBatch) -> int:
        """Hand off a batch of raw tensors (all or none): how many tensors were accepted."""
        return self._hand(batch, batch.size, len(batch.arrays))

    def submit_scalars(self, rows: ScalarRows) -> int:
        """Hand off float scalars of several steps (all or none): how many were accepted."""
        return self._hand(rows, rows.nbytes(), len(rows), kick=False)

    def submit_statistics(self, rows: StatisticsRows) -> int:
        """Hand off the statistics of a step's tensors (all or none): how many records were accepted."""
        return self._hand(rows, rows.nbytes(), len(rows), kick=False)

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

    def _reserve(self, size: int, records: int) -> bool:
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
                    if self._dropped == 0:
                        logger.warning("tensortap: storage is falling behind (%d bytes pending); dropping records "
                                       "(policy %r). Training continues.", self._pending_bytes, self.backpressure)
                    self._dropped += records
                    return False
            self._pending_bytes += size
            self._submitted += 1
        return True

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
            if self._start_by != _NEVER and self._write_here():
                return  # (readable now)
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
        if self._start_by != _NEVER and self._write_here():
            return ev.is_set()
        self._start()
        self._kick.set()
        return ev.wait(timeout)

    def _write_here(self) -> bool:
        """A flush, or a step mark that asks for an index block, while the writer thread has not started: what
        waits is encoded and its block written on the calling thread, which would wait for that anyway (no
        thread is started for it: a short job that flushes when training ends, then closes, never starts one).
        What waits is small: a backlog of `_KICK_BYTES` starts the thread. False when the thread has started
        meanwhile."""
        with self._room:  # (a hand-off on another thread that would start the thread waits for this)
            if self._start_by == _NEVER or self._closed or self.error is not None:
                return False
            try:
                blocked = False
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    blocked = self._handle(item)
                if not blocked:
                    self._block()
            except BaseException as e:  # never raise into training; the hook checks .error
                self.error = e
                logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)
                for ev in self._flush_events:
                    ev.set()
                self._flush_events.clear()
            return True

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush, write the end-of-job block and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        with self._room:  # (after a write on another thread that holds it, `_write_here`)
            if self._start_by != _NEVER:  # (never started: what was handed off is written here)
                self._start_by = _NEVER
                self._run()
                return
        self._kick.set()
        self._thread.join(timeout)

    # --- writer thread ---------------------------------------------------------------------

    def _block(self, end: bool = False) -> None:
        """An index block of everything encoded, with the newest step mark whose hand-offs are all in it."""
        marks = self._marks
        mark = None
        while marks and marks[0][0] <= self._handled:
            mark = marks.popleft()
        try:
            self.encoder.write_block(end, mark[1] if mark is not None else None, bool(self._flush_events))
        finally:
            for ev in self._flush_events:
                ev.set()
            self._flush_events.clear()

    def _take(self, item: Any) -> None:
        """Encode one queue item."""
        enc = self.encoder
        if isinstance(item, RecordBatch):
            enc.encode_batch(item)
            size = item.size
        elif isinstance(item, Record):
            enc.encode(item)
            size = item.nbytes()
        elif isinstance(item, StatisticsRows):
            enc.encode_statistics(item)
            size = item.nbytes()
        elif isinstance(item, ScalarRows):
            enc.encode_scalars(item)
            size = item.nbytes()
        else:  # (_RECORDS, records, size)
            enc.encode_many(item[1])
            size = item[2]
        self._handled += 1
        with self._room:  # its room is free again
            self._pending_bytes -= size
            self._room.notify_all()

    def _handle(self, item: Any) -> bool:
        """Take one queued item (collections, a flush, records); True when it was a flush (a block written)."""
        if isinstance(item, tuple) and item[0] == "collections":
            self.encoder.take_collections(item[1])
        elif isinstance(item, tuple) and item[0] == "flush":
            self._flush_events.append(item[1])
            self._block()
            return True
        else:
            self._take(item)
        return False

    def _run(self) -> None:
        last_flush = self._made  # (a thread started late writes what waited at once)
        enc = self.encoder
        try:
            enc.open_first_chunk()  # (beside the job's first steps, not when the first block is due)
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
                    self._block(end=True)
                    enc.drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if item is not None and self._handle(item):
                    last_flush = time.monotonic()
                item = None  # (drop the arrays now: the hook reuses their buffers)
                prompt = self._prompt_seq
                if prompt != self._prompt_done and self._queue.empty():
                    # (a step mark asks for its records to be readable: every hand-off before it is encoded)
                    self._block()
                    last_flush = time.monotonic()
                    with self._room:
                        self._prompt_done = prompt
                        self._room.notify_all()
                elif time.monotonic() - last_flush >= self.flush_interval or enc.block_bytes > BLOCK_BYTES:
                    self._block()
                    last_flush = time.monotonic()
                if enc.unpublished and time.monotonic() >= enc.retry_at:
                    enc.publish_pending()
        except BaseException as e:  # never raise into training; the hook checks .error
            self.error = e
            logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)
            with self._room:
                self._room.notify_all()
        finally:
            for ev in self._flush_events:
                ev.set()
            try:
                enc.close()
            except Exception:  # noqa: BLE001 - (the sink's own failure is the sink's)
                logger.debug("tensortap: closing the writer of %s", self.worker, exc_info=True)

    def _behind(self) -> bool:
        """Whether the records waiting for this writer are a backlog: over 1/8 of what may wait."""
        return self._pending_bytes > self.max_pending_bytes // 8
