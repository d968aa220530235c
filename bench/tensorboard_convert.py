"""Converting a saved 1,000-step job to TensorBoard: tensortap's converter vs smdebug's TensorBoard path.

The job: an MLP's weights, biases and their gradients (64->128->10: 4 parameters, 9,610 floats, and 4
gradients) and the loss, saved at every one of `--steps` steps, EVAL every tenth step (no gradients in EVAL,
as smdebug saves them). It is written once with tensortap's hook; then, alternating over `--rounds` rounds,
each path is timed in wall-clock and in CPU time of the process doing it (steadier on a shared VM):

- `tensortap convert`: `tensortap.tensorboard.convert.convert(out_dir, logdir)`, reading the job from its store
  (histograms, scalars, and `nonfinite/` counts smdebug does not write);
- `smdebug 1.0.34`: what smdebug's hook does for TensorBoard at every step, with smdebug's own code in its own
  venv (`--smdebug-python` or $SMDEBUG_PYTHON; `pip install smdebug==1.0.34 "numpy<2" "pandas<3" requests
  psutil`, no torch needed): a `FileWriter(wtype="tensorboard", write_checksum=True)` per step and mode, a
  histogram summary per tensor
  (`<collection>/<name>`), the loss as a scalar, the writer closed at the step's end: one file per step. The
  tensors come from memory (its training loop has them), so smdebug is not charged for any reading;
- two in-memory variants with tensortap's encoder, to separate the file-per-step effect from the encoder: one
  EventExporter for the whole job (`appended`), and a new EventExporter per step (`file per step`).

    .venv/bin/python bench/tensorboard_convert.py [--steps 1000] [--rounds 3] [--smdebug-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np

PARAMS = (("Net_fc1.weight", (128, 64)), ("Net_fc1.bias", (128,)), ("Net_fc2.weight", (10, 128)),
          ("Net_fc2.bias", (10,)))
DEFAULT_SMDEBUG_PYTHON = "/work/smdebug-venv/bin/python"  # as bench/pytorch_overhead.py


def mode_name(step: int) -> str:
    return "EVAL" if step % 10 == 9 else "TRAIN"


def step_tensors(step: int) -> list[tuple[str, str, np.ndarray]]:
    """(collection, name, value) saved at `step`; the loss last."""
    rng = np.random.default_rng(step)
    out = []
    for name, shape in PARAMS:
        out.append(("weights" if name.endswith("weight") else "biases", name,
                    rng.normal(size=shape).astype(np.float32)))
    if mode_name(step) == "TRAIN":
        for name, shape in PARAMS:
            out.append(("gradients", f"gradient/{name}", (rng.normal(size=shape) * 1e-3).astype(np.float32)))
    out.append(("losses", "CrossEntropyLoss_output_0", np.float32(2.3 / (1 + step / 100))))
    return out


def write_job(out_dir: str, steps: int) -> None:
    import tensortap as tt

    hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    for step in range(steps):
        hook.set_mode(tt.modes.EVAL if mode_name(step) == "EVAL" else tt.modes.TRAIN)
        hook.next_step()
        for coll, name, value in step_tensors(step):
            hook.save_tensor(name, value, collections_to_write=coll)
    hook.close()


def _dir_stats(path: str) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            if "tfevents" in n:
                files += 1
                size += os.path.getsize(os.path.join(root, n))
    return files, size


# --- the measured paths -----------------------------------------------------------------------------------------


def run_convert(out_dir: str, logdir: str) -> tuple[float, float]:
    from tensortap.tensorboard.convert import convert

    t0, c0 = time.perf_counter(), time.process_time()
    r = convert(out_dir, logdir)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert r.ended and r.records > 0
    return dt, dc


def run_in_memory(logdir: str, steps: int, per_step: bool, data: list) -> tuple[float, float]:
    from tensortap.tensorboard.export import EventExporter

    colls = {"collections": {c: {"name": c, "tensor_names": sorted({n for s in data for cc, n, _ in s if cc == c}),
                                 "save_histogram": c != "losses"} for c in ("weights", "biases", "gradients",
                                                                             "losses")}}
    t0, c0 = time.perf_counter(), time.process_time()
    ex = None
    for step in range(steps):
        if ex is None:
            ex = EventExporter(logdir, "worker_0")
            ex.set_collections(colls)
        mode = mode_name(step)
        for _coll, name, value in data[step]:
            ex.add(name, step, mode, step, value, {})
        if per_step:
            ex.close()
            ex = None
    if ex is not None:
        ex.close()
    return time.perf_counter() - t0, time.process_time() - c0


def smdebug_child(tb_dir: str, steps: int) -> None:
    """Runs in smdebug's venv: its TensorBoard writes for the job, timed around the writes only."""
    import logging

    logging.disable(logging.INFO)
    from smdebug.core.modes import ModeKeys
    from smdebug.core.writer import FileWriter

    total = cpu = 0.0
    for step in range(steps):
        data = step_tensors(step)
        mode = ModeKeys.EVAL if mode_name(step) == "EVAL" else ModeKeys.TRAIN
        t0, c0 = time.perf_counter(), time.process_time()
        w = FileWriter(trial_dir=tb_dir, step=step, worker=f"{os.getpid()}_bench", write_checksum=True,
                       wtype="tensorboard", mode=mode)
        for coll, name, value in data:
            if coll == "losses":
                w.write_scalar_summary(name, float(value), step)
            else:
                w.write_histogram_summary(value, f"{coll}/{name}", step)
        w.close()
        total += time.perf_counter() - t0
        cpu += time.process_time() - c0
    print(json.dumps({"seconds": total, "cpu": cpu}))


