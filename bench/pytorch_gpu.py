"""tensortap's PyTorch hook on a GPU: step-time ratio hooked / no hook for an MLP and a small transformer
encoder trained on CUDA, saving every 1, 10 and 100 steps, raw (weights, biases, gradients, loss: copied
asynchronously into pinned host memory, waited for at the step's end) or statistics only (l2, min, max, mean
computed on the GPU, one transfer per step); the flight recorder alone (statistics of every output, weight and
gradient at every step, nothing saved); the floor (statistics-only's values computed in the loop by hand with
`torch._foreach_norm` / `torch._foreach_max`, one transfer per saving step); and A/A (a second plain model in place
of the hooked one). Self-contained: run it anywhere with torch and tensortap; without
a GPU it runs on the CPU and says so.

Each configuration alternates blocks of `--steps` steps without and with the hook (the hook's hooks switched
off and on by `hook.register_module` on a fresh model would recompile nothing: the model is eager), a block
ends with `torch.cuda.synchronize()` and the hook's writer caught up (`hook.flush()`); the ratio is the median
over `--rounds` pairs.

    python bench/pytorch_gpu.py [--rounds 5] [--steps 50] [--models mlp,transformer] [--intervals 1,10,100]
                                [--kinds aa,raw,stats,flight,floor] [--read-loss]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(name: str, device):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
        x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))
    else:
        layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)

        class Encoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.enc = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
                self.head = nn.Linear(512, 10)

            def forward(self, x):
                return self.head(self.enc(x).mean(dim=1))

        model = Encoder()
        x, y = torch.randn(32, 128, 512), torch.randint(0, 10, (32,))
    model = model.to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), nn.CrossEntropyLoss(), x.to(device), y.to(device)


def measure(name: str, interval: int, kind: str, device, rounds: int, steps: int, root: str,
            read_loss: bool = False) -> tuple[float, float]:
    """(median ratio hooked / plain, median plain ms per step)."""
    import torch

    import tensortap.pytorch as tp

    def floor(model) -> list[float]:
        """The statistics tensortap saves (l2, max, min, mean of every weight and gradient), computed in the loop:
        batched where torch can, brought to the host in one transfer."""
        ts = [p.detach() for p in model.parameters()] + [p.grad for p in model.parameters()]
        return torch.stack([*torch._foreach_norm(ts), *torch._foreach_max(ts),
                            *[t.min() for t in ts], *[t.mean() for t in ts]]).tolist()

    def run(model, opt, loss_fn, x, y, n: int, hook=None, every: int = 0) -> float:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for i in range(n):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if read_loss:
                loss.item()  # (the loop's own wait for the GPU, as a progress bar's)
            if every and i % every == 0:
                floor(model)
            opt.step()
        sync()
        if hook is not None:
            hook.flush()
        return time.perf_counter() - t0

    plain = build(name, device)
    hooked = build(name, device)
    hook = None
    out = tempfile.mkdtemp(dir=root)
    every = interval if kind == "floor" else 0
    if kind not in ("aa", "floor"):  # (A/A: the second model trained with no hook; floor: statistics by hand)
        rc = None
        if kind == "stats":
            rc = tp.ReductionConfig(norms=["l2"], reductions=["max", "min", "mean"], save_raw_tensor=False)
        flight = kind == "flight"
        hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=10 ** 9 if flight else interval),
                       reduction_config=rc, flight_recorder=True if flight else None,
                       include_collections=[] if flight else ["weights", "biases", "gradients", "losses"])
        hook.register_module(hooked[0])
        hook.register_loss(hooked[2])
        hook.register_optimizer(hooked[1])
    run(*plain, 5)
    run(*hooked, 5, hook, every)
    ratios, base = [], []
    for _ in range(rounds):
        a = run(*plain, steps)
        b = run(*hooked, steps, hook, every)
        ratios.append(b / a)
        base.append(a / steps * 1e3)
    if hook is not None:
        hook.close()
        assert hook.error_count == 0, hook.first_error
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(ratios), statistics.median(base)


KINDS = ("aa", "raw", "stats", "flight", "floor")
MODELS = ("mlp", "transformer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--intervals", default="1,10,100")
    ap.add_argument("--kinds", default="aa,raw,stats,flight")
    ap.add_argument("--read-loss", action="store_true",
                    help="the loop reads the loss every step (loss.item(): it waits for the GPU, as most loops do)")
    args = ap.parse_args()
    for opt, given, allowed in (("--kinds", args.kinds, KINDS), ("--models", args.models, MODELS)):
        bad = sorted(set(given.split(",")) - set(allowed))
        if bad:
            ap.error(f"{opt} {','.join(bad)}: allowed are {', '.join(allowed)}")
    try:
        intervals = [int(i) for i in args.intervals.split(",")]
    except ValueError:
        intervals = [0]
    if min(intervals) < 1:
        ap.error(f"--intervals {args.intervals}: whole numbers of steps, 1 or more, separated by commas")
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    what = torch.cuda.get_device_name() if device.type == "cuda" else "no GPU: the CPU"
    loop = ", the loop reads the loss every step" if args.read_loss else ""
    print(f"torch {torch.__version__}, {what}; {args.rounds} pairs of {args.steps}-step blocks{loop}\n")
    print("| model | plain ms/step | saved | every | hooked / plain |")
    print("|---|---|---|---|---|")
    root = tempfile.mkdtemp(prefix="tt-gpu-")
    try:
        for name in args.models.split(","):
            for kind in args.kinds.split(","):
                once = kind in ("aa", "flight")  # (every step whatever the interval)
                for interval in (1,) if once else intervals:
                    r, ms = measure(name, interval, kind, device, args.rounds, args.steps, root, args.read_loss)
                    print(f"| {name} | {ms:.2f} | {kind} | {interval} | ×{r:.3f} |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
