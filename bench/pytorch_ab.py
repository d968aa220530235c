"""A/B of two variants of the hook in one process: blocks of steps plain, hooked with variant A and
hooked with variant B, in rotating order, so that both variants see the same machine state (on a noisy VM
the step time drifts by ±20% between runs, far more than the effects measured). Prints the median
training-thread CPU added per save interval by each variant and the median per-round difference B - A.

Variants are named in VARIANTS below: each is a function (hook, model, on: bool) that switches the variant on
(B) or off (A) while the hook stays registered. Used to decide whether a change that is too small for
bench/pytorch_overhead.py to resolve is worth keeping.

    .venv/bin/python bench/pytorch_ab.py aa --interval 100 --cycles 1 --rounds 20 [--no-optimizer]
    .venv/bin/python bench/pytorch_ab.py prompt_marks --interval 1 --rounds 30
    .venv/bin/python bench/pytorch_ab.py stream_copy --interval 1 --rounds 30
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


def _prompt_marks(hook, model, on: bool) -> None:
    """B: a step that saved is readable by the time the next one ends (an index block at its mark, the next
    mark waits for it; issue #35); A: at the writer's flush interval."""
    (hook._writer if hook._writer is not None else hook._get_writer()).prompt_marks = on


def _stream_copy(hook, model, on: bool) -> None:
    """B: the writer process's ring filled with non-temporal stores (`copy.gather_stream_into`); A: by memcpy
    (`copy.gather_into`)."""
    from tensortap.transport import copy, process_writer

    process_writer._gather = copy.gather_stream_into if on else copy.gather_into


def _aa(hook, model, on: bool) -> None:
    """The A/A control: A and B are the same hook."""


VARIANTS = {"prompt_marks": _prompt_marks, "stream_copy": _stream_copy, "aa": _aa}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--cycles", type=int, default=10, help="save intervals per block")
    ap.add_argument("--no-optimizer", action="store_true",
                    help="update the weights by hand (a loop with no optimizer: steps are the root's forwards)")
    args = ap.parse_args()

    out_root = tempfile.mkdtemp(prefix="ttab_")
    model, opt, loss_fn, x, y, hook = _hooked_mlp(args.interval, os.path.join(out_root, "run"))
    switch = VARIANTS[args.variant]
    import torch

    params = list(model.parameters())
    n = args.interval * args.cycles

    def block(kind: str) -> float:
        if kind == "plain":
            hooks = _HookSwitch([model, loss_fn])
            hooks.off()
        else:
            switch(hook, model, kind == "B")
        c0 = time.thread_time()
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            if args.no_optimizer:
                with torch.no_grad():
                    torch._foreach_add_(params, [p.grad for p in params], alpha=-0.01)
            else:
                opt.step()
        hook._writer.drain() if kind != "plain" and hasattr(hook._writer, "drain") else None
        spent = time.thread_time() - c0
        if kind == "plain":
            hooks.on()
        return spent / args.cycles * 1e6

    for kind in ("A", "B", "plain"):
        block(kind)
    added = {"A": [], "B": []}
    orders = [("plain", "A", "B"), ("B", "plain", "A"), ("A", "B", "plain"), ("plain", "B", "A"),
              ("A", "plain", "B"), ("B", "A", "plain")]
    for r in range(args.rounds):
        got = {k: block(k) for k in orders[r % len(orders)]}
        for k in added:
            added[k].append(got[k] - got["plain"])
    hook.close()
    shutil.rmtree(out_root, ignore_errors=True)
    a, b = statistics.median(added["A"]), statistics.median(added["B"])
    diff = sorted(y - x for x, y in zip(added["A"], added["B"], strict=True))
    q = len(diff) // 4
    loop = " (no optimizer)" if args.no_optimizer else ""
    print(f"{args.variant}{loop}, every {args.interval}, {args.rounds} rounds: training-thread CPU added per save "
          f"interval: A {a:+.0f} us, B {b:+.0f} us; B - A per round: median {statistics.median(diff):+.0f} us "
          f"(quartiles {diff[q]:+.0f} .. {diff[-q - 1]:+.0f})")


if __name__ == "__main__":
    main()
