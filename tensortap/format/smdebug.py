"""Read out_dirs written by smdebug (SageMaker Debugger) 1.0.x: index JSON + TFRecord event files (spec 1-4).

Entries (ENTRY_DTYPE) come from the index files alone; values are point reads of event-file records.
The index does not say a tensor's dtype, and gives its shape only when `save_shape=True`, so:

* `dtype` of every entry is UNKNOWN_DTYPE_ID: `dtypes[UNKNOWN_DTYPE_ID]` is UNKNOWN_DTYPE (`np.dtype("V0")`);
  the real dtype is the one of the array `read_values` returns.
* `shape` is the shape from the index `shape_payload` when there is one (for RAW and REDUCTION entries of
  that tensor), else UNKNOWN_SHAPE_ID: `shapes[UNKNOWN_SHAPE_ID]` is UNKNOWN_SHAPE (`(-1,)`); the real shape
  is the value's. A trial asked for such a shape reads the value.

A shape payload is merged into the RAW entry of the same (tensor, step, worker) (smdebug's bug 10.15 let it
hide the raw value); a SHAPE entry (chunk INLINE_CHUNK, no payload) is produced only when no raw value was saved.
An index entry with no event file (`event_file_name` "", as smdebug's own test helpers write for steps that carry
only metadata) gives a RAW entry with chunk NO_EVENT_FILE: its step and mode count, its value is unavailable.

Steps are complete by smdebug's rule, not tensortap's (docs/format.md, "Step completeness"): a step is complete
once as many workers as the collection files announce (`num_workers`) have written an index file for it, every
step up to the newest such step is complete too, and all are once `training_job_end.ts` exists. Workers are
counted, not matched by name: events written under `algo-1` complete the steps of a job whose collection file
is `worker_0_collections.json`. `listed_workers()` are the collection files' workers, as smdebug lists them.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections import defaultdict
from typing import Any

import numpy as np

from tensortap.exceptions import (
    CorruptData,
    IndexReaderException,
    TensorUnavailableForStep,
    UnsupportedFormatVersion,
)
from tensortap.format import _proto
from tensortap.format.entries import (
    ENTRY_DTYPE,
    INLINE_CHUNK,
    NO_REDUCTION,
    RAW,
    REDUCTION,
    REDUCTION_CODE,
    SHAPE,
    reduction_code,
    reduction_name,
)
from tensortap.format.source import CollectionInfo, Source
from tensortap.format.tfrecord import FRAMING_BYTES, decode_record
from tensortap.modes import ModeKeys
from tensortap.storage.base import Storage

__all__ = [
    "SmdebugSource",
    "is_smdebug_out_dir",
    "UNKNOWN_DTYPE",
    "UNKNOWN_DTYPE_ID",
    "UNKNOWN_SHAPE",
    "UNKNOWN_SHAPE_ID",
    "PASSED_ALL_STEPS",
    "REDUCTIONS_PREFIX",
]

REDUCTIONS_PREFIX = "smdebug/reductions/"
END_MARKER = "training_job_end.ts"
UNKNOWN_DTYPE = np.dtype("V0")
UNKNOWN_DTYPE_ID = 0
UNKNOWN_SHAPE: tuple[int, ...] = (-1,)
UNKNOWN_SHAPE_ID = 0
#: passed_step of every worker once the job has ended
PASSED_ALL_STEPS = int(np.iinfo(np.int64).max)
#: `chunk` of an entry whose index line names no event file (its value can never be read)
NO_EVENT_FILE = 0xFFFFFFFE
#: smdebug's INCOMPLETE_STEP_WAIT_WINDOW: with more incomplete steps than this, the next half are declared complete
INCOMPLETE_STEP_WAIT_WINDOW_KEY = "SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW"
INCOMPLETE_STEP_WAIT_WINDOW_DEFAULT = 1000

_INDEX_KEY = re.compile(r"^index/\d+/(\d+)_(.+)\.json$")
_COLLECTIONS_KEY = re.compile(r"^collections/[^/]+/(.+)_collections\.json$")


def deserialize_worker(name: str) -> str:
    """smdebug's worker name from a file name: a leading '_' marks a serialized TF device (spec 1.2)."""
    if name.startswith("_"):
        return name.replace("_", "/").replace("-", ":")
    return name


