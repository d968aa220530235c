"""Export and bulk-read benchmark (issue 41): tensortap export, Trial.to_arrow(), Trial.to_dataframe(), a wide job
read whole, a DuckDB query over 100 exported jobs, and tensortap.dask.read_jobs against the sequential trial loop.

Jobs are synthetic native stores written straight in the format (docs/format.md: index blocks of inline float32
scalars, TRAIN mode, every step saved) so that building them takes seconds, not a training run. Each figure is
the median of --repeat runs; A/B comparisons alternate their runs. The machine's load is printed: on a shared
machine the absolute figures move with it, ratios less.

Usage: .venv/bin/python bench/export.py [--only NAME ...] [--repeat 3] [--wide-steps 1000] [--old /work/main]
                                       [--wide-path JOB] [--dask-workers 2]
                                       [--packed-steps 10000] [--packed-tensors 10000] [--packed-path JOB]
  --old PATH  also time to_dataframe() of the tensortap checkout at PATH (the implementation before this one)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def synth_job(path: str, tensors: int, steps: int, workers: int = 1, steps_per_block: int = 0,
              seed: int = 0) -> int:
    """A finished native job: `workers` workers, each saving `tensors` float32 scalars at every one of `steps`
    TRAIN steps (tensor 0 is `scalar/loss`). Returns the number of scalar values."""
    from tensortap.format import codec, layout

    rng = np.random.default_rng(seed)
    names = ["scalar/loss"] + [f"layer{i // 4}/stat_{i % 4}" for i in range(1, tensors)]
    per_block = steps_per_block or max(1, 200_000 // tensors)
    for w in range(workers):
        worker = f"worker_{w}"
        os.makedirs(os.path.join(path, layout.worker_dir(worker)), exist_ok=True)
        with open(os.path.join(path, layout.chunk_key(worker, 0, layout.INDEX_SUFFIX)), "wb") as f:
            for b0 in range(0, steps, per_block):
                b1 = min(steps, b0 + per_block)
                n = (b1 - b0) * tensors
                e = np.zeros(n, dtype=codec.DISK_ENTRY_DTYPE)
                st = np.repeat(np.arange(b0, b1, dtype=np.int64), tensors)
                e["name"] = np.tile(np.arange(tensors, dtype=np.uint32), b1 - b0)
                e["mode"] = 1
                e["kind"] = 0
                e["reduction"] = 255
                e["flags"] = codec.FLAG_INLINE
                e["step"] = st
                e["mode_step"] = st
                e["length"] = 4
                vals = (1.0 / (st + 1) + rng.random(n) * 1e-3).astype(np.float32)
                inline = np.zeros((n, 16), dtype=np.uint8)
                inline[:, :4] = vals.view(np.uint8).reshape(n, 4)
                e["inline"] = inline.view("V16").reshape(n)
                header = {"names": names, "dtypes": ["<f4"], "shapes": [[]], "worker": worker,
                          "num_workers": workers, "time": time.time(), "passed": {"step": b1 - 1}}
                if b0 == 0:
                    header.update(format_version=1, metadata={"bench": True})
                if b1 == steps:
                    header["end"] = True
                f.write(codec.encode_block(header, e))
        with open(os.path.join(path, layout.chunk_key(worker, 0, layout.DATA_SUFFIX)), "wb"):
            pass
    return tensors * steps * workers


def load() -> str:
    a, b, c = os.getloadavg()
    return f"load average {a:.2f} {b:.2f} {c:.2f} on {os.cpu_count()} CPUs"


def med(xs: list[float]) -> float:
    return statistics.median(xs)


#: CPU seconds of the last timed() call: on a loaded machine wall time mostly measures the other processes
LAST_CPU = [0.0]


def timed(fn) -> float:
    c0 = time.process_time()
    t0 = time.perf_counter()
    fn()
    LAST_CPU[0] = time.process_time() - c0
    return time.perf_counter() - t0


def summary(n: int, wall: list[float], cpu: list[float] | None = None) -> dict:
    out = {"s": round(med(wall), 3), "values_per_s": round(n / med(wall))}
    if cpu:
        out.update(cpu_s=round(med(cpu), 3), values_per_cpu_s=round(n / med(cpu)))
    return out


OLD_TO_DATAFRAME = """
import sys, time
sys.path.insert(0, sys.argv[1])
import pandas
from tensortap.trials import create_trial
c0, t0 = time.process_time(), time.perf_counter()
trial = create_trial(sys.argv[2]); trial.steps()
c1, t1 = time.process_time(), time.perf_counter()
df = trial.to_dataframe()
c2, t2 = time.process_time(), time.perf_counter()
print(t1 - t0, t2 - t1, len(df), c1 - c0, c2 - c1)
"""


def _open(path: str):
    from tensortap.trials import create_trial

    trial = create_trial(path)
    trial.steps()
    return trial


def bench_to_frames(tmp: str, repeat: int, old: str | None) -> dict:
    """Each call on a trial opened just before (the open is timed apart: it is the trial's, not the call's)."""
    import pandas  # noqa: F401 - imports paid before timing
    import pyarrow

    pyarrow.array([1])
    path = os.path.join(tmp, "frames")
    n = synth_job(path, tensors=100, steps=10_000)
    res: dict[str, list[float]] = {"open": [], "to_dataframe": [], "to_arrow": [], "old_open": [],
                                   "old_to_dataframe": []}
    cpu: dict[str, list[float]] = {k: [] for k in res}
    for _ in range(repeat):  # alternate
        c0, t0 = time.process_time(), time.perf_counter()
        trial = _open(path)
        res["open"].append(time.perf_counter() - t0)
        cpu["open"].append(time.process_time() - c0)
        res["to_arrow"].append(timed(trial.to_arrow))
        cpu["to_arrow"].append(LAST_CPU[0])
        trial = _open(path)
        res["to_dataframe"].append(timed(trial.to_dataframe))
        cpu["to_dataframe"].append(LAST_CPU[0])
        del trial
        if old:
            out = subprocess.run([sys.executable, "-c", OLD_TO_DATAFRAME, old, path], capture_output=True,
                                 text=True, check=True, env={**os.environ, "PYTHONPATH": old}).stdout.split()
            assert int(out[2]) == n
            res["old_open"].append(float(out[0]))
            res["old_to_dataframe"].append(float(out[1]))
            cpu["old_open"].append(float(out[3]))
            cpu["old_to_dataframe"].append(float(out[4]))
    return {"values": n, **{k: summary(n, v, cpu[k]) for k, v in res.items() if v}}


def bench_export(tmp: str, repeat: int) -> dict:
    from tensortap.export import export

    path = os.path.join(tmp, "exp_job")
    n = synth_job(path, tensors=100, steps=10_000)
    import pyarrow

    pyarrow.array([1])
    times, cpu = [], []
    for i in range(repeat):
        dest = os.path.join(tmp, f"exp_dest{i}")
        times.append(timed(lambda dest=dest: export(path, dest)))
        cpu.append(LAST_CPU[0])
        shutil.rmtree(dest)
    return {"values": n, "note": "whole export: the trial opened, the rows built, Parquet written",
            **summary(n, times, cpu)}


def bench_wide(tmp: str, repeat: int, steps: int) -> dict:
    from tensortap.trials import create_trial

    path = os.path.join(tmp, "wide")
    n = synth_job(path, tensors=10_000, steps=steps, steps_per_block=20)
    opens, reads, cpus = [], [], []
    for _ in range(repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        trial = create_trial(path)
        trial.steps()
        t1 = time.perf_counter()
        tbl = trial.to_arrow()
        t2 = time.perf_counter()
        cpus.append(time.process_time() - c0)
        assert tbl.num_rows == n
        opens.append(t1 - t0)
        reads.append(t2 - t0)
        del tbl, trial
    return {"tensors": 10_000, "steps": steps, "values": n, "open_s": round(med(opens), 3),
            "read_whole": summary(n, reads, cpus)}


def bench_wide_stream(tmp: str, repeat: int, steps: int, path: str | None = None, dask_workers: int = 2,
                      only_columns: bool = False) -> dict:
    """A wide job (10,000 tensors x `steps` steps of statistics) read whole as `tensortap.dask.read_jobs` reads it:
    its index in byte ranges of whole blocks, each read straight into columns (trials.native_columns), one
    partition after another in this process, then on a LocalCluster of `dask_workers` processes. `path`: an
    existing job of that shape (it takes minutes to write 10^8 values). "columns": the partitions' columns alone
    (trials.native_columns, before pandas builds its string columns); `only_columns`: that alone."""
    import tensortap.dask as ttd

    if path is None:
        path = os.path.join(tmp, "wide_stream")
        n = synth_job(path, tensors=10_000, steps=steps, steps_per_block=20)
    else:
        n = None
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    t0 = time.perf_counter()
    parts = ttd.partitions([path])
    list_s = time.perf_counter() - t0
    seq, seq_cpu, dist, cols, cols_cpu = [], [], [], [], []
    rows = 0
    from tensortap.format import layout
    from tensortap.storage import open_storage
    from tensortap.trials.native_columns import read_scalars

    store = open_storage(path)
    for _ in range(repeat):  # the columns alone (what each partition reads before pandas)
        c0, t0 = time.process_time(), time.perf_counter()
        got = sum(len(read_scalars(store, layout.chunk_key(p.worker, p.seq, layout.INDEX_SUFFIX), p.lo,
                                   p.hi or None)) for p in parts)
        cols.append(time.perf_counter() - t0)
        cols_cpu.append(time.process_time() - c0)
    if only_columns:
        return {"values": got, "index_bytes": size, "partitions": len(parts), "columns": summary(got, cols, cols_cpu)}
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        rows = sum(len(ttd.read_partition(p)) for p in parts)
        seq.append(time.perf_counter() - t0)
        seq_cpu.append(time.process_time() - c0)
    if n is not None:
        assert rows == n
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=dask_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for _ in range(repeat):
            t0 = time.perf_counter()
            got = int(client.compute(ttd.read_jobs([path]).map_partitions(len)).result().sum())
            dist.append(time.perf_counter() - t0)
            assert got == rows
    return {"values": rows, "index_bytes": size, "partitions": len(parts), "list_s": round(list_s, 3),
            "columns": summary(rows, cols, cols_cpu), "sequential": summary(rows, seq, seq_cpu),
            f"dask_{dask_workers}_workers": summary(rows, dist)}


def packed_job(path: str, tensors: int, steps: int, steps_per_block: int = 100, nonfinite_every: int = 1000) -> int:
    """A finished native job of statistics as the PyTorch hook hands them over (`submit_statistics`: one vector a
    step, l2 as float32 and nonfinite as int64 of each tensor), written by the real encoder: one packed entry and
    payload a step (docs/format.md §3.3). As in training, the non-finite counts are 0 but at one step in
    `nonfinite_every` (1% of the tensors then count some): the other steps' payloads leave them out (kind 4).
    Returns the number of values."""
    from tensortap.format.records import StatisticsLayout, StatisticsRows
    from tensortap.format.writer import ChunkEncoder
    from tensortap.storage import LocalStorage

    names = tuple(f"gradient/layer{i}.weight" for i in range(tensors))
    keys = (("l2", False), ("nonfinite", False))
    lay = StatisticsLayout(names, (keys,) * tensors, ((np.dtype(np.float32), np.dtype(np.int64)),) * tensors)
    base = np.random.default_rng(0).random(lay.vector_size)
    enc = ChunkEncoder(LocalStorage(path), "worker_0")
    v = np.empty_like(base)
    for s in range(steps):
        np.divide(base, s + 1, out=v)
        v[1::2] = 0
        if s % nonfinite_every == nonfinite_every - 1:
            v[1:2 * max(1, tensors // 100):2] = s % 7 + 1
        enc.encode_statistics(StatisticsRows(lay, v.copy(), s, 1, s))
        if (s + 1) % steps_per_block == 0 or s == steps - 1:
            enc.write_block(passed={"step": s, "mode_steps": {"TRAIN": s}}, end=s == steps - 1)
    enc.close()
    return tensors * steps * 2


def _evict(path: str) -> None:
    """Drop the job's files (only them) from the page cache: the next read comes from the disk."""
    for d, _, fs in os.walk(path):
        for f in fs:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _disk_read(path: str) -> tuple[float, int]:
    """(seconds, bytes) to read the job's data files from the disk itself (`dd iflag=direct`: no page cache)."""
    dats = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".dat"))
    t0 = time.perf_counter()
    for f in dats:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"], check=True,
                       capture_output=True)
    return time.perf_counter() - t0, sum(os.path.getsize(f) for f in dats)


