"""Write and read benchmark of the store: tensortap vs smdebug 1.0.34, in the same run.

Jobs:
  (a) 1,000 saved steps x 50 tensors (25 scalars + 25 float32 64x64)
  (b) 100,000 steps x 5 scalars
For each: write time, files written, trial open time, full-read values/s; for (a) also the time from a
flush to a tailing reader seeing the step. smdebug runs in its own venv (default /work/smdebug-venv,
or $SMDEBUG_PYTHON); without it that column is skipped with a message.

Usage: .venv/bin/python bench/read_trial.py [--smdebug-steps-b N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

JOBS = {
    "a": {"steps": 1000, "scalars": 25, "matrices": 25},
    "b": {"steps": 100_000, "scalars": 5, "matrices": 0},
}


def count_files(path: str) -> int:
    return sum(len(fs) for _, _, fs in os.walk(path))


def values_in(job: dict) -> tuple[int, int]:
    """(scalar values, matrix elements) in a full read."""
    return job["steps"] * job["scalars"], job["steps"] * job["matrices"] * 64 * 64


def write_job(job: dict, out: str) -> float:
    """Write `job` with tensortap's generic hook to `out` (a path or s3:// URL); returns the seconds taken."""
    import tensortap as tt

    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(job["matrices"])]
    t0 = time.perf_counter()
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for step in range(job["steps"]):
        hook.next_step()
        for i in range(job["scalars"]):
            hook.save_tensor(f"scalar_{i}", np.float32(step + i))
        for i, m in enumerate(mats):
            hook.save_tensor(f"matrix_{i}", m)
    hook.close()
    return time.perf_counter() - t0


def tensortap_run(job: dict, out: str) -> dict:
    import tensortap as tt

    write_s = write_job(job, out)

    t0 = time.perf_counter()
    trial = tt.create_trial(out)
    steps = trial.steps()
    names = trial.tensor_names()
    open_s = time.perf_counter() - t0
    assert len(steps) == job["steps"]

    t0 = time.perf_counter()
    n_scalar = 0
    for name in names:
        s, vals = trial.tensor(name).stacked()
        if name.startswith("scalar_"):
            n_scalar += len(s)
    read_s = time.perf_counter() - t0
    assert n_scalar == job["steps"] * job["scalars"]
    return {"write_s": write_s, "files": count_files(out), "open_s": open_s, "read_s": read_s}


def tail_latency(out: str, n: int = 20) -> list[float]:
    """Seconds from a writer's flush of a step to a tailing reader seeing it (flush_interval 0.5 s)."""
    code = textwrap.dedent(
        """
        import sys, time, numpy as np, tensortap as tt
        hook = tt.Hook(sys.argv[1], save_config=tt.SaveConfig(save_interval=1))
        for step in range(int(sys.argv[2])):
            hook.next_step()
            hook.save_tensor("w", np.full((64, 64), step, dtype=np.float32))
            hook.end_step()
            print(step, time.time(), flush=True)
            time.sleep(0.2)
        hook.close()
        """
    )
    import tensortap as tt

    p = subprocess.Popen([sys.executable, "-c", code, out, str(n)], stdout=subprocess.PIPE, text=True)
    lat = []
    trial = None
    for line in p.stdout:
        step, t_handoff = int(line.split()[0]), float(line.split()[1])
        if trial is None:
            trial = tt.create_trial(out)
        trial.wait_for_steps([step], timeout=30)
        lat.append(time.time() - t_handoff)
    p.wait()
    return lat