def run_smdebug(python: str, tb_dir: str, steps: int) -> tuple[float, float]:
    r = subprocess.run([python, os.path.abspath(__file__), "--smdebug-child", tb_dir, "--steps", str(steps)],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"smdebug child failed: {r.stderr[-2000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["seconds"], d["cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smdebug-python", default=os.environ.get("SMDEBUG_PYTHON", DEFAULT_SMDEBUG_PYTHON))
    ap.add_argument("--smdebug-child", metavar="TB_DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smdebug_child:
        smdebug_child(args.smdebug_child, args.steps)
        return
    have_smdebug = os.path.exists(args.smdebug_python)
    if not have_smdebug:
        print(f"smdebug skipped: no {args.smdebug_python} (see the docstring to make that venv)")
    work = tempfile.mkdtemp(prefix="tt-tb-bench-")
    try:
        out = os.path.join(work, "job")
        t0 = time.perf_counter()
        write_job(out, args.steps)
        print(f"job: {args.steps} steps written in {time.perf_counter() - t0:.1f}s")
        data = [step_tensors(s) for s in range(args.steps)]
        times: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        stats: dict[str, tuple[int, int]] = {}
        for rnd in range(args.rounds):
            paths = ["tensortap convert", "appended", "file per step"] + (["smdebug 1.0.34"] if have_smdebug else [])
            if rnd % 2:
                paths.reverse()  # alternate the order between rounds
            for p in paths:
                logdir = os.path.join(work, f"tb-{rnd}-{p.replace(' ', '_')}")
                if p == "tensortap convert":
                    dt, dc = run_convert(out, logdir)
                elif p == "smdebug 1.0.34":
                    dt, dc = run_smdebug(args.smdebug_python, logdir, args.steps)
                else:
                    dt, dc = run_in_memory(logdir, args.steps, p == "file per step", data)
                times.setdefault(p, []).append(dt)
                cpus.setdefault(p, []).append(dc)
                stats[p] = _dir_stats(logdir)
                shutil.rmtree(logdir)
            print(f"round {rnd + 1}: " + ", ".join(f"{p} {times[p][-1]:.2f}s (CPU {cpus[p][-1]:.2f}s)"
                                                    for p in times), flush=True)
        base = statistics.median(times["tensortap convert"])
        cbase = statistics.median(cpus["tensortap convert"])
        print(f"\n| path ({args.steps} steps, {args.rounds} rounds) | median s | ratio | median CPU s | CPU ratio "
              "| files | MB |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for p, ts in times.items():
            med, cmed = statistics.median(ts), statistics.median(cpus[p])
            files, size = stats[p]
            print(f"| {p} | {med:.2f} | x{med / base:.1f} | {cmed:.2f} | x{cmed / cbase:.1f} | {files} | "
                  f"{size / 1e6:.1f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
