"""The synchronous encoder of the native store: records in, payloads and index blocks out, on a `Storage`.

`ChunkEncoder` has no thread, no queue and no transport: the writers (`tensortap.transport.thread_writer`, a
thread in the training process, and `tensortap.transport.process_writer`, a child process) take hand-offs off
the training thread and call it from one thread of their own. It keeps the writing rules of docs/format.md §4:
payloads reach the data file before the index block that points at them, one append per block, and on a full
disk the block of what fitted is still written in the space set aside (`reserve.bin`).

A sink the caller attaches (the TensorBoard export) gets every record the encoder takes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from typing import Any

import numpy as np

from tensortap.format import codec, layout
from tensortap.format.block_tables import BatchTemplate, BlockTables, byte_view, record_keys
from tensortap.format.datafile import DataFile, write_all
from tensortap.format.entries import (
    INLINE_BYTES,
    NO_REDUCTION,
    PACKED,
    PACKED_SPARSE,
    RAW,
    REDUCTION,
    SHAPE,
    reduction_code,
)
from tensortap.format.records import (
    MODE_NAME,
    Record,
    RecordBatch,
    ScalarRows,
    StatisticsLayout,
    StatisticsRows,
    compute_reduction,
)
from tensortap.storage.base import Storage

__all__ = ["ChunkEncoder", "DataFile", "Record", "RecordBatch", "ScalarRows", "StatisticsLayout", "StatisticsRows",
           "compute_reduction", "storage_full", "RESERVE_BYTES"]

logger = logging.getLogger("tensortap")

#: errors that mean the storage is full: the writer stops writing payloads and counts every record as dropped
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: set aside for the index blocks a writer still writes once the disk is full (docs/format.md §4): the block of
#: what fitted (fewer records while it does not fit, their payloads cut off the data file) and the end of the job
RESERVE_BYTES = 16 << 10
#: write an index block at least once per this many payload bytes
BLOCK_BYTES = 64 << 20
_FLOAT64 = codec.dtype_to_str(np.dtype("<f8"))


def storage_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in STORAGE_FULL_ERRNOS


class ChunkEncoder:
    """Appends one worker's records to chunk files (`.dat` payloads + `.idx` index blocks), synchronously.

    `encode*` take hand-offs into the block being built (payloads are appended to the data file as they come);
    `write_block` writes the data file's pending bytes and then one index block describing them. On an object
    store (`storage.supports_append` False) chunks are built in memory and published whole ("sealed").
    One thread calls it. Failures other than a full disk raise: the writer around it reports them.
    """

    def __init__(
        self,
        storage: Storage,
        worker: str,
        *,
        num_workers: int = 1,
        chunk_bytes: int = 256 << 20,
        max_pending_bytes: int = 512 << 20,
        seal_interval: float = 2.0,
        sealed_chunk_bytes: int = 32 << 20,
        metadata: dict[str, Any] | None = None,
        sink: Any = None,
        first_seq: int | None = None,
        data_file: Any = DataFile,
    ):
        """`sink`: gets every record taken (add(name, step, mode, mode_step, value, reductions),
        set_collections(json), flush() at each index block, close()). `first_seq`: the first free chunk number
        when the caller knows it (else the first chunk lists the worker's folder). `data_file(storage, key)`:
        opens a chunk's data file (a `DataFile`; the writer process's writes ring pages with direct I/O)."""
        self.storage = storage
        self.worker = worker
        self.num_workers = num_workers
        self.sink = sink
        self.data_file = data_file
        self.max_pending_bytes = max_pending_bytes
        self.seal_interval = seal_interval
        #: object stores cannot append: chunks are built in memory and published whole ("sealed")
        self.sealed_mode = not storage.supports_append
        # Object stores serve ranged GETs faster from smaller objects, and a reader lists chunks, not steps.
        self.chunk_bytes = min(chunk_bytes, sealed_chunk_bytes) if self.sealed_mode else chunk_bytes
        self.metadata = dict(metadata or {})
        self.dropped_records = 0  # records taken and not saved: the disk is full, or an object store stayed down
        self.written_records = 0  # records taken into a block (in memory or written)
        self.durable_records = 0  # records in index blocks written (what a reader finds; object stores: published)
        #: told, before an index write that makes records durable, (durable_records once it lands, the chunk
        #: whose index it writes, that index's size once it lands): a process that outlives a crash between the
        #: write and the next look at durable_records learns from the store whether it landed
        self.on_index_write: Any = None
        self.full = False  # the storage ran out of space: no more payloads are written
        self.outage = False  # publishing is failing; sealed chunks wait (bounded by max_pending_bytes)
        self.block_bytes = 0  # payload bytes since the last index block
        self._sealed_records = 0
        self._dat_buf = bytearray()  # (object stores) the chunk being built
        self._idx_buf = bytearray()
        self._chunk_started = time.monotonic()
        self._unpublished: list[tuple[int, bytes, bytes, int]] = []  # (seq, data, index, records) to upload
        self.unpublished_bytes = 0
        self.retry_at = 0.0
        self._retry_delay = 0.5
        self._published_step = -1
        self._durable_dat = 0  # bytes of the data file that indexed payloads reach
        self._reserved = False
        self._seq = -1 if first_seq is None else first_seq  # the chunk being written (-1: not known yet)
        self._dat: Any = None
        self._idx: Any = None
        self._idx_size = 0
        self._tables = BlockTables()
        self._rows: list[tuple] = []  # entries of single records, not yet in _row_parts
        self._row_parts: list[np.ndarray] = []  # entries of the block so far, in order
        self._templates: dict[Any, BatchTemplate] = {}  # batch layouts (bound to a block's tables when used)
        #: statistics layouts whose description the chunk's data file holds: by id and by content ->
        #: (layout, [offset, length, crc])
        self._layouts: dict[Any, tuple[StatisticsLayout, list[int]]] = {}
        self._passed: dict[str, Any] | None = None
        self._collections: dict[str, Any] | None = None
        self._first_block = True
        self._last_reductions: dict[str, dict[str, Any]] = {}  # of the batch being encoded, for the sink

    # --- chunks -----------------------------------------------------------------------------

    @property
    def chunk_open(self) -> bool:
        return self._dat is not None

    def open_first_chunk(self) -> None:
        """Make the first chunk's files now (a full disk then counts as when the first record finds it full)."""
        if self.sealed_mode or self._dat is not None or self.full:
            return
        try:
            self._open_chunk()
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, 0)

    def _first_free_seq(self) -> int:
        keys = self.storage.list(layout.worker_dir(self.worker) + "/")
        seqs = [p[1] for k in keys if (p := layout.parse_chunk_key(k))]
        return max(seqs) + 1 if seqs else 0

    def _open_chunk(self) -> None:
        if self._seq < 0:
            self._seq = self._first_free_seq()
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
            self._dat = self.data_file(self.storage, layout.chunk_key(self.worker, self._seq, layout.DATA_SUFFIX))
            self._idx = self.storage.open_append(layout.chunk_key(self.worker, self._seq, layout.INDEX_SUFFIX))
        self._durable_dat = 0
        self._idx_size = 0
        self._first_block = True
        self._layouts = {}

    @property
    def data_size(self) -> int:
        """Bytes of the current chunk's data (written or gathered)."""
        if self.sealed_mode:
            return len(self._dat_buf)
        return self._dat.size if self._dat is not None else 0

    def close(self) -> None:
        """Close the sink and the chunk's files (after the last block)."""
        try:
            if self.sink is not None:
                self.sink.close()
        finally:
            if not self.sealed_mode:
                for f in (self._dat, self._idx):
                    if f is not None:
                        try:
                            f.close()
                        except OSError:
                            pass

    # --- payloads ---------------------------------------------------------------------------

    def _add_payload(self, buf: bytes | np.ndarray) -> tuple[int, int, int, bytes]:
        """(flags, offset, crc, inline) for a payload: inline when small, else appended to the data file."""
        if len(buf) <= INLINE_BYTES:
            return codec.FLAG_INLINE, 0, 0, bytes(buf)
        return 0, self._append_data(buf), codec.crc32c(buf), b""

    def _append_data(self, buf: Any, address: int | None = None) -> int:
        """Append payload bytes to the data file; their offset. The caller's array is free once this returns.
        `address`: of the first byte of `buf`, when the caller has it (the data file then need not ask numpy)."""
        if self.sealed_mode:
            off = len(self._dat_buf)
            view = memoryview(buf).cast("B")
            self._dat_buf += view
            self.block_bytes += len(view)
            return off
        off = self._dat.append(buf, address)
        self.block_bytes += self._dat.size - off
        return off

    # --- hand-offs --------------------------------------------------------------------------

    def _guard(self, n: int, encode: Any, *args: Any) -> None:
        """Run an encode step; a full disk stops payloads (the `n` records of this hand-off counted)."""
        if self.full:
            self.dropped_records += n
            return
        try:
            encode(*args)
        except OSError as e:
            if not storage_full(e):
                raise
            self._storage_full(e, n)

    def encode(self, r: Record) -> None:
        self._guard(1, self._encode_rows, r)

    def encode_many(self, records: list[Record] | tuple[Record, ...]) -> None:
        for r in records:
            self.encode(r)

    def encode_batch(self, b: RecordBatch) -> None:
        self._guard(len(b.arrays), self._encode_batch_rows, b)

    def encode_scalars(self, rows: ScalarRows) -> None:
        if self.full or self.sink is not None:  # (dropped and counted, or each given to the sink)
            self.encode_many(rows.records())
            return
        self._guard(len(rows), self._encode_scalar_rows, rows)

    def encode_statistics(self, rows: StatisticsRows) -> None:
        if self.full or self.sink is not None:
            self.encode_many(rows.records())
            return
        self._guard(len(rows), self._encode_statistics_rows, rows)

    def take_collections(self, collections_json: dict[str, Any]) -> None:
        """The collections travel in the next block's header (the newest wins)."""
        self._collections = collections_json
        if self.sink is not None:
            self.sink.set_collections(collections_json)

    def _flush_rows(self) -> None:
        if self._rows:
            self._row_parts.append(np.array(self._rows, dtype=codec.DISK_ENTRY_DTYPE))
            self._rows.clear()

    def _template(self, b: RecordBatch, dtype_str: str | None) -> BatchTemplate:
        arrays = b.arrays
        n = len(arrays)
        rows = np.zeros(n, dtype=codec.DISK_ENTRY_DTYPE)
        dtypes = [dtype_str] * n if dtype_str is not None else [codec.dtype_to_str(a.dtype) for a in arrays]
        lengths = [a.nbytes for a in arrays]
        rows["kind"] = RAW
        rows["reduction"] = NO_REDUCTION
        rows["length"] = lengths
        runs: list[tuple[int, int]] = []
        for i in range(n):
            if lengths[i] <= INLINE_BYTES:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        tmpl = BatchTemplate(rows, lengths, runs, tuple(b.names), dtypes, [tuple(a.shape) for a in arrays])
        if tmpl.inline:
            rows["flags"][tmpl.inline] = codec.FLAG_INLINE
        return tmpl

    def _encode_batch_rows(self, b: RecordBatch) -> None:
        if self._dat is None:
            self._open_chunk()
        arrays = b.arrays
        flat = b.flat
        key = (b.names, flat.dtype if flat is not None else None, *[a.shape for a in arrays])
        tmpl = self._templates.get(key)
        if tmpl is None:
            if len(self._templates) >= 256:  # (layouts that keep changing: kept for a while, not forever)
                self._templates.clear()
            tmpl = self._templates[key] = self._template(b, codec.dtype_to_str(flat.dtype) if flat is not None
                                                         else None)
        if tmpl.tables is not self._tables:
            tmpl.bind(self._tables)  # (the first batch of this layout in the block)
        crc_at = codec.crc32c_at
        outline = tmpl.outline
        if flat is not None and flat.nbytes == tmpl.total:
            byte_flat = flat.reshape(-1).view(np.uint8)
            addr = byte_flat.ctypes.data  # (byte_flat keeps the memory alive)
            if not tmpl.inline:
                offsets = tmpl.rel + self._append_data(byte_flat, addr)  # every payload, in one write
            else:
                # Each run of written payloads at the offset _append_data gives it: a data file may place a run
                # on a page boundary (the writer process's direct writes), so runs need not be contiguous.
                offsets = np.empty(len(outline), dtype=np.uint64)
                spans = tmpl.spans
                j = 0
                for first, end in tmpl.runs:
                    start = spans[first][0]
                    at = self._append_data(byte_flat[start:spans[end - 1][1]], addr + start)
                    for i in range(first, end):
                        offsets[j] = at + spans[i][0] - start
                        j += 1
            spans = tmpl.spans
            if crc_at is not None:
                crcs = [crc_at(addr + spans[i][0], tmpl.lengths[i]) for i in outline]
            else:
                crcs = [codec.crc32c(byte_flat[spans[i][0]:spans[i][1]]) for i in outline]
            inline = [byte_flat[spans[i][0]:spans[i][1]] for i in tmpl.inline]
        else:
            pieces = [byte_view(a) for a in arrays]
            offsets = np.array([self._append_data(pieces[i]) for i in outline], dtype=np.uint64)
            crcs = [codec.crc32c(pieces[i]) for i in outline]
            inline = [pieces[i] for i in tmpl.inline]
        rows = tmpl.rows.copy()
        rows["mode"] = b.mode
        rows["step"] = b.step
        rows["mode_step"] = b.mode_step
        if not inline:
            rows["offset"] = offsets
            rows["crc"] = crcs
        else:
            if outline:
                rows["offset"][outline] = offsets
                rows["crc"][outline] = crcs
            for i, piece in zip(tmpl.inline, inline, strict=True):
                rows["inline"][i] = piece.tobytes().ljust(INLINE_BYTES, b"\0")
        self._flush_rows()
        self._row_parts.append(rows)
        reds = b.reductions
        if reds is not None:
            for name, arr, wanted in zip(b.names, arrays, reds, strict=True):
                if wanted:
                    self._add_reductions(name, arr, b.mode, b.step, b.mode_step, wanted, {})
        if self.sink is not None:
            mode = MODE_NAME[b.mode]
            for i, (name, arr) in enumerate(zip(b.names, arrays, strict=True)):
                self.sink.add(name, b.step, mode, b.mode_step, arr, self._last_reductions.get(name)
                              if reds is not None and reds[i] else None)
        self._last_reductions = {}
        self.written_records += len(arrays)

    def _inline_rows(self, n: int, mode: int, kind: int, dtype_id: Any, shape_id: int) -> np.ndarray:
        e = np.zeros(n, dtype=codec.DISK_ENTRY_DTYPE)
        e["mode"] = mode
        e["kind"] = kind
        e["flags"] = codec.FLAG_INLINE
        e["dtype"] = dtype_id
        e["shape"] = shape_id
        return e

    def _encode_scalar_rows(self, rows: ScalarRows) -> None:
        if self._dat is None:
            self._open_chunk()
        t = self._tables
        ids = np.array([t._id(t.names, name) for name in rows.names], dtype=np.uint32)
        n = len(rows)
        e = self._inline_rows(n, rows.mode, RAW, t._id(t.dtypes, _FLOAT64), t._id(t.shapes, ()))
        e["name"] = ids[rows.name]
        e["reduction"] = NO_REDUCTION
        e["step"] = rows.steps
        e["mode_step"] = rows.mode_steps
        e["length"] = 8
        inline = np.zeros((n, INLINE_BYTES), dtype=np.uint8)
        inline[:, :8] = np.asarray(rows.values, dtype="<f8").view(np.uint8).reshape(n, 8)
        e["inline"] = inline.view(e.dtype["inline"]).reshape(n)
        self._flush_rows()
        self._row_parts.append(e)
        self.written_records += n

    def _statistics_layout(self, lay: StatisticsLayout) -> int:
        """The block's id of a statistics layout. Its description is a payload of the chunk's data file, written
        the first time the chunk's entries use it (docs/format.md §3.3); the block header refers to it."""
        ref = self._layouts.get(id(lay))
        if ref is None or ref[0] is not lay:  # (a layout made anew for a step: found by its content)
            key = (lay.names, lay.keys, lay.kinds, lay.kind_of.tobytes(), lay.order.tobytes())
            same = self._layouts.get(key)
            if same is not None:
                ref = (lay, same[1])
                if len(self._layouts) < 256:  # (layouts made anew at every step: their content finds them)
                    self._layouts[id(lay)] = ref
        if ref is None or ref[0] is not lay:
            order = np.concatenate([at for at, _dt in lay._at])
            body = json.dumps({"names": [lay.names[i] for i in lay.tensor[order].tolist()],
                               "reductions": lay.codes[order].tolist(),
                               "dtypes": [lay.kinds[k] for k in lay.kind_of[order].tolist()]},
                              separators=(",", ":")).encode()
            ref = self._layouts[id(lay)] = (lay, [self._append_data(body), len(body), codec.crc32c(body)])
            self._layouts[key] = ref
        t = self._tables
        hit = t.statistics.get(ref[1][0])
        if hit is None:
            hit = t.statistics[ref[1][0]] = (len(t.statistics), ref[1], len(lay.names))
        return hit[0]

    def _encode_statistics_rows(self, rows: StatisticsRows) -> None:
        """One packed entry (docs/format.md §3.3): the step's statistics back to back, by dtype, in one payload."""
        if self._dat is None:
            self._open_chunk()
        lay = rows.layout
        if not len(lay):
            return
        lid = self._statistics_layout(lay)
        parts = [vals.view(np.uint8) for _at, vals in lay.stored(rows.values)]  # (the layout's runs, in order)
        # a run whose values are all zero (a non-finite count, nearly always) is left out: kind 4, mask of the rest
        mask = sum(1 << r for r, p in enumerate(parts) if p.any())
        kind = PACKED
        if mask != (1 << len(parts)) - 1 and len(parts) <= 32:
            kind, parts = PACKED_SPARSE, [p for p in parts if p.any()]
        else:
            mask = 0
        buf = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, np.uint8)
        flags, offset, crc, inline = self._add_payload(buf)
        self._flush_rows()
        self._rows.append((lid, rows.mode, kind, NO_REDUCTION, flags, 0, mask, rows.step, rows.mode_step, offset,
                           len(buf), crc, inline))
        self.written_records += len(rows)

    def _encode_rows(self, r: Record) -> None:
        if self._dat is None:
            self._open_chunk()
        t = self._tables
        name_id = t._id(t.names, r.name)
        value = r.value
        shape = tuple(value.shape) if value is not None else tuple(r.shape or ())
        shape_id = t._id(t.shapes, shape)
        if (value is not None and r.save_raw and value.nbytes <= INLINE_BYTES and not r.reductions
                and not r.reduction_values and self.sink is None):
            # (the usual scalar: its bytes inline in the entry, nothing else to store)
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype))
            self._rows.append((name_id, r.mode, RAW, NO_REDUCTION, codec.FLAG_INLINE, dtype_id, shape_id, r.step,
                               r.mode_step, 0, value.nbytes, 0, value.tobytes()))
            self.written_records += 1
            return
        wrote_any = False
        if value is not None and r.save_raw:
            buf = byte_view(value)  # no copy: the record owns its array until the block is written
            flags, off, crc, inl = self._add_payload(buf)
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype))
            self._rows.append((name_id, r.mode, RAW, NO_REDUCTION, flags, dtype_id, shape_id, r.step, r.mode_step,
                               off, len(buf), crc, inl))
            wrote_any = True
        reductions = self._add_reductions(r.name, value, r.mode, r.step, r.mode_step, r.reductions,
                                          r.reduction_values, shape)
        wrote_any = wrote_any or bool(reductions)
        if self.sink is not None:
            self._last_reductions = {}
            self.sink.add(r.name, r.step, MODE_NAME[r.mode], r.mode_step, value,
                          {("abs_" if a else "") + n: v for (n, a), v in reductions.items()})
        if r.save_shape and not wrote_any:
            dtype_id = t._id(t.dtypes, codec.dtype_to_str(value.dtype) if value is not None else "|V0")
            self._rows.append((name_id, r.mode, SHAPE, NO_REDUCTION, 0, dtype_id, shape_id, r.step, r.mode_step,
                               0, 0, 0, b""))
        self.written_records += 1

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
            self._rows.append((name_id, mode, REDUCTION, reduction_code(red_name, abs_), flags, dtype_id, shape_id,
                               step, mode_step, off, len(buf), crc, inl))
        if self.sink is not None:
            self._last_reductions[name] = {("abs_" if a else "") + n: v for (n, a), v in reductions.items()}
        return reductions

    # --- index blocks -----------------------------------------------------------------------

    @property
    def has_entries(self) -> bool:
        return bool(self._rows or self._row_parts)

    def write_block(self, end: bool = False, passed: dict[str, Any] | None = None, flushing: bool = False) -> None:
        """Write the data file's pending bytes, then one index block of the records taken since the last (with
        the step mark `passed`, the collections if they changed, the end of the job if `end`). `flushing`: a
        flush asked for it (an object store's chunk is then sealed and published)."""
        if passed is not None and passed["step"] > self._published_step:
            self._passed = passed
            self._published_step = passed["step"]
        if self.full and not end and not self.has_entries:
            return  # (the disk is full: the room left is for the end of the job; step marks wait for it)
        try:
            self._write_block_now(end, flushing)
        except OSError as e:
            if not storage_full(e):
                raise
            if not self.full:
                self._storage_full(e, 0)
            # The block of what fitted, in the space set aside; while it does not fit, it keeps fewer records (their
            # payloads cut off the data file), down to the marks and the end alone.
            while True:
                try:
                    self._write_block_now(end, flushing)
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

    def storage_full(self, e: OSError) -> None:
        """The data file found the storage full while writing payloads already taken (no hand-off failed)."""
        self._storage_full(e, 0)

    def _block_entries(self) -> np.ndarray:
        """The entries of the block being built, in order, as one array (which then stands for them)."""
        self._flush_rows()
        parts = self._row_parts
        if not parts:
            rows = np.empty(0, dtype=codec.DISK_ENTRY_DTYPE)
        elif len(parts) == 1:
            rows = parts[0]
        else:  # (np.concatenate of structured arrays is slow: it joins their bytes)
            rows = np.frombuffer(b"".join([p.tobytes() for p in parts]), dtype=codec.DISK_ENTRY_DTYPE)
        self._row_parts = [rows] if len(rows) else []
        return rows

    def _keep_fitted(self) -> int:
        """Keep the block's records whose payloads all reached the data file (entries of a record go or stay
        together); cut the data file after the last of them. How many records stay."""
        if self.sealed_mode or self._dat is None:
            self._forget_block()
            return 0
        self._dat.discard_pending()
        on_disk = self._dat.on_disk(self._durable_dat)
        rows = self._block_entries()
        keys = record_keys(rows)
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
        keys = record_keys(rows)
        _u, first = np.unique(keys, return_index=True)
        order = np.sort(first)
        stay = keys[order[:int(len(order) * keep_fraction)]]
        before = self._tables.records_of(rows)
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
        # (layout descriptions cut off with the payloads are written again when used)
        self._layouts = {k: v for k, v in self._layouts.items() if v[1][0] + v[1][1] <= end}
        if self.sealed_mode:
            del self._dat_buf[end:]
        else:
            try:
                self._dat.truncate(end)
            except OSError:
                self._dat.size = end
        return self._tables.records_of(rows)

    def _forget_block(self) -> None:
        self._rows.clear()
        self._row_parts = []
        if not self.sealed_mode and self._dat is not None:
            self._dat.discard_pending()
        self._tables = BlockTables()

    def _write_block_now(self, end: bool, flushing: bool) -> None:
        if not self.has_entries and self._passed is None and self._collections is None and not end:
            if self.sealed_mode and self._idx_buf and (self._seal_due() or flushing):
                self._seal()
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
        # Payloads first (most are written already), then the index block that points at them.
        block = codec.encode_block(header, self._block_entries())
        if self.sealed_mode:
            self._idx_buf += block
        else:
            self._dat.sync()
            start = self._idx_size
            if self.on_index_write is not None:
                self.on_index_write(self.written_records, self._seq, start + len(block))
            try:
                write_all(self._idx, block)  # one append (a short write is continued)
            except OSError:
                self._idx.flush()
                self.storage.truncate(layout.chunk_key(self.worker, self._seq, layout.INDEX_SUFFIX), start)
                raise  # (no torn block before the ones written later)
            self._idx_size = start + len(block)
            self.durable_records = self.written_records
        self._first_block = False
        self._durable_dat = self.data_size
        if self.sink is not None:
            self.sink.flush()
        self._rows.clear()
        self._row_parts = []
        self.block_bytes = 0
        self._tables = BlockTables()
        self._collections = None
        self._passed = None
        if self.sealed_mode:
            if end or flushing or self.data_size >= self.chunk_bytes or self._seal_due():
                self._seal()
        elif self.data_size >= self.chunk_bytes and not end:
            self._dat.close()
            self._idx.close()
            self._seq += 1
            self._open_chunk()

    # --- sealed chunks (object stores) ---------------------------------------------------------

    def _seal_due(self) -> bool:
        return time.monotonic() - self._chunk_started >= self.seal_interval

    def _seal(self) -> None:
        """Close the in-memory chunk and publish it (data object first, then its index)."""
        dat, idx = bytes(self._dat_buf), bytes(self._idx_buf)
        records, self._sealed_records = self.written_records - self._sealed_records, self.written_records
        if self._unpublished and self.unpublished_bytes + len(dat) + len(idx) > self.max_pending_bytes:
            # (the store has been down for a while: what waits for it is bounded; this chunk is lost, counted)
            self.dropped_records += records
            logger.warning("tensortap: %s is still unreachable and %d bytes wait for it: %d records dropped "
                           "(dropped_records)", self.storage.url, self.unpublished_bytes, records)
        else:
            self._unpublished.append((self._seq, dat, idx, records))
            self.unpublished_bytes += len(dat) + len(idx)
        self._seq += 1
        self._dat = self._idx = None  # the next record opens a new chunk
        self._dat_buf = bytearray()
        self._idx_buf = bytearray()
        self.publish_pending()

    @property
    def unpublished(self) -> bool:
        return bool(self._unpublished)

    def publish_pending(self) -> None:
        """Upload sealed chunks in order; on failure keep them and retry later with backoff."""
        while self._unpublished:
            seq, dat, idx, records = self._unpublished[0]
            try:
                if dat:
                    self.storage.write(layout.chunk_key(self.worker, seq, layout.DATA_SUFFIX), dat)
                if self.on_index_write is not None:
                    self.on_index_write(self.durable_records + records, seq, len(idx))
                self.storage.write(layout.chunk_key(self.worker, seq, layout.INDEX_SUFFIX), idx)
            except Exception as e:  # noqa: BLE001 - the store is unreachable: buffer and retry
                if not self.outage:
                    logger.warning("tensortap: cannot write to %s (%s); buffering up to %d bytes and retrying",
                                   self.storage.url, e, self.max_pending_bytes)
                self.outage = True
                self.retry_at = time.monotonic() + self._retry_delay
                self._retry_delay = min(self._retry_delay * 2, 10.0)
                return
            self._unpublished.pop(0)
            self.durable_records += records
            self.unpublished_bytes -= len(dat) + len(idx)
            if self.outage:
                logger.warning("tensortap: %s is reachable again; buffered data uploaded", self.storage.url)
            self.outage = False
            self._retry_delay = 0.5

    def drain_unpublished(self, deadline: float) -> None:
        """Publish what waits until `deadline` (time.monotonic()); what is still left then is counted as lost."""
        while self._unpublished and time.monotonic() < deadline:
            self.publish_pending()
            if self._unpublished:
                time.sleep(min(self._retry_delay, max(0.0, deadline - time.monotonic())))
        if self._unpublished:
            lost = sum(r for _s, _d, _i, r in self._unpublished)
            self.dropped_records += lost
            logger.error("tensortap: %d chunks (%d records) could not be written to %s and are lost (counted in "
                         "dropped_records)", len(self._unpublished), lost, self.storage.url)
            self._unpublished.clear()
