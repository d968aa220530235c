"""What the trainer callbacks cost a Lightning and a Hugging Face Trainer job (docs/trainers.md).

Each round trains the same small job, in this process, without a tensortap callback, with
`TensortapCallback(save_config=10, include_collections=["weights", "gradients", "losses"])`, and once more without
(the A/A control), with `--floor` with a callback that does nothing (what the trainer's calling one costs), and
with `--no-writer` with the callback in `dry_run` (everything but the writer: what is left is the writer's share);
which arm goes first rotates from round to round. Training time is taken from step WARMUP (20) to the trainer's
train-end callback: the steady cost per step, without the writer's start at the first saving step (a fixed cost,
`bench/fixed_cost.py`), which the whole `fit`/`train` column includes. Two clocks: the training thread's own CPU
time (`time.thread_time()`: both trainers run their loop on the calling thread; the writer process's work is not
counted, but on a shared machine it competes for the same cores), and the wall clock. A round's ratio is
arm / plain; the table gives the medians over rounds and their spread.

Separate fits differ by several per cent even on the CPU clock (the load of a shared machine drifts between them),
which is as much as the target allows. `--blocks B` (Lightning) therefore also measures inside one fit: its steps
run in blocks of B, each block with the callback in the trainer's callback list (and its optimizer hook on) or
without it, in the rotating order callback / plain / plain again (the A/A control); each block is charged the
training thread's CPU time per step, a ratio is a block's to the plain block beside it, medians over all blocks of
`--rounds` fits of `--steps` steps (the first three blocks left out). Blocks start 5 steps after a saving step, so
each callback block holds B/10 saving steps and the steps after them; the writer process runs through the whole
fit (in the plain blocks it idles, or finishes the previous block's last saving step). With `--shown` a fourth arm
runs the same callback with none of its hooks hidden from Lightning (docs/internals.md): what hiding them buys.

`--per-step` (Lightning's whole fits) also prints where in a fit each arm's CPU goes: the training thread's CPU of
each step, its median over rounds at each step index, averaged over classes of steps (the first 20, the next 20,
saving steps, the step after one, the others), over the plain arm's.

    .venv/bin/python bench/trainers_overhead.py --rounds 30 --steps 220
    .venv/bin/python bench/trainers_overhead.py --trainers lightning --rounds 60 --steps 220 --no-writer --per-step
    .venv/bin/python bench/trainers_overhead.py --trainers lightning --blocks 100 --rounds 4 --steps 3020
    .venv/bin/python bench/trainers_overhead.py --trainers lightning --blocks 100 --rounds 8 --steps 4020 --shown
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)

def _clocks() -> tuple[float, float]:
    """(the training thread's CPU time, wall clock): both trainers run their loop on the calling thread (the writer
    process's work is not the training thread's; the writer thread's, where one is used, is not either)."""
    return time.thread_time(), time.perf_counter()


def _process_cpu(pid: int) -> float:
    """CPU time (s) of every thread of process `pid` so far (its scheduler statistics: user and system)."""
    from writer_process import cpu_ns  # bench/ is the script's directory

    return cpu_ns(pid) / 1e9


def _figures(timer: object, start: tuple[float, float]) -> dict[str, float]:
    end = _clocks()
    return {"train_cpu": timer.t1[0] - timer.t0[0], "train_wall": timer.t1[1] - timer.t0[1],
            "whole_cpu": end[0] - start[0], "whole_wall": end[1] - start[1]}


#: training time is taken from this step on: the writer's start at the first saving step (a fixed cost of a hook,
#: bench/fixed_cost.py) stays out of the per-step figure, which the whole fit/train column keeps
WARMUP = 20


def _fit_mlp(steps: int, callbacks: list) -> tuple[float, float]:
    """Fit the Lightning MLP (64->256->256->10, batch 64, SGD, seeded data) for `steps` steps on the CPU with
    `callbacks`, no logger, checkpoint or progress bar; the clocks (`_clocks()`) as the fit began."""
    import lightning as L

    class MLP(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 10))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    x, y = torch.randn(64 * 50, 64), torch.randint(0, 10, (64 * 50,))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1)
    start = _clocks()
    trainer.fit(MLP(), data)
    return start