def index_key_prefix(step: int) -> str:
    """The key every index file of global `step` starts with (and is greater than)."""
    return f"index/{step // 1000:09d}/{step:012d}"


def is_smdebug_out_dir(storage: Storage) -> bool:
    """True if `storage` holds an smdebug out_dir (it has collections/, index/ or events/ keys)."""
    return any(storage.has_keys(p) for p in ("collections/", "index/", "events/"))


def has_smdebug_data(storage: Storage) -> bool:
    """True once an smdebug job has written step data (index/ or events/ keys), not only its collections."""
    return any(storage.has_keys(p) for p in ("index/", "events/"))


def split_reduction_name(tname: str) -> tuple[str, int] | None:
    """(base tensor name, reduction code) of `smdebug/reductions/[abs_]<red>/<name>`, None if not one."""
    if not tname.startswith(REDUCTIONS_PREFIX):
        return None
    red, sep, base = tname[len(REDUCTIONS_PREFIX) :].partition("/")
    if not sep or not base:
        return None
    is_abs = red.startswith("abs_")
    if is_abs:
        red = red[len("abs_") :]
    if red.endswith("_norm"):
        red = red[: -len("_norm")]
    if red not in REDUCTION_CODE:
        return None
    return base, reduction_code(red, is_abs)


def reduction_tensor_name(base: str, code: int) -> str:
    """The smdebug tensor name of reduction `code` of tensor `base`."""
    red, is_abs = reduction_name(code)
    return f"{REDUCTIONS_PREFIX}{'abs_' if is_abs else ''}{red}/{base}"