def bench_packed_write(path: str, steps: int, tensors: int) -> dict:
    """Write the job of `bench_wide_packed` (disk work: it may run outside the bench lock)."""
    c0, t0 = time.process_time(), time.perf_counter()
    n = packed_job(path, tensors, steps)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return {"path": path, "values": n, "bytes": size, "bytes_per_value": round(size / n, 3), "write_s": round(wall, 1),
            "write_cpu_s": round(cpu, 1), "values_per_s": round(n / wall)}


def bench_wide_packed(tmp: str, repeat: int, steps: int, tensors: int, path: str | None = None,
                      trial_steps: int = 1000) -> dict:
    """A job of `tensors` tensors x `steps` steps of statistics (2 a tensor) read whole by
    `tensortap.trials.read_statistics` (each statistic as saved: float32 l2, int64 counts): cold (the job's pages
    dropped from the cache first) and warm, beside the disk's own read of the data files (`dd iflag=direct`), in
    rounds; beside it, at `trial_steps` steps, the same statistics through a trial (`create_trial(...).statistics()`).
    """
    import resource

    from tensortap.trials import create_trial, read_statistics

    if path is None:
        path = os.path.join(tmp, "wide_packed")
    write = bench_packed_write(path, steps, tensors) if not os.path.exists(path) else None
    n = tensors * steps * 2
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    idx = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith(".idx"))
    res: dict = {"cold": ([], []), "warm": ([], [])}
    disk: list[float] = []
    loads = []
    for _ in range(repeat):
        loads.append(load())
        secs, dat_bytes = _disk_read(path)
        disk.append(dat_bytes / secs)
        for how in ("cold", "warm"):
            if how == "cold":
                _evict(path)
            got: list = []
            w = timed(lambda got=got: got.append(read_statistics(path)))
            assert sum(len(v[1]) for d in got[0].values() for v in d.values()) == n
            res[how][0].append(w)
            res[how][1].append(LAST_CPU[0])
            del got
    out = {"tensors": tensors, "steps": steps, "values": n, "write": write, "bytes": size, "index_bytes": idx,
           "bytes_per_value": round(size / n, 3), "disk_direct_mb_s": [round(x / 1e6) for x in disk],
           "disk_direct_mb_s_median": round(med(disk) / 1e6), "loads": loads,
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
           **{f"read_statistics_{k}": {**summary(n, *v), "runs_s": [round(x, 1) for x in v[0]],
                                        "runs_cpu_s": [round(x, 1) for x in v[1]]} for k, v in res.items()}}
    small = os.path.join(tmp, "wide_packed_small")
    if trial_steps and not os.path.exists(small):
        m = packed_job(small, tensors, trial_steps)
        walls, cpus = [], []
        for _ in range(repeat):
            walls.append(timed(lambda: create_trial(small).statistics(stats=["l2", "nonfinite"])))
            cpus.append(LAST_CPU[0])
        out["trial_statistics_small"] = {"steps": trial_steps, **summary(m, walls, cpus)}
        walls, cpus = [], []
        for _ in range(repeat):
            walls.append(timed(lambda: read_statistics(small)))
            cpus.append(LAST_CPU[0])
        out["read_statistics_small"] = {"steps": trial_steps, **summary(m, walls, cpus)}
        shutil.rmtree(small, ignore_errors=True)
    return out


