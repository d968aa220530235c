"""Statistics-only capture: reductions computed where the tensors live (tensortap.pytorch._tensors.
device_reductions) equal those of the values the script reads, for weights, gradients (read in the optimizer's
step pre-hook) and module outputs, with either writer: CPU float tensors in one pass (tensortap.capture._moments:
min and max exactly, sums in float64 within the bound docs/pytorch.md states), other tensors (and every tensor
without the C helper) torch's own values bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tensortap.pytorch as tp  # noqa: E402
from tensortap.exceptions import TensorUnavailableForStep  # noqa: E402
from tensortap.format.writer import compute_reduction  # noqa: E402
from tensortap.pytorch import _tensors  # noqa: E402
from tensortap.pytorch._tensors import device_reductions  # noqa: E402

REDUCTIONS = ["min", "max", "mean", "sum", "std", "variance", "nonfinite"]
NORMS = ["l1", "l2"]


def _close(a, b) -> None:
    assert np.asarray(a).dtype == np.asarray(b).dtype
    assert np.allclose(np.float64(a), np.float64(b), rtol=2e-6, atol=1e-7, equal_nan=True), (a, b)


def test_device_reductions_match_the_writer():
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(7, 5, generator=g), torch.randn(3, generator=g).double(), torch.arange(6).reshape(2, 3),
          torch.tensor([1.0, float("nan"), -float("inf"), 2.0])]
    keys = [(r, a) for r in REDUCTIONS + NORMS for a in (False, True)]
    got = device_reductions(ts, [tuple(keys)] * len(ts))
    for t, rv in zip(ts, got, strict=True):
        for (name, abs_), v in rv.items():
            if name in ("std", "variance", "mean", "sum") and not torch.isfinite(t.double()).all():
                continue  # (NaN either way)
            ref = compute_reduction(t.numpy(), name, abs_)
            if t.dtype == torch.int64 and name != "nonfinite":
                assert np.isclose(float(v), float(ref)), (name, abs_)
            else:
                _close(v, ref)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_statistics_only_equal_those_of_the_values_read(tmp_path, writer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rc = tp.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"], abs_reductions=["max"])
    hook = tp.Hook(out_dir=str(tmp_path), writer=writer, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "relu_output"], reduction_config=rc)
    hook.register_module(model)
    rec: list[tuple[dict, dict]] = []
    opt.register_step_pre_hook(lambda o, a, k: rec[-1][1].update(
        {n: p.grad.clone() for n, p in model.named_parameters()}))
    relu = []
    model[1].register_forward_hook(lambda m, i, o: relu.append(o.detach().clone()))
    for _step in range(3):
        rec.append(({n: p.detach().clone() for n, p in model.named_parameters()}, {}))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    for step, (w, grads) in enumerate(rec):
        for n in w:
            for name, values in ((f"Sequential_{n}", w), (f"gradient/Sequential_{n}", grads)):
                tt = t.tensor(name)
                with pytest.raises(TensorUnavailableForStep):
                    tt.value(step)  # no raw value: statistics only
                arr = values[n].numpy()
                for red in ("min", "max", "mean"):
                    _close(tt.reduction_value(step, red), compute_reduction(arr, red, False))
                _close(tt.reduction_value(step, "l2"), compute_reduction(arr, "l2", False))
                _close(tt.reduction_value(step, "max", abs=True), compute_reduction(arr, "max", True))
        _close(t.tensor("1_output_0").reduction_value(step, "l2"), compute_reduction(relu[step].numpy(), "l2", False))


def _bits(v) -> bytes:
    return np.asarray(v).tobytes()


@pytest.fixture
def torch_path(monkeypatch):
    """Statistics as without the C helper: torch's reductions."""
    monkeypatch.setattr(_tensors, "_c_moments", None)


