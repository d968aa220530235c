"""`tensortap run` on real PyTorch trainings with no tensortap code in them (zero script change)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tensortap as tt  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_saturating.py")

PLAIN = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    explicit = len(sys.argv) > 1 and sys.argv[1] == "explicit"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if explicit:
        import tensortap.pytorch as tp
        hook = tp.Hook(out_dir="ignored-out-dir", include_collections=["weights", "gradients", "losses"])
        hook.register_module(model)
        hook.register_loss(loss_fn)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for step in range(20):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    if explicit:  # (else the three forwards would be one step: the optimizer's steps are over, see docs/pytorch.md)
        hook.set_mode(tp.modes.EVAL)
    with torch.no_grad():
        for _ in range(3):
            loss_fn(model(x), y)
    """
)

DDP = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from torch import nn
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(12):
        x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    dist.barrier()  # (ranks leave the group together: gloo may abort a rank whose peer is gone)
    dist.destroy_process_group()
    """
)


def tensortap(*args, timeout=300, cwd=None):
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_broken_example_is_stopped_early_by_vanishing_gradient(tmp_path):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "10", "--rule", "vanishing_gradient",
                  "--rule", "exploding_tensor", "--rule", "loss_not_decreasing:num_steps=50,diff_percent=1",
                  "--stop-on-issue", "--json", "--", sys.executable, EXAMPLE, "--steps", "5000")
    assert r.returncode == 1, (r.stdout, r.stderr[-3000:])
    doc = json.loads(r.stdout)
    rules = {x["name"]: x for x in doc["rules"]}
    assert rules["vanishing_gradient"]["status"] == "IssuesFound" and rules["vanishing_gradient"]["first_step"] == 0
    assert rules["exploding_tensor"]["status"] == "NoIssuesFound"
    assert "training finished" not in r.stderr
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps and trial.steps()[-1] < 4990  # stopped well before the end
    # the loss never falls: judged on TRAIN steps it fires once its warm-up (4 windows of 5 saved values, up
    # to step 190) is over; if the stop came before that, it compared nothing and says NoData
    # (a loss that fell more than min_drop_percent below its first window before it stalled counts as converged:
    # judged, it may be NoIssuesFound; VanishingGradient is the rule for this job)
    lnd = rules["loss_not_decreasing"]
    if lnd["status"] == "IssuesFound":
        assert "the TRAIN loss stopped decreasing before it fell" in lnd["message"]
    assert (lnd["status"] == "NoData") == (trial.steps(mode=tt.modes.TRAIN)[-1] < 190), lnd
    # the job was stopped by the rule whose request it honoured
    stop = json.load(open(os.path.join(out, "tensortap", "control", "stop.json")))
    assert doc["training"]["stopped_by"] == {"VanishingGradient": "vanishing_gradient",
                                             "LossNotDecreasing": "loss_not_decreasing"}[stop["rule"]]
    assert any(n.startswith("gradient/Sequential_0.") for n in trial.tensor_names())


def test_healthy_example_ends_with_no_issues(tmp_path):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "10", "--rule", "vanishing_gradient",
                  "--rule", "exploding_tensor", "--rule", "loss_not_decreasing:num_steps=50,diff_percent=1",
                  "--stop-on-issue", "--json", "--", sys.executable, EXAMPLE, "--healthy", "--steps", "300")
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert [x["status"] for x in doc["rules"]] == ["NoIssuesFound"] * 3
    assert doc["training"]["exit_code"] == 0 and doc["training"]["stopped_by"] is None
    assert all(x["steps_judged"] and x["data_points"] for x in doc["rules"])  # a verdict on data


def test_zero_script_change_captures_what_an_explicit_hook_captures(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    trials = {}
    for variant in ("auto", "explicit"):
        out = str(tmp_path / variant)
        r = tensortap("run", "--out-dir", out, "--save-interval", "5", "--collection", "weights",
                      "--collection", "gradients", "--collection", "losses", "--json",
                      "--", sys.executable, str(script), variant, cwd=str(tmp_path))
        assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
        trials[variant] = tt.create_trial(out)
    auto, explicit = trials["auto"], trials["explicit"]
    assert not (tmp_path / "ignored-out-dir").exists()  # the script's own hook used the runner's out_dir
    names = auto.tensor_names()
    assert names == explicit.tensor_names()
    assert "Sequential_0.weight" in names and "gradient/Sequential_2.bias" in names
    assert "CrossEntropyLoss_output_0" in names
    # The explicit script sets only the EVAL mode (its training steps are GLOBAL); the automatic capture
    # follows model.train()/model.eval(). Global steps are the same.
    # Losses are saved at every EVAL step (an evaluation gives a curve): both have the three evaluation passes.
    for n in names:
        assert auto.tensor(n).steps() == explicit.tensor(n).steps(), n
    assert auto.tensor("CrossEntropyLoss_output_0").steps() == [0, 5, 10, 15, 20, 21, 22]
    assert auto.tensor("Sequential_0.weight").steps(tt.modes.TRAIN) == [0, 5, 10, 15]
    assert auto.steps(tt.modes.EVAL) == [0, 1, 2] and auto.mode(20) == tt.modes.EVAL  # model.eval() switched mode
    for n in ("Sequential_0.weight", "gradient/Sequential_2.bias", "CrossEntropyLoss_output_0"):
        assert auto.tensor(n).value(10).tobytes() == explicit.tensor(n).value(10).tobytes(), n


def test_torchrun_two_processes(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    out = str(tmp_path / "job")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r = tensortap("run", "--out-dir", out, "--save-interval", "2", "--rule", "vanishing_gradient",
                  "--rule", "exploding_tensor", "--json", "--", torchrun, "--standalone", "--nproc_per_node", "2",
                  str(script))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    doc = json.loads(r.stdout)
    assert [x["status"] for x in doc["rules"]] == ["NoIssuesFound", "NoIssuesFound"]
    trial = tt.create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"]
    g = "gradient/Sequential_0.weight"  # the inner module's names (the DDP wrapper is looked through)
    assert g in trial.tensor_names()
    assert trial.tensor(g).workers(4) == ["worker_0", "worker_1"]
    # DDP averages gradients: both ranks saved the same values
    t = trial.tensor(g)
    assert t.value(4, worker="worker_0").tobytes() == t.value(4, worker="worker_1").tobytes()


ACCUMULATE = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):              # 10 optimizer steps ...
        opt.zero_grad()
        for micro in range(3):          # ... of 3 accumulated micro-batches each
            loss_fn(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        opt.step()
    """
)


