"""What the live TensorBoard export costs the writer, and what it leaves out when it cannot keep up.

Two measurements, for `bench/pytorch_overhead.py`'s MLP (64->256->256->10, batch 64; weights, biases, their
gradients and the loss: 12 histograms of 170 k floats in all per saving step):

- `exporter`: CPU time of one `EventExporter` per saving step, fed the MLP's tensors in memory, with every
  histogram (`histogram_budget=None`), with none (every step over the budget: scalars only), and, for scale,
  `numpy.histogram` of a float64 copy of each tensor with the same edges (what smdebug does per tensor);
- `job`: the MLP trained `--steps` steps saving every `--intervals` steps, the hook's default writer (the writer
  process) with and without `export_tensorboard=True`, each run in its own process: wall time and training-thread
  CPU per step (after the writer caught up), the writer process's CPU per step (its rusage after it ended, its
  start-up included), and from the event files the histograms written and the `tensortap/skipped_histograms`
  count (export: histograms within the budget, none while the writer is behind; docs/tensorboard.md).

Medians over `--rounds` alternating rounds. CPU times are steadier than wall times on a shared machine.

    .venv/bin/python bench/tensorboard_export.py [--rounds 3] [--steps 2000] [--intervals 1,10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def mlp_tensors() -> list[tuple[str, str, np.ndarray]]:
    """(name, collection, value) of the MLP's parameters and gradients after a few SGD steps."""
    sys.path.insert(0, HERE)
    import torch
    from pytorch_overhead import _build

    torch.manual_seed(0)
    model, opt, loss_fn, x, y = _build("mlp")
    for _ in range(5):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    out = []
    for name, p in model.named_parameters():
        coll = "weights" if name.endswith("weight") else "biases"
        out.append((name, coll, p.detach().numpy().copy()))
        out.append((f"gradient/{name}", "gradients", p.grad.numpy().copy()))
    return out


def exporter_cpu(tensors, budget, steps: int) -> float:
    """CPU seconds per step of one EventExporter fed `tensors` at every step (budget as EventExporter's)."""
    from tensortap.tensorboard.export import EventExporter

    with tempfile.TemporaryDirectory() as d:
        ex = EventExporter(d, "worker_0", histogram_budget=budget)
        ex.add(tensors[0][0], 0, "TRAIN", 0, tensors[0][2], {}, [tensors[0][1]])  # over a tiny budget from now on
        t0 = time.process_time()
        for s in range(1, steps + 1):
            for name, coll, v in tensors:
                ex.add(name, s, "TRAIN", s, v, {}, [coll])
            ex.add("loss", s, "TRAIN", s, np.float32(1.0 / s), {})
        ex.flush()
        cpu = time.process_time() - t0
        ex.close()
    return cpu / steps


def numpy_cpu(tensors, steps: int) -> float:
    from tensortap.tensorboard.histogram import default_edges

    edges = default_edges()
    t0 = time.process_time()
    for _ in range(steps):
        for _name, _coll, v in tensors:
            np.histogram(v.astype(np.float64), bins=edges)
    return (time.process_time() - t0) / steps


def job_child(interval: int, export: bool, steps: int) -> dict:
    sys.path.insert(0, HERE)
    from pytorch_overhead import _drain, _hooked_mlp

    out = tempfile.mkdtemp(prefix="tt_tbexport_")
    model, opt, loss_fn, x, y, hook = _hooked_mlp(interval, out, export_tensorboard=export)

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    train(20)
    _drain(hook)
    t0, c0 = time.perf_counter(), time.thread_time()
    train(steps)
    _drain(hook)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    hook.close()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    hists = skipped = 0
    if export:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        ea = EventAccumulator(os.path.join(out, "tensorboard", "worker_0", "global"),
                              size_guidance={"scalars": 0, "histograms": 0})
        ea.Reload()
        tags = ea.Tags()
        hists = sum(len(ea.Histograms(t)) for t in tags["histograms"])
        if "tensortap/skipped_histograms" in tags["scalars"]:
            skipped = int(max(e.value for e in ea.Scalars("tensortap/skipped_histograms")))
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_us": 1e6 * wall / steps, "train_cpu_us": 1e6 * cpu / steps,
            "writer_cpu_us": 1e6 * (ru.ru_utime + ru.ru_stime) / steps, "histograms": hists, "skipped": skipped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000, help="training steps per job run")
    ap.add_argument("--intervals", default="1,10")
    ap.add_argument("--skip-exporter", action="store_true", help="only the job measurement")
    ap.add_argument("--job-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job_child:
        interval, export, steps = args.job_child
        print(json.dumps(job_child(int(interval), export == "1", int(steps))))
        return

    if not args.skip_exporter:
        tensors = mlp_tensors()
        print(f"exporter: {len(tensors)} tensors, {sum(v.size for _, _, v in tensors):,} floats per saving step")
        res: dict[str, list[float]] = {"every histogram": [], "histograms skipped": [], "numpy.histogram (float64)": []}
        for _ in range(args.rounds):
            res["every histogram"].append(exporter_cpu(tensors, None, 200))
            res["histograms skipped"].append(exporter_cpu(tensors, 1e-9, 200))
            res["numpy.histogram (float64)"].append(numpy_cpu(tensors, 100))
        for k, v in res.items():
            print(f"  {k:28s} {1e3 * statistics.median(v):7.3f} ms CPU per saving step  "
                  f"(rounds: {', '.join(f'{1e3 * x:.3f}' for x in v)})")

    runs: dict[tuple[int, bool], list[dict]] = {}
    for _ in range(args.rounds):
        for interval in [int(i) for i in args.intervals.split(",")]:
            for export in (False, True):
                r = subprocess.run([sys.executable, __file__, "--job-child", str(interval), "1" if export else "0",
                                    str(args.steps)], capture_output=True, text=True, check=True)
                runs.setdefault((interval, export), []).append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"job: MLP, {args.steps} steps, medians of {args.rounds} rounds (per step: us)")
    print("  every  export  wall     train CPU  writer CPU  histograms written / skipped (of 12 per saving step)")
    for (interval, export), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"  {interval:5d}  {'yes' if export else 'no ':6s}  {med['wall_us']:7.1f}  {med['train_cpu_us']:9.1f}  "
              f"{med['writer_cpu_us']:10.1f}  " + (f"{med['histograms']:.0f} / {med['skipped']:.0f}" if export else ""))


if __name__ == "__main__":
    main()
