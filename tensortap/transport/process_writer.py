"""A writer in a child process: the training process copies payloads into shared memory and goes on.

`ProcessChunkWriter` has the interface the hooks use of `ChunkWriter` (submit, submit_many, submit_batch,
mark_step_passed, set_collections, flush, close; error, dropped_records, written_records, outage,
sealed_mode). It starts `python -c ...` (a fresh interpreter that imports tensortap and numpy only,
never the training script or its framework), which runs a `ChunkWriter` on the same storage URL.

Transport: one shared-memory ring (`ring_bytes`, at most `max_pending_bytes`). Each hand-off is one
message in the ring: a fixed binary header, a JSON description (names, dtypes, shapes, offsets: no
pickle, nothing that executes code) and the payload bytes, copied with one memcpy per array. The layout
is specified in docs/transport.md. A byte on a pipe wakes the child. The child encodes a message (payloads go to the
data file or an in-memory chunk as they are encoded) and then frees its ring space by advancing the
shared tail. A message larger than the ring goes through a shared-memory segment of its own.

Step marks (`mark_step_passed`, once per step) are not messages: the training process writes them into
a seqlock-protected slot of the ring's header (a few stores, no system call), with the number of
messages sent before it. The child applies a mark once it has processed that many messages, so a step
is marked passed only after all its records are written.

Backpressure is the same as ChunkWriter's: with the ring full, "block" waits up to `block_timeout`
seconds and then drops, "drop" drops at once. If the child dies, nothing hangs or raises: the failure
is logged once, the records in flight and every later record are counted as dropped, and training
goes on.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.format.writer import PROMPT_GAP, ChunkWriter, Record, RecordBatch, ScalarRows, storage_full
from tensortap.storage import open_storage
from tensortap.storage.base import Storage
from tensortap.transport.copy import MESSAGE_HEADER, get_mark, load_acquire, put_mark, store_release
from tensortap.transport.copy import gather_into as _gather

logger = logging.getLogger("tensortap")

# Header slots (int64) at the start of the shared segment.
_HEAD = 0  # ring bytes published by the training process (monotonic)
_TAIL = 1  # ring bytes freed by the child (monotonic)
_STATE = 2  # child state, below
_WRITTEN = 3  # records written by the child
_OUTAGE = 4  # the child's storage is failing
_FLUSHED = 5  # last flush request done
_DONE_MSGS = 6  # messages processed by the child
_BIG_DONE = 7  # bytes of own-segment messages processed
_MARK_SEQ = 8  # the step mark (7 slots, copy.put_mark): seqlock (odd while being written), messages sent
_MARK_MODES = 11  # before it, step, mode steps of TRAIN, EVAL, PREDICT, GLOBAL (-1: none)
_ERR_LEN = 15
_URGENT = 16  # control messages sent: the child processes everything published before one at once
_DURABLE = 17  # records in index blocks the child has written (what readers find)
_DROPPED = 18  # records the child dropped (its storage is full)
_PROMPTED = 19  # the newest step mark the child has adopted and made readable (an index block written)
_ASKED = 20  # the newest step mark the training process asked to be made readable at once
_SLOTS = 21
_ERR_AT = 256  # error text of a failed child
_ERR_MAX = 3840
_HDR = 4096  # the ring starts here

_STARTING, _RUNNING, _ENDED, _FAILED = 0, 1, 2, 3
_MODE_NAMES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
_WRAP = -1
_ALIGN = 64
_PAGE = 4096
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+; Python 3.11 lacks the name
# The child looks at the ring this often; the training process rings its bell only for control messages
# or when a quarter of the ring is waiting. A bell costs the training thread ~30 us here (a pipe write
# that wakes another process), ~20 us per step when it rang every other saving step. On this 2-vCPU KVM
# machine every wake-up of the child costs ~85 us of CPU and slows the training threads beside it, so it
# wakes seldom, also while data keeps coming (it then handles several saving steps at once, in one write):
# readers see data at the flush interval, which the child keeps on its own clock, and flushes, drains and
# close ring the bell.
_POLL = 0.05
# Message header: int64 message size, meta size, payload offset, and for batches step, mode, mode step
# (kept out of the meta so that a batch layout's meta is built once).
_MSG = MESSAGE_HEADER
_MSG_HDR = _MSG.size


def _align(n: int, a: int = _ALIGN) -> int:
    return (n + a - 1) & ~(a - 1)


def encode_meta(meta: tuple | list) -> bytes:
    """A message's description as it travels in the ring: JSON (names, numbers, lists; bytes as hex)."""
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode_meta(buf: bytes) -> list:
    try:
        meta = json.loads(buf.decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        meta = None
    if not isinstance(meta, list) or not meta or not isinstance(meta[0], str):
        raise ValueError(f"not a writer-ring message description: {buf[:80]!r}")
    return meta


def _batch_meta(names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                reductions: tuple | None = None) -> tuple[bytes, int]:
    """A batch message's description (with, per tensor, the reductions the child computes) and its number of
    elements."""
    count = 0
    for shape in shapes:
        k = 1
        for d in shape:
            k *= d
        count += k
    return encode_meta(("batch", names, codec.dtype_to_str(dtype), shapes, count, reductions)), count


def _payload_bytes(meta: tuple) -> int:
    """Bytes of a message's payload that hold its values ("batch": every tensor's; "records": up to the end of
    the last value)."""
    if meta[0] == "batch":
        return meta[4] * codec.dtype_from_str(meta[2]).itemsize
    if meta[0] == "records":
        # (each record: (name, step, mode, mode_step, value (dtype, shape, offset, nbytes) or None, ...))
        return max((r[4][2] + r[4][3] for r in meta[1] if r[4] is not None), default=0)
    return 0


class Reservation:
    """Ring space handed to the training process to copy a batch's payload into (see `reserve_batch`)."""

    # Made by `reserve_batch` only, which sets every field (no __init__: one Python call less per saving step).
    __slots__ = (
        "start",  # ring position (monotonic) of the message
        "offset",  # of the payload from `ProcessChunkWriter.ring_address`, page-aligned
        "nbytes",
        "n",  # records
        "done",
        "_ring",
        "_w",
    )

    @property
    def payload(self) -> np.ndarray:
        """The payload bytes (a uint8 view of the ring)."""
        return self._ring[self.offset:self.offset + self.nbytes]

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


# The child imports what it runs (storage, format, transport) and numpy, not the package's front (hooks,
# collections, trials): `tensortap` is entered as a bare namespace over the same folder, which halves the child's
# start-up.
_CHILD_BOOT = ("import sys, types\n"
               "import importlib.util as u\n"
               "spec = u.find_spec('tensortap')\n"
               "p = types.ModuleType('tensortap'); p.__path__ = list(spec.submodule_search_locations)\n"
               "p.__spec__ = spec; p.__file__ = spec.origin\n"
               "sys.modules['tensortap'] = p\n"
               "from tensortap.transport.process_writer import _child_main\n"
               "_child_main()\n")


class WriterProcessDied(RuntimeError):
    """The writer process ended unexpectedly."""


class ProcessChunkWriter:
    """ChunkWriter's interface; the writing happens in a child process fed through shared memory."""

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
    ):
        if backpressure not in ("block", "drop"):
            raise ValueError(f"backpressure must be 'block' or 'drop', not {backpressure!r}")
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
        cap = max(_ALIGN * 64, min(int(ring_bytes), int(max_pending_bytes)) // _ALIGN * _ALIGN)
        self._cap = cap
        self._head = 0
        self._bell_at = cap // 4
        self._last_bell = 0
        # The ring is an anonymous shared file (memfd) whose descriptor the child inherits: it has no name, so
        # nothing (the resource tracker, a crash) can unlink it while a writer still needs it, and a training
        # process killed before the child attached leaves the child the ring all the same.
        self._ring_fd = _ring_file(_HDR + cap)
        try:
            self._mm = mmap.mmap(self._ring_fd, _HDR + cap)
        except BaseException:
            os.close(self._ring_fd)
            raise
        self._mem = memoryview(self._mm)
        self._h = self._mem[:_SLOTS * 8].cast("q")
        self._u8 = np.ndarray((cap,), dtype=np.uint8, buffer=self._mm, offset=_HDR)
        self._ring_mv = self._mem[_HDR:_HDR + cap]
        #: address of the ring's first byte in this process (to copy payloads to at `Reservation.offset`)
        self.ring_address: int = self._u8.ctypes.data
        self._hdr_addr = self.ring_address - _HDR
        self._prefault()
        self._layouts: dict[tuple, tuple[bytes, int, int, int]] = {}  # -> (encoded meta, bytes, room, records)
        for i in range(_SLOTS):
            self._h[i] = 0
        for i in range(4):
            self._h[_MARK_MODES + i] = -1
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
        self._opts = dict(num_workers=num_workers, flush_interval=flush_interval, chunk_bytes=chunk_bytes,
                          max_pending_bytes=max_pending_bytes, metadata=metadata or {},
                          tensorboard_dir=tensorboard_dir)
        cfg = dict(url=self.url, worker=worker, ring=self._ring_fd, size=_HDR + cap, bell=rfd, answer=wfd,
                   token=self._token, **self._opts)
        import tensortap

        root = os.path.dirname(os.path.dirname(os.path.abspath(tensortap.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_BOOT, json.dumps(cfg)],
                stdin=subprocess.DEVNULL, pass_fds=(rfd, wfd, self._ring_fd, self._token), env=env, close_fds=True,
            )
        except BaseException:
            for fd in (rfd, wfd, self._bell, self._answer, self._token):
                os.close(fd)
            self._release_ring()
            raise
        os.close(rfd)
        os.close(wfd)
        _LIVE.add(self)

    def _prefault(self) -> None:
        """Map every page of the ring once, rather than taking a page fault per 4 KB inside saving steps until the
        ring has wrapped once (measured: the copy of a saving step that writes fresh ring pages takes ~3x as
        long). On a thread of its own that does not hold the GIL (50 ms for 64 MB on a loaded machine): the
        training thread goes on; a copy that meets a page not mapped yet maps it itself."""
        addr, size = self._hdr_addr, _HDR + self._cap

        def populate() -> None:
            try:
                import ctypes

                madvise = ctypes.CDLL(None, use_errno=True).madvise
                # 1 MB at a time: the call holds the process's memory-map lock, which the training thread's own
                # allocations (and thread starts) may need meanwhile
                step = 1 << 20
                for at in range(0, size, step):
                    if madvise(ctypes.c_void_p(addr + at), ctypes.c_size_t(min(step, size - at)),
                               _MADV_POPULATE_WRITE) != 0:
                        break
                else:
                    return
                if at:
                    return  # (the ring was released meanwhile)
            except (AttributeError, OSError):  # not Linux
                pass
            u8 = self._u8  # kernel < 5.14: touch each page
            if u8 is not None:
                for at in range(0, len(u8), 1 << 20):
                    u8[at:at + (1 << 20):_PAGE] = 0

        self._prefaulting = threading.Thread(target=populate, name="tensortap-ring-pages", daemon=True)
        self._prefaulting.start()

    # --- status ------------------------------------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        """The child's writer failed (like ChunkWriter.error); a killed child is not an error, only drops."""
        if self._error is None and self._final is None and self._h[_STATE] == _FAILED:
            n = self._h[_ERR_LEN]
            text = bytes(self._mem[_ERR_AT:_ERR_AT + n]).decode("utf-8", "replace")
            self._error = RuntimeError(f"tensortap writer process failed: {text}")
        return self._error

    @property
    def written_records(self) -> int:
        return self._final[0] if self._final is not None else int(self._h[_WRITTEN])

    @property
    def outage(self) -> bool:
        return self._final[1] if self._final is not None else bool(self._h[_OUTAGE])

    @property
    def pending_bytes(self) -> int:
        """Bytes handed off and not yet processed by the child (0: it has caught up)."""
        if self._final is not None:
            return 0
        return int(self._h[_HEAD] - self._h[_TAIL]) + int(self._big_sent - self._h[_BIG_DONE])

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until the child has handled everything published so far (not a flush: no index block is
        written); True when done within `timeout`."""
        with self._lock:
            if not self._open and self._h[_HEAD] == self._head and not self.pending_bytes:
                return True  # the child has handled everything: no bell (a system call and a wake-up)
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
                           "(policy %r). Training continues.", self._head - self._h[_TAIL], self.backpressure)
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
        child_dropped = int(self._h[_DROPPED])
        lost = max(0, self._accepted - int(self._h[_DURABLE]) - child_dropped)
        self.dropped_records += lost + child_dropped
        self._child_dropped_counted = True
        logger.error("tensortap: the writer process of %s ended unexpectedly (exit code %s); %d records it had "
                     "not indexed are lost, later ones are dropped and counted (dropped_records), and no more data "
                     "will be saved. Training continues.", self.worker, code, lost)

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
                off = _align(off + v.nbytes, 16)
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

    def _send(self, meta: tuple, payload_bytes: int, arrays: list[tuple[int, np.ndarray]], n_records: int,
              control: bool = False, hdr: tuple[int, int, int] = (0, 0, 0)) -> bool:
        """Publish one message (meta + payload); False (records counted as dropped) if there is no room."""
        with self._lock:  # hooks hand off from one thread, but a user's save_scalar may come from another
            return self._send_locked(meta, payload_bytes, arrays, n_records, control, hdr)

    def _send_locked(self, meta: tuple, payload_bytes: int, arrays: list[tuple[int, np.ndarray]], n_records: int,
                     control: bool = False, hdr: tuple[int, int, int] = (0, 0, 0)) -> bool:
        m = encode_meta(meta)
        pay_at = _align(_MSG_HDR + len(m))
        need = _align(pay_at + payload_bytes)
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
        _MSG.pack_into(buf, pos, total, len(m), pay_at, step, mode, mode_step)
        buf[pos + _MSG_HDR:pos + _MSG_HDR + len(m)] = m

    def _publish(self, urgent: bool = False) -> None:
        """Let the child see every message up to the first open reservation.

        The child looks at the ring every few milliseconds, so it is woken only for control messages and
        when a quarter of the ring is waiting, not once per message.
        """
        if self._forked:
            return
        head = self._open[0].start if self._open else self._head
        if head != self._h[_HEAD]:
            store_release(self._hdr_addr + 8 * _HEAD, head)  # (after the messages it publishes are written)
        if urgent:
            self._h[_URGENT] += 1
        elif head - self._h[_TAIL] < self._bell_at or head - self._last_bell < self._bell_at // 2:
            return  # the child polls every _POLL seconds; a bell (a system call and a wake-up) only when
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
            m, count = _batch_meta(names, dtype, shapes, reductions)
            nbytes = count * dtype.itemsize
            layout = (m, nbytes, _align(_MSG_HDR + len(m)) + _PAGE + _align(nbytes, _PAGE), len(names))
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
        if self._closed or self._dead or self._forked or self._error is not None or self._h[_STATE] == _FAILED:
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
            if pos + need > self._cap or head + need - load_acquire(self._hdr_addr + 8 * _TAIL) > self._cap:
                pos = self._room(need, n, False)
                if pos is None:
                    return False
            # The payload starts on a page (the ring itself starts on one): the child can write it to
            # the data file with O_DIRECT, straight from the ring.
            mlen = len(m)
            pay_at = ((pos + _MSG_HDR + mlen + _PAGE - 1) & ~(_PAGE - 1)) - pos
            total = pay_at + ((nbytes + _PAGE - 1) & ~(_PAGE - 1))
            ring = self._ring_mv
            _MSG.pack_into(ring, pos, total, mlen, pay_at, step, mode, mode_step)
            ring[pos + _MSG_HDR:pos + _MSG_HDR + mlen] = m
            res = _new_reservation(Reservation)
            res.start = self._head
            res.offset = pos + pay_at
            res.nbytes = nbytes
            res.n = n
            res.done = False
            res._ring = self._u8
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
            store_release(self._hdr_addr + 8 * _HEAD, head)
            if head - h[_TAIL] >= self._bell_at and head - self._last_bell >= self._bell_at // 2:
                self._ring_bell(head)

    def shrink(self, res: Reservation, names: tuple[str, ...], dtype: np.dtype,
               shapes: tuple[tuple[int, ...], ...], reductions: tuple | None = None) -> None:
        """Send only the first `len(names)` tensors of an open reservation (`names` and `shapes` a prefix of
        those reserved): their bytes lead its payload; the rest of its ring space is skipped."""
        m, count = _batch_meta(names, dtype, shapes, reductions)
        with self._lock:
            if res.done:
                return
            pos = res.start % self._cap
            total, _mlen, pay_at, step, mode, mode_step = _MSG.unpack_from(self._ring_mv, pos)
            if _MSG_HDR + len(m) > pay_at:
                raise ValueError("shrink: the new batch description does not fit the reservation's header")
            _MSG.pack_into(self._ring_mv, pos, total, len(m), pay_at, step, mode, mode_step)
            self._ring_mv[pos + _MSG_HDR:pos + _MSG_HDR + len(m)] = m
            self._accepted -= res.n - len(names)
            res.n = len(names)
            res.nbytes = count * dtype.itemsize

    def cancel(self, res: Reservation) -> None:
        """Send nothing for this reservation (its ring space is skipped)."""
        with self._lock:
            if res.done:
                return
            m = encode_meta(("skip",))
            pos = res.start % self._cap
            total = _MSG.unpack_from(self._ring_mv, pos)[0]
            self._write_header(pos, total, m, _align(_MSG_HDR + len(m)))
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
            if head + skip + need - load_acquire(self._hdr_addr + 8 * _TAIL) <= cap:
                if skip:
                    struct.pack_into("<q", self._ring_mv, pos, _WRAP)
                    self._head += skip
                return self._head % cap
            if self._dead or self._proc.poll() is not None:
                self._died()
                if not control:
                    self._lose(n_records)
                return None
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

    def _send_big(self, meta: tuple, payload_bytes: int, arrays: list[tuple[int, np.ndarray]],
                  n_records: int, hdr: tuple[int, int, int]) -> bool:
        """A message larger than half the ring: its payload in a segment of its own."""
        limit = max(self.max_pending_bytes - self._cap, self._cap)
        deadline = time.monotonic() + self.block_timeout
        while self._big_sent - self._h[_BIG_DONE] + payload_bytes > limit and self._big_sent > self._h[_BIG_DONE]:
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
        put_mark(self._hdr_addr + 8 * _MARK_SEQ, self._mark_seq, self._sent, step, train, eval_, predict, global_)
        self._mark_seq += 2
        if self._h[_PROMPTED] < self._prompt_mark:
            self._await_prompt()  # (the step before this one handed something over: it is readable when this ends)
        if self._accepted != self._prompt_accepted and self.prompt_marks and (
                time.monotonic() - self._prompt_time >= self._flush_interval * PROMPT_GAP):
            # The step handed something over: readable by the time the next step ends (docs/format.md §7).
            self._prompt_time = time.monotonic()
            self._prompt_accepted, self._prompt_mark = self._accepted, self._mark_seq
            self._h[_ASKED] = self._mark_seq
            self._ring_bell(self._head)

    #: a step mark with records handed over since the last asks for an index block at once (False: the caller
    #: closes the writer next, which writes everything)
    prompt_marks = True
    _prompt_time = 0.0  # time.monotonic() of the last step mark that asked for an index block
    _prompt_accepted = 0  # records accepted before the newest step mark that asked for an index block
    _prompt_mark = 0  # ... and that mark's number (what _PROMPTED reaches once it is readable)

    def _await_prompt(self) -> None:
        """Wait (a flush interval at most) until the child has made the last prompted step readable. Not while the
        child is starting: the training thread never waits for that; those steps are readable once it runs."""
        deadline = time.monotonic() + self._flush_interval
        while self._h[_PROMPTED] < self._prompt_mark and self._h[_STATE] == _RUNNING and not self._dead:
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
        self._flush_seq += 1
        seq = self._flush_seq
        if not self._send(("flush", seq), 0, [], 0, control=True):
            return False
        self._prompt_accepted = self._accepted  # (what was handed over is readable: the next mark asks for none)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._h[_FLUSHED] < seq:
            if self._h[_STATE] in (_FAILED, _ENDED) or self._proc.poll() is not None:
                if self._h[_STATE] != _FAILED:
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
        for res in list(self._open):
            self.cancel(res)
        if not self._dead and self._proc.poll() is None and self._h[_STATE] != _FAILED:
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
        _reap_later(self._proc)
        if self._h[_STATE] != _ENDED and self._h[_STATE] != _FAILED:
            self._died()
        elif not self._child_dropped_counted:
            self.dropped_records += int(self._h[_DROPPED])  # (the child's storage was full)
            self._child_dropped_counted = True
        self.error  # noqa: B018 - read the child's error text while the segment is mapped
        self._final = (int(self._h[_WRITTEN]), bool(self._h[_OUTAGE]))
        done = self._h[_BIG_DONE]
        for cum, name in self._big_names:  # segments the child never took
            if cum > done:
                _unlink(name)
        for fd in (self._bell, self._answer, self._token):
            try:
                os.close(fd)
            except OSError:
                pass
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
            reader = _ChildWriter(self._storage, self.worker, self._mm, rfd, -1, start_after=3600.0, **self._opts)
            reader._start_by = float("inf")
            reader._run()
            reader.release()
        finally:
            os.close(rfd)
            os.close(wfd)

    def _await_end(self, timeout: float) -> bool:
        """Wait until the child has written everything up to the stop, or has gone (not for the rest of its exit);
        False if it is still at work after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self._h[_STATE] not in (_ENDED, _FAILED) and self._proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            self._await_answer(deadline)
        return True

    def _release_ring(self) -> None:
        self._h.release()
        self._u8 = None
        self._ring_mv.release()
        self._mem.release()
        self._h = _Closed()
        mm, fd, proc, addr, size = self._mm, self._ring_fd, self._proc, self._hdr_addr, _HDR + self._cap
        prefaulting = self._prefaulting

        def release() -> None:
            # Once the child has gone (it no longer reads the ring): drop this mapping's pages and free the
            # file's, without the GIL (mmap.close() holds it while it unmaps ~30 ms of populated pages).
            try:
                proc.wait(60)
                prefaulting.join()
                import ctypes

                ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), 4)
                os.ftruncate(fd, 0)  # (MADV_DONTNEED above, then the file's pages go)
            except Exception:  # noqa: BLE001 - not Linux, or the child did not end: unmapped as it is
                pass
            try:
                mm.close()
            except BufferError:
                # somebody still holds a view of the ring (e.g. a tensor over it): the mapping goes when they do
                logger.debug("tensortap: the writer's ring is still referenced at close")
            try:
                os.close(fd)
            except OSError:
                pass

        # Unmapping 64 MB and freeing it takes ~30 ms on a loaded machine: not on the closing thread, and not
        # holding the GIL.
        threading.Thread(target=release, name="tensortap-ring-release", daemon=True).start()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close(timeout=5)
            except Exception:  # noqa: BLE001
                pass


