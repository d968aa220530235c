"""What each non-PyTorch speed path of tensortap buys over its fallback, in the training thread's CPU time.

One process trains one model with one hook, in blocks of `--steps` steps; the blocks alternate, in a rotating
order, between the path on (`on`, `on2`) and its fallback (`off`), switched at run time in this process only
(the hook and the model stay the same). Per round: off/on (the path's gain) and on2/on (the A/A control: the
noise floor); the table gives the medians over rounds (the first round, a warm-up, is not counted) of the
training thread's CPU time (`time.thread_time`: other jobs on the machine, MXNet's and TensorFlow's own
threads and tensortap's writer process are not in it) and of the wall time, and the difference per saving
step in microseconds; and in how many rounds the fallback's block took longer than the path's (a sign test: a
path that buys nothing is slower in about half the rounds, as the A/A control is).

    .venv/bin/python bench/speed_paths.py --path ring        # the ring copy in training (PyTorch MLP)
    .venv/bin/python bench/speed_paths.py --path gather      # the ring copy alone (100 tensors)
    .venv-mxnet/bin/python bench/speed_paths.py --path mxnet  # MXNet's C-API staging (a Gluon MLP)

Paths and their fallbacks:
* ring, gather: `tensortap.transport.copy.gather_into` (one C call for all of a saving step's tensors) against
  one `ctypes.memmove` per tensor, as the writer process's reservations copy weights and gradients into the ring;
* mxnet: weights and gradients copied by one engine operation into a fixed host buffer through MXNet's C API
  (`_Stage`) against new `mx.nd` copies (`_copy_all`).
* keras (Keras's `IteratorStep`, removed: measured at commit 27349d2, where `--path keras` runs it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS", "MXNET_OMP_MAX_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402


def ring(interval: int, out: str):
    """A PyTorch MLP 64-256-256-10 (batch 64, SGD) saving weights, biases, gradients and losses through the writer
    process; `switch(on)` picks the ring copy."""
    import torch
    from torch import nn

    import tensortap.pytorch as tp
    from tensortap.transport import copy, process_writer

    if copy._c_gather is None:
        raise SystemExit("the C helper _streamcopy is not built (python setup.py build_ext --inplace)")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=interval), writer="process",
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)

    def switch(on: bool) -> None:
        process_writer._gather = copy._c_gather if on else copy._memmove_gather

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    return hook, switch, steps


def gather(interval: int, out: str):
    """The copy alone: a saving step's weights and gradients of a 4-layer transformer encoder (d_model 64: 100
    tensors, 420 KB) copied back to back into a buffer, `interval` times per step (no training, no hook);
    `switch(on)` picks the C gather (one call) or one ctypes.memmove per tensor."""
    import torch
    from torch import nn

    from tensortap.transport import copy

    if copy._c_gather is None:
        raise SystemExit("the C helper _streamcopy is not built (python setup.py build_ext --inplace)")
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    tensors = [t.detach() for p in model.parameters() for t in (p, torch.randn_like(p))]
    sources = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
    dst = np.empty(sum(n for _a, n in sources), dtype=np.uint8)
    state = {"fn": copy._c_gather}

    class NoHook:
        _writer = None

        def close(self) -> None:
            pass

    def switch(on: bool) -> None:
        state["fn"] = copy._c_gather if on else copy._memmove_gather

    def steps(n: int) -> None:
        fn, address = state["fn"], dst.ctypes.data
        for _ in range(n * interval):
            fn(address, sources)

    return NoHook(), switch, steps


def mxnet_loop(interval: int, out: str):
    """A Gluon MLP 64-256-256-10 (batch 64, SGD with momentum) saving weights, biases, gradients and losses;
    `switch(on)` lets the hook stage through MXNet's C API or copies with mx.nd."""
    import mxnet as mx
    from mxnet import autograd, gluon

    import tensortap.mxnet as tm
    from tensortap.mxnet import hook as mxhook

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    rs = np.random.RandomState(0)
    x = mx.nd.array(rs.randn(64, 64).astype(np.float32))
    y = mx.nd.array(rs.randint(0, 10, 64))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    hook = tm.Hook(out_dir=out, save_config=tm.SaveConfig(save_interval=interval),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    make = mxhook._Stage.make.__func__
    state = {"on": True}
    mxhook._Stage.make = classmethod(lambda cls, *a: make(cls, *a) if state["on"] else None)

    def switch(on: bool) -> None:
        state["on"] = on
        hook._mx_stages.clear()  # (made again, or not, at the next saving step)

    def steps(n: int) -> None:
        for _ in range(n):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(64)
        mx.nd.waitall()

    return hook, switch, steps


PATHS = {"ring": ring, "gather": gather, "mxnet": mxnet_loop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", choices=sorted(PATHS), required=True)
    ap.add_argument("--interval", type=int, default=5, help="save interval (steps)")
    ap.add_argument("--steps", type=int, default=100, help="steps per block")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix=f"ttbench_paths_{args.path}_", dir=os.environ.get("TTBENCH_OUT_ROOT"))
    try:
        run(args, os.path.join(tmp, "run"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # (every saving step's weights and gradients: gigabytes)


def run(args: argparse.Namespace, out: str) -> None:
    hook, switch, steps = PATHS[args.path](args.interval, out)

    def block(on: bool) -> tuple[float, float]:
        switch(on)
        t0, w0 = time.thread_time(), time.perf_counter()
        steps(args.steps)
        w = getattr(hook, "_writer", None)
        if w is not None:
            w.drain()  # (the writer caught up: what it costs the training thread is in the block)
        return time.thread_time() - t0, time.perf_counter() - w0

    orders = [("on", "off", "on2"), ("off", "on2", "on"), ("on2", "on", "off")]
    cpu: dict[str, list[float]] = {"gain": [], "aa": []}
    wall: dict[str, list[float]] = {"gain": [], "aa": []}
    diff_us: list[float] = []
    saves = args.steps / args.interval
    for r in range(args.rounds + 1):
        got = {name: block(name != "off") for name in orders[r % 3]}
        if r == 0:
            continue  # (warm-up: tracing, buffers made)
        cpu["gain"].append(got["off"][0] / got["on"][0])
        cpu["aa"].append(got["on2"][0] / got["on"][0])
        wall["gain"].append(got["off"][1] / got["on"][1])
        wall["aa"].append(got["on2"][1] / got["on"][1])
        diff_us.append((got["off"][0] - got["on"][0]) / saves * 1e6)
    hook.close()
    med = statistics.median
    print(f"path={args.path} interval={args.interval} steps/block={args.steps} rounds={args.rounds} "
          f"load={os.getloadavg()[0]:.1f}")
    print("clock        fallback/path (gain)   path/path (A/A)   A/A quartiles    rounds fallback slower than path")
    for name, d in (("thread CPU", cpu), ("wall", wall)):
        q = statistics.quantiles(d["aa"], n=4)
        slower = sum(g > 1 for g in d["gain"])
        slower_aa = sum(a > 1 for a in d["aa"])
        print(f"{name:<12} x{med(d['gain']):.3f}                 x{med(d['aa']):.3f}            "
              f"x{q[0]:.3f}-x{q[2]:.3f}    {slower}/{len(d['gain'])} (A/A: {slower_aa}/{len(d['aa'])})")
    print(f"fallback - path, thread CPU per saving step: {med(diff_us):+.1f} us (median)")


if __name__ == "__main__":
    main()
