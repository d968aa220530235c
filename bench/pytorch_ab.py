"""A/B of two variants of the hook in one process: blocks of steps plain, hooked with variant A and
hooked with variant B, in rotating order, so that both variants see the same machine state (on a noisy VM
the step time drifts by ±20% between runs, far more than the effects measured). Prints the median
training-thread CPU added per save interval by each variant and the median per-round difference B - A.

Variants are named in VARIANTS below: each is a function (hook, model, on: bool) that switches the variant on
(B) or off (A) while the hook stays registered. Used to decide whether a change that is too small for
bench/pytorch_overhead.py to resolve is worth keeping.

    .venv/bin/python bench/pytorch_ab.py counter --interval 100 --cycles 1 --rounds 20 [--no-optimizer]
    .venv/bin/python bench/pytorch_ab.py root_calls --rounds 80
    .venv/bin/python bench/pytorch_ab.py prompt_marks --interval 1 --rounds 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pytorch_overhead import _hooked_mlp, _HookSwitch  # noqa: E402


def _prompt_marks(hook, model, on: bool) -> None:
    """B: a step that saved is readable by the time the next one ends (an index block at its mark, the next
    mark waits for it; issue #35); A: at the writer's flush interval."""
    (hook._writer if hook._writer is not None else hook._get_writer()).prompt_marks = on


def _counter(hook, model, on: bool) -> None:
    """B: the root's calls counted by the counting dict (`_step_counter`: no module hook); A: the plain fallback,
    a forward pre-hook on the root (quiet steps counted in Python, `StepEngine.count_quiet`)."""
    from tensortap.pytorch import _step_counter as sc

    root = hook._roots[0]
    if (root.counter is not None) == on:
        return
    hook.engine.disarm()
    if on:
        for h in root.handles:
            h.remove()
        root.handles.clear()
        root.counter = sc.install(model, _counter.tick)
        hook.clock.tally = root.counter
    else:
        _counter.tick = root.counter.tick
        sc.uninstall(model, root.counter)
        hook.clock.sync()
        root.counter = None
        hook.clock.tally = None
        root.handles.append(model.register_forward_pre_hook(_counter.tick.func))


def _aa(hook, model, on: bool) -> None:
    """The A/A control: A and B are the same hook."""


VARIANTS = {"counter": _counter, "prompt_marks": _prompt_marks, "aa": _aa}


def _root_calls(rounds: int) -> None:
    """The root's forward alone (no backward, no hook work): torch's plain call, the counting dict whose truth test
    calls a trivial tick (or, armed, only counts), and the plain fallback, a forward pre-hook; per forward, the
    median over rounds of each minus the plain call, and the pre-hook minus the counter per round."""
    import torch
    from pytorch_overhead import _build

    from tensortap.pytorch import _step_counter as sc

    torch.set_num_threads(1)
    model, _opt, _loss, x, _y = _build("mlp")
    calls = [0]

    def tick() -> None:
        calls[0] += 1

    def pre(m, a) -> None:
        calls[0] += 1

    def set_path(path: str) -> None:
        model._forward_pre_hooks.clear()
        model._backward_hooks = OrderedDict()
        if path in ("counter", "counter armed"):
            d = model._backward_hooks = sc.CountingHooks()
            d.tick = tick
            if path == "counter armed":
                d.left, d.deadline = 1 << 40, float("inf")
        elif path == "pre-hook":
            model.register_forward_pre_hook(pre)

    paths = ["plain", "counter", "counter armed", "pre-hook"]
    over: dict[str, list[float]] = {p: [] for p in paths}
    with torch.no_grad():
        for r in range(rounds):
            got = {}
            for p in paths[r % len(paths):] + paths[:r % len(paths)]:
                set_path(p)
                c0 = time.thread_time_ns()
                for _ in range(200):
                    model(x)
                got[p] = (time.thread_time_ns() - c0) / 200 / 1e3
            for p in paths:
                over[p].append(got[p] - got["plain"])
    for p in paths[1:]:
        v = sorted(over[p])
        q = len(v) // 4
        print(f"{p}: {statistics.median(v):+.2f} us per forward over the plain call (quartiles {v[q]:+.2f} .. "
              f"{v[-q - 1]:+.2f})")
    d = sorted(a - b for a, b in zip(over["pre-hook"], over["counter"], strict=True))
    q = len(d) // 4
    print(f"pre-hook - counter: {statistics.median(d):+.2f} us per forward (quartiles {d[q]:+.2f} .. {d[-q - 1]:+.2f}),"
          f" slower in {sum(1 for v in d if v > 0)}/{len(d)} rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", choices=sorted([*VARIANTS, "root_calls"]))
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--cycles", type=int, default=10, help="save intervals per block")
    ap.add_argument("--no-optimizer", action="store_true",
                    help="update the weights by hand (a loop with no optimizer: steps are the root's forwards)")
    args = ap.parse_args()
    if args.variant == "root_calls":
        _root_calls(args.rounds)
        return

    out_root = tempfile.mkdtemp(prefix="ttab_")
    model, opt, loss_fn, x, y, hook = _hooked_mlp(args.interval, os.path.join(out_root, "run"))
    switch = VARIANTS[args.variant]
    import torch

    params = list(model.parameters())
    n = args.interval * args.cycles

    def block(kind: str) -> float:
        if kind == "plain":
            hooks = _HookSwitch([model, loss_fn], optimizer_hooks=True)
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
