"""Many jobs and workers read in parallel with Dask (docs/export.md §Dask).

`read_jobs(paths_or_globs)` is a Dask DataFrame of the export's scalars table (scalars, saved reductions and
statistics computed from raw values) with one partition per (job, worker, chunk): a chunk file of a native
store, or a range of steps of an smdebug out_dir. Partitions are read where the graph runs: threads, processes,
or a `dask.distributed` cluster, from local disk or S3. `run_rules(...)` evaluates built-in rules over many
jobs at once on a cluster, each job's statuses written as `tensortap rules run` writes them.

Needs dask[dataframe] (and dask.distributed for a cluster); pandas for the partitions.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tensortap.exceptions import InvalidConfiguration

__all__ = ["read_jobs", "partitions", "read_partition", "run_rules"]

#: steps per partition of an smdebug out_dir (its index files are one per step and worker)
SMDEBUG_STEPS_PER_PARTITION = 1000
COLUMNS = ("job", "worker", "mode", "mode_step", "step", "tensor", "statistic", "value", "computed", "wall_time")


#: index entries (values) per partition of a native chunk: a larger chunk is read as several byte ranges of
#: whole index blocks, so that a partition's memory stays bounded however long the job
NATIVE_ENTRIES_PER_PARTITION = 4_000_000


@dataclass(frozen=True)
class Partition:
    """What one partition reads: bytes [lo, hi) of the index of a native chunk (`seq`) of `worker` (hi 0: to its
    end), or steps [lo, hi) of an smdebug job."""

    path: str
    job: str
    worker: str
    format: str  # "native" or "smdebug"
    seq: int = -1
    lo: int = 0
    hi: int = 0


def expand_jobs(paths_or_globs: str | Iterable[str]) -> list[str]:
    """Job paths from paths and globs (local `runs/*`, or `s3://bucket/runs/*`), sorted, duplicates removed."""
    if isinstance(paths_or_globs, str | os.PathLike):
        paths_or_globs = [str(paths_or_globs)]
    out: list[str] = []
    for p in paths_or_globs:
        p = str(p)
        if not glob.has_magic(p):
            out.append(p)
            continue
        if p.startswith("s3://"):
            hits = _s3_glob(p)
        elif "://" in p:
            raise InvalidConfiguration(f"{p!r}: globs work on local paths and s3:// only")
        else:
            hits = sorted(h for h in glob.glob(p) if os.path.isdir(h))
        if not hits:
            raise InvalidConfiguration(f"{p!r} matches no job directory")
        out += hits
    if not out:
        raise InvalidConfiguration("give at least one job out_dir or glob")
    return list(dict.fromkeys(out))


def _s3_glob(url: str) -> list[str]:
    from tensortap.storage import open_storage

    bucket, _, key = url[len("s3://"):].partition("/")
    parts = key.split("/")
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    if first == 0 or first != len(parts) - 1:
        raise InvalidConfiguration(f"{url!r}: an s3:// glob may use wildcards in its last path part only, "
                                   "below a prefix (s3://bucket/runs/*)")
    parent = "/".join(parts[:first])
    store = open_storage(f"s3://{bucket}")
    return [f"s3://{bucket}/{d}" for d in store.list_dirs(parent) if fnmatch.fnmatchcase(d, key)]


def _job_name(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def partitions(paths_or_globs: str | Iterable[str], *, job_names: list[str] | None = None,
               steps_per_partition: int = SMDEBUG_STEPS_PER_PARTITION) -> list[Partition]:
    """The partitions `read_jobs` reads, found by listing each job's files (no index is read)."""
    from tensortap.format import layout
    from tensortap.format.native import is_native_out_dir
    from tensortap.format.smdebug import deserialize_worker, is_smdebug_out_dir
    from tensortap.storage import open_storage

    paths = expand_jobs(paths_or_globs)
    names = list(job_names) if job_names else [_job_name(p) for p in paths]
    if len(names) != len(paths):
        raise InvalidConfiguration(f"{len(names)} job names for {len(paths)} jobs")
    out: list[Partition] = []
    for path, job in zip(paths, names, strict=True):
        try:
            store = open_storage(path)
        except ValueError as e:
            raise InvalidConfiguration(f"{path!r}: {e}") from None
        if "://" not in path and not os.path.isdir(path):
            raise InvalidConfiguration(f"{path!r} is not a directory (expected a job's out_dir)")
        if is_native_out_dir(store):
            from tensortap.trials.native_columns import block_ranges

            for key in store.list(layout.ROOT + "/"):
                p = layout.parse_chunk_key(key)
                if p is None or p[2] != "idx":
                    continue
                # a large local index: ranges of whole blocks (found from the blocks' heads); else the chunk
                # (a data file of packed statistics holds a value per 4-8 bytes, its index one entry a step)
                dat = layout.chunk_key(p[0], p[1], layout.DATA_SUFFIX)
                big = store.supports_append and ((store.size(key) or 0) > NATIVE_ENTRIES_PER_PARTITION * 66
                                                 or (store.size(dat) or 0) > NATIVE_ENTRIES_PER_PARTITION * 4)
                ranges = block_ranges(store, key, NATIVE_ENTRIES_PER_PARTITION) if big else [(0, 0)]
                for lo, hi in ranges:
                    out.append(Partition(path, job, p[0], "native", seq=p[1], lo=lo, hi=hi))
        elif is_smdebug_out_dir(store):
            by_worker: dict[str, list[int]] = {}
            for key in store.list("index/"):
                parts = key.split("/")  # index/<step // 1000>/<step, 12 digits>_<worker>.json
                f = parts[-1]
                if len(parts) == 3 and f.endswith(".json") and f[:12].isdigit() and f[12:13] == "_":
                    by_worker.setdefault(deserialize_worker(f[13 : -len(".json")]), []).append(int(f[:12]))
            for worker, steps in sorted(by_worker.items()):
                steps = sorted(set(steps))
                for i in range(0, len(steps), steps_per_partition):
                    sl = steps[i : i + steps_per_partition]
                    out.append(Partition(path, job, worker, "smdebug", lo=sl[0], hi=sl[-1] + 1))
    return out