def test_train_steps_are_counted_at_optimizer_steps(tmp_path):
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATE)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--collection", "gradients", "--json",
                  "--", sys.executable, str(script))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    trial = tt.create_trial(out)
    assert trial.steps(tt.modes.TRAIN) == list(range(10))
    assert trial.tensor("gradient/Sequential_0.weight").steps() == list(range(10))


GRAD_SCALER = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for step in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if step == 2:
            loss = loss * float("inf")  # non-finite gradients: the scaler skips this step
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print("max|grad|", step, float(model[0].weight.grad.abs().max()), flush=True)
    """
)


def test_grad_scaler_found_without_script_change(tmp_path):
    """`tensortap run` registers the script's GradScaler: its skipped step is recorded as skipped (not run into
    the next step), and gradients are saved unscaled, as the optimizer consumed them."""
    script = tmp_path / "amp.py"
    script.write_text(GRAD_SCALER)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--collection", "gradients",
                  "--collection", "grad_scaler", "--json", "--", sys.executable, str(script))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    trial = tt.create_trial(out)
    assert trial.steps(tt.modes.TRAIN) == [0, 1, 2, 3, 4]
    assert trial.tensor("grad_scaler/skipped").steps() == [2]
    g = trial.tensor("gradient/Sequential_0.weight")
    assert g.steps() == [0, 1, 3, 4]
    assert float(abs(g.value(0)).max()) < 10  # unscaled (×65536 they would not be)
