"""The PyTorch hook on a CUDA device: saved values equal what the script reads there (raw, statistics, GradScaler with
float16 autocast, bfloat16, an inductor-compiled model, FSDP2 and DTensor parameters over NCCL, Lightning's
16-mixed), no synchronising CUDA call (a transfer the host waits for) in any step, no device memory taken by a
saving step, and the flight recorder naming a layer. Skipped where torch sees no CUDA device (CI); run on a GPU
machine with `python -m pytest tests/pytorch/test_cuda.py`."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from torch import nn  # noqa: E402

import tensortap.pytorch as tp  # noqa: E402
from tensortap import modes  # noqa: E402
from tensortap.capture.flight import FlightConfig  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402

CUDA = torch.device("cuda")


def _mlp(layers: int = 3, width: int = 64, dtype=torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    mods: list[nn.Module] = [nn.Linear(32, width), nn.Tanh()]
    for _ in range(layers - 2):
        mods += [nn.Linear(width, width), nn.Tanh()]
    mods.append(nn.Linear(width, 4))
    return nn.Sequential(*mods).to(CUDA, dtype)


def _batch(step: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(64, 32, generator=g).to(CUDA, dtype), torch.randint(0, 4, (64,), generator=g).to(CUDA))


def _host(t: torch.Tensor) -> np.ndarray:
    """The bytes of a tensor as the script reads them, as a numpy array of the same width."""
    t = t.detach().to("cpu", copy=True)
    return t.view(torch.int16).numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()


def _saved_bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int16) if a.dtype.itemsize == 2 else a


def _record_consumed(opt, model, store: list) -> None:
    """What the optimizer consumes, read inside its own step pre-hook."""
    opt.register_step_pre_hook(
        lambda o, a, k: store.append({n: _host(p.grad) for n, p in model.named_parameters()}))


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_raw_values_bit_for_bit_with_accumulation_and_clipping(tmp_path, writer):
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hook = tp.Hook(out_dir=str(tmp_path), writer=writer, save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    grads: list[dict] = []
    _record_consumed(opt, model, grads)
    weights, losses = [], []
    for step in range(8):
        weights.append({n: _host(p) for n, p in model.named_parameters()})
        opt.zero_grad()
        losses.append([])
        for micro in range(2):
            x, y = _batch(2 * step + micro)
            loss = loss_fn(model(x), y)
            losses[-1].append(_host(loss))
            (loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    t = create_trial(str(tmp_path))
    assert t.steps() == [0, 2, 4, 6]
    names = [n for n, _p in model.named_parameters()]
    for s in (0, 2, 4, 6):
        for n in names:
            assert t.tensor(f"Sequential_{n}").value(s).tobytes() == weights[s][n].tobytes(), (s, n)
            assert t.tensor(f"gradient/Sequential_{n}").value(s).tobytes() == grads[s][n].tobytes(), (s, n)
        loss_name = "CrossEntropyLoss_output_0"
        assert t.tensor(loss_name).value(s).tobytes() in {v.tobytes() for v in losses[s]}
    assert t.tensor("gradient/Sequential_0.weight").steps() == [0, 2, 4, 6]


def test_a_saving_step_takes_no_device_memory(tmp_path):
    """Raw weights and gradients go to pinned host memory tensor by tensor: a saving step's peak device memory is
    a quiet step's (a concatenation on the device would add the 33 MB saved)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)]).to(CUDA)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients"])
    hook.register_module(model)
    hook.register_optimizer(opt)
    x = torch.randn(64, 1024, device=CUDA)
    peaks = []
    for _step in range(8):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    hook.close()
    assert hook.error_count == 0, hook.first_error
    assert create_trial(str(tmp_path)).tensor("gradient/Sequential_0.weight").steps() == [0, 2, 4, 6]
    saving, quiet = max(peaks[2::2]), max(peaks[3::2])  # (steps 2, 4, 6 save; 3, 5, 7 do not)
    print("peak device memory above the step's start, saving / quiet:", saving, quiet)
    assert saving - quiet < 1 << 20, (saving, quiet)