def _one_pass_close(v, x: torch.Tensor, name: str) -> None:
    """A one-pass statistic of CPU tensor `x` (its dtype's value) against the exact value: Σ in float64 within
    (136 + n/1024)·2⁻⁵³·Σ|term| (docs/pytorch.md), then rounded once to the dtype (one ulp here)."""
    a = x.detach().double().numpy().ravel()
    n = a.size
    terms = a * a if name == "l2" else a
    exact_sum = math.fsum(terms)
    exact = math.sqrt(exact_sum) if name == "l2" else exact_sum / n if name == "mean" else exact_sum
    err = (136 + n / 1024) * 2.0 ** -53 * math.fsum(np.abs(terms)) / (n if name == "mean" else 1)
    if name == "l2":
        err = err / (2 * exact) if exact else 0.0
    v = np.asarray(v)
    assert v.dtype == x.numpy().dtype
    assert abs(float(v) - exact) <= err + float(np.spacing(v.dtype.type(abs(exact)))), (name, float(v), exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_pass_statistics_of_cpu_tensors(dtype):
    """CPU float tensors: min and max exactly torch's, means, sums and norms within the stated bound of the exact
    value, for tensors that are not contiguous and counts a float32 cannot hold exactly too."""
    pytest.importorskip("tensortap.capture._moments", reason="the C helper is not built (setup.py build_ext)")
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(300, 70, generator=g).to(dtype) * 1e3 + 7, torch.randn(5, generator=g).to(dtype),
          torch.randn(40, 30, generator=g).to(dtype).t(), torch.full(((1 << 24) + 3,), 0.3, dtype=dtype)]
    keys = (("l2", False), ("max", False), ("min", False), ("mean", False), ("sum", False), ("max", True))
    prog = _tensors.ReductionProgram(ts, [keys] * len(ts))
    for _again in range(2):
        got = prog.run(ts)
        for t, rv in zip(ts, got, strict=True):
            assert _bits(rv[("min", False)]) == _bits(t.min().numpy())
            assert _bits(rv[("max", False)]) == _bits(t.max().numpy())
            assert _bits(rv[("max", True)]) == _bits(t.abs().max().numpy())
            for name in ("mean", "l2", "sum"):
                _one_pass_close(rv[(name, False)], t, name)
    ts[1] = torch.randn(9, generator=g).to(dtype)  # another count under the same program
    _one_pass_close(prog.run(ts)[1][("mean", False)], ts[1], "mean")


def test_one_pass_statistics_of_bfloat16_are_float64():
    pytest.importorskip("tensortap.capture._moments", reason="the C helper is not built (setup.py build_ext)")
    g = torch.Generator().manual_seed(2)
    ts = [torch.randn(3000, generator=g).bfloat16(), torch.randn(7, 3, generator=g).bfloat16()]
    got = _tensors.ReductionProgram(ts, [(("mean", False), ("l2", False), ("min", False))] * 2).run(ts)
    for t, rv in zip(ts, got, strict=True):
        a = t.double().numpy().ravel()
        assert rv[("min", False)].dtype == np.float64 and float(rv[("min", False)]) == a.min()
        assert abs(float(rv[("mean", False)]) - math.fsum(a) / a.size) <= 1e-15 * math.fsum(np.abs(a))
        assert float(rv[("l2", False)]) == pytest.approx(math.sqrt(math.fsum(a * a)), rel=1e-14)


def test_statistics_only_of_a_bfloat16_model_through_torchs_reductions(tmp_path, monkeypatch):
    """Without the one pass (as on an accelerator): a bfloat16 model's statistics are torch's values, stored as
    float64 (numpy has no bfloat16), and the hook stays on."""
    monkeypatch.setattr(_tensors, "_c_moments", None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).bfloat16()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rc = tp.ReductionConfig(reductions=["min", "max"], norms=["l2"], save_raw_tensor=False)
    hook = tp.Hook(out_dir=str(tmp_path), writer="process", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients"], reduction_config=rc)
    hook.register_module(model)
    hook.register_optimizer(opt)
    grads: list[dict] = []
    opt.register_step_pre_hook(lambda o, a, k: grads.append(
        {n: p.grad.clone() for n, p in model.named_parameters()}))
    for _step in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(4, 6).bfloat16()).float(), torch.randint(0, 3, (4,))).backward()
        opt.step()
    hook.close()
    assert hook.error_count == 0, hook.first_error
    t = tp.create_trial(str(tmp_path))
    for step, g in enumerate(grads):
        for n, x in g.items():
            tt = t.tensor(f"gradient/Sequential_{n}")
            assert tt.reduction_value(step, "max").dtype == np.float64
            assert float(tt.reduction_value(step, "max")) == x.max().item()
            assert float(tt.reduction_value(step, "min")) == x.min().item()
            assert float(tt.reduction_value(step, "l2")) == torch._foreach_norm([x])[0].item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_means_are_torch_means_bit_for_bit(dtype, torch_path):
    """Without the one pass: a mean is taken as a sum divided by the element count with the other tensors'
    (torch's CPU mean is that): the value is torch's own, for counts a float32 cannot hold exactly too."""
    from tensortap.pytorch._tensors import ReductionProgram

    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(300, 70, generator=g).to(dtype) * 1e3 + 7, torch.randn(5, generator=g).to(dtype),
          torch.randn(40, 30, generator=g).to(dtype).t(), torch.tensor([0.1, float("nan")], dtype=dtype),
          torch.full(((1 << 24) + 3,), 0.3, dtype=dtype)]
    keys = (("l2", False), ("max", False), ("min", False), ("mean", False), ("mean", True))
    prog = ReductionProgram(ts, [keys] * len(ts))
    for _again in range(2):  # (the divisor is kept between runs)
        got = prog.run(ts)
        for t, rv in zip(ts, got, strict=True):
            assert _bits(rv[("mean", False)]) == _bits(t.mean().numpy()), t.shape
            assert _bits(rv[("mean", True)]) == _bits(t.abs().mean().numpy())
            assert _bits(rv[("min", False)]) == _bits(t.min().numpy())
            assert _bits(rv[("max", False)]) == _bits(t.max().numpy())
    ts[1] = torch.randn(9, generator=g).to(dtype)  # another count under the same program
    assert _bits(prog.run(ts)[1][("mean", False)]) == _bits(ts[1].mean().numpy())


