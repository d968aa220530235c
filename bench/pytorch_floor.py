"""The floor under the PyTorch hook's overhead: what saving weights, gradients and the loss every N steps costs
the MLP benchmark with the same torch hooks and the same copies as tensortap (one C gather call), but almost no Python
and no writer (no step bookkeeping, no checks, no ring protocol, no disk: the bytes go to a prefaulted
shared-memory buffer and stay there).

It answers "how far can the hook's own work still shrink?": the difference between tensortap and this floor
is what a leaner steady-state saving cycle (in Python or C) could win; what the floor itself costs (torch's
hook dispatch, the cold caches of a saving step, two 340 KB copies) stays with any design that uses torch's
hooks. The method is bench/pytorch_overhead.py's (one model, alternating 100-step blocks with the hooks on
and off, the median over pairs of hooked/plain step time); `tensortap` runs the real hook the same way, so
alternate the two:

    .venv/bin/python bench/pytorch_floor.py --interval 10 --runs 3
    .venv/bin/python bench/pytorch_floor.py --interval 100 --pairs 90 --runs 3
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _floor_hooks(model, loss_fn, interval: int) -> None:
    """Attach the floor's hooks: every `interval`-th forward copies the weights, then the loss and (at the end
    of the backward pass) the gradients, into one rotating 1 MB slot of a shared-memory buffer."""
    import numpy as np
    import torch
    from tensortap.transport._streamcopy import gather

    slots = 60
    shm = mmap.mmap(-1, slots << 20)
    buf = np.frombuffer(shm, dtype=np.uint8)
    buf[:] = 1  # prefaulted, as tensortap's ring is
    base = buf.ctypes.data
    params = list(model.parameters())
    weight_bytes = sum(p.nbytes for p in params)
    engine = torch.autograd.Variable._execution_engine
    root_hooks, loss_hooks = model._forward_hooks, loss_fn._forward_hooks
    state = {"at": 0, "memory": (shm, buf)}  # (kept alive with the hooks: the copies write to its address)

    def collect() -> None:
        gather(base + state["at"] + weight_bytes, [(p.grad.data_ptr(), p.grad.nbytes) for p in params])
        root_hooks.pop(1, None)
        loss_hooks.pop(2, None)

    def output_grad_hook(grad) -> None:
        engine.queue_callback(collect)

    def root_forward_hook(module, args, out) -> None:
        out._backward_hooks = OrderedDict(((3, output_grad_hook),))
        out.grad_fn._register_hook_dict(out)

    def loss_forward_hook(module, args, loss) -> None:
        gather(base + state["at"] + 2 * weight_bytes, [(loss.data_ptr(), loss.nbytes)])

    def saving_step() -> None:
        state["at"] = (state["at"] + (1 << 20)) % (slots << 20)
        gather(base + state["at"], [(p.data_ptr(), p.nbytes) for p in params])
        root_hooks[1] = root_forward_hook
        loss_hooks[2] = loss_forward_hook

    def step_start(module, args) -> None:  # each forward of the root is a step; every interval-th one saves
        state["left"] -= 1
        if state["left"] < 0:
            state["left"] = interval - 1
            saving_step()

    state["left"] = 0
    model.register_forward_pre_hook(step_start)


def child(kind: str, interval: int, pairs: int) -> float:
    import torch
    from pytorch_overhead import _build, _drain, _HookSwitch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, opt, loss_fn, x, y = _build("mlp")
    hook, out_root = None, None
    if kind == "floor":
        _floor_hooks(model, loss_fn, interval)
    else:
        import tensortap.pytorch as tp

        out_root = tempfile.mkdtemp(prefix="ttfloor_", dir=os.environ.get("TTBENCH_OUT_ROOT"))
        hook = tp.Hook(out_dir=os.path.join(out_root, "run"), save_config=tp.SaveConfig(save_interval=interval),
                       include_collections=["weights", "biases", "gradients", "losses"])
        hook.register_module(model)
        hook.register_loss(loss_fn)
    switch = _HookSwitch([model, loss_fn])

    def run(hooked: bool, n: int = 100) -> float:
        switch.on() if hooked else switch.off()
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        if hooked and hook is not None:
            _drain(hook)
        return (time.perf_counter() - t0) / n

    run(True)
    run(False)
    ratios = []
    for i in range(pairs):
        if i % 2:
            h, p = run(True), run(False)
        else:
            p, h = run(False), run(True)
        ratios.append(h / p)
    switch.on()
    if hook is not None:
        hook.close()
        shutil.rmtree(out_root, ignore_errors=True)
    return statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3, help="alternated child processes of each kind")
    ap.add_argument("--child", choices=("floor", "tensortap"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    for opt in ("interval", "pairs", "runs"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt} {getattr(args, opt)}: must be at least 1")
    if args.child:
        print(child(args.child, args.interval, args.pairs))
        return
    got: dict[str, list[float]] = {"floor": [], "tensortap": []}
    for _ in range(args.runs):
        for kind in got:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, "--interval",
                                  str(args.interval), "--pairs", str(args.pairs)], capture_output=True, text=True,
                                 check=True, env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
                                     os.path.abspath(__file__)))))
            got[kind].append(float(out.stdout.split()[-1]))
            print(f"{kind:9s} every {args.interval}: x{got[kind][-1]:.4f}", flush=True)
    for kind, ratios in got.items():
        print(f"{kind:9s} median of {len(ratios)} runs: x{statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