def _sync_counts(hook_kw: dict, tmp_path, steps: int = 9) -> tuple[list[int], list[int]]:
    """Synchronising CUDA calls per step of a plain loop (no sync of its own) hooked with `hook_kw` (saving every
    3rd step): (counts of saving steps, counts of quiet steps)."""
    model = _mlp(layers=8)  # 16 parameters: a per-tensor transfer would show as 16+ per step
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=3),
                   include_collections=["weights", "biases", "gradients", "losses"], **hook_kw)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    batches = [_batch(s) for s in range(steps)]
    torch.cuda.synchronize()
    counts = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for step in range(steps):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                x, y = batches[step]
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
            counts.append(sum("synchroniz" in str(w.message) for w in seen))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    hook.close()
    assert hook.error_count == 0, hook.first_error
    assert create_trial(str(tmp_path)).tensor("gradient/Sequential_0.weight").steps() == [0, 3, 6]
    print(hook_kw, "synchronising calls per step:", counts)
    return [c for s, c in enumerate(counts) if s % 3 == 0], [c for s, c in enumerate(counts) if s % 3]


@pytest.mark.parametrize("kind", ["raw", "statistics"])
def test_no_synchronising_call_in_any_step(tmp_path, kind):
    kw = {}
    if kind == "statistics":
        kw["reduction_config"] = tp.ReductionConfig(norms=["l2"], reductions=["max", "min", "mean"],
                                                    save_raw_tensor=False)
    saving, quiet = _sync_counts(kw, tmp_path)
    assert quiet == [0] * len(quiet)
    # (copies to pinned memory, waited for on their event when the step's data is handed off)
    assert saving == [0] * len(saving)


