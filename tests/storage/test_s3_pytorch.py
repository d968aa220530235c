"""Real PyTorch training into a real S3-compatible server (moto's, on 127.0.0.1), read back through the
trial, the CLI and the rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensortap as tt  # noqa: E402
import tensortap.pytorch as tp  # noqa: E402

DDP = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from torch import nn
    import tensortap.pytorch as tp
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)))
    hook = tp.Hook(out_dir=sys.argv[1], save_config=tp.SaveConfig(save_interval=1), include_workers="all",
                   include_collections=["weights", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(4):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 2, (8,), generator=g)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    dist.barrier()  # (ranks leave the group together: gloo may abort a rank whose peer is gone)
    dist.destroy_process_group()
    """
)


def test_pytorch_training_into_s3_reads_back_bit_exact(s3_url):
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tp.Hook(out_dir=s3_url, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    seen = {}
    for step in range(5):
        x, y = torch.randn(16, 5), torch.randint(0, 2, (16,))
        seen[("w", step)] = model[0].weight.detach().clone().numpy()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        seen[("g", step)] = model[2].bias.grad.clone().numpy()
        seen[("loss", step)] = loss.detach().numpy().copy()
        opt.step()
    hook.close()
    trial = tt.create_trial(s3_url)
    assert trial.steps() == list(range(5)) and trial.loaded_all_steps
    for step in range(5):
        assert trial.tensor("Sequential_0.weight").value(step).tobytes() == seen[("w", step)].tobytes()
        assert trial.tensor("gradient/Sequential_2.bias").value(step).tobytes() == seen[("g", step)].tobytes()
        assert trial.tensor("CrossEntropyLoss_output_0").value(step).tobytes() == seen[("loss", step)].tobytes()


def test_two_torchrun_workers_on_one_s3_prefix_cli_and_rules(s3_url, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script), s3_url],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    trial = tt.create_trial(s3_url)
    assert trial.workers() == ["worker_0", "worker_1"] and trial.steps() == [0, 1, 2, 3]
    w = "Sequential_0.weight"
    a, b = (trial.tensor(w).value(3, worker=k) for k in ("worker_0", "worker_1"))
    assert np.array_equal(a, b)  # DDP keeps the replicas identical
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    ls = subprocess.run([exe, "ls", s3_url, "--json"], capture_output=True, text=True, timeout=120)
    assert ls.returncode == 0, ls.stderr
    info = json.loads(ls.stdout)
    assert info["workers"] == ["worker_0", "worker_1"] and info["steps"]["count"] == 4
    rules = subprocess.run([exe, "rules", "run", s3_url, "--rule", "exploding_tensor", "--json"],
                           capture_output=True, text=True, timeout=120)
    assert rules.returncode == 0, (rules.stdout, rules.stderr)
    assert json.loads(rules.stdout)["rules"][0]["status"] == "NoIssuesFound"
