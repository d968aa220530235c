"""`tensortap export`: jobs into a Hive-partitioned Parquet dataset, incrementally (docs/export.md).

Layout under DEST (local directory or s3://bucket/prefix):

    scalars/job=<job>/worker=<worker>/step_block=<first step>/part-<generation>-<n>.parquet
    tensors/job=<job>/worker=<worker>/step_block=<first step>/part-<generation>-<n>.parquet
    events/job=<job>/part-<generation>-0.parquet
    _tensortap/export.json            the schema version and what was exported of each job

Every export is one *generation*: it writes new files only, then commits by rewriting export.json. Files of a
generation that never committed (an export that was interrupted) are deleted by the next export before it
writes, so a reader of committed data never sees a row twice.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import numpy as np

from tensortap.exceptions import InvalidConfiguration

logger = logging.getLogger("tensortap")

STATE_KEY = "_tensortap/export.json"
FORMAT = "tensortap-export"
#: default global steps per step_block partition
STEP_BLOCK = 10_000
#: rows per Parquet file at most (a partition with more gets several files)
MAX_ROWS_PER_FILE = 4_000_000
_PART = re.compile(r"(^|/)part-(\d{6})-\d{4}\.parquet$")


def partition_value(v: str) -> str:
    """A job or worker name as a Hive partition value: percent-encoded (readers decode it)."""
    return quote(str(v), safe="")


def job_name(path: str) -> str:
    return os.path.basename(str(path).rstrip("/")) or str(path)


def expand(out_dirs: str | Iterable[str]) -> list[str]:
    """Paths and local globs ('runs/*') as a sorted list of job paths; a glob that matches nothing is an error."""
    import glob

    if isinstance(out_dirs, str | os.PathLike):
        out_dirs = [str(out_dirs)]
    paths: list[str] = []
    for p in out_dirs:
        p = str(p)
        if "://" not in p and glob.has_magic(p):
            hits = sorted(h for h in glob.glob(p) if os.path.isdir(h))
            if not hits:
                raise InvalidConfiguration(f"{p!r} matches no directory")
            paths += hits
        else:
            paths.append(p)
    if not paths:
        raise InvalidConfiguration("give at least one job out_dir")
    return paths


def _read_state(dest: Any) -> dict[str, Any]:
    try:
        raw = dest.read(STATE_KEY)
    except FileNotFoundError:
        return {"format": FORMAT, "schema_version": None, "generation": 0, "jobs": {}}
    try:
        state = json.loads(raw)
        assert state.get("format") == FORMAT
    except (ValueError, AssertionError):
        raise InvalidConfiguration(f"{dest.describe(STATE_KEY)} is not a tensortap export's state") from None
    return state


def export(
    out_dirs: str | Iterable[str],
    dest: str,
    *,
    job_names: list[str] | None = None,
    tables: Iterable[str] = ("scalars", "tensors", "events"),
    step_block: int | None = None,
    max_elements: int = 4096,
    full: bool = False,
    assume_ended: bool = False,
    compression: str = "zstd",
) -> dict[str, Any]:
    """Export each job (local path, glob or s3://) into `dest`, appending what is new since the last export there:
    the complete steps after the last exported step of each job. `full=True` deletes the job's exported data
    and exports it again; `assume_ended=True` exports steps not every worker finished (a job whose process died).
    Returns a summary: per job the rows written per table and the steps exported."""
    from tensortap.storage import open_storage
    from tensortap.trials import _check_out_dir, create_trial
    from tensortap.trials.arrow import SCHEMA_VERSION

    tables = list(tables)
    for t in tables:
        if t not in ("scalars", "tensors", "events"):
            raise InvalidConfiguration(f"table {t!r}: allowed are scalars, tensors, events")
    if step_block is not None and (isinstance(step_block, bool) or not isinstance(step_block, int) or step_block < 1):
        raise InvalidConfiguration(f"step_block={step_block!r} must be a positive int")
    if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 0:
        raise InvalidConfiguration(f"max_elements={max_elements!r} must be a non-negative int")
    paths = expand(out_dirs)
    names = list(job_names) if job_names else [job_name(p) for p in paths]
    if len(names) != len(paths):
        raise InvalidConfiguration(f"{len(names)} job names for {len(paths)} jobs")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidConfiguration(f"two jobs would be exported as {dup[0]!r}: give each a distinct name (--job-name)")
    try:
        store = open_storage(dest)
    except ValueError as e:
        raise InvalidConfiguration(f"--parquet {dest!r}: {e}") from None
    state = _read_state(store)
    if state.get("schema_version") not in (None, SCHEMA_VERSION):
        raise InvalidConfiguration(f"{dest}: exported with schema version {state['schema_version']}, this "
                                   f"tensortap writes {SCHEMA_VERSION}; export into a new destination")
    state["schema_version"] = SCHEMA_VERSION
    block = int(state.get("step_block") or step_block or STEP_BLOCK)
    if step_block is not None and step_block != block:
        raise InvalidConfiguration(f"{dest} uses step_block={block}; give the same or none")
    state["step_block"] = block
    gen = int(state["generation"]) + 1
    existing = store.list("")
    for k in existing:  # a generation that never committed
        m = _PART.search(k)
        if m and int(m.group(2)) >= gen:
            store.delete(k)
    for path, name in zip(paths, names, strict=True):
        prev = state["jobs"].get(name)
        if prev is not None and prev.get("source") != path:
            raise InvalidConfiguration(f"{dest} already holds a job {name!r} exported from {prev.get('source')}, "
                                       f"not {path}: give this one another name (--job-name)")
        try:  # (a path that is no job: refused before anything is written)
            _check_out_dir(open_storage(path), path)
        except ValueError as e:
            raise InvalidConfiguration(f"{path!r}: {e}") from None
    summary: dict[str, Any] = {"dest": dest, "generation": gen, "jobs": {}}
    obsolete: list[str] = []
    for path, name in zip(paths, names, strict=True):
        js = state["jobs"].get(name)
        if js is None or full:
            if js is not None:
                obsolete += [k for k in existing if _job_of(k) == partition_value(name)]
            js = {"source": path, "exported_upto": -1, "first_nonfinite": {}}
        # the first step block to export, read through a trial of its steps alone: it also tells what the job holds
        lo = int(js["exported_upto"]) + 1
        probe = create_trial(path, name=name, range_steps=(lo, (lo // block + 1) * block))
        rows, probe = _export_job(store, probe, path, name, js, gen, block, tables, max_elements, compression,
                                  assume_ended)
        if "events" in tables:
            obsolete += [k for k in existing if k.startswith(f"events/job={partition_value(name)}/")]
        state["jobs"][name] = js
        summary["jobs"][name] = {"rows": rows, "exported_upto": js["exported_upto"], "ended": probe.loaded_all_steps}
    state["generation"] = gen
    state["updated_at"] = time.time()
    store.write(STATE_KEY, json.dumps(state, indent=1, sort_keys=True).encode())
    for k in obsolete:  # replaced by this generation, which is committed now
        store.delete(k)
    return summary


def _job_of(key: str) -> str | None:
    parts = key.split("/")
    return parts[1][len("job="):] if len(parts) > 2 and parts[1].startswith("job=") else None


def _export_job(store: Any, probe: Any, path: str, name: str, js: dict[str, Any], gen: int, block: int,
                tables: list[str], max_elements: int, compression: str, assume_ended: bool) -> tuple[
                    dict[str, int], Any]:
    """Export the job's complete steps after `exported_upto`, one step block at a time: a trial of tensortap's
    store holds only that block's entries (its index is read again for each block, in bounded pieces), so memory
    stays that of a block however long the job. `probe`: a trial of the job that holds no entry of them."""
    from tensortap.format.native import NativeSource
    from tensortap.trials import arrow, create_trial
    from tensortap.trials.columns import STATISTICS, Extract, collections_of

    if assume_ended:
        probe.assume_ended()
    probe.refresh_data()
    native = isinstance(probe.source, NativeSource)
    whole = None
    if native:
        last = probe.source.last_step_written
        upto = int(min(probe.complete_upto(), last))
    else:  # (an smdebug out_dir: read as one trial, as before)
        whole = create_trial(path, name=name)
        if assume_ended:
            whole.assume_ended()
        whole.refresh_data()
        upto = whole.last_complete_step
    lo = int(js["exported_upto"])
    rows = {t: 0 for t in tables}
    counters: dict[str, int] = {}
    nonfinite = js.setdefault("first_nonfinite", {})
    trial = whole or probe
    if upto > lo:
        first_block, last_block = (lo + 1) // block, upto // block
        nf_stat = STATISTICS.index("nonfinite")
        for b in range(first_block, last_block + 1):
            a, z = max(lo + 1, b * block), min(upto, (b + 1) * block - 1)
            if native and b != first_block:
                trial = create_trial(path, name=name, range_steps=(a, z + 1))
                if assume_ended:
                    trial.assume_ended()
                trial.refresh_data()
            ex = Extract(trial, steps=(a - 1, z))
            if not len(ex.entries):
                continue
            per_tensor = collections_of(trial, ex.tensors)
            cache: dict[int, np.ndarray] = {}
            if "scalars" in tables or "events" in tables:
                s = ex.scalars(raw_values=cache)
                bad = ~np.isfinite(s.value) | ((s.statistic == nf_stat) & (s.value > 0))
                for t, st in zip(s.tensor[bad].tolist(), s.step[bad].tolist(), strict=True):
                    tn = s.tensors[t]
                    if tn not in nonfinite or st < nonfinite[tn]:
                        nonfinite[tn] = st
                if "scalars" in tables and len(s):
                    tbl = arrow.scalars_table(s, name, per_tensor, with_partitions=False)
                    rows["scalars"] += _write_partitions(store, "scalars", tbl, s.worker, s.workers, name, b * block,
                                                         gen, counters, compression)
            if "tensors" in tables:
                t = ex.tensors_table(max_elements, raw_values=cache)
                if len(t):
                    tbl = arrow.tensors_table(t, name, per_tensor, with_partitions=False)
                    rows["tensors"] += _write_partitions(store, "tensors", tbl, t.worker, t.workers, name, b * block,
                                                         gen, counters, compression)
        js["exported_upto"] = int(upto)
    if "events" in tables:
        ev = _events(trial, name, nonfinite)
        _write(store, f"events/job={partition_value(name)}/part-{gen:06d}-0000.parquet",
               arrow.events_table(ev, with_partitions=False), compression)
        rows["events"] = len(ev)
    return rows, trial


def _write_partitions(store: Any, table: str, tbl: Any, worker: np.ndarray, workers: list[str], job: str,
                      block_start: int, gen: int, counters: dict[str, int], compression: str) -> int:
    order = np.argsort(worker, kind="stable")
    w_sorted = worker[order]
    bounds = np.flatnonzero(np.diff(w_sorted)) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [len(w_sorted)]]).astype(np.int64)
    tbl = tbl.take(order) if not np.array_equal(order, np.arange(len(order))) else tbl
    n = 0
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if e <= s:
            continue
        wname = workers[int(w_sorted[s])]
        prefix = f"{table}/job={partition_value(job)}/worker={partition_value(wname)}/step_block={block_start}/"
        for a in range(s, e, MAX_ROWS_PER_FILE):
            i = counters.get(prefix, 0)
            counters[prefix] = i + 1
            part = tbl.slice(a, min(e, a + MAX_ROWS_PER_FILE) - a)
            _write(store, f"{prefix}part-{gen:06d}-{i:04d}.parquet", part, compression)
            n += part.num_rows
    return n


def _write(store: Any, key: str, tbl: Any, compression: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    strings = [f.name for f in tbl.schema if pa.types.is_dictionary(f.type) or f.name == "collections"]
    pq.write_table(tbl, buf, compression=compression, use_dictionary=strings)
    store.write(key, buf.getvalue())


def _events(trial: Any, job: str, nonfinite: dict[str, int]) -> list[dict[str, Any]]:
    """Rule statuses (live and offline), the rule that fired first, the stop request, first non-finite values."""
    from tensortap.runner import status as st

    storage = trial.source.storage if hasattr(trial.source, "storage") else None
    rows: list[dict[str, Any]] = []
    if storage is not None:
        for key in storage.list("rules/"):
            if not key.endswith("/status.json"):
                continue
            parts = key.split("/")
            offline = len(parts) == 4 and parts[2] == "offline"
            if len(parts) not in (3, 4) or (len(parts) == 4 and not offline):
                continue
            doc = st.read_status(storage, parts[1], offline)
            if not isinstance(doc, dict):
                continue
            base = {"job": job, "rule": parts[1], "origin": "offline" if offline else "live",
                    "status": doc.get("status"), "message": doc.get("message"), "time": _num(doc.get("updated_at"))}
            rows.append({**base, "event": "status", "step": _int(doc.get("last_step"))})
            if doc.get("status") == st.ISSUES_FOUND:
                rows.append({**base, "event": "fired", "step": _int(doc.get("first_step"))})
        try:
            stop = json.loads(storage.read("tensortap/control/stop.json"))
        except (FileNotFoundError, ValueError):
            stop = None
        if isinstance(stop, dict):
            rows.append({"job": job, "event": "stopped", "rule": stop.get("rule"), "step": _int(stop.get("step")),
                         "message": stop.get("reason"), "time": _num(stop.get("requested_at"))})
    for tensor, step in sorted(nonfinite.items()):
        rows.append({"job": job, "event": "first_nonfinite", "tensor": tensor, "step": int(step)})
    return rows


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