def _native_trial(part: Partition) -> Any:
    """A trial of the partition's chunk (its byte range of whole index blocks)."""
    from tensortap.format import layout
    from tensortap.format.native import NativeSource
    from tensortap.storage import open_storage
    from tensortap.trials.trial import Trial

    key = layout.chunk_key(part.worker, part.seq, layout.INDEX_SUFFIX)
    storage = open_storage(part.path)
    if part.hi:
        real_size = storage.size

        def size(k: str) -> int | None:  # the range ends at hi: the blocks after it are another partition's
            return part.hi if k == key else real_size(k)

        storage.size = size  # (this storage object is the partition's own)

    class _OneChunk(NativeSource):
        def _list_chunk_keys(self) -> list[str]:
            return [key]

        def _discover(self) -> None:
            super()._discover()
            for c in self._chunks:
                if c.read_upto < part.lo:
                    c.read_upto = part.lo

    return Trial(_OneChunk(storage), part.job)


def read_partition(part: Partition, mode: int | None = None, names: list[str] | None = None) -> Any:
    """One partition as a pandas DataFrame (COLUMNS): what was written when it is read, finished steps or not."""
    import numpy as np
    import pandas as pd

    from tensortap.trials.columns import MODE_NAMES, STATISTICS, Extract

    s = None
    if part.format == "native":
        # a range of statistics and scalars straight into columns; through a trial where that cannot be
        from tensortap.format import layout
        from tensortap.storage import open_storage
        from tensortap.trials.native_columns import read_scalars

        key = layout.chunk_key(part.worker, part.seq, layout.INDEX_SUFFIX)
        s = read_scalars(open_storage(part.path), key, part.lo, part.hi or None, mode=mode, names=names)
        if s is None:
            ex = Extract(_native_trial(part), names, mode)
    else:
        from tensortap.trials import create_trial

        trial = create_trial(part.path, name=part.job, range_steps=(part.lo, part.hi))
        trial.assume_ended()
        ex = Extract(trial, names, mode, workers=[part.worker])
    if s is None:
        s = ex.scalars()

    import pyarrow as pa

    def strings(codes: np.ndarray, table: list[str]) -> Any:
        # decoded by pyarrow from the codes and their small table: no Python string object per row
        arr = pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)),
                                             pa.array(table or [""], pa.string()))
        return pd.arrays.ArrowStringArray(arr.cast(pa.string()))

    return pd.DataFrame({
        "job": strings(np.zeros(len(s), np.int32), [part.job]), "worker": strings(s.worker, s.workers),
        "mode": strings(s.mode.astype(np.int32) - 1, [MODE_NAMES[i] for i in range(1, 5)]),
        "mode_step": s.mode_step, "step": s.step, "tensor": strings(s.tensor, s.tensors),
        "statistic": strings(s.statistic, list(STATISTICS)),
        "value": s.value, "computed": s.computed, "wall_time": s.wall_time,
    })


