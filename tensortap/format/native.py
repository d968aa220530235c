"""Reads the native chunked store (docs/format.md) incrementally, for a trial."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensortap.exceptions import CorruptData
from tensortap.format import codec, layout, packed
from tensortap.format.entries import (
    ENTRY_DTYPE,
    INLINE_BYTES,
    INLINE_CHUNK,
    PACKED,
    PACKED_SPARSE,
    REDUCTION,
    SHAPE,
    is_packed,
)
from tensortap.format.entries import concat as entries_concat
from tensortap.format.source import CollectionInfo, Damage, LostSteps, Source
from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")


def is_native_out_dir(storage: Storage) -> bool:
    return bool(storage.list(layout.ROOT + "/"))


@dataclass
class _Chunk:
    worker: str
    seq: int
    idx_key: str
    dat_key: str
    read_upto: int = 0  # bytes of the .idx consumed
    sealed: bool = False  # a later chunk of the worker exists and this one was read to its end
    pending_since: float | None = None  # when the current unread tail (a block being written?) was first seen
    pending_size: int | None = None  # the file size then
    damaged_tail: bool = False  # the last thing read from this index was damage
    damaged_since: float | None = None
    damaged_size: int | None = None
    idle_since: float | None = None  # when this newest index was first seen read to its end at idle_size
    idle_size: int | None = None
    next_gone_look: float = 0.0  # (monotonic) when to look next whether its writer is gone


class NativeSource(Source):
    """A job written by tensortap's writers (tensortap.format.writer.ChunkEncoder)."""

    #: seconds an index tail may stay incomplete or damaged before it counts as final (its writer is gone)
    settle_s: float = 2.0
    #: bytes of a local index read and decoded at a time
    read_piece: int = 64 << 20

    def __init__(self, storage: Storage, range_steps: tuple[int | None, int | None] | None = None,
                 settle_s: float | None = None):
        super().__init__()
        self.storage = storage
        if settle_s is not None:
            self.settle_s = settle_s
        self._damage_seen: set[tuple[str, int]] = set()
        # worker -> the last global step its intact blocks hold records of or have passed: damage after them
        # lost steps after it
        self._after: dict[str, int] = {}
        # worker -> (index into self.damage, self._after then) of damage whose lost steps the next intact block tells
        self._open_damage: dict[str, list[tuple[int, int]]] = {}
        self._end_seq: dict[str, int] = {}  # worker -> the newest chunk holding its end mark
        self.range_steps = range_steps
        self.passed_mode_step: dict[str, dict[str, int]] = {}
        self.metadata: dict[str, dict[str, Any]] = {}
        #: {worker: {tensor name: where its saved value lies in the full tensor}} (docs/format.md §10)
        self.shards: dict[str, dict[str, dict[str, Any]]] = {}
        self._chunks: list[_Chunk] = []  # id = position
        self._chunk_by_key: dict[str, int] = {}
        self._name_ids: dict[str, int] = {}
        self._worker_ids: dict[str, int] = {}
        self._dtype_ids: dict[str, int] = {}
        self._shape_ids: dict[tuple, int] = {}
        self._num_workers_seen: dict[str, int] = {}
        self._last_key: dict[str, str] = {}
        #: (worker id, largest global step, header `time`) of each ingested block with entries: wall times
        self.block_times: list[tuple[int, int, float]] = []
        #: (chunk id, offset) -> packed statistics layout read from the chunk's data file, its name and dtype ids
        self._layouts: dict[tuple[int, int], tuple] = {}  # (layout, name ids, dtype ids[, entry template])

    @property
    def last_step_written(self) -> int:
        """The newest global step any intact block read so far holds records of or has passed (-1: none), whatever
        `range_steps` keeps."""
        return max(self._after.values(), default=-1)

    @property
    def location(self) -> str:
        return self.storage.url

    def writers_gone(self) -> bool:
        """Every worker seen that has not closed claimed its folder (docs/format.md §1) from a process on this
        machine that no longer runs; every expected worker has been seen. Claims from other machines, or
        unreadable ones, say nothing: False."""
        if self.num_workers is None or len(self.workers) < self.num_workers:
            return False
        open_workers = [w for w in self.workers if w not in self.ended_workers]
        return bool(open_workers) and all(self._writer_gone(w) for w in open_workers)

    def _writer_gone(self, worker: str) -> bool:
        """The worker's claim names a process on this machine that no longer runs (False when unknown)."""
        try:
            claim = json.loads(self.storage.read(layout.claim_key(worker)))
        except Exception:  # noqa: BLE001 - no claim (an old job), unreadable: unknown
            return False
        pid = claim.get("pid") if isinstance(claim, dict) else None
        if claim.get("host") != platform.node() or not isinstance(pid, int) or pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    # --- tables -----------------------------------------------------------------------------

    def _intern(self, table: dict, lst: list, key: Any, value: Any = None) -> int:
        i = table.get(key)
        if i is None:
            i = table[key] = len(lst)
            lst.append(key if value is None else value)
        return i

    # --- refresh ----------------------------------------------------------------------------

    def _list_chunk_keys(self) -> list[str]:
        if self.storage.supports_append:
            return self.storage.list(layout.ROOT + "/")  # local: one small walk of the worker folders
        # Object store: one LIST per worker folder, starting after the newest key already seen, so the
        # cost grows with new chunks only.
        keys: list[str] = []
        list_dirs = getattr(self.storage, "list_dirs", None)
        dirs = list_dirs(layout.ROOT) if list_dirs else [layout.ROOT]
        for d in dirs:
            new = [k for k in self.storage.list(d + "/", start_after=self._last_key.get(d))
                   if layout.parse_chunk_key(k) is not None]  # (chunk keys only: other files sort after them)
            if new:
                self._last_key[d] = new[-1]
                keys.extend(new)
        return keys

    def _discover(self) -> None:
        for key in self._list_chunk_keys():
            p = layout.parse_chunk_key(key)
            if p is None or p[2] != "idx" or key in self._chunk_by_key:
                continue
            worker, seq, _ = p
            self._chunk_by_key[key] = len(self._chunks)
            self._chunks.append(_Chunk(worker, seq, key, layout.chunk_key(worker, seq, layout.DATA_SUFFIX)))
        last_seq: dict[str, int] = {}
        for c in self._chunks:
            last_seq[c.worker] = max(last_seq.get(c.worker, -1), c.seq)
        self._last_seq = last_seq

    def refresh(self) -> np.ndarray:
        self._discover()
        immutable = not self.storage.supports_append
        now = time.monotonic()
        out = []
        for cid, c in enumerate(self._chunks):
            if c.sealed:
                continue
            path = self.storage.describe(c.idx_key)
            if immutable:
                # Published objects are complete and never change: read each once.
                buf = self.storage.read(c.idx_key)
                size = len(buf)
            else:
                size = self.storage.size(c.idx_key) or 0
                buf = b""
            newest = self._last_seq.get(c.worker, c.seq) <= c.seq
            # A tail that cannot change any more is decoded to the end: damage there is final.
            final = immutable or not newest or self._ended_at(c) or (
                c.pending_since is not None and c.pending_size == size and now - c.pending_since >= self.settle_s)
            if buf:
                used = self._decode_index(cid, c, path, buf, final, out)
                if used < len(buf) and not final and self._ended_at(c):
                    # the end mark was in this read: what follows it is final now
                    used += self._decode_index(cid, c, path, buf[used:], True, out)
            else:  # a local index is read in pieces: the bytes in memory stay bounded however long the index
                piece = self.read_piece
                while c.read_upto < size:
                    n = min(piece, size - c.read_upto)
                    buf = self.storage.read_range(c.idx_key, c.read_upto, n)
                    whole = c.read_upto + len(buf) >= size
                    used = self._decode_index(cid, c, path, buf, final and whole, out)
                    if used < len(buf) and whole and not final and self._ended_at(c):
                        used += self._decode_index(cid, c, path, buf[used:], True, out)
                    if whole or not buf:
                        break
                    if not used:
                        piece *= 2  # (a block larger than the piece)
            if c.read_upto < size:
                if c.pending_size != size:
                    c.pending_since, c.pending_size = now, size
            else:
                c.pending_since = c.pending_size = None
            if c.damaged_tail and newest and c.read_upto >= size and c.worker not in self.ended_workers:
                if c.damaged_since is None or c.damaged_size != size:
                    c.damaged_since, c.damaged_size = now, size
                elif now - c.damaged_since >= self.settle_s:
                    # Nothing valid follows damage at the end of the worker's newest index: its writer
                    # stopped there (crashed mid-block, or its last block, with the end mark, is damaged).
                    logger.warning("tensortap: %s ends in damage and has not grown for %.1f s: worker %s is "
                                   "treated as ended", path, self.settle_s, c.worker)
                    self.ended_workers.add(c.worker)
            if (newest and not immutable and c.read_upto >= size and not c.damaged_tail
                    and c.worker not in self.ended_workers):
                self._end_if_writer_gone(c, path, size, now)
            if c.worker in self.ended_workers and self._open_damage.get(c.worker):
                for i, after in self._open_damage.pop(c.worker):  # no intact block follows: the worker's last ones
                    self._lost(i, c.worker, after + 1, None)
            if immutable or (not newest and c.read_upto >= size):
                c.sealed = True
        if not out:
            return self.empty()
        return entries_concat(out)

    def _end_if_writer_gone(self, c: _Chunk, path: str, size: int, now: float) -> None:
        """A worker's newest index read to its end, without its end mark, that has not grown for the settle time,
        whose writing process is known gone: its index was cut short, or its process was killed between two
        blocks. Either way nothing more comes: the worker counts as ended (logged once)."""
        if c.idle_since is None or c.idle_size != size:
            c.idle_since, c.idle_size = now, size
            return
        if now - c.idle_since < self.settle_s or now < c.next_gone_look:
            return
        c.next_gone_look = now + self.settle_s
        if not self._writer_gone(c.worker):
            return
        after = self._after.get(c.worker)
        logger.warning("tensortap: %s ends at offset %d without the end mark of worker %s, and the process that "
                       "wrote it is gone (killed, or the index was cut short): the worker is treated as ended after "
                       "%s", path, size, c.worker, "no step" if after is None else f"step {after}")
        self.ended_workers.add(c.worker)

    def _decode_index(self, cid: int, c: _Chunk, path: str, buf: bytes, final: bool, out: list) -> int:
        """Ingest the blocks of `buf` (the bytes of c's index from c.read_upto), report its damage; returns
        the bytes consumed (c.read_upto has moved past them)."""
        dec = codec.decode_blocks(buf, c.read_upto, path, final=final)
        # in file order: what damaged bytes cost is told by the intact blocks before and after them
        events = sorted([(at, 0, i) for i, (_, _, at) in enumerate(dec.blocks)]
                        + [(d.offset, 1, i) for i, d in enumerate(dec.damage)])
        for at, kind, i in events:
            if kind == 0:
                header, disk, _ = dec.blocks[i]
                bad = _malformed(header, disk)
                if bad:
                    self._report(c, path, c.read_upto + at, f"malformed block: {bad}")
                    continue
                self._intact(c.worker, header, disk)
                out.append(self._ingest(cid, c, header, disk))
                if header.get("end"):
                    self._end_seq[c.worker] = max(self._end_seq.get(c.worker, -1), c.seq)
            else:
                d = dec.damage[i]
                self._report(c, path, c.read_upto + d.offset, d.reason)
                if d.header is not None and d.header.get("end") is True:
                    self.ended_workers.add(c.worker)  # the end mark of a damaged last block
                    self._end_seq[c.worker] = max(self._end_seq.get(c.worker, -1), c.seq)
        if dec.blocks:
            c.damaged_tail = False
        if dec.damage and dec.damage[-1].offset + dec.damage[-1].length == dec.used:
            c.damaged_tail = True
        c.read_upto += dec.used
        return dec.used

    def _packed_entries(self, cid: int, c: _Chunk, header: dict, disk: np.ndarray, wid: int) -> tuple[
            np.ndarray, np.ndarray]:
        """The block's packed statistics (docs/format.md §3.3) as one inline REDUCTION entry per value, read from
        the data file now: the entries their values would have had written one by one. A damaged payload or layout
        costs its values only, reported once with what they were. Also: per entry made, its packed entry's position
        in `disk`."""
        def fetch(offset: int, length: int) -> bytes:
            mm = self.storage.mapped(c.dat_key)
            if mm is not None:
                return mm[offset:offset + length]
            return self.storage.read_range(c.dat_key, offset, length)

        path = self.storage.describe(c.dat_key)
        refs = packed.refs(header)
        assert not isinstance(refs, str)
        lay_of = disk["name"].astype(np.int64)
        parts, where = [], []
        scalar = self._intern(self._shape_ids, self.shapes, ())
        for lid in np.unique(lay_of).tolist():
            at = np.flatnonzero(lay_of == lid)
            sub = disk[at]
            ref = refs[lid]
            got = self._layouts.get((cid, ref[0]))
            if got is None:
                try:
                    lay = packed.read_layout(ref, fetch)
                except packed.LayoutError as e:
                    self._payload_damage(path, ref[0], str(e), c.worker, sub, None)
                    continue
                names = np.array([self._intern(self._name_ids, self.names, n) for n in lay.names], dtype="<u4")
                dts = np.array([self._intern(self._dtype_ids, self.dtypes, d, _safe_dtype(d)) for d in lay.dtype_strs],
                               dtype="<u2")[lay.dtypes]
                got = self._layouts[(cid, ref[0])] = (lay, names, dts)
            lay, names, dts = got[:3]
            rows, bad = packed.payloads(sub, lay, fetch)
            if bad:
                for i, offset, reason in bad:
                    self._payload_damage(path, offset, reason, c.worker, sub[i:i + 1], lay)
                ok = np.ones(len(sub), dtype=bool)
                ok[[i for i, _, _ in bad]] = False
                sub, rows, at = sub[ok], rows[ok], at[ok]
            k, n = len(sub), len(lay.names)
            if not k:
                continue
            tmpl = got[3] if len(got) > 3 and got[3][0] == (wid, scalar) else None
            if tmpl is None:  # the layout's entries with what every step shares, copied per step as bytes
                t = np.zeros(n, dtype=ENTRY_DTYPE)
                t["name"], t["worker"], t["kind"], t["reduction"] = names, wid, REDUCTION, lay.codes
                t["dtype"], t["shape"], t["chunk"], t["length"] = dts, scalar, INLINE_CHUNK, lay.widths
                tmpl = ((wid, scalar), t.view(np.uint8).reshape(n, -1))
                self._layouts[(cid, ref[0])] = (lay, names, dts, tmpl)
            e = np.tile(tmpl[1], (k, 1)).view(ENTRY_DTYPE).reshape(-1)
            e2 = e.reshape(k, n)
            for f in ("mode", "step", "mode_step"):
                e2[f] = sub[f][:, None]
            e["inline"] = lay.inline_bytes(rows).reshape(k * n, INLINE_BYTES).view(e.dtype["inline"]).reshape(-1)
            parts.append(e)
            where.append(np.repeat(at, n))
        if not parts:
            return self.empty(), np.empty(0, dtype=np.int64)
        return entries_concat(parts), np.concatenate(where)

    def _payload_damage(self, path: str, offset: int, reason: str, worker: str, sub: np.ndarray,
                        lay: packed.Layout | None) -> None:
        if (path, offset) in self._damage_seen:
            return
        self._damage_seen.add((path, offset))
        steps = sorted(set(sub["step"].tolist()))
        what = f"{lay.tensors} tensors" if lay is not None else "the tensors of a packed layout"
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
        words = f"the statistics of {what} at {at} of worker {worker} lost"
        self.damage.append(Damage(path, offset, reason, words))
        logger.warning("tensortap: packed statistics damaged in %s at offset %d (%s): %s; the rest stays readable",
                       path, offset, reason, words)

    def _ended_at(self, c: _Chunk) -> bool:
        """The worker wrote its end mark in this chunk or a later one: nothing more comes to c's index."""
        return self._end_seq.get(c.worker, -1) >= c.seq

    def _report(self, c: _Chunk, path: str, offset: int, reason: str) -> None:
        """Record damage once (a reader that re-reads a file does not report it again); it is logged once the
        steps it cost are known (the next intact block of the worker, or its end)."""
        if (path, offset) in self._damage_seen:
            return
        self._damage_seen.add((path, offset))
        self.damage.append(Damage(path, offset, reason))
        i = len(self.damage) - 1
        if self._end_seq.get(c.worker, -1) == c.seq:  # after the worker's end mark (read before it): no records
            self._lost(i, c.worker, 0, -1, "nothing lost: it lies after the end mark of worker " + c.worker)
        else:
            self._open_damage.setdefault(c.worker, []).append((i, self._after.get(c.worker, -1)))

    def _intact(self, worker: str, header: dict, disk: np.ndarray) -> None:
        """An intact block of `worker`: it tells the steps lost to the damage before it (its records start at
        its first step; a block of step marks only has passed its `passed` step)."""
        passed = header["passed"]["step"] if "passed" in header else None
        if self._open_damage.get(worker):
            upto = int(disk["step"].min()) - 1 if len(disk) else passed
            if upto is not None:
                for i, after in self._open_damage.pop(worker):
                    self._lost(i, worker, after + 1, upto)
        last = int(disk["step"].max()) if len(disk) else -1
        self._after[worker] = max(self._after.get(worker, -1), last, -1 if passed is None else int(passed))

    def _lost(self, i: int, worker: str, lo: int, hi: int | None, words: str | None = None) -> None:
        """Damage i cost global steps lo..hi of `worker` (hi None: every step from lo on): say so, once."""
        d = self.damage[i]
        if words is None:
            if hi is None:
                words = (f"whatever worker {worker} saved lost" if lo <= 0 else
                         f"whatever worker {worker} saved after step {lo - 1} lost")
            elif lo < hi:
                words = f"steps {lo}–{hi} of worker {worker} lost"
            elif lo == hi:
                words = f"step {lo} of worker {worker} lost"
            else:  # records of a step the intact blocks around it hold records of too
                words = f"part of the records of step {lo - 1 if hi + 1 == lo - 1 else f'{lo - 1}–{hi + 1}'} of " \
                        f"worker {worker} lost"
        d = self.damage[i] = Damage(d.path, d.offset, d.reason, words)
        if hi is None or lo <= hi:
            self.lost_steps.append(LostSteps(worker, lo, hi, d))
        logger.warning("tensortap: index block damaged in %s at offset %d (%s): %s; skipped, the rest stays "
                       "readable", d.path, d.offset, d.reason, words)

    def _ingest(self, cid: int, c: _Chunk, header: dict, disk: np.ndarray) -> np.ndarray:
        worker = header.get("worker", c.worker)
        wid = self._intern(self._worker_ids, self.workers, worker)
        if "metadata" in header:
            self.metadata[worker] = header["metadata"]
        nw = header.get("num_workers")
        if isinstance(nw, int):
            self._num_workers_seen[worker] = nw
            self.num_workers = max(self._num_workers_seen.values())
        if "collections" in header:
            self._merge_collections(header["collections"])
            shards = (header["collections"].get("_meta") or {}).get("shards")
            if isinstance(shards, dict):
                self.shards.setdefault(worker, {}).update(shards)
        if "passed" in header:
            p = header["passed"]
            self.passed_step[worker] = max(self.passed_step.get(worker, -1), int(p["step"]))
            pm = self.passed_mode_step.setdefault(worker, {})
            for m, s in p.get("mode_steps", {}).items():
                pm[m] = max(pm.get(m, -1), int(s))
        if header.get("end"):
            self.ended_workers.add(worker)
        n = len(disk)
        if n == 0:
            return self.empty()
        if isinstance(header.get("time"), int | float):
            self.block_times.append((wid, int(disk["step"].max()), float(header["time"])))
        if self.range_steps is not None:  # (per block, before its entries are made: memory is the range's)
            lo, hi = self.range_steps
            keep = np.ones(n, dtype=bool)
            if lo is not None:
                keep &= disk["step"] >= lo
            if hi is not None:
                keep &= disk["step"] < hi
            if not keep.all():
                disk = disk[keep]
                n = len(disk)
                if not n:
                    return self.empty()
        name_map = np.array([self._intern(self._name_ids, self.names, s) for s in header["names"]], dtype="<u4")
        dtype_map = np.array(
            [self._intern(self._dtype_ids, self.dtypes, s, _safe_dtype(s)) for s in header["dtypes"]],
            dtype="<u2",
        )
        shape_map = np.array(
            [self._intern(self._shape_ids, self.shapes, tuple(s)) for s in header["shapes"]], dtype="<u4"
        )
        pk = is_packed(disk["kind"])
        extra = None
        if pk.any():
            extra, extra_at = self._packed_entries(cid, c, header, disk[pk], wid)
            extra_at = np.flatnonzero(pk)[extra_at]  # (each value's packed entry's position in the block)
            own_at = np.flatnonzero(~pk)
            disk = disk[~pk]
            n = len(disk)
        e = np.empty(n, dtype=ENTRY_DTYPE)
        e["name"] = name_map[disk["name"]]
        e["worker"] = wid
        for f in ("mode", "kind", "reduction", "step", "mode_step", "offset", "length", "crc", "inline"):
            e[f] = disk[f]
        e["dtype"] = dtype_map[disk["dtype"]]
        e["shape"] = shape_map[disk["shape"]]
        e["chunk"] = np.where(disk["flags"] & codec.FLAG_INLINE, INLINE_CHUNK, cid)
        if extra is None or not len(extra):
            return e
        if not len(e):
            return extra
        # in the order written: where a step has the same reduction of a tensor twice, readers keep the first
        order = np.argsort(np.concatenate([own_at, extra_at]), kind="stable")
        both = entries_concat([e, extra])
        return np.take(both.view(np.uint8).reshape(len(both), -1), order, axis=0).view(ENTRY_DTYPE).reshape(-1)

    def _merge_collections(self, cj: dict) -> None:
        for name, d in (cj.get("collections") or {}).items():
            info = self.collections.get(name)
            if info is None:
                info = self.collections[name] = CollectionInfo(name)
            info.tensor_names.update(d.get("tensor_names") or [])
            for rx in d.get("include_regex") or []:
                if rx not in info.include_regex:
                    info.include_regex.append(rx)
            info.config = d

    # --- payloads ---------------------------------------------------------------------------

    def _payloads(self, entries: np.ndarray) -> list[bytes | None]:
        """CRC-checked payload bytes of non-inline entries (None for inline ones), in order."""
        out: list[bytes | None] = [None] * len(entries)
        chunk = entries["chunk"]
        for cid in np.unique(chunk[chunk != INLINE_CHUNK]).tolist():
            idx = np.nonzero(chunk == cid)[0]
            c = self._chunks[cid]
            path = self.storage.describe(c.dat_key)
            offs = entries["offset"][idx].tolist()
            lens = entries["length"][idx].tolist()
            crcs = entries["crc"][idx].tolist()
            mm = self.storage.mapped(c.dat_key)
            if mm is not None:
                pieces = [mm[o : o + n] for o, n in zip(offs, lens, strict=True)]
            else:  # object stores: the backend coalesces neighbouring ranges and reads in parallel
                try:
                    pieces = self.storage.read_ranges(c.dat_key, list(zip(offs, lens, strict=True)))
                except FileNotFoundError:
                    raise CorruptData(path, offs[0], "the data file is missing") from None
            crc = codec.crc32c
            for i, piece, off, n, want in zip(idx.tolist(), pieces, offs, lens, crcs, strict=True):
                if len(piece) != n:
                    raise CorruptData(path, off, f"payload truncated ({len(piece)} of {n} bytes)")
                if crc(piece) != want:
                    raise CorruptData(path, off, "payload checksum mismatch")
                out[i] = piece
        return out

    def read_values(self, entries: np.ndarray) -> list[np.ndarray]:
        if len(entries) == 0:
            return []
        out: list[np.ndarray | None] = [None] * len(entries)
        chunk = entries["chunk"]
        inline_idx = np.nonzero(chunk == INLINE_CHUNK)[0]
        if len(inline_idx):
            self._decode_inline(entries, inline_idx, out)
        if len(inline_idx) < len(entries):
            payloads = self._payloads(entries)
            kinds = entries["kind"].tolist()
            dts = entries["dtype"].tolist()
            shapes = entries["shape"].tolist()
            for i, buf in enumerate(payloads):
                if buf is None:
                    continue
                if kinds[i] == SHAPE:
                    raise ValueError("a shape entry has no value")
                shape = self.shapes[shapes[i]] if kinds[i] == 0 else ()
                out[i] = np.frombuffer(buf, dtype=self.dtypes[dts[i]]).reshape(shape).copy()
        return out  # type: ignore[return-value]

    def read_stacked(self, entries: np.ndarray) -> np.ndarray | None:
        """Entries of one kind, dtype and shape as one stacked array (the bulk path); None if they differ."""
        if len(entries) == 0:
            return None
        for f in ("dtype", "kind", "shape"):
            if not np.all(entries[f] == entries[f][0]):
                return None
        inline = self.read_stacked_inline(entries)
        if inline is not None:
            return inline
        e0 = entries[0]
        dt = self.dtypes[int(e0["dtype"])]
        shape = () if int(e0["kind"]) != 0 else self.shapes[int(e0["shape"])]
        if np.any(entries["chunk"] == INLINE_CHUNK):
            return None
        out = np.empty((len(entries), *shape), dtype=dt)
        rows = out.reshape(len(entries), -1).view(np.uint8)
        if not self._copy_direct(entries, rows):
            for j, buf in enumerate(self._payloads(entries)):
                rows[j] = np.frombuffer(buf, dtype=np.uint8)
        return out

    def _copy_direct(self, entries: np.ndarray, rows: np.ndarray) -> bool:
        """Read payloads of local chunks straight into `rows` (one pread each, no intermediate bytes, no
        page-table faults of a fresh mmap) and checksum them in place; False where that is not possible."""
        crc_at = codec.crc32c_at
        if crc_at is None or not len(rows) or not rows.flags.c_contiguous or not self.storage.supports_append:
            return False
        width = rows.shape[1]
        base = rows.ctypes.data
        chunk = entries["chunk"].tolist()
        keys = {cid: self._chunks[cid].dat_key for cid in set(chunk)}
        readinto = self.storage.readinto
        for j, (cid, off, n, want) in enumerate(zip(chunk, entries["offset"].tolist(), entries["length"].tolist(),
                                                    entries["crc"].tolist(), strict=True)):
            if n != width:
                return False
            try:
                got = readinto(keys[cid], off, rows[j])
            except FileNotFoundError:
                raise CorruptData(self.storage.describe(keys[cid]), off, "the data file is missing") from None
            if got != n:
                raise CorruptData(self.storage.describe(keys[cid]), off, f"payload truncated ({got} of {n} bytes)")
            if crc_at(base + j * width, n) != want:
                raise CorruptData(self.storage.describe(keys[cid]), off, "payload checksum mismatch")
        return True

    def _decode(self, e: np.void, buf: bytes | memoryview) -> np.ndarray:
        dt = self.dtypes[int(e["dtype"])]
        if int(e["kind"]) == SHAPE:
            raise ValueError("a shape entry has no value")
        shape = () if int(e["kind"]) != 0 else self.shapes[int(e["shape"])]
        return np.frombuffer(buf, dtype=dt).reshape(shape).copy()

    def _decode_inline(self, entries: np.ndarray, idx: np.ndarray, out: list) -> None:
        sub = entries[idx]
        raw = np.frombuffer(sub["inline"].tobytes(), dtype=np.uint8).reshape(len(sub), -1)
        keys = np.stack([sub["dtype"].astype(np.int64), sub["kind"].astype(np.int64),
                         sub["shape"].astype(np.int64), sub["length"].astype(np.int64)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for g, (dt_id, kind, shape_id, length) in enumerate(uniq):
            sel = np.nonzero(inverse == g)[0]
            dt = self.dtypes[int(dt_id)]
            shape = () if int(kind) != 0 else self.shapes[int(shape_id)]
            block = np.ascontiguousarray(raw[sel, : int(length)])
            vals = block.view(dt).reshape((len(sel), *shape)) if int(length) else np.zeros(
                (len(sel), *shape), dtype=dt
            )
            for j, i in enumerate(sel):
                out[int(idx[i])] = np.array(vals[j])

    def read_stacked_inline(self, entries: np.ndarray) -> np.ndarray | None:
        """All-inline entries of one dtype and shape as one stacked array, else None (the bulk fast path)."""
        if len(entries) == 0 or not np.all(entries["chunk"] == INLINE_CHUNK):
            return None
        for f in ("dtype", "kind", "shape", "length"):
            if not np.all(entries[f] == entries[f][0]):
                return None
        e0 = entries[0]
        dt = self.dtypes[int(e0["dtype"])]
        shape = () if int(e0["kind"]) != 0 else self.shapes[int(e0["shape"])]
        n = int(e0["length"])
        raw = np.frombuffer(entries["inline"].tobytes(), dtype=np.uint8).reshape(len(entries), -1)
        return np.ascontiguousarray(raw[:, :n]).view(dt).reshape((len(entries), *shape))


def _malformed(header: dict, disk: np.ndarray) -> str | None:
    """Why a checksum-valid block cannot be ingested (a writer bug, or damage the CRC missed), else None."""
    tables = {k: header.get(k, []) for k in ("names", "dtypes", "shapes")}
    for k, v in tables.items():
        if not isinstance(v, list):
            return f"{k!r} is not a list"
    if not all(isinstance(x, str) for x in tables["names"] + tables["dtypes"]):
        return "a name or dtype is not a string"
    if not all(isinstance(sh, list) and all(isinstance(d, int) and d >= 0 for d in sh) for sh in tables["shapes"]):
        return "a shape is not a list of non-negative ints"
    if len(disk):
        unpacked = disk[~is_packed(disk["kind"])] if int(disk["kind"].max()) >= PACKED else disk
        for field, k in (("name", "names"), ("dtype", "dtypes"), ("shape", "shapes")):
            if len(unpacked) and int(unpacked[field].max()) >= len(tables[k]):
                return f"an entry's {field} id is outside the block's {k} table"
        if int(disk["mode"].min()) < 1 or int(disk["mode"].max()) > 4 or int(disk["kind"].max()) > PACKED_SPARSE:
            return "an entry has an unknown mode or kind"
        bad = packed.malformed(header, disk)
        if bad:
            return bad
    checks = {
        "worker": lambda v: isinstance(v, str),
        "num_workers": lambda v: isinstance(v, int) and v >= 1,
        "metadata": lambda v: isinstance(v, dict),
        "collections": lambda v: isinstance(v, dict) and isinstance(v.get("collections") or {}, dict) and all(
            isinstance(d, dict) for d in (v.get("collections") or {}).values()),
        "passed": lambda v: isinstance(v, dict) and isinstance(v.get("step"), int) and isinstance(
            v.get("mode_steps", {}), dict) and all(isinstance(x, int) for x in v.get("mode_steps", {}).values()),
    }
    for k, ok in checks.items():
        if k in header and not ok(header[k]):
            return f"header key {k!r} has a value of the wrong type"
    return None


def _safe_dtype(s: str) -> np.dtype:
    try:
        return codec.dtype_from_str(s)
    except Exception as e:  # keep the index readable; decoding this dtype raises later
        logger.warning("tensortap: %s", e)
        return np.dtype("V1")
