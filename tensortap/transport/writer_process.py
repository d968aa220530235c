"""The writer process's side of the ring (docs/transport.md): `RingReader` takes the messages the training process
publishes and hands them to a `ChunkEncoder`; large payloads that sit on ring pages are written straight from the
ring with direct I/O (`RingDataFile`, where the storage offers it).

`_child_main` is what the writer process runs; the training process's `close()` runs the same reader on its own
thread when the child never attached.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import select
import struct
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.format.records import Record, RecordBatch, StatisticsLayout, StatisticsRows
from tensortap.format.writer import BLOCK_BYTES, ChunkEncoder, DataFile, storage_full
from tensortap.storage import open_storage
from tensortap.storage.base import Storage
from tensortap.transport import ring as R
from tensortap.transport.copy import get_mark, load_acquire, store_release

logger = logging.getLogger("tensortap")

# The child looks at the ring this often while nothing comes; the training process rings its bell only for control
# messages, a step mark that asks for an index block (docs/transport.md §4), or when a quarter of the ring is waiting.
# A bell costs the training thread ~30 us here (a pipe write that wakes another process), so hand-offs do not ring.
# On this 2-vCPU KVM machine every wake-up of the child costs ~85 us of CPU, so an idle child wakes seldom.
POLL = 0.05
# After a look that found messages the next comes this soon, then twice as late each time nothing came, up to POLL.
# A step mark that asks for an index block waits until every message before it is written, so a backlog the child
# slept over would be written while the training thread waits (docs/transport.md §4).
BUSY_POLL = 0.002
# Payload runs of at least this many bytes that start on a page of the ring are written with direct I/O: the
# disk reads them from the ring, so the child neither copies them into the page cache nor takes that memory
# traffic away from the training process (measured here: 97 us of CPU per 680 KB against 321 us for a buffered
# append).
_DIRECT_MIN = 1 << 16
# Direct writes are held until this many bytes wait (at most an eighth of the ring) or an index block is due, and
# made as one call: each is a disk request whose completion interrupts a CPU, perhaps the training thread's
# (bench/RESULTS.md, "Trainer callbacks").
_DIO_MAX = 8 << 20


_TOTAL = struct.Struct("<q")  # a message's first field: its size, or R.WRAP


class _BatchPlan:
    """What a batch message's description says (names, dtype, shapes, per tensor its elements in the payload),
    decoded once per description."""

    __slots__ = ("names", "dtype", "count", "nbytes", "bounds", "reductions")

    def __init__(self, meta: list):
        _k, names, dt, shapes, count, *rest = meta
        reds = rest[0] if rest else None
        if reds is not None:
            reds = tuple(tuple((rn, ab) for rn, ab in r) if r else () for r in reds)
        self.names = tuple(names)
        self.dtype = codec.dtype_from_str(dt)
        self.count = count
        self.nbytes = count * self.dtype.itemsize
        self.reductions = reds
        bounds = []
        off = 0
        for shape in shapes:
            k = 1
            for d in shape:
                k *= d
            bounds.append((off, off + k, tuple(shape)))
            off += k
        self.bounds = bounds


class RingDataFile(DataFile):
    """A chunk's data file that writes payloads lying on ring pages straight from the ring with the storage's
    direct I/O (`Storage.open_direct`), at page-aligned offsets (the gaps stay holes: docs/format.md §2). The
    ring space of such a payload is freed once it is written.

    The direct writes are held and made together (one call, one run of the file) until `_hold` bytes wait, an
    index block is written (`sync`, at least every flush interval) or the file closes: each direct write is
    a disk request whose completion interrupts a CPU, perhaps the training thread's, so fewer and larger is
    cheaper for training. Small payloads that come while a run is held (a step's loss between two steps'
    tensors) join the run in page-aligned buffers of their own (`_tail`), so the run stays one write."""

    def __init__(self, storage: Storage, key: str, reader: RingReader):
        super().__init__(storage, key)
        self.reader = reader
        self.direct = storage.open_direct(key) if storage.supports_direct else None
        self._regions: list[Any] = []  # the held run: ring regions and page buffers, to write at `_at` in one call
        self._at = 0
        self._bytes = 0  # (the run's bytes, the tail not included)
        self._tail = bytearray()  # small payloads after the run, at `_at + _bytes` (written padded to a page)
        #: a held run is written once this many bytes wait (at most an eighth of the ring: its space is freed only
        #: when written)
        self._hold = max(R.PAGE, min(_DIO_MAX, reader._rcap // 8))

    def append(self, buf: Any, address: int | None = None) -> int:
        r = self.reader
        n = memoryview(buf).nbytes
        if self.direct is None:
            return super().append(buf)
        if self._regions and n < _DIRECT_MIN:
            off = self.size  # (the run's end: small payloads join the run)
            self._tail += memoryview(buf).cast("B")
            self.size += n
            if self._bytes + len(self._tail) >= self._hold:
                self.write_regions()
            return off
        if not isinstance(buf, np.ndarray) or n < _DIRECT_MIN:
            self.write_regions()  # (buffered writes append at the end of the file)
            return super().append(buf)
        if address is None:
            address = buf.ctypes.data
        padded = R.align(n, R.PAGE)
        if address != r.ring_addr + r.pay_pos or address % R.PAGE or padded > r.room_after:
            self.write_regions()  # (buffered writes append at the end of the file)
            return super().append(buf)
        if self._pend:
            self.write_pending()  # (no run is held: the file ends where they begin)
        if self._tail:
            self._close_tail()
        off = R.align(self.size, R.PAGE)  # the gap before it stays a hole in the file
        if self._regions and off != self._at + self._bytes:
            self.write_regions()
            off = R.align(self.size, R.PAGE)
        region = r.ring[r.pay_pos:r.pay_pos + padded]
        # The page's tail beyond the payload belongs to this message: zeroed, but not the payload's own
        # bytes after `buf` (small tensors of the batch that the index holds, copied after this call).
        region[max(n, r.pay_bytes):] = 0
        if not self._regions:
            self._at = off
        self._regions.append(memoryview(region))
        self._bytes += padded
        self.size = off + padded
        if self._bytes >= self._hold or len(self._regions) >= 256:
            self.write_regions()
        return off

    def _close_tail(self) -> None:
        """The small payloads after the run go into it as whole pages (direct writes take page-aligned memory:
        an anonymous map); the file's next payload starts after them, on a page."""
        tail, self._tail = self._tail, bytearray()
        padded = R.align(len(tail), R.PAGE)
        page = mmap.mmap(-1, padded)
        page[:len(tail)] = tail
        self._regions.append(page)
        self._bytes += padded
        self.size = self._at + self._bytes

    def write_regions(self) -> None:
        """Write the held run (one call), then free its ring space."""
        if self._tail:
            self._close_tail()
        regions = self._regions
        if not regions:
            return
        self._regions = []
        self._bytes = 0
        try:
            self.direct.write_at([memoryview(v) for v in regions], self._at)
        except OSError as e:
            if not storage_full(e):
                raise
            self.reader.encoder.storage_full(e)
        if not self.direct.direct:  # (refused after all: later payloads are appended through the page cache)
            self.direct.close()
            self.direct = None
        self.reader.publish_done()

    @property
    def waiting(self) -> bool:
        return bool(self._regions)

    def sync(self) -> None:
        self.write_regions()  # payloads before the index block that points at them
        super().sync()

    def discard_pending(self) -> None:
        super().discard_pending()
        self._regions = []
        self._bytes = 0
        self._tail = bytearray()

    def close(self) -> None:
        self.write_regions()  # (they go to the chunk they were laid out in)
        if self.direct is not None:
            self.direct.close()
            self.direct = None
        super().close()