EXPORT_PEAK = """
import resource, sys, time
sys.path.insert(0, sys.argv[1])
from tensortap.export import export
c0, t0 = time.process_time(), time.perf_counter()
export(sys.argv[2], sys.argv[3], tables=["scalars"])
print(time.perf_counter() - t0, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_export_memory(tmp: str, repeat: int, tensors: int, steps: int, old: str | None) -> dict:
    """Peak RSS of `tensortap export` of one job of `tensors` scalars x `steps` steps (one index entry a value), in
    a fresh process each, this checkout and `old` alternately."""
    path = os.path.join(tmp, "export_memory")
    n = synth_job(path, tensors=tensors, steps=steps)
    idx = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res: dict = {}
    for i in range(repeat):
        for label, root in (("this", here), ("old", old)):
            if root is None:
                continue
            dest = os.path.join(tmp, f"export_memory_out_{label}_{i}")
            r = subprocess.run([sys.executable, "-c", EXPORT_PEAK, root, path, dest], capture_output=True, text=True,
                               check=True, env={**os.environ, "PYTHONPATH": root})
            wall, cpu, rss = r.stdout.split()
            res.setdefault(label, []).append((float(wall), float(cpu), int(rss)))
            shutil.rmtree(dest, ignore_errors=True)
    out = {"values": n, "index_bytes": idx}
    for label, runs in res.items():
        out[label] = {"peak_rss_mb": round(med([r[2] for r in runs]) / 1024), **summary(n, [r[0] for r in runs],
                                                                                      [r[1] for r in runs])}
    shutil.rmtree(path, ignore_errors=True)
    return out


def bench_duckdb(tmp: str, repeat: int) -> dict:
    import duckdb

    from tensortap.export import export

    jobs = []
    for j in range(100):
        p = os.path.join(tmp, "many", f"job{j:03d}")
        synth_job(p, tensors=10, steps=1000 + j, seed=j)
        jobs.append(p)
    dest = os.path.join(tmp, "many_dest")
    t_export = timed(lambda: export(jobs, dest))
    q = (f"SELECT job, arg_max(value, step) AS last_loss, max(step) AS last_step FROM read_parquet('{dest}/scalars/"
         "**/*.parquet', hive_partitioning=true) WHERE tensor = 'scalar/loss' AND statistic = 'value' GROUP BY job")
    times, rows = [], None
    for _ in range(max(repeat, 5)):
        con = duckdb.connect()  # a fresh connection each time: no cached metadata
        t0 = time.perf_counter()
        rows = con.sql(q).fetchall()
        times.append(time.perf_counter() - t0)
        con.close()
    assert len(rows) == 100 and all(r[2] == 999 + int(r[0][3:]) for r in rows)
    return {"jobs": 100, "export_s": t_export, "query_s": med(times), "query_s_all": times}


def bench_read_jobs(tmp: str, repeat: int, steps: int) -> dict:
    import distributed

    import tensortap.dask as ttd
    from tensortap.trials import create_trial

    path = os.path.join(tmp, "w64")
    n = synth_job(path, tensors=5, steps=steps, workers=64, steps_per_block=2000)

    def loop() -> int:  # the sequential trial loop: every tensor of every worker, read in bulk
        trial = create_trial(path)
        total = 0
        for w in trial.workers():
            for name in trial.tensor_names():
                total += len(trial.tensor(name).values(worker=w))
        return total

    def frame() -> int:
        return len(create_trial(path).to_dataframe())

    res: dict[str, list[float]] = {"trial_loop": [], "to_dataframe": [], "read_jobs_2_workers": []}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        client.run(lambda: __import__("tensortap.dask"))  # imports paid once, as on a running cluster
        for _ in range(repeat):  # alternate
            res["trial_loop"].append(timed(loop))
            res["to_dataframe"].append(timed(frame))
            df = ttd.read_jobs(path)
            t = timed(lambda df=df: client.compute(df.map_partitions(len)).result())
            res["read_jobs_2_workers"].append(t)
    assert loop() == n
    return {"workers": 64, "steps": steps, "tensors": 5, "values": n,
            **{k: summary(n, v) for k, v in res.items()},
            "speedup_vs_trial_loop": round(med(res["trial_loop"]) / med(res["read_jobs_2_workers"]), 2),
            "speedup_vs_to_dataframe": round(med(res["to_dataframe"]) / med(res["read_jobs_2_workers"]), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=["frames", "export", "wide", "wide_stream", "wide_packed", "duckdb",
                                                  "read_jobs"])
    ap.add_argument("--packed-steps", type=int, default=10_000, help="wide_packed: steps of the job")
    ap.add_argument("--packed-tensors", type=int, default=10_000, help="wide_packed: tensors of the job")
    ap.add_argument("--packed-path", default=None, help="wide_packed: where the job is (kept if it exists); "
                    "packed_write: where to write it")
    ap.add_argument("--packed-trial-steps", type=int, default=1000,
                    help="wide_packed: steps of the job read through a trial beside it (0: none)")
    ap.add_argument("--memory-tensors", type=int, default=200, help="export_memory: scalars of the job")
    ap.add_argument("--memory-steps", type=int, default=25_000, help="export_memory: steps of the job")
    ap.add_argument("--wide-path", default=None, help="wide_stream: an existing job of 10,000 tensors (reused)")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--only-columns", action="store_true", help="wide_stream: the columnar read alone")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wide-steps", type=int, default=1000)
    ap.add_argument("--w64-steps", type=int, default=10_000)
    ap.add_argument("--old", help="a tensortap checkout whose to_dataframe() to time too")
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tt-bench-export-", dir=args.tmp)
    out = {"load_before": load()}
    try:
        for name in args.only:
            t0 = time.perf_counter()
            if name == "frames":
                out[name] = bench_to_frames(tmp, args.repeat, args.old)
            elif name == "export":
                out[name] = bench_export(tmp, args.repeat)
            elif name == "wide":
                out[name] = bench_wide(tmp, args.repeat, args.wide_steps)
            elif name == "wide_stream":
                out[name] = bench_wide_stream(tmp, args.repeat, args.wide_steps, args.wide_path, args.dask_workers,
                                              args.only_columns)
            elif name == "wide_packed":
                out[name] = bench_wide_packed(tmp, args.repeat, args.packed_steps, args.packed_tensors,
                                              args.packed_path, args.packed_trial_steps)
            elif name == "packed_write":
                out[name] = bench_packed_write(args.packed_path, args.packed_steps, args.packed_tensors)
            elif name == "export_memory":
                out[name] = bench_export_memory(tmp, args.repeat, args.memory_tensors, args.memory_steps, args.old)
            elif name == "duckdb":
                out[name] = bench_duckdb(tmp, args.repeat)
            elif name == "read_jobs":
                out[name] = bench_read_jobs(tmp, args.repeat, args.w64_steps)
            out[name]["load_after"] = load()
            out[name]["bench_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps({name: out[name]}, indent=1), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