def test_statistics_are_torchs_on_the_device(tmp_path):
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rc = tp.ReductionConfig(norms=["l1", "l2"], reductions=["max", "min", "mean", "nonfinite"], save_raw_tensor=False)
    hook = tp.Hook(out_dir=str(tmp_path), writer="process", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"], reduction_config=rc)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    grads: list[dict] = []
    opt.register_step_pre_hook(lambda o, a, k: grads.append(
        {n: p.grad.detach().clone() for n, p in model.named_parameters()}))
    weights = []
    for step in range(4):
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        x, y = _batch(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    t = create_trial(str(tmp_path))
    for step in range(4):
        for n in weights[step]:
            for name, x in ((f"Sequential_{n}", weights[step][n]), (f"gradient/Sequential_{n}", grads[step][n])):
                tt = t.tensor(name)
                assert tt.reduction_value(step, "min") == x.min().item(), (name, step)
                assert tt.reduction_value(step, "max") == x.max().item(), (name, step)
                assert tt.reduction_value(step, "mean") == x.mean().item(), (name, step)  # (torch.mean's own)
                assert tt.reduction_value(step, "l2") == pytest.approx(x.norm().item(), rel=1e-6)
                assert tt.reduction_value(step, "l1") == pytest.approx(x.abs().sum().item(), rel=1e-6)
                assert int(tt.reduction_value(step, "nonfinite")) == 0


def test_grad_scaler_with_float16_autocast_saves_unscaled_gradients(tmp_path):
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 16)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "grad_scaler"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    hook.register_scaler(scaler)
    grads: list[dict] = []
    _record_consumed(opt, model, grads)
    scales = []
    for step in range(6):
        x, y = _batch(step)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        if step == 2:
            loss = loss * float("inf")  # non-finite gradients: the scaler skips this step
        scaler.scale(loss).backward()
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    t = create_trial(str(tmp_path))
    assert t.steps() == list(range(6))
    kept = [0, 1, 3, 4, 5]
    assert t.tensor("gradient/Sequential_0.weight").steps() == kept
    for s, g in zip(kept, grads, strict=True):
        for n in g:
            assert t.tensor(f"gradient/Sequential_{n}").value(s).tobytes() == g[n].tobytes(), (s, n)
    assert np.abs(t.tensor("gradient/Sequential_0.weight").value(0)).max() < 10  # (×65536 they would not be)
    assert t.tensor("grad_scaler/skipped").steps() == [2]
    assert t.tensor("grad_scaler/scale").value(3) == np.float32(scales[3]) < scales[2]


@pytest.mark.parametrize("raw", [True, False])
def test_bfloat16_model_raw_and_statistics(tmp_path, raw):
    model = _mlp(dtype=torch.bfloat16)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rc = tp.ReductionConfig(norms=["l2"], reductions=["max", "min"], save_raw_tensor=raw)
    hook = tp.Hook(out_dir=str(tmp_path), writer="process", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients"], reduction_config=rc)
    hook.register_module(model)
    hook.register_optimizer(opt)
    grads: list[dict] = []
    _record_consumed(opt, model, grads)
    weights = []
    for step in range(3):
        weights.append({n: _host(p) for n, p in model.named_parameters()})
        x, y = _batch(step, torch.bfloat16)
        opt.zero_grad()
        loss_fn(model(x).float(), y).backward()
        opt.step()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    t = create_trial(str(tmp_path))
    for s in range(3):
        for n in weights[s]:
            g = t.tensor(f"gradient/Sequential_{n}")
            if raw:
                w = t.tensor(f"Sequential_{n}")
                assert _saved_bits(w.value(s)).tobytes() == weights[s][n].tobytes(), (s, n)
                assert _saved_bits(g.value(s)).tobytes() == grads[s][n].tobytes(), (s, n)
            gf = torch.from_numpy(grads[s][n]).view(torch.bfloat16).double()
            assert float(g.reduction_value(s, "max")) == gf.max().item()
            assert float(g.reduction_value(s, "l2")) == pytest.approx(gf.norm().item(), rel=1e-2)


def test_inductor_compiled_model_no_graph_break_values_bit_for_bit(tmp_path):
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    run = torch.compile(model, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads: list[dict] = []
    _record_consumed(opt, model, grads)
    weights, losses = [], []
    for step in range(6):
        weights.append(_host(model[0].weight))
        x, y = _batch(step)
        opt.zero_grad()
        loss = loss_fn(run(x), y)
        loss.backward()
        losses.append(_host(loss))
        opt.step()
    hook.close()
    assert dict(counters["graph_break"]) == {}
    assert hook.error_count == 0, hook.first_error
    t = create_trial(str(tmp_path))
    for s in (0, 2, 4):
        assert t.tensor("Sequential_0.weight").value(s).tobytes() == weights[s].tobytes()
        assert t.tensor("gradient/Sequential_0.weight").value(s).tobytes() == grads[s]["0.weight"].tobytes()
        assert t.tensor("CrossEntropyLoss_output_0").value(s).tobytes() == losses[s].tobytes()


def test_flight_recorder_names_the_layer_that_went_non_finite(tmp_path):
    k, n = 12, 6
    model = _mlp(layers=4)
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=500),
                   flight_recorder=FlightConfig(steps=n))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    norms = {}
    for step in range(k + 3):
        if step == k:
            with torch.no_grad():
                model[4].weight.fill_(3e38)  # (finite weights; their products overflow)
        x, y = _batch(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        norms[step] = model[2].weight.grad.norm().item()
        opt.step()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    trial = create_trial(str(tmp_path))
    inc = trial.first_nonfinite()
    assert inc["step"] == k
    assert (inc["detail"]["phase"], inc["detail"]["module"]) == ("forward", "4")
    g = trial.tensor("gradient/Sequential_2.weight")
    for step in range(k - n + 1, k):
        assert float(g.reduction_value(step, "l2")) == pytest.approx(norms[step], rel=1e-5)


def test_lightning_16_mixed_on_gpu_saves_what_the_optimizer_consumed(tmp_path):
    L = pytest.importorskip("lightning")
    sys.path.insert(0, str(Path(__file__).parents[1] / "trainers"))
    from _lightning_job import loaders, make_module

    from tensortap.lightning import TensortapCallback

    torch.manual_seed(0)
    record: list[dict] = []
    module = make_module(L, record)
    out = str(tmp_path / "job")
    cb = TensortapCallback(out_dir=out, save_config=2, include_collections=["weights", "gradients", "losses"])
    trainer = L.Trainer(callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="gpu", devices=1, precision="16-mixed",
                        max_steps=8, limit_val_batches=2, val_check_interval=4)
    trainer.fit(module, *loaders())
    assert trainer.global_step == len(record)
    trial = create_trial(out)
    steps = trial.tensor("gradient/Tiny_net.0.weight").steps(mode=modes.TRAIN)
    assert steps and steps[0] == 0
    for s in steps:
        for pname in ("net.0.weight", "net.2.weight"):
            got = trial.tensor(f"gradient/Tiny_{pname}").value(s, mode=modes.TRAIN)
            assert np.array_equal(got, record[s]["grads"][pname].cpu().numpy()), (s, pname)
    assert trial.tensor("loss").steps(mode=modes.TRAIN)
    assert trial.tensor("loss").steps(mode=modes.EVAL)


@pytest.mark.parametrize("kind", ["fsdp", "dtensor"])
def test_sharded_parameters_over_nccl(tmp_path, kind):
    """FSDP2 (`fully_shard`) and DTensor parameters on the GPU, one process over NCCL: the saved values are the
    full tensors the script reads, bit for bit (test_sharded.py's checks)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_sharded import _check, _run

    _check(*_run(tmp_path, 1, "process", kind, device="cuda"))