@pytest.mark.parametrize(("writer", "one_pass"), [("thread", True), ("process", True), ("process", False)])
def test_statistics_only_are_those_of_the_values_read(tmp_path, writer, one_pass, monkeypatch):
    """Weights' and gradients' statistics (one hand-off per step) are those of the values the script reads: min and
    max exactly, in one pass the rest within the stated bound, else torch's own values bit for bit."""
    if one_pass:
        pytest.importorskip("tensortap.capture._moments", reason="the C helper is not built (setup.py build_ext)")
    else:
        monkeypatch.setattr(_tensors, "_c_moments", None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rc = tp.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"], save_raw_tensor=False)
    hook = tp.Hook(out_dir=str(tmp_path), writer=writer, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"], reduction_config=rc)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(opt)
    rec: list[tuple[dict, dict, float]] = []
    opt.register_step_pre_hook(lambda o, a, k: rec[-1][1].update(
        {n: p.grad.clone() for n, p in model.named_parameters()}))
    for _step in range(4):
        rec.append(({n: p.detach().clone() for n, p in model.named_parameters()}, {}, []))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        rec[-1][2].append(loss.detach().clone())
        loss.backward()
        opt.step()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    for step, (w, grads, loss) in enumerate(rec):
        assert t.tensor("CrossEntropyLoss_output_0").value(step).tobytes() == loss[0].numpy().tobytes()
        for n in w:
            for name, values in ((f"Sequential_{n}", w), (f"gradient/Sequential_{n}", grads)):
                x = values[n]
                tt = t.tensor(name)
                assert _bits(tt.reduction_value(step, "min")) == _bits(x.min().numpy())
                assert _bits(tt.reduction_value(step, "max")) == _bits(x.max().numpy())
                if one_pass:
                    _one_pass_close(tt.reduction_value(step, "mean"), x, "mean")
                    _one_pass_close(tt.reduction_value(step, "l2"), x, "l2")
                else:
                    assert _bits(tt.reduction_value(step, "mean")) == _bits(x.mean().numpy()), (name, step)
                    assert _bits(tt.reduction_value(step, "l2")) == _bits(torch._foreach_norm([x])[0].numpy())


class _WithEmpty(nn.Module):
    """A linear layer and a zero-element parameter that takes part in the forward (its gradient is empty too)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.empty = nn.Parameter(torch.empty(0))

    def forward(self, x):
        return self.fc(x) + self.empty.sum()


def test_a_zero_element_parameter_saves_its_defined_statistics_and_the_hook_stays_on(tmp_path):
    torch.manual_seed(0)
    model = _WithEmpty()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rc = tp.ReductionConfig(reductions=["min", "max", "mean"], norms=["l2"], abs_reductions=["max"])
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients"], reduction_config=rc)
    hook.register_module(model)
    seen = []
    for _step in range(3):
        seen.append(model.fc.weight.detach().clone())
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2]
    for step, w in enumerate(seen):
        fc_max = t.tensor("_WithEmpty_fc.weight").reduction_value(step, "max")
        _close(fc_max, compute_reduction(w.numpy(), "max", False))
        for name in ("gradient/_WithEmpty_empty",):  # (a parameter named `empty` is in no weights collection)
            assert float(t.tensor(name).reduction_value(step, "l2")) == 0.0
            for red in ("min", "max", "mean"):  # undefined over zero elements: not saved, never invented
                with pytest.raises(TensorUnavailableForStep):
                    t.tensor(name).reduction_value(step, red)