def _meta() -> Any:
    import pandas as pd

    return pd.DataFrame({
        "job": pd.Series([], dtype="string[pyarrow]"), "worker": pd.Series([], dtype="string[pyarrow]"),
        "mode": pd.Series([], dtype="string[pyarrow]"), "mode_step": pd.Series([], dtype="int64"),
        "step": pd.Series([], dtype="int64"), "tensor": pd.Series([], dtype="string[pyarrow]"),
        "statistic": pd.Series([], dtype="string[pyarrow]"), "value": pd.Series([], dtype="float64"),
        "computed": pd.Series([], dtype="bool"), "wall_time": pd.Series([], dtype="float64"),
    })


def read_jobs(paths_or_globs: str | Iterable[str], *, job_names: list[str] | None = None,
              mode: str | None = None, tensors: Iterable[str] | None = None,
              steps_per_partition: int = SMDEBUG_STEPS_PER_PARTITION) -> Any:
    """A Dask DataFrame (COLUMNS) of the jobs' scalars, saved reductions and statistics of raw values, one
    partition per (job, worker, chunk). `mode` ("TRAIN", ...) and `tensors` (names) keep only those rows.
    Reads at compute time, where the graph runs (a `dask.distributed` client's cluster when one is active)."""
    import dask.dataframe as dd

    from tensortap.modes import parse_mode

    if isinstance(steps_per_partition, bool) or not isinstance(steps_per_partition, int) or steps_per_partition < 1:
        raise InvalidConfiguration(f"steps_per_partition={steps_per_partition!r} must be a positive int")
    mode_value = None if mode is None else parse_mode(mode).value
    names = None if tensors is None else list(tensors)
    parts = partitions(paths_or_globs, job_names=job_names, steps_per_partition=steps_per_partition)
    if not parts:
        raise InvalidConfiguration("the jobs hold no data yet")
    return dd.from_map(read_partition, parts, mode=mode_value, names=names, meta=_meta(),
                       label="tensortap-read-jobs", enforce_metadata=False)


# --- rules over many jobs ------------------------------------------------------------------------

def _rule_task(job: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one rule on one job (what `tensortap rules run` runs per rule) and return its status."""
    from tensortap.runner import rule_worker
    from tensortap.runner import status as st
    from tensortap.storage import open_storage

    code = rule_worker.run(job)
    status = st.read_status(open_storage(job["out_dir"]), job["label"], True) or {}
    return {"out_dir": job["out_dir"], "label": job["label"], "exit_code": code, "status": status.get("status"),
            "first_step": status.get("first_step"), "message": status.get("message", "")}


def run_rules(paths_or_globs: str | Iterable[str], rules: list[Any], client: Any = None) -> dict[str, Any]:
    """Evaluate rules (built-ins as `"name[:k=v,...]"`, as `--rule`, or RuleSpecs) on every job at once on a Dask
    cluster (`client`: a distributed Client or a scheduler address; None: the active client).
    Each job's statuses and reports are
    written to `OUT_DIR/rules/<rule>/offline/`, as `tensortap rules run` writes them. Returns
    {"exit_status": as rules run's, over all jobs, "jobs": {out_dir: [{name, status, first_step, message}]}}."""
    from tensortap.runner.rule_worker import build_rule
    from tensortap.runner.run import _labels
    from tensortap.runner.spec import parse_rule
    from tensortap.trials import create_trial

    if not rules:
        raise InvalidConfiguration("give at least one rule")
    specs = [parse_rule(r) if isinstance(r, str) else r for r in rules]
    paths = expand_jobs(paths_or_globs)
    first = create_trial(paths[0])
    for s in specs:  # bad names and parameters fail here, before anything is submitted
        build_rule(s, first)
    labels = _labels(specs)
    from distributed import Client, get_client

    own = None
    if client is None:
        client = get_client()
    elif isinstance(client, str):
        client = own = Client(client)
    try:
        jobs = [{"out_dir": p, "label": label, "rule": s.to_json(), "offline": True}
                for p in paths for s, label in zip(specs, labels, strict=True)]
        futures = client.map(_rule_task, jobs, pure=False)
        results = client.gather(futures)
    finally:
        if own is not None:
            own.close()
    out: dict[str, Any] = {"jobs": {}}
    for r in results:
        out["jobs"].setdefault(r["out_dir"], []).append(
            {"name": r["label"], "status": r["status"], "first_step": r["first_step"], "message": r["message"]})
    statuses = [r["status"] for r in results]
    out["exit_status"] = (2 if any(s in ("Error", "Stopped", None) for s in statuses) else
                          1 if "IssuesFound" in statuses else 3 if "NoData" in statuses else 0)
    return out