def lightning_job(steps: int, callback: object | None) -> dict[str, float]:
    import lightning as L

    class Timer(L.Callback):
        def __init__(self):
            self.marks: list[float] = []  # the training thread's CPU time at each batch's start, then at the end

        def on_train_batch_start(self, trainer, *a):
            self.marks.append(time.thread_time())
            if trainer.global_step == WARMUP and not hasattr(self, "t0"):
                self.t0 = _clocks()

        def on_train_end(self, *a):
            self.t1 = _clocks()
            self.marks.append(self.t1[0])

    timer = Timer()
    start = _fit_mlp(steps, [timer] + ([callback] if callback is not None else []))
    return {**_figures(timer, start), "marks": timer.marks}


def per_step_table(runs: list[dict[str, dict]], arms: list[str], steps: int) -> None:
    """`--per-step`: where in a fit an arm's CPU goes. Each step's training-thread CPU (batch start to the next),
    its median over the rounds at each step index, then per class of steps the mean over its steps, minus the plain
    arm's."""
    import numpy as np

    per_arm = {a: np.median(np.array([np.diff(g[a]["marks"])[:steps] for g in runs]), axis=0) for a in arms}
    i = np.arange(steps)
    classes = {"steps 0-19 (the writer starts)": i < 20, "steps 20-39": (i >= 20) & (i < 40),
               "saving steps (40 on)": (i >= 40) & (i % 10 == 0), "the step after": (i >= 40) & (i % 10 == 1),
               "the other 8 (40 on)": (i >= 40) & (i % 10 >= 2)}
    shown = [a for a in arms if a != "plain"]
    print("\nPer step, µs of the training thread's CPU over the plain arm (medians over rounds per step index, "
          "means over the steps of each class; plain's own in the last column)")
    print("| steps | " + " | ".join(shown) + " | plain |")
    print("|---|" + "---:|" * (len(shown) + 1))
    for label, sel in classes.items():
        base = per_arm["plain"][sel].mean()
        cells = [f"{(per_arm[a][sel].mean() - base) * 1e6:+.0f}" for a in shown]
        print(f"| {label} | " + " | ".join(cells) + f" | {base * 1e6:.0f} |")


