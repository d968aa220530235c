"""A writer in a child process: the training process copies payloads into shared memory and goes on.

`ProcessChunkWriter` is a `Writer` (tensortap.capture.writer). It starts `python -c ...` (a fresh interpreter
that imports tensortap's storage, format and transport and numpy only, never the training script or its
framework), which runs the same `ChunkEncoder` as the writer thread, fed by a `RingReader`
(tensortap.transport.writer_process) on the same storage URL.

Transport: one shared-memory ring (`ring_bytes`, at most `max_pending_bytes`). Each hand-off is one
message in the ring: a fixed binary header, a JSON description (names, dtypes, shapes, offsets: no
pickle, nothing that executes code) and the payload bytes, copied with one memcpy per array. The layout
is specified in docs/transport.md. A byte on a pipe wakes the child. The child encodes a message (payloads go to the
data file or an in-memory chunk as they are encoded) and then frees its ring space by advancing the
shared tail. A message larger than the ring goes through a shared-memory segment of its own.

Step marks are not messages but a seqlock-protected slot of the ring's header, applied by the child once every
message sent before it is processed. Backpressure is the writer thread's; if the child dies, nothing hangs or
raises: the failure is logged once, what it had not indexed and every later record are counted as dropped.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import select
import struct
import threading
import time
import weakref
from collections import deque
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.format.records import Record, RecordBatch, ScalarRows, StatisticsLayout, StatisticsRows
from tensortap.storage import open_storage
from tensortap.storage.base import Storage
from tensortap.transport import ring as R
from tensortap.transport.copy import gather_stream_into as _gather
from tensortap.transport.copy import load_acquire, put_mark, store_release
from tensortap.transport.thread_writer import PROMPT_GAP

logger = logging.getLogger("tensortap")


class Reservation:
    """Ring space handed to the training process to copy a batch's payload into (see `reserve_batch`)."""

    # Made by `reserve_batch` only, which sets every field (no __init__: one Python call less per saving step).
    __slots__ = (
        "start",  # ring position (monotonic) of the message
        "offset",  # of the payload from `ProcessChunkWriter.ring_address`, page-aligned
        "nbytes",
        "n",  # records
        "done",
        "_u8",  # the ring's bytes
        "_w",
    )

    @property
    def payload(self) -> np.ndarray:
        """The payload bytes (a uint8 view of the ring)."""
        return self._u8[self.offset:self.offset + self.nbytes]

    def copy_in(self, sources: list[tuple[int, int]], at: int = 0) -> None:
        """Copy each (address, byte count) of `sources` back to back into the payload, from byte `at` on."""
        if at + sum(n for _a, n in sources) > self.nbytes:
            raise ValueError("copy_in: the sources do not fit the reservation")
        _gather(self._w.ring_address + self.offset + at, sources)

    def commit(self) -> None:
        """The payload is filled in: send it."""
        self._w.commit(self)

    def cancel(self) -> None:
        """Send nothing (its ring space is skipped)."""
        self._w.cancel(self)

    def shrink(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
               reductions: tuple | None = None) -> None:
        """Send only the first `len(names)` tensors (their bytes lead the payload)."""
        self._w.shrink(self, names, dtype, shapes, reductions)


