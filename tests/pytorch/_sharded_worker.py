"""One worker of an FSDP2 (`fully_shard`) or DTensor (`distribute_module`) job on CPU/gloo, run by
test_sharded.py (one process, or two with torchrun's environment variables). It records what the script
itself reads: the full weights before each step's forward, the full gradients inside the optimizer's step
pre-hook (`full_tensor()`), the loss and `get_total_norm` of the full gradients.

    python _sharded_worker.py OUT_DIR WRITER KIND INCLUDE_WORKERS RECORD.npz

With TT_TEST_DEVICE=cuda: on the GPU (one per rank) over NCCL.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import tensortap.pytorch as tp

out_dir, writer, kind, include_workers, rec_path = sys.argv[1:6]
# (after tensortap, as in a script that imports it first: it must know the DTensors made below all the same)
from torch.distributed.tensor import (  # noqa: E402
    DTensor,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    init_device_mesh,
)

device = os.environ.get("TT_TEST_DEVICE", "cpu")
dist.init_process_group("nccl" if device == "cuda" else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if device == "cuda":
    torch.cuda.set_device(rank)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3)).to(device)
mesh = init_device_mesh(device, (world,))
if kind == "fsdp":
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
else:
    def partition(name, module, device_mesh):
        for pname, p in list(module.named_parameters(recurse=False)):
            placement = Shard(0) if pname == "weight" else Replicate()
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p.detach(), device_mesh, [placement])))

    distribute_module(
        model, mesh, partition,
        input_fn=lambda mod, inputs, device_mesh: tuple(
            DTensor.from_local(t, device_mesh, [Replicate()]) for t in inputs),
        output_fn=lambda mod, outputs, device_mesh: outputs.redistribute(device_mesh, [Replicate()]).to_local(),
    )
hook = tp.Hook(out_dir=out_dir, writer=writer, save_config=tp.SaveConfig(save_interval=1),
               include_collections=["weights", "biases", "gradients", "losses"], include_workers=include_workers)
hook.register_module(model)
loss_fn = nn.CrossEntropyLoss()
hook.register_loss(loss_fn)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
names = [n for n, _p in model.named_parameters()]
rec = {}
step_now = [0]


def host(t):
    """What the script reads: the full tensor, on the host."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().numpy().copy()


def read_grads(optimizer, args, kwargs):
    s = step_now[0]
    grads = [p.grad for p in model.parameters()]
    for n, g in zip(names, grads, strict=True):
        rec[f"g{s}/{n}"] = host(g)
    rec[f"total{s}"] = np.asarray(torch.nn.utils.get_total_norm(
        [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]).item())


opt.register_step_pre_hook(read_grads)
for step in range(3):
    step_now[0] = step
    for n, p in model.named_parameters():
        rec[f"w{step}/{n}"] = host(p)
    torch.manual_seed(100 + step)
    x, y = torch.randn(4, 6).to(device), torch.randint(0, 3, (4,)).to(device)
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    rec[f"loss{step}"] = host(loss)
    opt.step()
hook.close()
if rank == 0:
    np.savez(rec_path, **rec)
print(json.dumps({"rank": rank, "errors": hook.error_count, "step": hook.step, "names": names}), flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