def lightning_blocks(steps: int, block: int, callbacks: dict[str, object]) -> dict[str, list[float]]:
    """One Lightning fit whose blocks of `block` steps run with one of `callbacks` ({arm: callback}) or none (see
    the docstring): the training thread's CPU time per step of each block, by arm ("plain", "plain again" and
    those of `callbacks`), in the order they ran (one entry per rotation)."""
    import lightning as L

    arms = (*callbacks, "plain", "plain again")
    n = len(arms)

    class Switch(L.Callback):
        """First in the callback list: at each block's first step, puts the block's callback in the list and takes
        the others out."""

        def __init__(self):
            self.marks: list[tuple[int, str, float]] = []

        def on_train_batch_start(self, trainer, *a):
            step = trainer.global_step
            if step % block != 5 % block:
                return
            k = step // block
            arm = arms[(k + k // n) % n]  # (each arm first in turn)
            self.marks.append((step, arm, time.thread_time()))
            for name, callback in callbacks.items():
                listed = callback in trainer.callbacks
                if name == arm and not listed:
                    trainer.callbacks.append(callback)  # (called from this hook on: the list is read as it goes)
                    callback._hook_optimizers(trainer)
                elif name != arm and listed:
                    trainer.callbacks.remove(callback)
                    for h in callback._handles:
                        h.remove()
                    callback._handles = []

        def on_train_end(self, trainer, *a):
            self.marks.append((trainer.global_step, "", time.thread_time()))

    switch = Switch()
    _fit_mlp(steps, [switch, *callbacks.values()])
    per_step: dict[str, list[float]] = {a: [] for a in arms}
    marks = switch.marks[n:]  # (the first blocks: warm-up)
    for (s0, arm, t0), (s1, _next, t1) in zip(marks, marks[1:], strict=False):
        if s1 - s0 == block:
            per_step[arm].append((t1 - t0) / block)
    return per_step


def blocks_table(args: argparse.Namespace) -> None:
    from tensortap.lightning import TensortapCallback

    lightning_job(WARMUP + 20, None)  # warm-up
    shown = "callback, hooks shown"
    arms = ["callback", *([shown] if args.shown else []), "plain again"]
    ratios: dict[str, list[float]] = {a: [] for a in arms}
    plain: list[float] = []
    for _r in range(args.rounds):
        outs = [tempfile.mkdtemp(prefix="tt-bench-") for _ in arms]
        made = {"callback": TensortapCallback(out_dir=outs[0], save_config=10,
                                              include_collections=["weights", "gradients", "losses"])}
        if args.shown:
            # (the same callback with every hook a method Lightning calls at every batch: what hiding them buys)
            made[shown] = TensortapCallback(out_dir=outs[1], save_config=10,
                                            include_collections=["weights", "gradients", "losses"])
            made[shown]._hides_hooks = False
        got = lightning_blocks(args.steps, args.blocks, made)
        for cb in made.values():
            cb.capture.close()
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
        n = min(len(v) for v in got.values())
        for i in range(n):
            for arm in ratios:
                ratios[arm].append(got[arm][i] / got["plain"][i])
            plain.append(got["plain"][i])

    def cell(rs: list[float]) -> str:
        q = statistics.quantiles(rs, n=4)
        return f"x{statistics.median(rs):.3f} ({q[0]:.3f}-{q[2]:.3f})"

    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} fits of {args.steps} steps, blocks of {args.blocks} "
          f"steps: {len(plain)} blocks per arm")
    print("Block / the plain block beside it, training thread's CPU time, medians over blocks (in brackets: "
          "quartiles)")
    print("| trainer | A/A control | callback | " + (f"{shown} | " if args.shown else "") + "plain per step |")
    print("|---|---:|---:|" + ("---:|" if args.shown else "") + "---:|")
    print(f"| lightning, blocks of {args.blocks} | {cell(ratios['plain again'])} | **{cell(ratios['callback'])}** | "
          + (f"{cell(ratios[shown])} | " if args.shown else "") + f"{statistics.median(plain) * 1e3:.3f} ms |")