class SmdebugSource(Source):
    """An smdebug out_dir (local or any Storage) as a Source; `range_steps` keeps global steps in [begin, end)."""

    def __init__(self, storage: Storage, range_steps: tuple[int | None, int | None] | None = None):
        super().__init__()
        self.storage = storage
        begin, end = range_steps if range_steps is not None else (None, None)
        if begin is not None and end is not None and begin >= end:
            raise ValueError(f"range_steps {range_steps}: begin must be < end")
        self._begin, self._end = begin, end
        self.dtypes.append(UNKNOWN_DTYPE)
        self.shapes.append(UNKNOWN_SHAPE)
        #: event-file keys; an entry's `chunk` is an index into this list
        self.event_files: list[str] = []
        self._ids: dict[str, dict[Any, int]] = {"name": {}, "worker": {}, "shape": {UNKNOWN_SHAPE: 0}, "file": {}}
        self._token: str | None = index_key_prefix(begin) if begin else None
        self._seen: set[str] = set()  # index keys read (only those > _token are kept)
        self._seen_collections: set[str] = set()
        self._last_step: dict[str, int] = {}  # worker -> largest global step of an index file seen
        self._pending: list[np.ndarray] = []  # entries parsed during a refresh that then raised
        self._ended = False
        #: workers named by the collection files (smdebug's worker_set)
        self.collection_workers: set[str] = set()
        #: global step -> names of the workers whose index file of that step held entries (in range_steps)
        self.step_workers: dict[int, set[str]] = {}
        #: smdebug's last_complete_step: the newest step written by num_workers workers (or the window's)
        self.last_complete_step = -1
        self._counted_with: int | None = None  # num_workers last_complete_step was computed with
        self._window = int(os.environ.get(INCOMPLETE_STEP_WAIT_WINDOW_KEY, INCOMPLETE_STEP_WAIT_WINDOW_DEFAULT))

    @property
    def location(self) -> str:
        return self.storage.url

    # ------------------------------------------------------------------------------------------- tables
    def _id(self, table: str, value: Any) -> int:
        ids = self._ids[table]
        i = ids.get(value)
        if i is None:
            lst = {"name": self.names, "worker": self.workers, "shape": self.shapes, "file": self.event_files}[table]
            i = ids[value] = len(lst)
            lst.append(value)
        return i

    # ------------------------------------------------------------------------------------------ refresh
    def refresh(self) -> np.ndarray:
        out, self._pending = self._pending, []
        errors: list[Exception] = []
        ended = self._ended or self.storage.exists(END_MARKER)  # before listing: then every file is there
        try:
            self._refresh_collections()
        except IndexReaderException as e:
            errors.append(e)
        keys = self.storage.list("index/", start_after=self._token)
        for key in keys:
            if key in self._seen or not key.endswith(".json"):
                continue
            self._seen.add(key)
            try:
                entries = self._read_index_file(key)
            except IndexReaderException as e:
                errors.append(e)
                continue
            if entries is not None and len(entries):
                out.append(entries)
                self._count_worker(int(entries["step"][0]), key)
        self._update_last_complete_step(bool(keys))
        self._advance_token(ended, keys)
        if ended:
            self._ended = True
            if self.num_workers is None:
                self.num_workers = len(self.workers)
            self.ended_workers = set(self.workers)
            self.passed_step = dict.fromkeys(self.workers, PASSED_ALL_STEPS)
        else:
            self.passed_step = {w: s - 1 for w, s in self._last_step.items()}
        result = np.concatenate(out) if out else self.empty()
        if errors:
            self._pending = [result] if len(result) else []
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise IndexReaderException(f"{errors[0]}{more}") from errors[0]
        return result

    # ------------------------------------------------------------------------------------- completeness
    def _count_worker(self, step: int, key: str) -> None:
        m = _INDEX_KEY.match(key)
        worker = deserialize_worker(m.group(2)) if m else key
        ws = self.step_workers.setdefault(step, set())
        ws.add(worker)
        nw = self.num_workers
        if nw is not None and len(ws) >= nw and step > self.last_complete_step:
            self.last_complete_step = step

    def _update_last_complete_step(self, listed: bool) -> None:
        nw = self.num_workers
        if nw is not None and nw != self._counted_with:
            # num_workers became known (or grew) after some index files were read: count again
            done = [g for g, ws in self.step_workers.items() if len(ws) >= nw]
            self.last_complete_step = max(done, default=-1) if self._counted_with is None else max(
                self.last_complete_step, max(done, default=-1))
            self._counted_with = nw
        # smdebug's window: with more incomplete steps than the window, half of it is declared complete
        if listed and len(self.step_workers) - (self.last_complete_step + 1) > self._window:
            self.last_complete_step += self._window // 2

    def complete_upto(self) -> float:
        if self.training_ended():
            return float("inf")
        if self.num_workers is None:
            return -1
        return self.last_complete_step

    def training_ended(self) -> bool:
        return self._ended

    def all_workers_passed(self, step: int, mode_name: str | None) -> bool:
        return False  # smdebug's rule: only a later complete step makes a missing step unavailable

    def listed_workers(self) -> list[str]:
        return sorted(self.collection_workers) if self.collection_workers else list(self.workers)

    def _advance_token(self, ended: bool, keys: list[str]) -> None:
        """Move the listing start past every step no known worker can still write (spec 10.13, fixed)."""
        if ended:
            if keys:
                self._token = max(keys[-1], self._token or "")
        else:
            expected = max(self.num_workers or 0, len(self._last_step))
            if not self._last_step or len(self._last_step) < expected:
                return  # a worker we have not heard from may still write any step
            # every worker wrote step min(last); files of steps < it will not appear any more
            token = index_key_prefix(min(self._last_step.values()))
            if self._token is None or token > self._token:
                self._token = token
        if self._token is not None:
            self._seen = {k for k in self._seen if k > self._token}

    def _read_index_file(self, key: str) -> np.ndarray | None:
        m = _INDEX_KEY.match(key)
        where = self.storage.describe(key)
        if m is None:
            raise IndexReaderException(f"{where}: not an smdebug index file name (index/<dir>/<step>_<worker>.json)")
        step = int(m.group(1))
        worker = deserialize_worker(m.group(2))
        wid = self._id("worker", worker)
        if step > self._last_step.get(worker, -1):
            self._last_step[worker] = step
        if (self._begin is not None and step < self._begin) or (self._end is not None and step >= self._end):
            return None
        try:
            doc = json.loads(self.storage.read(key))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as e:
            raise IndexReaderException(f"{where}: empty or corrupt index file ({e})") from e
        try:
            return self._entries_from_index(doc, step, wid)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IndexReaderException(f"{where}: invalid index file ({type(e).__name__}: {e})") from e

    def _entries_from_index(self, doc: Any, step: int, wid: int) -> np.ndarray:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        meta = doc.get("meta")
        if not meta or not isinstance(meta, dict):
            raise ValueError("missing 'meta'")
        tensors = doc.get("tensor_payload")
        shapes = doc.get("shape_payload")
        if tensors is None and shapes is None:
            raise ValueError("neither 'tensor_payload' nor 'shape_payload'")
        tensors = tensors or []
        shapes = shapes or []
        if len({str(t["tensorname"]) for t in tensors}) < len(tensors):
            # A name twice in one index file (smdebug writes a save_scalar of an unsaved step into the next saved
            # step's file, its bug 10.7): the last one is the value, as smdebug's reader keeps it.
            tensors = list({str(t["tensorname"]): t for t in tensors}.values())
        mode_name = meta["mode"]
        try:
            mode = ModeKeys[mode_name].value
        except KeyError:
            raise ValueError(f"unknown mode {mode_name!r}") from None
        mode_step = meta.get("mode_step")
        mode_step = step if mode_step is None else int(mode_step)
        chunk = INLINE_CHUNK
        if tensors:
            parts = [p for p in str(meta.get("event_file_name") or "").replace("\\", "/").split("/") if p]
            chunk = self._id("file", posixpath.join(*parts[-3:])) if parts else NO_EVENT_FILE

        shape_of: dict[str, int] = {}
        for sp in shapes:
            shape_of[str(sp["tensorname"])] = self._id("shape", tuple(int(d) for d in sp["shape"]))

        n_t = len(tensors)
        rows_name = np.empty(n_t, dtype="<u4")
        rows_kind = np.full(n_t, RAW, dtype="u1")
        rows_red = np.full(n_t, NO_REDUCTION, dtype="u1")
        rows_shape = np.zeros(n_t, dtype="<u4")
        rows_off = np.empty(n_t, dtype="<u8")
        rows_len = np.empty(n_t, dtype="<u8")
        raw_names: set[str] = set()
        for i, t in enumerate(tensors):
            tname = str(t["tensorname"])
            red = split_reduction_name(tname)
            if red is None:
                base = tname
                raw_names.add(tname)
            else:
                base, code = red
                rows_kind[i] = REDUCTION
                rows_red[i] = code
            rows_name[i] = self._id("name", base)
            rows_shape[i] = shape_of.get(base, UNKNOWN_SHAPE_ID)
            start, length = int(t["start_idx"]), int(t["length"])
            if chunk != NO_EVENT_FILE and (start < 0 or length < FRAMING_BYTES):
                raise ValueError(f"bad location start_idx={start} length={length} of {tname!r}")
            rows_off[i] = start
            rows_len[i] = length
        shape_only = [n for n in shape_of if n not in raw_names]

        out = np.zeros(n_t + len(shape_only), dtype=ENTRY_DTYPE)
        out["worker"] = wid
        out["mode"] = mode
        out["dtype"] = UNKNOWN_DTYPE_ID
        out["step"] = step
        out["mode_step"] = mode_step
        out["name"][:n_t] = rows_name
        out["kind"][:n_t] = rows_kind
        out["reduction"][:n_t] = rows_red
        out["shape"][:n_t] = rows_shape
        out["chunk"][:n_t] = chunk
        out["offset"][:n_t] = rows_off
        out["length"][:n_t] = rows_len
        for j, n in enumerate(shape_only, start=n_t):
            out["name"][j] = self._id("name", n)
            out["kind"][j] = SHAPE
            out["reduction"][j] = NO_REDUCTION
            out["shape"][j] = shape_of[n]
            out["chunk"][j] = INLINE_CHUNK
        return out

    def _refresh_collections(self) -> None:
        if self.num_workers is not None and len(self._seen_collections) >= self.num_workers:
            return
        errors: list[str] = []
        for key in self.storage.list("collections/"):
            if key in self._seen_collections or not key.endswith(".json"):
                continue
            self._seen_collections.add(key)
            where = self.storage.describe(key)
            m = _COLLECTIONS_KEY.match(key)
            if m is None:
                errors.append(f"{where}: not a collections file name (<worker>_collections.json)")
                continue
            try:
                doc = json.loads(self.storage.read(key))
                self._add_collections(doc)
            except FileNotFoundError:
                self._seen_collections.discard(key)
                continue
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
                errors.append(f"{where}: corrupt collections file ({type(e).__name__}: {e})")
                continue
            self.collection_workers.add(deserialize_worker(m.group(1)))
        if errors:
            raise IndexReaderException("; ".join(errors))

    def _add_collections(self, doc: Any) -> None:
        if not isinstance(doc, dict) or set(doc) - {"collections", "_meta"}:
            raise ValueError("top-level keys must be 'collections' and '_meta'")
        n = (doc.get("_meta") or {}).get("num_workers")
        if n is not None:
            self.num_workers = max(int(n), self.num_workers or 0)
        for name, c in (doc.get("collections") or {}).items():
            info = self.collections.get(name)
            if info is None:
                regex = c.get("include_regex") or []
                info = self.collections[name] = CollectionInfo(name=name, include_regex=list(regex), config=dict(c))
            info.tensor_names.update(c.get("tensor_names") or [])

    # --------------------------------------------------------------------------------------------- read
    def read_values(self, entries: np.ndarray) -> list[np.ndarray]:
        """Decoded values; a SHAPE entry gives its shape as an int64 array."""
        entries = np.asarray(entries, dtype=ENTRY_DTYPE).reshape(-1)
        results: list[np.ndarray | None] = [None] * len(entries)
        by_chunk: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(entries):
            if e["chunk"] == NO_EVENT_FILE:
                name = self.names[e["name"]]
                raise TensorUnavailableForStep(name, int(e["mode_step"]), ModeKeys(int(e["mode"])))
            if e["kind"] == SHAPE or e["chunk"] == INLINE_CHUNK:
                results[i] = np.array(self.shapes[e["shape"]], dtype=np.int64)
            else:
                by_chunk[int(e["chunk"])].append(i)
        for chunk, idx in by_chunk.items():
            key = self.event_files[chunk]
            where = self.storage.describe(key)
            idx.sort(key=lambda i: int(entries["offset"][i]))
            # coalesce adjacent (or overlapping) ranges into one read each
            spans: list[list[int]] = []
            for i in idx:
                off, ln = int(entries["offset"][i]), int(entries["length"][i])
                if spans and off <= spans[-1][1]:
                    spans[-1][1] = max(spans[-1][1], off + ln)
                else:
                    spans.append([off, off + ln])
            try:
                blobs = self.storage.read_ranges(key, [(a, b - a) for a, b in spans])
            except FileNotFoundError as e:
                raise CorruptData(where, int(entries["offset"][idx[0]]), "event file is missing") from e
            s = 0
            for i in idx:
                off, ln = int(entries["offset"][i]), int(entries["length"][i])
                while off >= spans[s][1]:
                    s += 1
                rel = off - spans[s][0]
                results[i] = self._decode(entries[i], blobs[s][rel : rel + ln], where, off, ln)
        return results  # type: ignore[return-value]

    def _decode(self, e: np.void, rec: bytes, where: str, off: int, ln: int) -> np.ndarray:
        payload, end = decode_record(rec, 0, where, off)
        if end != ln:
            raise CorruptData(where, off, f"the index says {ln} bytes, the record has {end}")
        name = self.names[e["name"]]
        expected = reduction_tensor_name(name, int(e["reduction"])) if e["kind"] == REDUCTION else name
        try:
            ev = _proto.decode_event(payload)
            vals = [v for v in ev.values if v.tensor is not None]
            if not vals:
                raise _proto.ProtoError("the event holds no tensor")
            v = next((v for v in vals if v.tag == expected), None)
            if v is None:
                raise _proto.ProtoError(f"the record holds {vals[0].tag!r}, the index says {expected!r}")
            return _proto.tensor_to_numpy(v.tensor)  # type: ignore[arg-type]
        except _proto.UnsupportedDtype as ex:
            raise UnsupportedFormatVersion(f"{where} at offset {off}: {ex}") from ex
        except (_proto.ProtoError, ValueError) as ex:
            raise CorruptData(where, off, str(ex)) from ex