class _Closed:
    """The header after close: every slot reads 0."""

    def __getitem__(self, i: int) -> int:
        return 0

    def __setitem__(self, i: int, v: int) -> None:
        pass


_ENDING: list[subprocess.Popen] = []  # writer processes that have written everything and are exiting


def _reap_later(proc: subprocess.Popen) -> None:
    """Collect `proc`'s exit status once it has gone (now, or at a later call), without waiting for it."""
    _ENDING.append(proc)
    _ENDING[:] = [p for p in _ENDING if p.poll() is None]


def _unlink(name: str) -> None:
    try:
        import _posixshmem

        _posixshmem.shm_unlink("/" + name)
    except (FileNotFoundError, ImportError, OSError):
        pass


# --- child process --------------------------------------------------------------------------------


def _ring_file(size: int) -> int:
    """A descriptor of a new anonymous shared file of `size` bytes. Without memfd its pages are reserved in
    /dev/shm now: on a full /dev/shm (Docker's default is 64 MB) touching an unbacked page later would kill the
    training process with SIGBUS; here it is an OSError."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tensortap-ring", os.MFD_CLOEXEC)
    else:  # (no memfd: a file in /dev/shm, unlinked at once)
        import tempfile

        fd, path = tempfile.mkstemp(prefix="tensortap-ring-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
        if not hasattr(os, "memfd_create") and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)  # (a memfd is not on /dev/shm, whose size a container may limit)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_segment(name: str, size: int) -> Any:
    """Map a POSIX shared-memory segment without the resource tracker (which would unlink it at our exit)."""
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class _ChildWriter(ChunkWriter):
    """A ChunkWriter whose writer thread reads messages from the shared ring instead of a queue."""

    def __init__(self, storage: Storage, worker: str, mem: Any, bell: int, answer: int = -1,
                 tensorboard_dir: str | None = None, **kw: Any):
        self._mem = mem
        self._hv = memoryview(mem)[:_SLOTS * 8].cast("q")
        self._ring = np.frombuffer(mem, dtype=np.uint8, offset=_HDR)
        self._rcap = len(self._ring)
        self._bell = bell
        self._answer = answer  # see ProcessChunkWriter._answer
        self._answer_due = False  # a control message came: answer once everything before it is handled
        self._tail = 0
        self._done_msgs = 0
        self._mark_seen = 0
        self._stop = False
        self._parent_gone = False
        self._ring_addr = self._ring.ctypes.data
        self._hdr_addr = self._ring_addr - _HDR
        self._seen_marks: deque[tuple[int, ...]] = deque(maxlen=1024)
        self._pay_pos = -1  # ring position of the payload being handled
        self._room_after = 0
        self._pay_bytes = 0  # ... and its bytes (a batch's: small tensors after those written go into the index)
        self._direct: int | None = None  # the data file opened with O_DIRECT, when the filesystem allows
        self._dio: list[memoryview] = []  # ring regions to write with O_DIRECT at `_dio_off`, in one call
        self._dio_off = 0
        self._dio_bytes = 0
        self._slept_bytes = 0  # bytes published while the child last slept (0: it found more without sleeping)
        exporter = None
        if tensorboard_dir:  # (the TensorBoard export, attached to the writer as its sink)
            from tensortap.tensorboard.export import EventExporter

            exporter = EventExporter(tensorboard_dir, worker)
        super().__init__(storage, worker, exporter=exporter, **kw)

    # Payload runs of at least this many bytes that start on a page of the ring are written with
    # O_DIRECT: the disk reads them from the ring, so the child neither copies them into the page cache
    # nor takes that memory traffic away from the training process (measured here: 97 us of CPU per
    # 680 KB against 321 us for a buffered append).
    _DIRECT_MIN = 1 << 16
    # The direct writes of the messages handled in one go are made with one call (up to this many
    # bytes). Measured here (a process writing beside the MLP training step): one 340 KB O_DIRECT write
    # every 3.7 ms slowed the training thread by 5%, the same bytes as 680 KB every 7.4 ms by 1-2%.
    _DIO_MAX = 8 << 20

    def _behind(self) -> bool:
        """Whether the messages published and not yet handled are a backlog: over 1/8 of the ring more than what
        came while the child last slept (that much waits at every look, however fast it writes)."""
        return load_acquire(self._hdr_addr + 8 * _HEAD) - self._tail > self._rcap // 8 + self._slept_bytes

    def release(self) -> None:
        """Drop this reader's views of the ring (when it ran in the training process, which unmaps it)."""
        self._hv.release()
        self._ring = None
        self._mem = None

    def _open_chunk(self) -> None:
        self._close_direct()  # (pending direct writes go to the chunk they were laid out in)
        super()._open_chunk()
        flag = getattr(os, "O_DIRECT", 0)
        name = getattr(self._dat, "name", None)
        if flag and not self.sealed_mode and isinstance(name, str):
            try:
                self._direct = os.open(name, os.O_WRONLY | flag)
            except OSError:
                self._direct = None  # e.g. tmpfs: buffered writes

    def _close_direct(self) -> None:
        self._flush_dio()
        if self._direct is not None:
            try:
                os.close(self._direct)
            except OSError:
                pass
            self._direct = None

    def _append_data(self, buf: Any) -> int:
        fd = self._direct
        if (fd is None or not isinstance(buf, np.ndarray) or buf.nbytes < self._DIRECT_MIN
                or buf.ctypes.data != self._ring_addr + self._pay_pos or buf.ctypes.data % _PAGE):
            self._flush_dio()  # (buffered writes append at the end of the file)
            return super()._append_data(buf)
        n = buf.nbytes
        padded = _align(n, _PAGE)
        if padded > self._room_after:
            self._flush_dio()
            return super()._append_data(buf)
        if self._pend:
            self._flush_dio()
            self._write_pending()
        off = _align(self._dat_size, _PAGE)  # the gap before it stays a hole in the file
        if self._dio and off != self._dio_off + self._dio_bytes:
            self._flush_dio()
        region = self._ring[self._pay_pos:self._pay_pos + padded]
        # The page's tail beyond the payload belongs to this message: zeroed, but not the payload's own
        # bytes after `buf` (small tensors of the batch that the index holds, copied after this call).
        region[max(n, self._pay_bytes):] = 0
        if not self._dio:
            self._dio_off = off
        self._dio.append(memoryview(region))
        self._dio_bytes += padded
        self._dat_size = off + padded
        self._block_bytes += n
        if self._dio_bytes >= self._DIO_MAX or len(self._dio) >= 256:
            self._flush_dio()
        return off

    def _flush_dio(self) -> None:
        """Write the pending direct regions (one call), then free their ring space."""
        views = self._dio
        if not views:
            return
        try:
            self._write_dio(views)
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, 0)
        self._publish_done()

    def _discard_unwritten(self) -> None:
        super()._discard_unwritten()
        self._dio = []
        self._dio_bytes = 0

    def _forget_block(self) -> None:
        super()._forget_block()
        self._dio = []
        self._dio_bytes = 0

    def _write_dio(self, views: list[memoryview]) -> None:
        off, total = self._dio_off, self._dio_bytes
        self._dio = []
        self._dio_bytes = 0
        done = 0
        try:
            done = os.pwritev(self._direct, views, off)
            while done < total:  # (a short write: the rest one region at a time)
                at = 0
                for v in views:
                    if done < at + len(v):
                        done += os.pwrite(self._direct, v[done - at:], off + done)
                        break
                    at += len(v)
        except OSError as e:
            if storage_full(e):
                raise
            logger.info("tensortap: O_DIRECT writes failed (%s); writing through the page cache", e)
            fd = os.open(self._dat.name, os.O_WRONLY)  # (the rows already point at these offsets)
            try:
                at = 0
                for v in views:
                    end = at + len(v)
                    if end > done:
                        start = max(done, at) - at
                        w = start
                        while w < len(v):
                            w += os.pwrite(fd, v[w:], off + at + w)
                    at = end
            finally:
                os.close(fd)
            direct, self._direct = self._direct, None
            try:
                os.close(direct)
            except OSError:
                pass

    def _write_block(self, end: bool = False) -> None:
        self._flush_dio()  # payloads before the index block that points at them
        super()._write_block(end)
        self._publish_done()  # (what is now indexed: the training process counts losses against it)

    def _run(self) -> None:
        h = self._hv
        h[_STATE] = _RUNNING
        last_flush = time.monotonic()
        try:
            while True:
                target = self._target()
                if self._tail >= target:
                    wait = max(0.0, self.flush_interval - (time.monotonic() - last_flush))
                    r, _w, _x = select.select([self._bell], [], [], min(wait, _POLL))
                    if r:
                        if os.read(self._bell, 65536) == b"":
                            self._parent_gone = True
                    target = self._target()
                    self._slept_bytes = target - self._tail
                else:
                    self._slept_bytes = 0
                while self._tail < target and not self._stop:
                    self._one()
                    if (self._flush_events or self._block_bytes > 64 << 20
                            or time.monotonic() - last_flush >= self.flush_interval):
                        # (also while working through a backlog: a crash loses at most a flush interval)
                        self._take_mark()
                        self._write_block()
                        last_flush = time.monotonic()
                        if self._flush_events_done:
                            h[_FLUSHED] = self._flush_events_done
                        self._publish_done()
                self._flush_dio()
                if self._answer_due and self._tail >= target:
                    self._answer_due = False
                    try:
                        os.write(self._answer, b"\0")
                    except OSError:  # full (nobody waits) or closed (the parent is gone)
                        pass
                self._take_mark()
                if self._adopted > h[_PROMPTED] and h[_ASKED] > h[_PROMPTED]:
                    # (a step mark at or past the one the training process asked for: readable now)
                    self._write_block()
                    last_flush = time.monotonic()
                    h[_PROMPTED] = self._adopted
                    try:
                        os.write(self._answer, b"\0")
                    except OSError:
                        pass
                if self._stop:
                    self._write_block(end=True)
                    self._drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if self._parent_gone and self._tail >= h[_HEAD]:
                    self._write_block()  # no end mark: the training process did not close
                    self._drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if time.monotonic() - last_flush >= self.flush_interval:
                    self._write_block()
                    last_flush = time.monotonic()
                if self._unpublished and time.monotonic() >= self._retry_at:
                    self._publish_pending()
                h[_OUTAGE] = int(self.outage)
            h[_WRITTEN] = self.written_records
            h[_DURABLE] = self.durable_records
            h[_DROPPED] = self.dropped_records
            h[_OUTAGE] = int(self.outage)
            h[_STATE] = _ENDED
        except BaseException as e:  # noqa: BLE001 - report to the training process
            self.error = e
            logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)
            text = f"{type(e).__name__}: {e}".encode()[:_ERR_MAX]
            self._mem[_ERR_AT:_ERR_AT + len(text)] = text
            h[_ERR_LEN] = len(text)
            h[_STATE] = _FAILED
        finally:
            try:
                os.write(self._answer, b"\0")  # (a close() waiting for the end wakes at once)
            except OSError:
                pass
            if self.exporter is not None:
                self.exporter.close()
            self._close_direct()
            for f in (self._dat, self._idx) if not self.sealed_mode else ():
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass

    _flush_events_done = 0
    _urgent_seen = 0
    _adopted = 0  # the newest step mark adopted

    def _target(self) -> int:
        """Ring position to handle messages up to: everything published. (Handling it at each look rather
        than a lag behind: a saving step's message no longer waits for a drain or a flush to wake the
        child; on the MLP benchmark, saving losses only every 100 steps, x1.006 instead of x1.010.)
        A new control message is answered once everything before it is handled."""
        h = self._hv
        urgent = h[_URGENT]  # read before the head: the head is then at least as new
        if urgent != self._urgent_seen:
            self._urgent_seen = urgent
            self._answer_due = True
        return load_acquire(self._hdr_addr + 8 * _HEAD)  # (the messages before it are all written)

    def _take_mark(self) -> None:
        """Adopt the newest step mark whose messages are all processed. Every mark seen is kept until then, so a
        child that lags behind the training process still publishes marks (not only once it catches up)."""
        mark = get_mark(self._hdr_addr + 8 * _MARK_SEQ)
        if mark is not None and mark[0] != self._mark_seen and mark[0] > 0:
            self._mark_seen = mark[0]
            self._seen_marks.append(mark)
        best = None
        seen = self._seen_marks
        while seen and seen[0][1] <= self._done_msgs:
            best = seen.popleft()
        if best is not None:
            self._adopted, _msgs, step, *modes = best
            self._marks.append((self._encoded, {"step": step, "mode_steps": {
                n: v for n, v in zip(_MODE_NAMES, modes, strict=True) if v >= 0}}))

    def _one(self) -> None:
        """Process the message at the tail, then free its ring space."""
        ring, cap = self._ring, self._rcap
        pos = self._tail % cap
        total = int(ring[pos:pos + 8].view(np.int64)[0])
        if total == _WRAP:
            self._tail += cap - pos
            return
        _t, mlen, pay_at, step, mode, mode_step = _MSG.unpack_from(self._mem, _HDR + pos)
        meta = decode_meta(ring[pos + _MSG_HDR:pos + _MSG_HDR + mlen].tobytes())
        base, pay = ring, pos + pay_at
        self._pay_pos, self._room_after = pay, total - pay_at  # ring bytes from the payload to the message's end
        self._pay_bytes = _payload_bytes(meta)
        seg = None
        if meta[0] == "big":
            _k, name, size, meta = meta
            seg = _open_segment(name, size)
            base, pay = np.frombuffer(seg, dtype=np.uint8), 0
            self._pay_pos = -1
        if meta[0] == "batch":  # step, mode and mode step travel in the message header
            meta = (*meta[:4], step, mode, mode_step, meta[4], meta[5] if len(meta) > 5 else None)
        try:
            self._handle(meta, base, pay)
        finally:
            base = None
            if seg is not None:
                try:
                    seg.close()
                except BufferError:
                    pass  # a view is still alive somewhere: the mapping goes with it
                _unlink(name)
                self._hv[_BIG_DONE] += size
        self._tail += total
        self._done_msgs += 1
        if not self._dio:  # (else once its direct writes are done: the ring space is read until then)
            self._publish_done()

    def _publish_done(self) -> None:
        """Tell the training process what is handled: the ring space up to the tail is free again."""
        h = self._hv
        h[_WRITTEN] = self.written_records
        h[_DURABLE] = self.durable_records
        h[_DROPPED] = self.dropped_records
        h[_DONE_MSGS] = self._done_msgs
        store_release(self._hdr_addr + 8 * _TAIL, self._tail)  # (after every read of the space it frees)

    def _handle(self, meta: list, base: np.ndarray, pay: int) -> None:
        kind = meta[0]
        if kind == "batch":
            _k, names, dt, shapes, step, mode, mode_step, count, reds = meta
            names = tuple(names)
            if reds is not None:
                reds = tuple(tuple((rn, ab) for rn, ab in r) if r else () for r in reds)
            shapes = [tuple(shape) for shape in shapes]
            flat = np.frombuffer(base, dtype=codec.dtype_from_str(dt), count=count, offset=pay)
            arrays = []
            off = 0
            for shape in shapes:
                k = 1
                for d in shape:
                    k *= d
                arrays.append(flat[off:off + k].reshape(shape))
                off += k
            self._encode_batch(RecordBatch(names, arrays, flat, step, mode, mode_step, reds))
        elif kind == "records":
            for (name, step, mode, mode_step, vd, save_raw, reductions, reds, save_shape, shape) in meta[1]:
                value = None
                if vd is not None:
                    dt, vshape, off, nbytes = vd
                    dtype = codec.dtype_from_str(dt)
                    value = np.frombuffer(base, dtype=dtype, count=nbytes // dtype.itemsize if dtype.itemsize else 0,
                                          offset=pay + off).reshape(vshape)
                rv = {(rn, ab): np.frombuffer(bytes.fromhex(b), dtype=codec.dtype_from_str(d)).reshape(s).copy()
                      for rn, ab, d, s, b in reds}
                self._encode(Record(name=name, step=step, mode=mode, mode_step=mode_step, value=value,
                                    save_raw=save_raw, reductions=tuple((rn, ab) for rn, ab in reductions),
                                    reduction_values=rv, save_shape=save_shape,
                                    shape=tuple(shape) if shape is not None else None))
        elif kind == "collections":
            self._take_collections(json.loads(meta[1]))
        elif kind == "flush":
            self._flush_events.append(_Done())
            self._flush_events_done = meta[1]
        elif kind == "stop":
            self._stop = True
        # "skip": a cancelled reservation, nothing to do


class _Done:
    """Stands for a flush request's event: the training process polls the shared FLUSHED slot instead."""

    def set(self) -> None:
        pass


def _child_main() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the training process, which closes us
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cfg = json.loads(sys.argv[1])
    try:
        token = os.read(cfg["token"], 1) if "token" in cfg else b"\0"
    except BlockingIOError:
        token = b""
    if token != b"\0":
        os._exit(0)  # the training process's close() writes the ring itself
    mem = mmap.mmap(cfg["ring"], cfg["size"])
    os.close(cfg["ring"])
    storage = open_storage(cfg["url"])
    if cfg.get("answer", -1) >= 0:
        os.set_blocking(cfg["answer"], False)
    w = _ChildWriter(storage, cfg["worker"], mem, cfg["bell"], cfg.get("answer", -1), num_workers=cfg["num_workers"],
                     flush_interval=cfg["flush_interval"], chunk_bytes=cfg["chunk_bytes"],
                     max_pending_bytes=cfg["max_pending_bytes"], metadata=cfg["metadata"],
                     tensorboard_dir=cfg.get("tensorboard_dir"))
    w._thread.join()
    logging.shutdown()
    os._exit(1 if w.error is not None else 0)  # (everything is written: no interpreter teardown to wait for)