def hf_job(steps: int, callback: object | None) -> dict[str, float]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "trainers"))
    from _hf_job import dataset, model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **k):
            if state.global_step == WARMUP:
                self.t0 = _clocks()

        def on_train_end(self, *a, **k):
            self.t1 = _clocks()

    timer = Timer()
    out = tempfile.mkdtemp(prefix="tt-bench-hf-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, max_steps=steps, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=10**9)
    cbs = [timer] + ([callback] if callback is not None else [])
    trainer = Trainer(model=model(), args=args, train_dataset=dataset(512), callbacks=cbs)
    t = _clocks()
    trainer.train()
    shutil.rmtree(out, ignore_errors=True)
    return _figures(timer, t)


def empty_callback(name: str) -> object:
    """A callback that does nothing, for the trainer's own cost of calling one (`--floor`)."""
    if name == "lightning":
        import lightning as L

        return L.Callback()
    from transformers import TrainerCallback

    return TrainerCallback()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--trainers", default="lightning,huggingface")
    ap.add_argument("--no-writer", action="store_true",
                    help="also time the callback with dry_run=True (no writer: its process's work is left out)")
    ap.add_argument("--floor", action="store_true",
                    help="also time a callback that does nothing (the trainer's own cost of calling one)")
    ap.add_argument("--blocks", type=int, default=0,
                    help="Lightning: measure inside each fit, in alternating blocks of this many steps (a multiple "
                         "of 10), instead of whole fits")
    ap.add_argument("--per-step", action="store_true",
                    help="Lightning whole fits: also where in the fit each arm's CPU goes, by class of step")
    ap.add_argument("--shown", action="store_true",
                    help="--blocks: also the callback with every hook shown to Lightning (none hidden)")
    args = ap.parse_args()
    if args.per_step and (args.blocks or "lightning" not in args.trainers.split(",")):
        raise SystemExit("--per-step is for Lightning's whole fits: give it with --trainers lightning (no --blocks)")
    if args.shown and not args.blocks:
        raise SystemExit("--shown is an arm of the block runs: give it with --blocks")
    if args.blocks:
        if args.blocks % 10 or args.trainers != "lightning":
            raise SystemExit("--blocks: give a multiple of 10, with --trainers lightning")
        blocks_table(args)
        return
    jobs = {"lightning": lightning_job, "huggingface": hf_job}
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.steps} steps")
    print("Ratios to the round's plain run, medians over rounds (in brackets: min-max); cpu = the training thread's "
          "CPU time, wall = wall clock")
    print("| trainer | clock | A/A control | callback, training | callback, whole fit/train | "
          + ("callback, no writer | " if args.no_writer else "")
          + ("empty callback, training | " if args.floor else "") + "plain per step |")
    print("|---|---|---:|---:|---:|" + ("---:|" if args.no_writer else "") + ("---:|" if args.floor else "") + "---:|")
    for name in args.trainers.split(","):
        job = jobs[name]
        if name == "lightning":
            from tensortap.lightning import TensortapCallback
        else:
            from tensortap.huggingface import TensortapCallback
        job(WARMUP + 20, None)  # warm-up
        arms = (["plain", "callback", "plain again"] + (["empty"] if args.floor else [])
                + (["no writer"] if args.no_writer else []))
        runs: list[dict[str, dict[str, float]]] = []
        writer_cpu: list[float] = []  # the writer process's CPU per job with the callback, its start included
        for r in range(args.rounds):
            out, out_dry = tempfile.mkdtemp(prefix="tt-bench-"), tempfile.mkdtemp(prefix="tt-bench-")
            made = {"plain": None, "plain again": None, "empty": empty_callback(name) if args.floor else None,
                    "callback": TensortapCallback(out_dir=out, save_config=10,
                                                  include_collections=["weights", "gradients", "losses"]),
                    "no writer": TensortapCallback(out_dir=out_dry, save_config=10, dry_run=True,
                                                   include_collections=["weights", "gradients", "losses"])}
            got = {}
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # (each arm first in turn)
                got[arm] = job(args.steps, made[arm])
            runs.append(got)
            writer = getattr(made["callback"].capture.hook, "_writer", None)
            if writer is not None and getattr(writer, "_proc", None) is not None:
                writer.drain()  # (what the job handed over, handled)
                writer_cpu.append(_process_cpu(writer._proc.pid))
            made["callback"].capture.close()
            made["no writer"].capture.close()
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(out_dry, ignore_errors=True)
        med = statistics.median

        def ratio(arm: str, key: str, runs: list = runs) -> str:
            rs = [g[arm][key] / g["plain"][key] for g in runs]
            return f"x{statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f})"

        for clock in ("cpu", "wall"):
            floor = f"{ratio('no writer', 'train_' + clock)} | " if args.no_writer else ""
            floor += f"{ratio('empty', 'train_' + clock)} | " if args.floor else ""
            per_step = med(g["plain"]["train_" + clock] for g in runs) / (args.steps - WARMUP)
            print(f"| {name} | {clock} | {ratio('plain again', 'train_' + clock)} | "
                  f"**{ratio('callback', 'train_' + clock)}** | {ratio('callback', 'whole_' + clock)} | {floor}"
                  f"{per_step * 1e3:.3f} ms |")
        if args.per_step and name == "lightning":
            per_step_table(runs, arms, args.steps)
        if writer_cpu:
            saving = -(-args.steps // 10)
            print(f"{name}: the writer process's CPU in a job with the callback (its start included, all its threads): "
                  f"median {med(writer_cpu) * 1e3:.0f} ms for {saving} saving steps "
                  f"(bench/writer_process.py gives its steady cost per saving step)")


if __name__ == "__main__":
    main()