SMDEBUG_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time, numpy as np
    from smdebug.core.writer import FileWriter
    from smdebug.core.collection_manager import CollectionManager
    from smdebug.core.modes import ModeKeys
    from smdebug.trials import create_trial
    out, steps, n_scalars, n_mats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(n_mats)]
    t0 = time.perf_counter()
    for step in range(steps):
        with FileWriter(trial_dir=out, step=step, worker="worker_0") as fw:
            for i in range(n_scalars):
                fw.write_tensor(tdata=np.float32(step + i), tname=f"scalar_{i}", mode=ModeKeys.TRAIN,
                                mode_step=step)
            for i, m in enumerate(mats):
                fw.write_tensor(tdata=m, tname=f"matrix_{i}", mode=ModeKeys.TRAIN, mode_step=step)
    cm = CollectionManager()
    cm.add("default")
    cm.export(out, "worker_0_collections.json")
    open(os.path.join(out, "training_job_end.ts"), "w").close()
    write_s = time.perf_counter() - t0
    files = sum(len(fs) for _, _, fs in os.walk(out))
    t0 = time.perf_counter()
    trial = create_trial(out)
    all_steps = trial.steps()
    names = trial.tensor_names()
    open_s = time.perf_counter() - t0
    assert len(all_steps) == steps, (len(all_steps), steps)
    t0 = time.perf_counter()
    for name in names:
        t = trial.tensor(name)
        for s in t.steps():
            t.value(s)
    read_s = time.perf_counter() - t0
    print(json.dumps({"write_s": write_s, "files": files, "open_s": open_s, "read_s": read_s}))
    """
)


def smdebug_run(python: str, job: dict, steps: int, out: str) -> dict | None:
    r = subprocess.run([python, "-c", SMDEBUG_SCRIPT, out, str(steps), str(job["scalars"]), str(job["matrices"])],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print("smdebug run failed:", r.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smdebug-steps-b", type=int, default=10_000,
                    help="steps of job (b) for smdebug (100,000 makes 200,000 files; default 10,000, scaled)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = args.out or tempfile.mkdtemp(prefix="tt-bench-")
    smd_python = os.environ.get("SMDEBUG_PYTHON", "/work/smdebug-venv/bin/python")
    have_smd = os.path.exists(smd_python)
    if not have_smd:
        print(f"smdebug column skipped: no smdebug venv at {smd_python} (set SMDEBUG_PYTHON)")
    results = {}
    for key, job in JOBS.items():
        out = os.path.join(base, f"tt_{key}")
        shutil.rmtree(out, ignore_errors=True)
        r = tensortap_run(job, out)
        n_scalar, n_elems = values_in(job)
        r["values_per_s"] = (n_scalar + job["steps"] * job["matrices"]) / r["read_s"]
        r["scalar_values_per_s"] = n_scalar / r["read_s"] if not job["matrices"] else None
        results[("tensortap", key)] = r
        if have_smd:
            steps = job["steps"] if key == "a" else args.smdebug_steps_b
            out_s = os.path.join(base, f"smd_{key}")
            shutil.rmtree(out_s, ignore_errors=True)
            sj = dict(job, steps=steps)
            s = smdebug_run(smd_python, sj, steps, out_s)
            if s is not None:
                s["steps"] = steps
                s["values_per_s"] = steps * (job["scalars"] + job["matrices"]) / s["read_s"]
                results[("smdebug", key)] = s
    lat = tail_latency(os.path.join(base, "tail"))

    print(f"\nmachine: {os.cpu_count()} cores; python {sys.version.split()[0]}; numpy {np.__version__}")
    hdr = f"{'job':<4}{'impl':<11}{'steps':>8}{'write s':>9}{'files':>8}{'open s':>8}{'read s':>8}{'values/s':>12}"
    print(hdr)
    for (impl, key), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0] != "tensortap")):
        steps = r.get("steps", JOBS[key]["steps"])
        print(f"{key:<4}{impl:<11}{steps:>8}{r['write_s']:>9.2f}{r['files']:>8}{r['open_s']:>8.3f}"
              f"{r['read_s']:>8.3f}{r['values_per_s']:>12,.0f}")
    if ("smdebug", "a") in results:
        ra, sa = results[("tensortap", "a")], results[("smdebug", "a")]
        print(f"\n(a) full read: tensortap {sa['read_s'] / ra['read_s']:.0f}x faster than smdebug; "
              f"open {sa['open_s'] / ra['open_s']:.0f}x faster; {sa['files']} vs {ra['files']} files")
    lat_sorted = sorted(lat)
    print(f"tail latency (hand-off to reader, flush_interval 0.5 s): median {np.median(lat):.3f} s, "
          f"max {lat_sorted[-1]:.3f} s over {len(lat)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