class RingReader:
    """Reads the ring's messages and hands them to a `ChunkEncoder` (the writer process's loop)."""

    def __init__(self, storage: Storage, worker: str, mem: Any, bell: int, answer: int = -1, *,
                 tensorboard_dir: str | None = None, num_workers: int = 1, flush_interval: float = 0.5,
                 chunk_bytes: int = 256 << 20, max_pending_bytes: int = 512 << 20,
                 metadata: dict[str, Any] | None = None, backpressure: str = "block"):
        self._mem = mem
        self._hv = memoryview(mem)[:R.SLOTS * 8].cast("q")
        self.ring = np.frombuffer(mem, dtype=np.uint8, offset=R.HDR)
        self._rcap = len(self.ring)
        self.ring_addr = self.ring.ctypes.data
        self._hdr_addr = self.ring_addr - R.HDR
        self._bell = bell
        self._answer = answer  # see ProcessChunkWriter._answer
        self._answer_due = False  # a control message came: answer once everything before it is handled
        self.worker = worker
        self.flush_interval = flush_interval
        self.close_timeout = 30.0
        self.error: BaseException | None = None
        self._tail = 0
        self._done_msgs = 0
        self._mark_seen = 0
        self._adopted = 0  # the newest step mark adopted
        self._passed: dict[str, Any] | None = None  # ... not yet in an index block
        self._seen_marks: deque[tuple[int, ...]] = deque(maxlen=1024)
        self._stop = False
        self._parent_gone = False
        self._flush_due = False
        self._flush_seq = 0
        self._urgent_seen = 0
        self.pay_pos = -1  # ring position of the payload being handled
        self.room_after = 0  # ... ring bytes from it to the message's end
        self.pay_bytes = 0  # ... and its bytes (a batch's: small tensors after those written go into the index)
        self._slept_bytes = 0  # bytes published while the child last slept (0: it found more without sleeping)
        self._data: RingDataFile | None = None
        self._layouts: dict[bytes, StatisticsLayout | _BatchPlan] = {}  # decoded descriptions
        sink = None
        if tensorboard_dir:  # (the TensorBoard export, attached to the encoder as its sink)
            from tensortap.tensorboard.export import EventExporter

            sink = EventExporter(tensorboard_dir, worker)
            sink.behind = self._behind
        self.encoder = ChunkEncoder(storage, worker, num_workers=num_workers, chunk_bytes=chunk_bytes,
                                    max_pending_bytes=max_pending_bytes, metadata=metadata, sink=sink,
                                    data_file=self._data_file)
        self.encoder.on_index_write = self._index_write

    def _index_write(self, records: int, chunk: int, size: int) -> None:
        """An index write begins (see ring.INDEX_RECORDS): every earlier one has landed."""
        h = self._hv
        h[R.DURABLE] = self.encoder.durable_records
        h[R.INDEX_CHUNK] = chunk
        h[R.INDEX_SIZE] = size
        h[R.INDEX_RECORDS] = records

    def _data_file(self, storage: Storage, key: str) -> RingDataFile:
        self._data = RingDataFile(storage, key, self)
        return self._data

    def _behind(self) -> bool:
        """Whether the messages published and not yet handled are a backlog: over 1/8 of the ring more than what
        came while the child last slept (that much waits at every look, however fast it writes)."""
        return load_acquire(self._hdr_addr + 8 * R.HEAD) - self._tail > self._rcap // 8 + self._slept_bytes

    def release(self) -> None:
        """Drop this reader's views of the ring (when it ran in the training process, which unmaps it)."""
        self._hv.release()
        self.ring = None
        self._mem = None

    def _write_regions(self) -> None:
        if self._data is not None:
            self._data.write_regions()

    def _block(self, end: bool = False) -> None:
        """Write an index block (with the newest step mark adopted), then tell the training process."""
        self._write_regions()
        passed, self._passed = self._passed, None
        self.encoder.write_block(end, passed, self._flush_due)
        if self._flush_due:
            self._flush_due = False
            self._hv[R.FLUSHED] = self._flush_seq
        self.publish_done()  # (what is now indexed: the training process counts losses against it)

    def _say(self) -> None:
        try:
            os.write(self._answer, b"\0")
        except OSError:  # full (nobody waits) or closed (the parent is gone)
            pass

    def run(self) -> None:
        h = self._hv
        enc = self.encoder
        h[R.STATE] = R.RUNNING
        last_flush = time.monotonic()
        poll = POLL
        try:
            while True:
                target = self._target()
                if self._tail >= target:
                    wait = max(0.0, self.flush_interval - (time.monotonic() - last_flush))
                    r, _w, _x = select.select([self._bell], [], [], min(wait, poll))
                    poll = min(POLL, poll * 2)
                    if r and os.read(self._bell, 65536) == b"":
                        self._parent_gone = True
                    target = self._target()
                    self._slept_bytes = target - self._tail
                else:
                    self._slept_bytes = 0
                if self._tail < target:
                    poll = BUSY_POLL
                while self._tail < target and not self._stop:
                    self._one()
                    if (self._flush_due or enc.block_bytes > BLOCK_BYTES
                            or time.monotonic() - last_flush >= self.flush_interval):
                        # (also while working through a backlog: a crash loses at most a flush interval)
                        self._take_mark()
                        self._block()
                        last_flush = time.monotonic()
                if self._answer_due and self._tail >= target:
                    self._write_regions()  # (what a control message's sender waits for is written)
                    self._answer_due = False
                    self._say()
                self._take_mark()
                if self._adopted > h[R.PROMPTED] and h[R.ASKED] > h[R.PROMPTED]:
                    # (a step mark at or past the one the training process asked for: readable now)
                    self._block()
                    last_flush = time.monotonic()
                    h[R.PROMPTED] = self._adopted
                    self._say()
                if self._stop:
                    self._block(end=True)
                    enc.drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if self._parent_gone and self._tail >= h[R.HEAD]:
                    self._block()  # no end mark: the training process did not close
                    enc.drain_unpublished(deadline=time.monotonic() + self.close_timeout)
                    break
                if time.monotonic() - last_flush >= self.flush_interval:
                    self._block()
                    last_flush = time.monotonic()
                if enc.unpublished and time.monotonic() >= enc.retry_at:
                    enc.publish_pending()
                h[R.OUTAGE] = int(enc.outage)
            self.publish_done()
            h[R.OUTAGE] = int(enc.outage)
            h[R.STATE] = R.ENDED
        except BaseException as e:  # noqa: BLE001 - report to the training process
            self.error = e
            logger.exception("tensortap: the writer of %s failed; no more data will be saved", self.worker)
            text = f"{type(e).__name__}: {e}".encode()[:R.ERR_MAX]
            self._mem[R.ERR_AT:R.ERR_AT + len(text)] = text
            h[R.ERR_LEN] = len(text)
            h[R.STATE] = R.FAILED
        finally:
            self._say()  # (a close() waiting for the end wakes at once)
            try:
                enc.close()
            except Exception:  # noqa: BLE001 - (the files are written; the sink's failure is the sink's)
                logger.debug("tensortap: closing the writer of %s", self.worker, exc_info=True)

    def _target(self) -> int:
        """Ring position to handle messages up to: everything published. (Handling it at each look rather
        than a lag behind: a saving step's message no longer waits for a drain or a flush to wake the
        child; on the MLP benchmark, saving losses only every 100 steps, x1.006 instead of x1.010.)
        A new control message is answered once everything before it is handled."""
        urgent = self._hv[R.URGENT]  # read before the head: the head is then at least as new
        if urgent != self._urgent_seen:
            self._urgent_seen = urgent
            self._answer_due = True
        return load_acquire(self._hdr_addr + 8 * R.HEAD)  # (the messages before it are all written)

    def _take_mark(self) -> None:
        """Adopt the newest step mark whose messages are all processed. Every mark seen is kept until then, so a
        child that lags behind the training process still publishes marks (not only once it catches up)."""
        mark = get_mark(self._hdr_addr + 8 * R.MARK_SEQ)
        if mark is not None and mark[0] != self._mark_seen and mark[0] > 0:
            self._mark_seen = mark[0]
            self._seen_marks.append(mark)
        best = None
        seen = self._seen_marks
        while seen and seen[0][1] <= self._done_msgs:
            best = seen.popleft()
        if best is not None:
            self._adopted, _msgs, step, *modes = best
            self._passed = {"step": step, "mode_steps": {
                n: v for n, v in zip(R.MODE_NAMES, modes, strict=True) if v >= 0}}

    def _one(self) -> None:
        """Process the message at the tail, then free its ring space."""
        mem, cap = self._mem, self._rcap
        pos = self._tail % cap
        total = _TOTAL.unpack_from(mem, R.HDR + pos)[0]
        if total == R.WRAP:
            self._tail += cap - pos
            return
        _t, mlen, pay_at, step, mode, mode_step = R.MSG.unpack_from(mem, R.HDR + pos)
        raw = mem[R.HDR + pos + R.MSG_HDR:R.HDR + pos + R.MSG_HDR + mlen]
        # A batch's or a statistics message's description is the same at every step: decoded once.
        plan = self._layouts.get(raw)
        if plan is None:
            meta = R.decode_meta(raw)
            if meta[0] == "batch":
                plan = _BatchPlan(meta)
            elif meta[0] == "statistics":
                plan = StatisticsLayout.from_json(meta[1])
            if plan is not None:
                if len(self._layouts) > 256:
                    self._layouts.clear()
                self._layouts[raw] = plan
        pay = pos + pay_at
        self.pay_pos, self.room_after = pay, total - pay_at  # ring bytes from the payload to the message's end
        if type(plan) is _BatchPlan:
            self.pay_bytes = plan.nbytes
            flat = np.frombuffer(self.ring, dtype=plan.dtype, count=plan.count, offset=pay)
            self.encoder.encode_batch(RecordBatch(plan.names, [flat[i:j].reshape(shape) for i, j, shape in plan.bounds],
                                                  flat, step, mode, mode_step, plan.reductions))
        elif plan is not None:
            self.pay_bytes = 0
            values = np.frombuffer(self.ring, dtype=plan.vector_dtype, count=plan.vector_size, offset=pay)
            self.encoder.encode_statistics(StatisticsRows(plan, values, step, mode, mode_step))
        else:
            self._other(meta, pay, step, mode, mode_step)
        self._tail += total
        self._done_msgs += 1
        if self._data is None or not self._data.waiting:  # (else once its direct writes are done)
            self.publish_done()

    def _other(self, meta: list, pay: int, step: int, mode: int, mode_step: int) -> None:
        """A message other than a batch or statistics in the ring: records, control, or one whose payload lies in
        a segment of its own."""
        self.pay_bytes = R.payload_bytes(meta)
        base: Any = self.ring
        seg = None
        if meta[0] == "big":
            _k, name, size, meta = meta
            seg = R.open_segment(name, size)
            base, pay = np.frombuffer(seg, dtype=np.uint8), 0
            self.pay_pos = -1
        try:
            if meta[0] == "statistics":
                layout = StatisticsLayout.from_json(meta[1])
                values = np.frombuffer(base, dtype=layout.vector_dtype, count=layout.vector_size, offset=pay)
                self.encoder.encode_statistics(StatisticsRows(layout, values, step, mode, mode_step))
            else:
                self._handle(meta, base, pay, step, mode, mode_step)
        finally:
            base = None
            if seg is not None:
                try:
                    seg.close()
                except BufferError:
                    pass  # a view is still alive somewhere: the mapping goes with it
                R.unlink_segment(name)
                self._hv[R.BIG_DONE] += size

    def publish_done(self) -> None:
        """Tell the training process what is handled: the ring space up to the tail is free again."""
        h = self._hv
        enc = self.encoder
        h[R.WRITTEN] = enc.written_records
        h[R.DURABLE] = enc.durable_records
        h[R.DROPPED] = enc.dropped_records
        h[R.DONE_MSGS] = self._done_msgs
        store_release(self._hdr_addr + 8 * R.TAIL, self._tail)  # (after every read of the space it frees)

    def _handle(self, meta: list, base: np.ndarray, pay: int, step: int, mode: int, mode_step: int) -> None:
        kind = meta[0]
        enc = self.encoder
        if kind == "batch":  # step, mode and mode step travel in the message header
            plan = _BatchPlan(meta)
            flat = np.frombuffer(base, dtype=plan.dtype, count=plan.count, offset=pay)
            enc.encode_batch(RecordBatch(plan.names, [flat[i:j].reshape(shape) for i, j, shape in plan.bounds],
                                         flat, step, mode, mode_step, plan.reductions))
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
                enc.encode(Record(name=name, step=step, mode=mode, mode_step=mode_step, value=value,
                                  save_raw=save_raw, reductions=tuple((rn, ab) for rn, ab in reductions),
                                  reduction_values=rv, save_shape=save_shape,
                                  shape=tuple(shape) if shape is not None else None))
        elif kind == "collections":
            enc.take_collections(json.loads(meta[1]))
        elif kind == "flush":
            self._flush_due = True
            self._flush_seq = meta[1]
        elif kind == "stop":
            self._stop = True
        # "skip": a cancelled reservation, nothing to do


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
    reader = RingReader(storage, cfg["worker"], mem, cfg["bell"], cfg.get("answer", -1),
                        num_workers=cfg["num_workers"], flush_interval=cfg["flush_interval"],
                        chunk_bytes=cfg["chunk_bytes"], max_pending_bytes=cfg["max_pending_bytes"],
                        metadata=cfg["metadata"], tensorboard_dir=cfg.get("tensorboard_dir"))
    reader.run()
    logging.shutdown()
    os._exit(1 if reader.error is not None else 0)  # (everything is written: no interpreter teardown to wait for)
