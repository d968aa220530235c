"""The writer process's own CPU per saving step (docs/transport.md), without a framework.

A training loop stand-in hands the real `ProcessChunkWriter` what the Lightning job of `bench/trainers_overhead.py`
hands it at `save_config=10` with weights, gradients and losses: per saving step one batch of 9 float32 tensors
(678 KB, reserved in the ring and copied in) and the loss (one float64), and a step mark at every step; one step
every `--step-ms` (1.5 ms: the Lightning job's plain step), sleeping between them. The figure is the writer
process's CPU time (all its threads, from /proc/<pid>/task/*/schedstat: nanoseconds, user and system) from the
`--warmup`th saving step to the last, divided by the saving steps between: it does not depend on the machine's
load (beyond caches shared with other jobs). `--profile FILE` runs the child's loop under cProfile and writes its
statistics to FILE.

    .venv/bin/python bench/writer_process.py --saving-steps 300 --repeats 5
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensortap.transport import ring as R  # noqa: E402
from tensortap.transport.process_writer import ProcessChunkWriter  # noqa: E402

NAMES = ("MLP_net.0.weight", "MLP_net.2.weight", "MLP_net.4.weight", "gradient/MLP_net.0.weight",
         "gradient/MLP_net.0.bias", "gradient/MLP_net.2.weight", "gradient/MLP_net.2.bias",
         "gradient/MLP_net.4.weight", "gradient/MLP_net.4.bias")
SHAPES = ((256, 64), (256, 256), (10, 256), (256, 64), (256,), (256, 256), (256,), (10, 256), (10,))
F4, F8 = np.dtype("<f4"), np.dtype("<f8")


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of process `pid` (ns)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def run_once(saving_steps: int, interval: int, step_s: float, warmup: int) -> float:
    """The writer process's CPU per saving step (us) over one job."""
    out = tempfile.mkdtemp(prefix="tt-bench-writer-")
    try:
        w = ProcessChunkWriter(out, "worker_0")
        pid = w._proc.pid
        rng = np.random.default_rng(0)
        tensors = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
        sources = [(t.ctypes.data, t.nbytes) for t in tensors]
        layout = w.batch_layout(NAMES, F4, SHAPES)
        loss_layout = w.batch_layout(("loss",), F8, ((),))
        loss = np.zeros(1, dtype=F8)
        t0 = None
        next_at = time.perf_counter()
        for step in range(saving_steps * interval):
            if step % interval == 0:
                k = step // interval
                if k == warmup:
                    w.drain()  # (the child has started and handled the warm-up's saving steps)
                    t0 = cpu_ns(pid)
                res = w.reserve_batch(NAMES, F4, SHAPES, step, 1, step, layout)
                if res:
                    res.copy_in(sources)
                    res.commit()
                loss[0] = 1.0 / (step + 1)
                res = w.reserve_batch(("loss",), F8, ((),), step, 1, step, loss_layout)
                if res:
                    res.copy_in([(loss.ctypes.data, 8)])
                    res.commit()
            w.mark_steps(step, step, -1, -1, -1)
            next_at += step_s
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        w.drain()
        t1 = cpu_ns(pid)
        w.close()
        if w.dropped_records:
            raise SystemExit(f"the writer dropped {w.dropped_records} records")
        return (t1 - t0) / (saving_steps - warmup) / 1e3
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--saving-steps", type=int, default=300)
    ap.add_argument("--interval", type=int, default=10, help="steps per saving step")
    ap.add_argument("--step-ms", type=float, default=1.5)
    ap.add_argument("--warmup", type=int, default=5, help="saving steps before the count starts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", help="write the child loop's cProfile statistics to this file (last repeat)")
    args = ap.parse_args()
    if args.profile:
        R.CHILD_BOOT = R.CHILD_BOOT.replace("_child_main()\n", (
            "import cProfile, tensortap.transport.writer_process as W\n"
            "_run = W.RingReader.run\n"
            "def run(self):\n"
            "    pr = cProfile.Profile(); pr.enable()\n"
            "    try: _run(self)\n"
            f"    finally: pr.disable(); pr.dump_stats({args.profile!r})\n"
            "W.RingReader.run = run\n"
            "_child_main()\n"))
    figures = [run_once(args.saving_steps, args.interval, args.step_ms / 1e3, args.warmup)
               for _ in range(args.repeats)]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.repeats} jobs of {args.saving_steps} saving steps "
          f"(678 KB each, one every {args.interval} steps of {args.step_ms} ms)")
    print(f"writer process CPU per saving step: median {statistics.median(figures):.0f} us "
          f"(min {min(figures):.0f}, max {max(figures):.0f})")


if __name__ == "__main__":
    main()
