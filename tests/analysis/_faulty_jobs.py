"""Real PyTorch trainings with a planted fault, shared by the analysis, rules and CLI tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np


def _data(seed: int = 0, n: int = 4096, d: int = 16) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 4, generator=g)
    return x, (x @ w).argmax(1)


def mlp(seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def spike_job(out_dir: str, steps: int = 90, corrupt_step: int | None = 60, factor: float = 100.0,
              save_interval: int = 1, flight: bool = False) -> dict[str, Any]:
    """An MLP trained with SGD. At `corrupt_step` the gradient of its second Linear (`Sequential_2.weight`) is
    multiplied by `factor` before the optimizer's step (a bad batch, a broken kernel): that gradient spikes at
    that step, the weights jump, and the loss spikes at the next step. With `flight`, the flight recorder is on
    (what is saved between save_interval steps is its ring, written when it sees the spike). Returns
    {"losses": [...]}."""
    import torch
    from torch import nn

    import tensortap.pytorch as tp

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    loss_fn = nn.CrossEntropyLoss()
    extra = {"flight_recorder": True} if flight else {}
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=save_interval),
                   include_collections=["weights", "gradients", "losses"], writer="thread", **extra)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    x, y = _data()
    losses = []
    for step in range(steps):
        idx = slice(step * 32 % 4000, step * 32 % 4000 + 32)
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        losses.append(loss.item())
        if step == corrupt_step:
            model[2].weight.grad.mul_(factor)
        opt.step()
    hook.close()
    return {"losses": losses}


class _Outliers:
    """An identity module (built lazily: torch is imported in the job) that, from step `start`, multiplies one
    channel of its input by `growth` ** (steps since `start` + 1): outliers growing in a layer's activations."""

    def __new__(cls, start: int | None, growth: float = 10.0):
        import torch
        from torch import nn

        class Outliers(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.step = -1

            def forward(self, x):
                if start is None or self.step < start:
                    return x
                scale = torch.ones(x.shape[1])
                scale[0] = growth ** (self.step - start + 1)
                return x * scale

        return Outliers()


def outlier_job(out_dir: str, start: int | None = 60, steps: int = 66) -> dict[str, Any]:
    """An MLP trained with SGD, the flight recorder on with its full statistics, nothing else saved
    (save_interval=500). From step `start` the outputs of its module `2` (after the first ReLU) grow an outlier
    channel (x10, x100, ...): their kurtosis jumps at `start`, the gradients follow at the next step, then the
    loss. The job ends with an exception (the flight recorder writes its whole ring). Returns {"losses": [...]}."""
    import torch
    from torch import nn

    import tensortap.pytorch as tp
    from tensortap.capture.flight import FlightConfig

    torch.manual_seed(0)
    planted = _Outliers(start)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), planted, nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=500), writer="thread",
                   flight_recorder=FlightConfig(statistics="full"))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = _data()
    losses = []
    try:
        with hook:
            for step in range(steps):
                planted.step = step
                idx = slice(step * 32 % 4000, step * 32 % 4000 + 32)
                opt.zero_grad()
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                losses.append(loss.item())
                opt.step()
            raise RuntimeError("the job ends")
    except RuntimeError:
        pass
    return {"losses": losses}


def amp_job(out_dir: str, steps: int = 40, overflow_from: int | None = 20) -> list[float]:
    """An MLP trained with a real torch.amp.GradScaler on CPU (registered with the hook). From step
    `overflow_from` the loss is multiplied by inf (an overflow): every gradient is non-finite, the scaler skips
    every step and halves its scale. Returns the scaler's scale after each step."""
    import torch
    from torch import nn

    import tensortap.pytorch as tp

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=5),
                   include_collections=["gradients", "losses", "grad_scaler"], writer="thread")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    hook.register_scaler(scaler)
    x, y = _data()
    scales = []
    for step in range(steps):
        idx = slice(step * 32, step * 32 + 32)
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        if overflow_from is not None and step >= overflow_from:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
    hook.close()
    return scales


DDP_WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    import tensortap.pytorch as tp

    out_dir, corrupt_rank, corrupt_from = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = nn.parallel.DistributedDataParallel(net)
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=1), include_workers="all",
                   include_collections=["gradients", "losses"], writer="thread")
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(4096, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    for step in range(40):
        i = (step * 2 + rank) * 32 % 4000
        opt.zero_grad()
        loss_fn(model(x[i:i + 32]), y[i:i + 32]).backward()
        if rank == corrupt_rank and step >= corrupt_from:
            for p in model.parameters():  # a corrupted gradient on this rank only, after the all-reduce
                p.grad.mul_(40.0)
        opt.step()
    hook.close()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def ddp_job(out_dir: str, tmp_dir: str, corrupt_rank: int = 1, corrupt_from: int = 20) -> None:
    """Two gloo processes of a DDP job (workers worker_0 and worker_1); from step `corrupt_from` rank
    `corrupt_rank` multiplies its gradients by 40 after the all-reduce (-1: no corruption)."""
    script = os.path.join(tmp_dir, "ddp_worker.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(DDP_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   OMP_NUM_THREADS="1")
        env.pop("TENSORTAP_DISABLE", None)
        procs.append(subprocess.Popen([sys.executable, script, out_dir, str(corrupt_rank), str(corrupt_from)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]


def finite(a: Any) -> bool:
    return bool(np.isfinite(np.asarray(a, dtype=np.float64)).all())
