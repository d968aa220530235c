"""torch.compile and the saving cadence: a compiled model, hooked in any order, compiles once; saving and quiet
steps (the hook's handles installed and removed between them) and a plain compiled model trained in between
cause no recompilation and no graph break, and the steps that save hold what the script reads at them (the
steps are counted right when the model's forward is unseen and quiet steps are only counted)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import tensortap.pytorch as tp  # noqa: E402

ORDERS = ["register_then_compile", "compile_then_register", "module_compile"]
# A model of the script's own class (dynamo compiles its forward, the module call's hooks run outside) and a
# torch.nn container (dynamo compiles the call, hooks and all)
MODELS = ["Net", "Sequential"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _model(kind: str) -> nn.Module:
    if kind == "Net":
        return Net()
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _names(model: nn.Module) -> list[str]:
    return [f"{type(model).__name__}_{n}" for n, _p in model.named_parameters()]


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _hooked(order: str, hook, model: nn.Module):
    kw = {"backend": "aot_eager", "fullgraph": True}
    if order == "register_then_compile":
        hook.register_module(model)
        return torch.compile(model, **kw)
    if order == "compile_then_register":
        run = torch.compile(model, **kw)
        hook.register_module(run)
        return run
    hook.register_module(model)
    model.compile(**kw)
    return model


def _train(order: str, kind: str, hook, steps: int, record: dict) -> None:
    """Train a hooked compiled Net and, step by step beside it, a plain compiled Net; everything compiles in step
    0, and steps 1.. run with recompilation an error. `record`: what the script reads at each step."""
    torch.manual_seed(0)
    model = _model(kind)
    plain = _model(kind)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    run = _hooked(order, hook, model)
    plain_run = torch.compile(plain, backend="aot_eager", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    record["names"] = _names(model)
    opt.register_step_pre_hook(lambda o, a, k: record["grads"].append([p.grad.clone() for p in model.parameters()]))
    for step in range(steps):
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            record["weights"].append([p.detach().clone() for p in model.parameters()])
            x, y = _batch(step)
            opt.zero_grad()
            loss = loss_fn(run(x), y)
            loss.backward()
            record["losses"].append(loss.detach().clone())
            opt.step()
            plain_opt.zero_grad()
            nn.functional.cross_entropy(plain_run(x), y).backward()
            plain_opt.step()
        if step == 0:
            record["graphs"] = counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("order", ORDERS)
def test_saving_and_quiet_steps_compile_once(tmp_path, order, kind):
    torch._dynamo.reset()
    counters.clear()
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=3),
                   include_collections=["weights", "biases", "gradients", "losses"])
    record: dict = {"grads": [], "weights": [], "losses": []}
    _train(order, kind, hook, 11, record)
    hook.close()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == record["graphs"] >= 1
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 3, 6, 9]
    for s in t.steps():
        assert t.tensor("CrossEntropyLoss_output_0").value(s).tobytes() == record["losses"][s].numpy().tobytes()
        for i, n in enumerate(record["names"]):
            assert t.tensor(n).value(s).tobytes() == record["weights"][s][i].numpy().tobytes(), (s, n)
            assert t.tensor(f"gradient/{n}").value(s).tobytes() == record["grads"][s][i].numpy().tobytes(), (s, n)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("order", ORDERS)
def test_statistics_only_every_other_step_compiles_once(tmp_path, order, kind):
    """Statistics alone (no raw values) at every other step: the norms and extrema of the tensors the script reads."""
    torch._dynamo.reset()
    counters.clear()
    rc = tp.ReductionConfig(norms=["l2"], reductions=["max", "min"], save_raw_tensor=False)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients"], reduction_config=rc)
    record: dict = {"grads": [], "weights": [], "losses": []}
    _train(order, kind, hook, 7, record)
    hook.close()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == record["graphs"] >= 1
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 2, 4, 6]
    for s in t.steps():
        for i, n in enumerate(record["names"]):
            for name, value in ((n, record["weights"][s][i]), (f"gradient/{n}", record["grads"][s][i])):
                tensor = t.tensor(name)
                assert tensor.reduction_value(s, "max") == value.max().item(), (s, name)
                assert tensor.reduction_value(s, "min") == value.min().item(), (s, name)
                np.testing.assert_allclose(tensor.reduction_value(s, "l2"),
                                           torch.linalg.vector_norm(value).item(), rtol=1e-6)
