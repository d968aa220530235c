"""What the trainer callbacks cost a Lightning and a Hugging Face Trainer job (docs/trainers.md).

Each round trains the same small job twice in this process, once without a tensortap callback and once with
`TensortapCallback(save_config=10, include_collections=["weights", "gradients", "losses"])`, in alternating
order (which goes first alternates too), then once more without, as the A/A control. Training time is taken
from step WARMUP (20) to the trainer's train-end callback: the steady cost per step, without the writer's start
at the first saving step (a fixed cost, `bench/fixed_cost.py`), which the whole `fit`/`train` column includes.
A round's ratio is callback / plain; the table gives the medians over rounds.

    .venv/bin/python bench/trainers_overhead.py --rounds 7 --steps 1000
"""

from __future__ import annotations

import argparse
import logging
import os
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

#: training time is taken from this step on: the writer's start at the first saving step (a fixed cost of a hook,
#: bench/fixed_cost.py) stays out of the per-step figure, which the whole fit/train column keeps
WARMUP = 20


def lightning_job(steps: int, callback: object | None) -> tuple[float, float]:
    import lightning as L

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, *a):
            if trainer.global_step == WARMUP:
                self.t0 = time.perf_counter()

        def on_train_end(self, *a):
            self.t1 = time.perf_counter()

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
    timer = Timer()
    cbs = [timer] + ([callback] if callback is not None else [])
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, callbacks=cbs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    t = time.perf_counter()
    trainer.fit(MLP(), data)
    return timer.t1 - timer.t0, time.perf_counter() - t


def hf_job(steps: int, callback: object | None) -> tuple[float, float]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "trainers"))
    from _hf_job import dataset, model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **k):
            if state.global_step == WARMUP:
                self.t0 = time.perf_counter()

        def on_train_end(self, *a, **k):
            self.t1 = time.perf_counter()

    timer = Timer()
    out = tempfile.mkdtemp(prefix="tt-bench-hf-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, max_steps=steps, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=10**9)
    cbs = [timer] + ([callback] if callback is not None else [])
    trainer = Trainer(model=model(), args=args, train_dataset=dataset(512), callbacks=cbs)
    t = time.perf_counter()
    trainer.train()
    return timer.t1 - timer.t0, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--trainers", default="lightning,huggingface")
    args = ap.parse_args()
    jobs = {"lightning": lightning_job, "huggingface": hf_job}
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.steps} steps")
    print("| trainer | A/A control | callback, training | callback, whole fit/train | plain s/step |")
    print("|---|---:|---:|---:|---:|")
    for name in args.trainers.split(","):
        job = jobs[name]
        if name == "lightning":
            from tensortap.lightning import TensortapCallback
        else:
            from tensortap.huggingface import TensortapCallback
        job(WARMUP + 20, None)  # warm-up
        aa, train_r, whole_r, plain_step = [], [], [], []
        for r in range(args.rounds):
            out = tempfile.mkdtemp(prefix="tt-bench-")
            cb = TensortapCallback(out_dir=out, save_config=10, include_collections=["weights", "gradients", "losses"])
            order = [None, cb] if r % 2 == 0 else [cb, None]
            got = {}
            for c in order:
                got[c is None] = job(args.steps, c)
            control = job(args.steps, None)
            train_r.append(got[False][0] / got[True][0])
            whole_r.append(got[False][1] / got[True][1])
            aa.append(control[0] / got[True][0])
            plain_step.append(got[True][0] / (args.steps - WARMUP))
        med = statistics.median
        print(f"| {name} | x{med(aa):.3f} | **x{med(train_r):.3f}** | x{med(whole_r):.3f} | "
              f"{med(plain_step) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
