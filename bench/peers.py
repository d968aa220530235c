"""What watching a PyTorch job costs with tensortap and with its peers, side by side (issue #43).

Workloads: `bench/pytorch_overhead.py`'s MLP and 4-layer transformer encoder, one CPU thread, SGD. Each
measurement is a block of `--steps` training steps; the blocks of every configuration alternate within a round,
each round starts with a plain block and ends with a second one (the A/A control, `none-again`), and the
driver prints the median over rounds of (block time / the round's plain block time). Configurations:

* `none`: no hook;
* `tensortap-raw`: tensortap saving weights, biases, gradients and the loss, raw;
* `tensortap-stats`: tensortap saving only their statistics (`ReductionConfig(norms=["l2"],
  reductions=["max", "min", "mean"])`, no raw values: computed where the tensors live);
* `foreach-floor`: the same norms and extrema computed in the loop by hand, batched (`torch._foreach_norm`,
  `torch._foreach_max`) and brought to the host once per step: the floor any statistics logger can reach;
* `tensorboard`: `torch.utils.tensorboard.SummaryWriter` histograms of every weight and gradient plus their
  L2 norms as scalars (what people log by hand);
* `wandb`: `wandb.watch(model, log="all", log_freq=interval)` in an offline run (histograms of every weight and
  gradient), with the loss logged by `wandb.log` at each saving step (which commits what `watch` gathered).

Hooks and runs are built and closed outside the timed blocks; a block is charged until tensortap's writer has
caught up (`hook.flush()`). wandb's own service process writes its offline run meanwhile, as it would.

`--clock cpu` charges each block the training thread's CPU time (`time.thread_time`) instead of wall time: on a
loaded machine it shows what each configuration costs the training thread itself, without the time the thread
waits to be scheduled (nor the time it waits for tensortap's writer).

    .venv/bin/python bench/peers.py [--models mlp,transformer] [--intervals 1,10] [--rounds 7] [--steps 100]
                                    [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WRITER = os.environ.get("TTBENCH_WRITER", "auto")  # tensortap's writer (--writer)
CLOCK = time.perf_counter  # what a block is charged (--clock)
CONFIGS = ("none", "tensortap-raw", "tensortap-stats", "foreach-floor", "tensorboard", "wandb")


def _model(name: str):
    from pytorch_overhead import _build

    return _build(name)


class _Runner:
    """One configuration over one model: `block(n)` trains n steps and returns the seconds they took."""

    def __init__(self, config: str, model_name: str, interval: int, root: str):
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.config, self.interval = config, interval
        self.model, self.opt, self.loss_fn, self.x, self.y = _model(model_name)
        self.dir = tempfile.mkdtemp(dir=root)
        self.hook = self.tb = self.wb = None
        self.step = 0
        if config.startswith("tensortap"):
            import tensortap.pytorch as tp

            rc = None
            if config == "tensortap-stats":
                rc = tp.ReductionConfig(norms=["l2"], reductions=["max", "min", "mean"], save_raw_tensor=False)
            self.hook = tp.Hook(out_dir=self.dir, save_config=tp.SaveConfig(save_interval=interval), writer=WRITER,
                                include_collections=["weights", "biases", "gradients", "losses"],
                                reduction_config=rc)
            self.hook.register_module(self.model)
            self.hook.register_loss(self.loss_fn)
            self.hook.register_optimizer(self.opt)
        elif config == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(self.dir)
        elif config == "wandb":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wb = wandb.init(mode="offline", dir=self.dir, project="tensortap-peers")  # (watch logs to wandb.run)
            wandb.watch(self.model, log="all", log_freq=interval)
        self.params = [(n, p) for n, p in self.model.named_parameters()]

    def _log_floor(self) -> None:
        torch = self.torch
        ws = [p.detach() for _n, p in self.params]
        gs = [p.grad for _n, p in self.params]
        ts = ws + gs
        stats = torch.stack([*torch._foreach_norm(ts), *torch._foreach_max(ts),
                             *[t.min() for t in ts], *[t.mean() for t in ts]])
        self._floor = stats.tolist()

    def _log_tb(self) -> None:
        for n, p in self.params:
            self.tb.add_histogram(f"weights/{n}", p.detach(), self.step)
            self.tb.add_histogram(f"gradients/{n}", p.grad, self.step)
            self.tb.add_scalar(f"norms/{n}", p.grad.norm().item(), self.step)

    def block(self, n: int) -> float:
        model, opt, loss_fn, x, y = self.model, self.opt, self.loss_fn, self.x, self.y
        t0 = CLOCK()
        for _ in range(n):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if self.step % self.interval == 0:
                if self.config == "foreach-floor":
                    self._log_floor()
                elif self.config == "tensorboard":
                    self._log_tb()
                elif self.wb is not None:
                    self.wb.log({"loss": loss.item()}, step=self.step)
            opt.step()
            self.step += 1
        if self.hook is not None:
            self.hook.flush()
        elif self.tb is not None:
            self.tb.flush()
        return CLOCK() - t0

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--intervals", default="1,10")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--writer", default="auto", help="tensortap's writer: auto (the default), thread or process")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="charge blocks wall time (default) or the training thread's CPU time")
    args = ap.parse_args()
    global WRITER, CLOCK
    WRITER = args.writer
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    import torch

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="tt-peers-")
    configs = [c for c in args.configs.split(",") if c != "none"]
    if "wandb" in configs:
        try:
            import wandb  # noqa: F401
        except ImportError:
            configs.remove("wandb")
            print("(wandb is not installed: `pip install -r requirements/test.txt`; its column is left out)")
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.steps}-step blocks, 1 thread, "
          f"tensortap writer {args.writer}, {args.clock} clock\n")
    print("| model | every | " + " | ".join(configs) + " | A/A (none again) |")
    print("|---|---|" + "---|" * (len(configs) + 1))
    try:
        for model_name in args.models.split(","):
            for interval in (int(i) for i in args.intervals.split(",")):
                runners = {c: _Runner(c, model_name, interval, root) for c in ["none", *configs, "none-again"]}
                for r in runners.values():
                    r.block(args.warmup)
                ratios: dict[str, list[float]] = {c: [] for c in runners if c != "none"}
                for _round in range(args.rounds):
                    base = runners["none"].block(args.steps)
                    for c in [*configs, "none-again"]:
                        ratios[c].append(runners[c].block(args.steps) / base)
                for r in runners.values():
                    r.close()
                cells = [f"×{statistics.median(ratios[c]):.3f}" for c in [*configs, "none-again"]]
                print(f"| {model_name} | {interval} | " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