class _NotStarted:
    """`ProcessChunkWriter._proc` before a late start (`start_after`): no process yet, so none has ended."""

    pid = None

    def poll(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        pass


_NOT_STARTED = _NotStarted()


class _ReaderThread:
    """`ProcessChunkWriter._proc` once a thread of the training process reads the ring (`_read_here`): the
    writer process's loop (`RingReader.run`), asked what a process would be asked."""

    pid = None

    def __init__(self, reader: Any, fds: tuple[int, int]) -> None:
        self._reader = reader
        self._fds = fds
        self._thread = threading.Thread(target=self._run, name="tensortap-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._reader.run()
        finally:
            self._reader.release()
            for fd in self._fds:
                os.close(fd)

    def poll(self) -> int | None:
        if self._thread.is_alive():
            return None
        return 1 if self._reader.error is not None else 0

    def wait(self, timeout: float | None = None) -> int | None:
        self._thread.join(timeout)
        return self.poll()

    def kill(self) -> None:
        self._reader._stop = True  # (it ends after the message at hand, writing the end of the job)


_new_reservation = object.__new__
_RECORDS = object()  # (see ProcessChunkWriter._hand)

_LIVE: weakref.WeakSet = weakref.WeakSet()  # writers of this process


def _after_fork_in_child() -> None:
    # A forked process (e.g. a DataLoader worker) inherits the writer objects: they must neither send
    # into the parent's ring nor stop its writer process or unlink the ring when they are collected.
    for w in list(_LIVE):
        w._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class WriterProcessDied(RuntimeError):
    """The writer process ended unexpectedly."""


class ProcessChunkWriter:
    """A `Writer` whose encoder runs in a child process fed through shared memory."""

    kind = "process"
    #: every batch is worth a reservation: it is copied once, straight into the ring
    reserve_min_bytes = 0

    def __init__(
        self,
        storage: Storage | str,
        worker: str,
        *,
        num_workers: int = 1,
        flush_interval: float = 0.5,
        chunk_bytes: int = 256 << 20,
        max_pending_bytes: int = 512 << 20,
        backpressure: str = "block",
        block_timeout: float = 30.0,
        metadata: dict[str, Any] | None = None,
        ring_bytes: int = 64 << 20,
        tensorboard_dir: str | None = None,
        start_after: float = 0.0,
    ):
        """`start_after` > 0: the writer process starts that many seconds after this writer is made (see
        `_start_late`), not now."""
        if backpressure not in ("block", "drop"):
            raise ValueError(f"backpressure must be 'block' or 'drop', not {backpressure!r}")
        if isinstance(start_after, bool) or not isinstance(start_after, int | float) or not start_after >= 0:
            raise ValueError(f"start_after must be a number of seconds >= 0, not {start_after!r}")
        if tensorboard_dir:  # the child's EventExporter reads its budget from the environment: refuse a bad one here
            from tensortap.tensorboard.export import histogram_budget_from_env

            histogram_budget_from_env()
        if isinstance(storage, str):
            storage = open_storage(storage)
        self.url = storage.url
        self.worker = worker
        self.sealed_mode = not storage.supports_append
        self.backpressure = backpressure
        self.block_timeout = block_timeout
        self.max_pending_bytes = max_pending_bytes
        self.close_timeout = 60.0
        self.dropped_records = 0
        self._error: BaseException | None = None
        self._final: tuple[int, bool] | None = None  # (written, outage) once closed
        self._closed = False
        self._dead = False
        self._forked = False  # True in a forked copy of the training process
        self._lock = threading.Lock()
        self._sent = 0  # messages published
        self._flush_seq = 0
        self._mark_seq = 0
        self._big_sent = 0  # bytes of own-segment messages sent
        self._big_names: deque[tuple[int, str]] = deque()  # (cumulative bytes, name) not yet freed
        self._open: deque[Reservation] = deque()  # reservations not yet committed, in ring order
        self._lost_keys: set[tuple[int, int, str]] = set()  # (step, mode, name) counted as dropped (see _lose)
        cap = max(R.ALIGN * 64, min(int(ring_bytes), int(max_pending_bytes)) // R.ALIGN * R.ALIGN)
        self._cap = cap
        self._head = 0
        self._bell_at = cap // 4
        self._last_bell = 0
        # The ring is an anonymous shared file (memfd) whose descriptor the child inherits: it has no name, so
        # nothing (the resource tracker, a crash) can unlink it while a writer still needs it, and a training
        # process killed before the child attached leaves the child the ring all the same.
        self._ring_fd = R.ring_file(R.HDR + cap)
        try:
            self._mm = mmap.mmap(self._ring_fd, R.HDR + cap)
        except BaseException:
            os.close(self._ring_fd)
            raise
        self._mem = memoryview(self._mm)
        self._h = self._mem[:R.SLOTS * 8].cast("q")
        self._u8 = np.ndarray((cap,), dtype=np.uint8, buffer=self._mm, offset=R.HDR)
        self._ring_mv = self._mem[R.HDR:R.HDR + cap]
        #: address of the ring's first byte in this process (to copy payloads to at `Reservation.offset`)
        self.ring_address: int = self._u8.ctypes.data
        self._hdr_addr = self.ring_address - R.HDR
        self._layouts: dict[tuple, tuple[bytes, int, int, int]] = {}  # -> (encoded meta, bytes, room, records)
        self._stat_metas: dict[int, tuple[StatisticsLayout, bytes]] = {}  # id(layout) -> (layout, encoded meta)
        for i in range(R.SLOTS):
            self._h[i] = 0
        for i in range(4):
            self._h[R.MARK_MODES + i] = -1
        rfd, self._bell = os.pipe()
        os.set_blocking(self._bell, False)
        # The child's answer: a byte each time it has handled everything up to a control message (a
        # drain, a flush), so that waiting for it is one wake-up instead of a sleep loop (~40 us of CPU per
        # wake-up here; a drain at the end of a saving step's interval took 6 of them).
        self._answer, wfd = os.pipe()
        os.set_blocking(self._answer, False)
        # The ring's reader: one byte in a pipe, taken by the child when it attaches, or by close() when the child
        # has not attached yet (a short job: close() then writes the ring itself instead of waiting for the child
        # to start). Whoever reads the byte reads the ring; the other finds the pipe empty.
        self._token, twfd = os.pipe()
        os.write(twfd, b"\0")
        os.close(twfd)
        os.set_blocking(self._token, False)
        self._storage = storage
        self._flush_interval = flush_interval
        self._prompt_time = time.monotonic()  # (the first step mark that asks for an index block: as later ones)
        self._opts = dict(num_workers=num_workers, flush_interval=flush_interval, chunk_bytes=chunk_bytes,
                          max_pending_bytes=max_pending_bytes, metadata=metadata or {},
                          tensorboard_dir=tensorboard_dir)
        self._cfg = dict(url=self.url, worker=worker, ring=self._ring_fd, size=R.HDR + cap, bell=rfd, answer=wfd,
                         token=self._token, **self._opts)
        self._child_fds: tuple[int, int] | None = (rfd, wfd)  # (the child's ends of the bell and the answer)
        self._proc: Any = _NOT_STARTED
        self._start_lock = threading.Lock()
        self._start_wake = threading.Event()
        self._start_cancelled = False
        self._late = start_after > 0
        if self._late:
            self._backlog = -1
            self._prefaulting = threading.Thread(target=self._start_late, args=(float(start_after),),
                                                 name="tensortap-writer-start", daemon=True)
            self._prefaulting.start()
        else:
            self._prefaulting = R.prefault(self._hdr_addr, R.HDR + cap, lambda: self._u8)
            try:
                self._start_child()
            except BaseException:
                for fd in (rfd, wfd, self._bell, self._answer, self._token):
                    os.close(fd)
                self._child_fds = None
                self._release_ring()
                raise
        _LIVE.add(self)

    def _start_child(self) -> None:
        """Start the writer process (what was handed over meanwhile waits in the ring)."""
        rfd, wfd = self._child_fds
        if self._backlog is not None:
            self._backlog = self._head
        self._proc = R.start_child(self._cfg, (rfd, wfd, self._ring_fd, self._token))
        self._child_fds = None
        os.close(rfd)
        os.close(wfd)

    def _start_late(self, delay: float) -> None:
        """The writer's own thread when the writer process starts late (`start_after`): map the ring's first
        quarter (ring.populate), wait `delay` seconds, then start the process, unless a quarter of the ring waits
        sooner (it starts then), or a flush or a drain made this process the ring's reader (`_read_here`), or the
        writer was closed first (close() then writes the ring itself): a job shorter than `delay` starts no
        process. The rest of the ring is mapped once the ring has a reader (a job that ends sooner touches only
        the quarter it can fill before the process starts)."""
        pages = lambda: self._u8  # noqa: E731
        size = R.HDR + self._cap
        first = min(size, (R.HDR + self._bell_at + R.PAGE - 1) // R.PAGE * R.PAGE)  # (madvise takes whole pages)
        R.populate(self._hdr_addr, first, pages)
        self._start_wake.wait(delay)
        with self._start_lock:
            if self._start_cancelled:
                return
            if self._proc is _NOT_STARTED:
                try:
                    self._start_child()
                except Exception as e:  # noqa: BLE001 - no process now: what waits in the ring is written here
                    logger.warning("tensortap: cannot start the writer process (%s); writing from a thread instead",
                                   e)
                    self._read_here()
        if first < size:
            R.populate(self._hdr_addr + first, size - first, pages)

    def _reader_now(self) -> None:
        """Something must wait for the ring to be read (a flush, a drain) and the writer process has not started:
        this process becomes the ring's reader rather than wait for a process to start."""
        with self._start_lock:
            if self._proc is _NOT_STARTED and not self._start_cancelled:
                self._read_here()
        self._start_wake.set()

    def _read_here(self) -> None:
        """A thread of this process reads the ring from now on (the loop the writer process would run); called
        with `_start_lock` held, before the process has started."""
        try:
            os.read(self._token, 1)  # (the ring's reader is whoever holds the token)
        except (BlockingIOError, OSError):
            return
        rfd, wfd = self._child_fds
        self._child_fds = None
        self._backlog = self._head
        os.set_blocking(wfd, False)
        from tensortap.transport.writer_process import RingReader

        self._proc = _ReaderThread(RingReader(self._storage, self.worker, self._mm, rfd, wfd, **self._opts),
                                   (rfd, wfd))

    # --- status ------------------------------------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        """The child's writer failed (like ChunkWriter.error); a killed child is not an error, only drops."""
        if self._error is None and self._final is None and self._h[R.STATE] == R.FAILED:
            n = self._h[R.ERR_LEN]
            text = bytes(self._mem[R.ERR_AT:R.ERR_AT + n]).decode("utf-8", "replace")
            self._error = RuntimeError(f"tensortap writer process failed: {text}")
        return self._error

    @property
    def written_records(self) -> int:
        return self._final[0] if self._final is not None else int(self._h[R.WRITTEN])

    @property
    def outage(self) -> bool:
        return self._final[1] if self._final is not None else bool(self._h[R.OUTAGE])

    @property
    def pending_bytes(self) -> int:
        """Bytes handed off and not yet processed by the child (0: it has caught up)."""
        if self._final is not None:
            return 0
        return int(self._h[R.HEAD] - self._h[R.TAIL]) + int(self._big_sent - self._h[R.BIG_DONE])

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until the child has handled everything published so far (not a flush: no index block is
        written); True when done within `timeout`."""
        with self._lock:
            if not self._open and self._h[R.HEAD] == self._head and not self.pending_bytes:
                return True  # the child has handled everything: no bell (a system call and a wake-up)
            if self._proc is _NOT_STARTED:
                self._reader_now()
            self._publish(urgent=True)
        deadline = time.monotonic() + timeout
        while self.pending_bytes:
            if self._proc.poll() is not None or time.monotonic() >= deadline:
                return False
            self._await_answer(deadline)
        return True

    def _await_answer(self, deadline: float | None) -> None:
        """Sleep until the child answers a control message (or 50 ms, or the deadline, pass)."""
        wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
        try:
            if select.select([self._answer], [], [], wait)[0]:
                os.read(self._answer, 4096)  # (answers to earlier requests too: the caller tests its own)
        except OSError:  # the pipe is closed: the caller's test of the child's state ends the wait
            time.sleep(wait)

    def _accepting(self) -> bool:
        return not self._closed and not self._dead and not self._forked and self.error is None

    def _drop(self, n: int) -> None:
        if self.dropped_records == 0 and not self._dead:
            logger.warning("tensortap: storage is falling behind (%d bytes pending); dropping records "
                           "(policy %r). Training continues.", self._head - self._h[R.TAIL], self.backpressure)
        self._lose(n)

    # What the hand-off being made holds, for `_lose`: (step, mode, names) of a batch, or _RECORDS (the records
    # in `_hand_records`).
    _hand: Any = None
    _hand_records: Any = ()

    def _lose(self, n: int) -> None:
        """Count the `n` records of the hand-off being made as dropped. A refused reservation may be offered again
        another way (a hook then hands the same step's tensors over in smaller batches): its (step, mode, name)s
        are remembered, and a later refusal counts none of them again."""
        hand = self._hand
        if hand is None:
            self.dropped_records += n
            return
        reserving = False
        if hand is _RECORDS:
            keys = [(r.step, r.mode, r.name) for r in self._hand_records[:n]]
        else:
            step, mode, names = hand[:3]
            keys = [(step, mode, name) for name in names[:n]]
            reserving = len(hand) == 4
        seen = self._lost_keys
        fresh = [k for k in keys if k not in seen]
        if reserving:
            if len(seen) > 4096:  # (only a step's offers need remembering)
                seen.clear()
            seen.update(fresh)
        self.dropped_records += len(fresh)

    def _died(self) -> None:
        """The child is gone: log once, count what it had not written, drop from now on."""
        if self._dead:
            return
        self._dead = True
        code = self._proc.poll()
        # Everything accepted is either in an index block the child wrote, dropped by the child, or lost now.
        child_dropped = int(self._h[R.DROPPED])
        lost = max(0, self._accepted - self._durable_at_death() - child_dropped)
        self.dropped_records += lost + child_dropped
        self._child_dropped_counted = True
        logger.error("tensortap: the writer process of %s ended unexpectedly (exit code %s); %d records it had "
                     "not indexed are lost, later ones are dropped and counted (dropped_records), and no more data "
                     "will be saved. Training continues.", self.worker, code, lost)

    def _durable_at_death(self) -> int:
        """Records in index blocks the dead child wrote: DURABLE, or more when an index write it began had landed
        before it died (it tells DURABLE only after the write)."""
        h = self._h
        durable = int(h[R.DURABLE])
        records = int(h[R.INDEX_RECORDS])
        if records > durable:
            from tensortap.format import layout

            try:
                size = self._storage.size(layout.chunk_key(self.worker, int(h[R.INDEX_CHUNK]), layout.INDEX_SUFFIX))
            except Exception:  # noqa: BLE001 - the store cannot say: those records count as lost
                size = None
            if size is not None and size >= h[R.INDEX_SIZE]:
                return records
        return durable

    _accepted = 0  # records accepted (instance attribute once the first one is)
    _child_dropped_counted = False

    # --- training-thread side -----------------------------------------------------------------

    def submit(self, record: Record) -> bool:
        return self.submit_many((record,)) == 1

    def submit_many(self, records: list[Record] | tuple[Record, ...]) -> int:
        """Hand off several records at once (all or none): how many were accepted."""
        n = len(records)
        self._hand, self._hand_records = _RECORDS, records
        if not self._accepting():
            if self._dead:
                self._lose(n)
            return 0
        metas = []
        arrays = []
        off = 0
        for r in records:
            v = r.value
            vd = None
            if v is not None:
                v = v if v.flags.c_contiguous else np.ascontiguousarray(v)
                vd = (codec.dtype_to_str(v.dtype), v.shape, off, v.nbytes)
                arrays.append((off, v))
                off = R.align(off + v.nbytes, 16)
            reds = [(k[0], k[1], codec.dtype_to_str(a.dtype), a.shape, a.tobytes().hex())
                    for k, rv in r.reduction_values.items() for a in (codec.as_storable(rv),)]
            metas.append((r.name, r.step, r.mode, r.mode_step, vd, r.save_raw, r.reductions, reds, r.save_shape,
                          r.shape))
        ok = self._send(("records", metas), off, arrays, n)
        self._hand_records = ()
        return n if ok else 0

    def submit_scalars(self, rows: ScalarRows) -> int:
        """Hand off float scalars of several steps (all or none): how many were accepted."""
        return self.submit_many(rows.records())

    def submit_statistics(self, rows: StatisticsRows) -> int:
        """Hand off the statistics of a step's tensors as one message (all or none): how many records were
        accepted. The description of a layout is encoded once."""
        lay = rows.layout
        n = len(rows)
        self._hand = (rows.step, rows.mode, lay.names)
        if not self._accepting():
            if self._dead:
                self._lose(n)
            return 0
        m = self._stat_metas.get(id(lay))
        if m is None or m[0] is not lay:
            if len(self._stat_metas) > 256:
                self._stat_metas.clear()
            m = self._stat_metas[id(lay)] = (lay, R.encode_meta(("statistics", lay.to_json())))
        values = rows.values
        ok = self._send(m[1], values.nbytes, [(0, values)], n, hdr=(rows.step, rows.mode, rows.mode_step))
        return n if ok else 0

    def submit_batch(self, batch: RecordBatch) -> int:
        """Hand off a batch of raw tensors (all or none): how many tensors were accepted."""
        n = len(batch.arrays)
        self._hand = (batch.step, batch.mode, batch.names)
        if not self._accepting():
            if self._dead:
                self._lose(n)
            return 0
        flat = batch.flat
        if flat is not None and flat.flags.c_contiguous and flat.nbytes == sum(a.nbytes for a in batch.arrays):
            shapes = [a.shape for a in batch.arrays]
            meta = ("batch", batch.names, codec.dtype_to_str(flat.dtype), shapes, flat.size, batch.reductions)
            ok = self._send(meta, flat.nbytes, [(0, flat)], n, hdr=(batch.step, batch.mode, batch.mode_step))
        else:
            return self.submit_many(batch.records())
        return n if ok else 0

    def _send(self, meta: tuple | bytes, payload_bytes: int, arrays: list[tuple[int, np.ndarray]], n_records: int,
              control: bool = False, hdr: tuple[int, int, int] = (0, 0, 0)) -> bool:
        """Publish one message (meta + payload); False (records counted as dropped) if there is no room."""
        with self._lock:  # hooks hand off from one thread, but a user's save_scalar may come from another
            return self._send_locked(meta, payload_bytes, arrays, n_records, control, hdr)

    def _send_locked(self, meta: tuple | bytes, payload_bytes: int, arrays: list[tuple[int, np.ndarray]],
                     n_records: int, control: bool = False, hdr: tuple[int, int, int] = (0, 0, 0)) -> bool:
        m = meta if isinstance(meta, bytes) else R.encode_meta(meta)
        pay_at = R.align(R.MSG_HDR + len(m))
        need = R.align(pay_at + payload_bytes)
        if need > self._cap // 2 and payload_bytes:
            return self._send_big(meta, payload_bytes, arrays, n_records, hdr)
        pos = self._room(need, n_records, control)
        if pos is None:
            return False
        u8 = self._u8
        self._write_header(pos, need, m, pay_at, *hdr)
        base = pos + pay_at
        for off, a in arrays:
            if a.nbytes:
                u8[base + off:base + off + a.nbytes] = a.reshape(-1).view(np.uint8)
        self._head += need
        self._sent += 1
        self._accepted += n_records
        self._publish(urgent=control)
        return True

    def _write_header(self, pos: int, total: int, m: bytes, pay_at: int, step: int = 0, mode: int = 0,
                      mode_step: int = 0) -> None:
        buf = self._ring_mv
        R.MSG.pack_into(buf, pos, total, len(m), pay_at, step, mode, mode_step)
        buf[pos + R.MSG_HDR:pos + R.MSG_HDR + len(m)] = m

    def _publish(self, urgent: bool = False) -> None:
        """Let the child see every message up to the first open reservation.

        The child looks at the ring every few milliseconds, so it is woken only for control messages and
        when a quarter of the ring is waiting, not once per message.
        """
        if self._forked:
            return
        head = self._open[0].start if self._open else self._head
        if head != self._h[R.HEAD]:
            store_release(self._hdr_addr + 8 * R.HEAD, head)  # (after the messages it publishes are written)
            if self._proc is _NOT_STARTED and head - self._h[R.TAIL] >= self._bell_at:
                self._start_wake.set()  # (a late start: the process starts now)
        if urgent:
            self._h[R.URGENT] += 1
        elif head - self._h[R.TAIL] < self._bell_at or head - self._last_bell < self._bell_at // 2:
            return  # the child polls every POLL seconds; a bell (a system call and a wake-up) only when
            # the ring is filling up faster than that
        self._ring_bell(head)

    def _ring_bell(self, head: int) -> None:
        self._last_bell = head
        try:
            os.write(self._bell, b"\0")
        except BlockingIOError:
            pass  # the child has wake-ups pending already
        except OSError:  # EPIPE: the child is gone
            self._died()

    # --- payloads copied straight into the ring ----------------------------------------------------

    def batch_layout(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                     reductions: tuple | None = None) -> tuple[bytes, int, int, int]:
        """What `reserve_batch` needs to know of a batch layout, for callers that reserve it again and again
        (cached here too: the lookup hashes every name and shape)."""
        key = (names, dtype, shapes, reductions)
        layout = self._layouts.get(key)
        if layout is None:
            m, count = R.batch_meta(names, dtype, shapes, reductions)
            nbytes = count * dtype.itemsize
            layout = (m, nbytes, R.align(R.MSG_HDR + len(m)) + R.PAGE + R.align(nbytes, R.PAGE), len(names))
            if len(self._layouts) > 256:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def reserve_batch(self, names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                      step: int, mode: int, mode_step: int, layout: tuple | None = None,
                      reductions: tuple | None = None) -> Reservation | bool | None:
        """Ring space for a batch of raw tensors, for the caller to copy into (`Reservation.payload`: one
        page-aligned byte array, the tensors' bytes in order) and then `commit` (or `cancel`). `names` and
        `shapes` are tuples; `layout`: `batch_layout(names, dtype, shapes)` when the caller keeps it.

        Returns None when the batch does not fit in the ring (hand it off with `submit_batch` instead),
        False when it was dropped under backpressure (counted). Messages sent after an open reservation
        reach the child only once it is committed or cancelled.
        """
        if layout is None:
            layout = self._layouts.get((names, dtype, shapes, reductions))
            if layout is None:
                layout = self.batch_layout(names, dtype, shapes, reductions)
        self._hand = (step, mode, names, True)
        return self._reserve(layout, step, mode, mode_step)

    def _reserve(self, layout: tuple, step: int, mode: int, mode_step: int) -> Reservation | bool | None:
        m, nbytes, need, n = layout
        if self._closed or self._dead or self._forked or self._error is not None or self._h[R.STATE] == R.FAILED:
            if not self._accepting():
                if self._dead:
                    self._lose(n)
                return False
        if need > self._cap // 2:
            return None
        with self._lock:
            head = self._head
            pos = head % self._cap
            # (what _room does when the message fits without wrapping: the usual case, inline)
            if pos + need > self._cap or head + need - load_acquire(self._hdr_addr + 8 * R.TAIL) > self._cap:
                pos = self._room(need, n, False)
                if pos is None:
                    return False
            # The payload starts on a page (the ring itself starts on one): the child can write it to
            # the data file with O_DIRECT, straight from the ring.
            mlen = len(m)
            pay_at = ((pos + R.MSG_HDR + mlen + R.PAGE - 1) & ~(R.PAGE - 1)) - pos
            total = pay_at + ((nbytes + R.PAGE - 1) & ~(R.PAGE - 1))
            ring = self._ring_mv
            R.MSG.pack_into(ring, pos, total, mlen, pay_at, step, mode, mode_step)
            ring[pos + R.MSG_HDR:pos + R.MSG_HDR + mlen] = m
            res = _new_reservation(Reservation)
            res.start = self._head
            res.offset = pos + pay_at
            res.nbytes = nbytes
            res.n = n
            res.done = False
            res._u8 = self._u8
            res._w = self
            self._head += total
            self._sent += 1
            self._accepted += n
            self._open.append(res)
            return res

    def commit(self, res: Reservation) -> None:
        """The reservation's payload is filled in: send it."""
        with self._lock:
            res.done = True
            opened = self._open
            while opened and opened[0].done:
                opened.popleft()
            if opened or self._forked:
                self._publish()
                return
            # (what _publish does when no reservation is open, inline: this runs at every saving step)
            head = self._head
            h = self._h
            store_release(self._hdr_addr + 8 * R.HEAD, head)
            if head - h[R.TAIL] >= self._bell_at:
                if self._proc is _NOT_STARTED:
                    self._start_wake.set()  # (a late start: the process starts now)
                if head - self._last_bell >= self._bell_at // 2:
                    self._ring_bell(head)

    def shrink(self, res: Reservation, names: tuple[str, ...], dtype: np.dtype,
               shapes: tuple[tuple[int, ...], ...], reductions: tuple | None = None) -> None:
        """Send only the first `len(names)` tensors of an open reservation (`names` and `shapes` a prefix of
        those reserved): their bytes lead its payload; the rest of its ring space is skipped."""
        m, count = R.batch_meta(names, dtype, shapes, reductions)
        with self._lock:
            if res.done:
                return
            pos = res.start % self._cap
            total, _mlen, pay_at, step, mode, mode_step = R.MSG.unpack_from(self._ring_mv, pos)
            if R.MSG_HDR + len(m) > pay_at:
                raise ValueError("shrink: the new batch description does not fit the reservation's header")
            R.MSG.pack_into(self._ring_mv, pos, total, len(m), pay_at, step, mode, mode_step)
            self._ring_mv[pos + R.MSG_HDR:pos + R.MSG_HDR + len(m)] = m
            self._accepted -= res.n - len(names)
            res.n = len(names)
            res.nbytes = count * dtype.itemsize

    def cancel(self, res: Reservation) -> None:
        """Send nothing for this reservation (its ring space is skipped)."""
        with self._lock:
            if res.done:
                return
            m = R.encode_meta(("skip",))
            pos = res.start % self._cap
            total = R.MSG.unpack_from(self._ring_mv, pos)[0]
            self._write_header(pos, total, m, R.align(R.MSG_HDR + len(m)))
            self._accepted -= res.n
        self.commit(res)

    def _room(self, need: int, n_records: int, control: bool) -> int | None:
        """Ring position for a message of `need` bytes (a wrap marker written if needed), else None."""
        cap = self._cap
        deadline = None
        delay = 0.0002
        while True:
            head = self._head
            pos = head % cap
            skip = cap - pos if pos + need > cap else 0
            if head + skip + need - load_acquire(self._hdr_addr + 8 * R.TAIL) <= cap:
                if skip:
                    struct.pack_into("<q", self._ring_mv, pos, R.WRAP)
                    self._head += skip
                return self._head % cap
            if self._dead or self._proc.poll() is not None:
                self._died()
                if not control:
                    self._lose(n_records)
                return None
            if self._proc is _NOT_STARTED:
                self._start_wake.set()
            if self.backpressure == "drop" and not control:
                self._drop(n_records)
                return None
            if deadline is None:
                deadline = time.monotonic() + self.block_timeout
            elif time.monotonic() >= deadline:
                if not control:
                    self._drop(n_records)
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def _send_big(self, meta: tuple | bytes, payload_bytes: int, arrays: list[tuple[int, np.ndarray]],
                  n_records: int, hdr: tuple[int, int, int]) -> bool:
        """A message larger than half the ring: its payload in a segment of its own."""
        limit = max(self.max_pending_bytes - self._cap, self._cap)
        if self._proc is _NOT_STARTED:
            self._start_wake.set()
        deadline = time.monotonic() + self.block_timeout
        while self._big_sent - self._h[R.BIG_DONE] + payload_bytes > limit and self._big_sent > self._h[R.BIG_DONE]:
            if self._proc.poll() is not None:
                self._died()
                self._lose(n_records)
                return False
            if self.backpressure == "drop" or time.monotonic() >= deadline:
                self._drop(n_records)
                return False
            time.sleep(0.002)
        seg = shared_memory.SharedMemory(create=True, size=max(payload_bytes, 1))
        try:
            buf = np.ndarray((payload_bytes,), dtype=np.uint8, buffer=seg.buf)
            for off, a in arrays:
                buf[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
            del buf
        finally:
            seg.close()
        resource_tracker.unregister(seg._name, "shared_memory")  # the child unlinks it
        self._big_sent += payload_bytes
        self._big_names.append((self._big_sent, seg.name))
        if isinstance(meta, bytes):
            meta = json.loads(meta)
        ok = self._send_locked(("big", seg.name, payload_bytes, meta), 0, [], n_records, control=True, hdr=hdr)
        if not ok:
            self._lose(n_records)
        return ok

    def mark_step_passed(self, step: int, mode_steps: dict[str, int]) -> None:
        """Nothing more comes for `step`: a few stores into the shared header, no message."""
        get = mode_steps.get
        self.mark_steps(step, get("TRAIN", -1), get("EVAL", -1), get("PREDICT", -1), get("GLOBAL", -1))

    def mark_steps(self, step: int, train: int, eval_: int, predict: int, global_: int) -> None:
        """`mark_step_passed` with the mode steps as numbers (-1: none), for a caller that has them at hand."""
        if self._forked or self._closed:
            return
        put_mark(self._hdr_addr + 8 * R.MARK_SEQ, self._mark_seq, self._sent, step, train, eval_, predict, global_)
        self._mark_seq += 2
        if self._h[R.PROMPTED] < self._prompt_mark:
            self._await_prompt()  # (the step before this one handed something over: it is readable when this ends)
        if self._accepted != self._prompt_accepted and self.prompt_marks and (
                time.monotonic() - self._prompt_time >= self._flush_interval * PROMPT_GAP):
            if self._backlog is not None and self._in_backlog():
                return
            # The step handed something over: readable by the time the next step ends (docs/format.md §7).
            self._prompt_time = time.monotonic()
            self._prompt_accepted, self._prompt_mark = self._accepted, self._mark_seq
            self._h[R.ASKED] = self._mark_seq
            self._ring_bell(self._head)

    def _in_backlog(self) -> bool:
        """A late start: whether the ring's reader has not started yet or not yet read what waited for it when it
        was started (`_backlog`: the head then). Meanwhile a step mark asks for no index block, which the next one
        would wait for while the backlog is written: those steps are readable once it is, or at the reader's flush
        interval (docs/format.md §7)."""
        end = self._backlog
        if end < 0 or self._h[R.STATE] != R.RUNNING or self._h[R.TAIL] < end:
            return True
        self._backlog = None
        return False

    #: a late start (`start_after`): the head when the ring's reader was started (-1 before), None once it has read
    #: that far (see `_in_backlog`)
    _backlog: int | None = None
    #: a step mark with records handed over since the last asks for an index block at once (False: the caller
    #: closes the writer next, which writes everything)
    prompt_marks = True
    _prompt_time = 0.0  # time.monotonic() of the last step mark that asked for an index block
    _prompt_accepted = 0  # records accepted before the newest step mark that asked for an index block
    _prompt_mark = 0  # ... and that mark's number (what R.PROMPTED reaches once it is readable)

    def _await_prompt(self) -> None:
        """Wait (a flush interval at most) until the child has made the last prompted step readable. Not while the
        child is starting: the training thread never waits for that; those steps are readable once it runs."""
        deadline = time.monotonic() + self._flush_interval
        while self._h[R.PROMPTED] < self._prompt_mark and self._h[R.STATE] == R.RUNNING and not self._dead:
            if time.monotonic() >= deadline or self._proc.poll() is not None:
                return
            self._await_answer(deadline)

    def set_collections(self, collections_json: dict[str, Any]) -> None:
        if self._accepting():
            self._send(("collections", json.dumps(collections_json)), 0, [], 0, control=True)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write out everything handed off so far; True when done within `timeout`."""
        if not self._accepting():
            return False
        if self._proc is _NOT_STARTED:
            self._reader_now()
        self._flush_seq += 1
        seq = self._flush_seq
        if not self._send(("flush", seq), 0, [], 0, control=True):
            return False
        self._prompt_accepted = self._accepted  # (what was handed over is readable: the next mark asks for none)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._h[R.FLUSHED] < seq:
            if self._h[R.STATE] in (R.FAILED, R.ENDED) or self._proc.poll() is not None:
                if self._h[R.STATE] != R.FAILED:
                    self._died()
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._await_answer(deadline)
        return True

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush, write the end-of-job block, and wait for the child (killed after `timeout`)."""
        if self._closed:
            return
        if self._forked:
            self._closed = True  # the parent's writer: not ours to stop
            return
        if self._late:
            with self._start_lock:
                self._start_cancelled = True  # (from here on `_proc` stays what it is)
            self._start_wake.set()
        for res in list(self._open):
            self.cancel(res)
        if not self._dead and self._proc.poll() is None and self._h[R.STATE] != R.FAILED:
            self._send(("stop",), 0, [], 0, control=True)
        self._closed = True
        wait = timeout if timeout is not None else self.close_timeout
        if self._take_ring():
            self._write_ring_here()
        elif not self._await_end(wait):
            logger.error("tensortap: the writer process of %s did not finish within %s s; stopping it",
                         self.worker, wait)
            self._proc.kill()
        # Its exit (and the ring's memory, freed when the last holder lets go) is not waited for: the process is
        # reaped when it has gone.
        if self._proc.pid is not None:
            R.reap_later(self._proc)
        if self._h[R.STATE] != R.ENDED and self._h[R.STATE] != R.FAILED:
            self._died()
        elif not self._child_dropped_counted:
            self.dropped_records += int(self._h[R.DROPPED])  # (the child's storage was full)
            self._child_dropped_counted = True
        self.error  # noqa: B018 - read the child's error text while the segment is mapped
        self._final = (int(self._h[R.WRITTEN]), bool(self._h[R.OUTAGE]))
        done = self._h[R.BIG_DONE]
        for cum, name in self._big_names:  # segments the child never took
            if cum > done:
                R.unlink_segment(name)
        for fd in (self._bell, self._answer, self._token, *(self._child_fds or ())):
            try:
                os.close(fd)
            except OSError:
                pass
        self._child_fds = None
        self._release_ring()

    def _take_ring(self) -> bool:
        """Become the ring's reader if the child has not attached yet (it then exits as soon as it starts)."""
        if self._dead or self._proc.poll() is not None:
            return False
        try:
            return os.read(self._token, 1) == b"\0"
        except (BlockingIOError, OSError):
            return False

    def _write_ring_here(self) -> None:
        """What the child would have done, on this thread: write every message in the ring up to the stop."""
        self._proc.kill()
        rfd, wfd = os.pipe()
        try:
            # (a writer thread that is never started: its loop runs here, up to the stop message)
            from tensortap.transport.writer_process import RingReader

            reader = RingReader(self._storage, self.worker, self._mm, rfd, -1, **self._opts)
            reader.run()
            reader.release()
        finally:
            os.close(rfd)
            os.close(wfd)

    def _await_end(self, timeout: float) -> bool:
        """Wait until the child has written everything up to the stop, or has gone (not for the rest of its exit);
        False if it is still at work after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self._h[R.STATE] not in (R.ENDED, R.FAILED) and self._proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            self._await_answer(deadline)
        return True

    def _release_ring(self) -> None:
        self._h.release()
        self._u8 = None
        self._ring_mv.release()
        self._mem.release()
        self._h = R.Closed()
        # (once the child has gone: the pages freed and the mapping closed off this thread, without the GIL)
        R.release_later(self._mm, self._ring_fd, self._proc, self._hdr_addr, R.HDR + self._cap, self._prefaulting)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close(timeout=5)
            except Exception:  # noqa: BLE001
                pass
