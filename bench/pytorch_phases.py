"""Where a PyTorch hook's overhead falls within a save interval: per step position and training phase.

The MLP of `pytorch_overhead.py` (64->256->256->10, batch 64, SGD, one thread) trains in alternating
blocks of whole save intervals with tensortap's hooks on and off (the same `_HookSwitch`). For each
position in the interval (0 = the saving step) it prints the median training-thread CPU time of
zero_grad, forward + loss, backward and the optimizer step, hooked minus plain.

    .venv/bin/python bench/pytorch_phases.py [--interval 10] [--pairs 40] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pytorch_overhead import _hooked_mlp, _HookSwitch  # noqa: E402

PHASES = ("zero_grad", "forward + loss", "backward", "optimizer step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=40, help="pairs of blocks (hooked, plain)")
    ap.add_argument("--cycles", type=int, default=10, help="save intervals per block")
    ap.add_argument("--dry-run", action="store_true", help="the hook does everything but hand off to a writer")
    args = ap.parse_args()

    out_dir = tempfile.mkdtemp(prefix="ttphases_")
    model, opt, loss_fn, x, y, hook = _hooked_mlp(args.interval, os.path.join(out_dir, "run"), dry_run=args.dry_run)
    switch = _HookSwitch([model, loss_fn])
    iv, clock = args.interval, time.thread_time

    def block(hooked: bool, cycles: int) -> list[list[list[float]]]:
        (switch.on if hooked else switch.off)()
        out = [[[] for _ in PHASES] for _ in range(iv)]
        for _ in range(cycles):
            for k in range(iv):
                t0 = clock()
                opt.zero_grad()
                t1 = clock()
                loss = loss_fn(model(x), y)
                t2 = clock()
                loss.backward()
                t3 = clock()
                opt.step()
                t4 = clock()
                for j, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    out[k][j].append(d)
        return out

    block(True, 3)
    block(False, 3)
    hooked = [[[] for _ in PHASES] for _ in range(iv)]
    plain = [[[] for _ in PHASES] for _ in range(iv)]
    for _ in range(args.pairs):
        for acc, blk in ((hooked, block(True, args.cycles)), (plain, block(False, args.cycles))):
            for k in range(iv):
                for j in range(len(PHASES)):
                    acc[k][j] += blk[k][j]
    switch.on()
    hook.close()
    shutil.rmtree(out_dir, ignore_errors=True)  # (a run writes ~150 MB)
    print(f"save interval {iv}{' (dry run)' if args.dry_run else ''}: hooked - plain, training-thread CPU, us")
    print("pos " + "".join(f"{p:>16s}" for p in PHASES) + "   plain step")
    total = 0.0
    for k in range(iv):
        deltas = [(statistics.median(hooked[k][j]) - statistics.median(plain[k][j])) * 1e6 for j in range(len(PHASES))]
        total += sum(deltas)
        step = sum(statistics.median(plain[k][j]) for j in range(len(PHASES))) * 1e6
        print(f"{k:3d} " + "".join(f"{d:+16.1f}" for d in deltas) + f"   {step:8.1f}")
    print(f"per save interval: {total:+.0f} us")


if __name__ == "__main__":
    main()
