"""The PyTorch hook against real torch (CPU): saved values are bit-identical to what the script saw."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tensortap.pytorch as tp  # noqa: E402
from tensortap.pytorch import _capture as hook_capture  # noqa: E402
from tensortap.pytorch import _grads as hook_grads  # noqa: E402

TRAIN, EVAL, PREDICT = tp.modes.TRAIN, tp.modes.EVAL, tp.modes.PREDICT


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor


class MultiOut(nn.Module):
    """Returns a tuple, a dict or a dataclass."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y = self.fc2(h)
        if self.kind == "tuple":
            return y, h
        if self.kind == "dict":
            return {"logits": y, "hidden": h}
        return Out(y, h)


@pytest.fixture(autouse=True)
def _reset_hook(monkeypatch):
    monkeypatch.delenv("TENSORTAP_DISABLE", raising=False)
    torch.manual_seed(0)
    yield
    tp.del_hook()


def _batch(n=5):
    return torch.randn(n, 8), torch.randint(0, 4, (n,))


def _train(model, hook_or_none, steps, loss_fn=None, opt=None, record=None, mode=TRAIN):
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        x, y = _batch()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        if record is not None:
            record.append({
                "w": before,
                "g": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                "loss": loss.detach().clone(),
                "out": out.detach().clone(),
                "x": x.clone(),
            })
        opt.step()
    return opt


def test_weights_gradients_losses_bit_identical(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    rec: list = []
    _train(model, hook, 5, loss_fn=loss_fn, record=rec)
    hook.close()

    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 2, 4]
    assert set(t.tensor_names()) == {
        "Net_fc1.weight", "Net_fc1.bias", "Net_fc2.weight", "Net_fc2.bias",
        "gradient/Net_fc1.weight", "gradient/Net_fc1.bias", "gradient/Net_fc2.weight", "gradient/Net_fc2.bias",
        "CrossEntropyLoss_output_0",
    }
    for s in (0, 2, 4):
        for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            assert np.array_equal(t.tensor(f"Net_{n}").value(s), rec[s]["w"][n].numpy())
            assert np.array_equal(t.tensor(f"gradient/Net_{n}").value(s), rec[s]["g"][n].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), rec[s]["loss"].numpy())
    assert set(t.tensor_names(collection="weights")) == {"Net_fc1.weight", "Net_fc2.weight"}
    assert set(t.tensor_names(collection="biases")) == {"Net_fc1.bias", "Net_fc2.bias"}
    assert set(t.tensor_names(collection="losses")) == {"CrossEntropyLoss_output_0"}
    assert t.workers() == ["worker_0"]


def test_default_collections_save_losses_only(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1))
    loss_fn = nn.MSELoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    losses = []
    for _ in range(3):
        out = model(torch.randn(2, 8))
        loss = loss_fn(out, torch.zeros(2, 4))
        losses.append(loss.detach().clone())
        loss.backward()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names() == ["MSELoss_output_0"]
    for s in range(3):
        assert np.array_equal(t.tensor("MSELoss_output_0").value(s), losses[s].numpy())


@pytest.mark.parametrize("kind", ["tuple", "dict", "dataclass"])
def test_inputs_outputs_of_modules_with_structured_outputs(tmp_path, kind):
    model = MultiOut(kind)
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["inputs", "outputs"])
    hook.register_module(model)
    seen = []
    for _ in range(2):
        x = torch.randn(3, 8)
        out = model(x)
        y, h = (out if kind == "tuple" else (out["logits"], out["hidden"]) if kind == "dict"
                else (out.logits, out.hidden))
        seen.append((x.clone(), y.detach().clone(), h.detach().clone()))
        (y.sum() + h.sum()).backward()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    names = set(t.tensor_names())
    assert {"MultiOut_input_0", "MultiOut_output_0", "MultiOut_output_1", "fc1_input_0", "fc1_output_0",
            "fc2_input_0", "fc2_output_0"} <= names
    assert not any(n.startswith("gradient/") or n.startswith("MultiOut_fc") for n in names)
    for s, (x, y, h) in enumerate(seen):
        assert np.array_equal(t.tensor("MultiOut_input_0").value(s), x.numpy())
        assert np.array_equal(t.tensor("MultiOut_output_0").value(s), y.numpy())
        assert np.array_equal(t.tensor("MultiOut_output_1").value(s), h.numpy())
        assert np.array_equal(t.tensor("fc2_output_0").value(s), y.numpy())
    assert set(t.tensor_names(collection="inputs")) >= {"MultiOut_input_0", "fc1_input_0"}


def test_include_regex_on_module_names_and_inplace_activation(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1), include_regex=["^0_output"])
    hook.register_module(model)
    x = torch.randn(3, 8)
    pre_relu = model[0](x).detach().clone()
    model(x)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names() == ["0_output_0"]
    # The ReLU ran in place on this output afterwards: the hook copied it before.
    assert np.array_equal(t.tensor("0_output_0").value(0), pre_relu.numpy())


def test_modes_and_mode_steps_no_gradients_in_eval(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(TRAIN)
    _train(model, hook, 3, loss_fn=loss_fn)
    hook.set_mode(EVAL)
    model.eval()
    eval_losses = []
    with torch.no_grad():
        for _ in range(2):
            x, y = _batch()
            eval_losses.append(loss_fn(model(x), y).clone())
    hook.set_mode(PREDICT)
    with torch.no_grad():
        model(torch.randn(2, 8))
    hook.set_mode(TRAIN)
    model.train()
    _train(model, hook, 1, loss_fn=loss_fn)
    assert (hook.step, hook.mode_steps[TRAIN], hook.mode_steps[EVAL], hook.mode_steps[PREDICT]) == (6, 3, 1, 0)
    hook.close()

    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2, 3, 4, 5, 6]
    assert t.steps(TRAIN) == [0, 1, 2, 3]
    assert t.steps(EVAL) == [0, 1]
    assert t.steps(PREDICT) == [0]
    g = t.tensor("gradient/Net_fc1.weight")
    assert g.steps() == [0, 1, 2, 6]  # never in EVAL/PREDICT
    assert g.steps(TRAIN) == [0, 1, 2, 3]
    loss = t.tensor("CrossEntropyLoss_output_0")
    assert loss.steps(EVAL) == [0, 1]
    for i in range(2):
        assert np.array_equal(loss.value(i, mode=EVAL), eval_losses[i].numpy())
    assert t.tensor("Net_fc1.weight").steps(PREDICT) == [0]


def test_per_mode_and_per_collection_save_configs(tmp_path):
    model = Net()
    hook = tp.Hook(
        out_dir=str(tmp_path),
        save_config=tp.SaveConfig(mode_save_configs={TRAIN: tp.SaveConfigMode(save_interval=3),
                                                     EVAL: tp.SaveConfigMode(save_interval=2, start_step=1)}),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.get_collection("gradients").save_config = tp.SaveConfig(save_interval=2)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.set_mode(TRAIN)
    _train(model, hook, 7, loss_fn=loss_fn)
    hook.set_mode(EVAL)
    with torch.no_grad():
        for _ in range(3):
            loss_fn(model(torch.randn(2, 8)), torch.zeros(2, dtype=torch.long))
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor("Net_fc1.weight").steps(TRAIN) == [0, 3, 6]
    assert t.tensor("gradient/Net_fc1.weight").steps(TRAIN) == [0, 2, 4, 6]
    assert t.tensor("CrossEntropyLoss_output_0").steps(EVAL) == [2]
    assert t.tensor("Net_fc1.weight").steps(EVAL) == [2]


def test_collection_change_after_quiet_steps_takes_effect(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1000),
                   include_collections=["weights"])
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(1, 8))
    hook.get_collection("weights").save_config = tp.SaveConfig(save_interval=2)
    for _ in range(3):
        model(torch.randn(1, 8))
    hook.close()
    assert tp.create_trial(str(tmp_path)).tensor("Net_fc1.weight").steps() == [0, 4]


def test_frozen_parameters_no_crash(tmp_path):
    model = Net()
    model.fc1.weight.requires_grad_(False)
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients"])
    hook.register_module(model)
    rec: list = []
    _train(model, hook, 2, opt=torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
           record=rec)
    hook.close()
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    names = set(t.tensor_names())
    assert "Net_fc1.weight" in names and "gradient/Net_fc1.weight" not in names
    assert np.array_equal(t.tensor("gradient/Net_fc2.weight").value(1), rec[1]["g"]["fc2.weight"].numpy())
    assert np.array_equal(t.tensor("Net_fc1.weight").value(1), rec[1]["w"]["fc1.weight"].numpy())


def test_gradients_when_output_does_not_require_grad(tmp_path):
    """The loss is computed from something other than the model's output: per-parameter hooks."""

    class Side(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.last = None

        def forward(self, x):
            self.last = self.fc(x)
            return self.last.detach()

    model = Side()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["gradients"])
    hook.register_module(model)
    grads = []
    for _ in range(2):
        model.zero_grad()
        model(torch.randn(2, 4))
        model.last.pow(2).sum().backward()
        grads.append(model.fc.weight.grad.clone())
    hook.close()
    t = tp.create_trial(str(tmp_path))
    for s in range(2):
        assert np.array_equal(t.tensor("gradient/Side_fc.weight").value(s), grads[s].numpy())


def test_optimizer_variables(tmp_path):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["optimizer_variables"])
    hook.register_module(model)
    hook.register_optimizer(opt)
    bufs = []
    for _ in range(3):
        x, y = _batch()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        bufs.append(opt.state[model.fc1.weight]["momentum_buffer"].clone())
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor("optimizer/param_group_0/lr").value(2) == pytest.approx(0.05)
    for s in (0, 2):
        assert np.array_equal(t.tensor("optimizer/Net_fc1.weight/momentum_buffer").value(s), bufs[s].numpy())
    # optimizer state is not mistaken for weights
    assert not any(n.startswith("Net_") for n in t.tensor_names())


def test_losses_saved_alone_go_to_the_writer_process_as_one_batch(tmp_path):
    """Steps that save losses but no gradients send a step's small tensors together at its end; a step whose
    losses differ in dtype, or change shape, still saves exactly what the script computed, as do EVAL steps."""
    model = Net()
    loss_fn = nn.MSELoss()
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer="process", save_config=tp.SaveConfig(save_interval=1))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = []
    for step in range(8):
        if step == 6:
            hook.set_mode(EVAL)
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        opt.zero_grad()
        pred = model(x)
        loss = loss_fn(pred, y)
        aux = (pred - y).abs().mean(dim=1) if step == 4 else (pred - y).abs().max()
        if step == 3:
            aux = aux.double()
        hook.record_tensor_value("l1_loss", aux)
        rec.append((loss.detach().clone(), aux.detach().clone()))
        if step < 6:
            loss.backward()
            opt.step()
    hook.close()
    t = tp.create_trial(out)
    assert t.steps() == list(range(8))
    assert set(t.tensor_names()) == {"MSELoss_output_0", "l1_loss_output_0"}
    for s, (loss, aux) in enumerate(rec):
        assert np.array_equal(t.tensor("MSELoss_output_0").value(s), loss.numpy())
        value = t.tensor("l1_loss_output_0").value(s)
        assert value.dtype == aux.numpy().dtype and np.array_equal(value, aux.numpy())
    assert t.tensor("MSELoss_output_0").steps(mode=EVAL) == [0, 1]
    assert set(t.tensor_names(collection="losses")) == {"MSELoss_output_0", "l1_loss_output_0"}


def test_reductions_and_shapes(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients"],
                   reduction_config=tp.ReductionConfig(reductions=["mean", "max"], norms=["l2"], save_shape=True))
    hook.register_module(model)
    rec: list = []
    _train(model, hook, 1, record=rec)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    w = rec[0]["w"]["fc1.weight"].numpy()
    g = rec[0]["g"]["fc1.weight"].numpy()
    tw = t.tensor("Net_fc1.weight")
    assert tw.reduction_value(0, "l2") == pytest.approx(np.linalg.norm(w.ravel()), rel=1e-6)
    assert tw.reduction_value(0, "max") == w.max()
    assert t.tensor("gradient/Net_fc1.weight").reduction_value(0, "mean") == pytest.approx(g.mean(), rel=1e-5)
    assert tuple(tw.shape(0)) == (16, 8)


def test_save_tensor_save_scalar_and_record_tensor_value(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1))
    hook.register_module(model)
    out = model(torch.randn(2, 8))
    loss = nn.functional.mse_loss(out, torch.zeros(2, 4))
    hook.record_tensor_value("mse_loss", loss)
    t_custom = torch.arange(6.0, requires_grad=True).reshape(2, 3)
    hook.save_tensor("custom", t_custom, "mine")
    hook.save_scalar("lr", torch.tensor(0.25))
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert np.array_equal(t.tensor("mse_loss_output_0").value(0), loss.detach().numpy())
    assert "mse_loss_output_0" in t.tensor_names(collection="losses")
    assert np.array_equal(t.tensor("custom").value(0), t_custom.detach().numpy())
    assert t.tensor("scalar/lr").value(0) == 0.25


def test_async_copy_path_gives_identical_values(tmp_path):
    """The accelerator path (deferred copies written at step end), exercised on CPU tensors."""
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "outputs"])
    hook._force_async_copies = True
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    rec: list = []
    _train(model, hook, 2, loss_fn=loss_fn, record=rec)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    for s in range(2):
        assert np.array_equal(t.tensor("Net_fc2.weight").value(s), rec[s]["w"]["fc2.weight"].numpy())
        assert np.array_equal(t.tensor("gradient/Net_fc1.bias").value(s), rec[s]["g"]["fc1.bias"].numpy())
        assert np.array_equal(t.tensor("Net_output_0").value(s), rec[s]["out"].numpy())


def test_host_batch_through_the_accelerator_path_copies_every_layout():
    """The accelerator path of HostBatch (each tensor copied into its place in one host buffer per dtype) on CPU
    tensors: non-contiguous, zero-dimensional, empty and mixed-dtype tensors come back equal, in order."""
    from tensortap.pytorch._tensors import HostBatch

    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(3, 4, generator=g).t(), torch.tensor(2.5), torch.empty(0, 3), torch.arange(6).reshape(2, 3),
          torch.randn(5, generator=g)[::2], torch.randn(2, 2, generator=g)]
    got = HostBatch(ts, force_async=True).arrays()
    assert len(got) == len(ts)
    for t, a in zip(ts, got, strict=True):
        assert a.shape == tuple(t.shape) and a.dtype == t.numpy().dtype
        assert np.array_equal(a, t.numpy())


def test_bfloat16_parameters(tmp_path):
    pytest.importorskip("ml_dtypes")
    model = Net().to(torch.bfloat16)
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights"])
    hook.register_module(model)
    model(torch.randn(2, 8, dtype=torch.bfloat16))
    hook.close()
    got = tp.create_trial(str(tmp_path)).tensor("Net_fc1.weight").value(0)
    assert str(got.dtype) == "bfloat16"
    assert np.array_equal(got.view(np.int16), model.fc1.weight.detach().view(torch.int16).numpy())


def test_nested_registration_counts_each_forward_once(tmp_path):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights"])
    hook.register_module(model.fc1)  # a submodule first: replaced as root by its parent below
    hook.register_module(model)
    hook.register_module(model.fc2)  # inside a registered module: nothing to do
    for _ in range(3):
        model(torch.randn(1, 8))
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2]
    assert "Net_fc1.weight" in t.tensor_names()


def test_dataparallel_wrapper_names(tmp_path):
    model = nn.DataParallel(Net())
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients"])
    hook.register_module(model)
    rec: list = []
    _train(model, hook, 1, record=rec)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert np.array_equal(t.tensor("DataParallel_module.fc1.weight").value(0), rec[0]["w"]["module.fc1.weight"].numpy())
    assert np.array_equal(t.tensor("gradient/DataParallel_module.fc1.weight").value(0),
                          rec[0]["g"]["module.fc1.weight"].numpy())


def test_torch_compile_model(tmp_path):
    model = Net()
    compiled = torch.compile(model, backend="eager")
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "gradients", "losses", "outputs"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(compiled)
    hook.register_loss(loss_fn)
    rec: list = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(compiled, hook, 4, loss_fn=loss_fn, opt=opt, record=rec)
    hook.close()
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 2]
    for s in (0, 2):
        # named like the uncompiled model
        assert np.array_equal(t.tensor("Net_fc1.weight").value(s), rec[s]["w"]["_orig_mod.fc1.weight"].numpy())
        assert np.array_equal(t.tensor("gradient/Net_fc2.bias").value(s), rec[s]["g"]["_orig_mod.fc2.bias"].numpy())
        assert np.array_equal(t.tensor("Net_output_0").value(s), rec[s]["out"].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), rec[s]["loss"].numpy())


def test_model_compile_in_place(tmp_path):
    model = Net()
    model.compile(backend="eager")
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    rec: list = []
    _train(model, hook, 3, loss_fn=loss_fn, record=rec)
    hook.close()
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2]
    for s in range(3):
        assert np.array_equal(t.tensor("Net_fc1.weight").value(s), rec[s]["w"]["fc1.weight"].numpy())
        assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(s), rec[s]["g"]["fc1.weight"].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), rec[s]["loss"].numpy())


@pytest.mark.filterwarnings("ignore::UserWarning")  # dynamo: "does not know how to trace" the hook's builtins
def test_model_compiled_in_place_after_registration(tmp_path):
    """model.compile() after register_module: dynamo traces through the root's pre-hook; steps and values stay
    right (the hook's own code runs eagerly at graph breaks)."""
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    model.compile(backend="eager")
    rec: list = []
    _train(model, hook, 5, loss_fn=loss_fn, record=rec)
    hook.close()
    assert hook.error_count == 0
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 2, 4]
    for s in (0, 2, 4):
        assert np.array_equal(t.tensor("Net_fc1.weight").value(s), rec[s]["w"]["fc1.weight"].numpy())
        assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(s), rec[s]["g"]["fc1.weight"].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), rec[s]["loss"].numpy())


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_injected_failure_disables_hook_and_training_continues(tmp_path, monkeypatch, caplog, writer):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"], writer=writer)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    calls = {"n": 0}
    # the copy of saved tensors into what the writer reserved: a host buffer (thread) or its ring (process)
    from tensortap.transport.process_writer import Reservation
    from tensortap.transport.thread_writer import HostReservation

    owner, attr = (HostReservation if writer == "thread" else Reservation), "copy_in"
    real = getattr(owner, attr)

    def failing(*args):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise RuntimeError("injected failure")
        return real(*args)

    monkeypatch.setattr(owner, attr, failing)
    w0 = model.fc1.weight.detach().clone()
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        _train(model, hook, 6, loss_fn=loss_fn)
    assert hook.disabled and hook.error_count == 1
    assert sum("turns itself off" in r.getMessage() for r in caplog.records) == 1
    assert not torch.equal(model.fc1.weight, w0)  # training went on: all 6 optimizer steps ran
    assert calls["n"] == 3  # and the hook did no more work after it failed
    hook.close()


def test_failure_inside_backward_does_not_break_backward(tmp_path, monkeypatch):
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["gradients"])
    hook.register_module(model)

    def boom(t):
        raise ValueError("injected in the autograd callback")


    for module in (hook_capture, hook_grads):  # (runs in the end-of-backward callback)
        monkeypatch.setattr(module, "ring_sources", boom)
    rec: list = []
    _train(model, hook, 3, record=rec)
    assert hook.disabled
    assert len(rec) == 3 and all(r["g"] for r in rec)
    hook.close()


def test_disable_env_turns_everything_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    assert not model._forward_pre_hooks and not loss_fn._forward_hooks
    _train(model, hook, 2, loss_fn=loss_fn)
    hook.close()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.idx"))


def test_get_hook_singleton_and_json_config(tmp_path, monkeypatch):
    assert tp.get_hook() is None
    monkeypatch.delenv("TENSORTAP_CONFIG", raising=False)
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "missing.json"))
    assert tp.get_hook(create_if_not_exists=True) is None
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "2"},
        "CollectionConfigurations": [{"CollectionName": "weights"}],
    }))
    monkeypatch.setenv("TENSORTAP_CONFIG", str(cfg))
    hook = tp.get_hook(create_if_not_exists=True)
    assert isinstance(hook, tp.Hook) and tp.get_hook() is hook
    assert "weights" in hook.include_collections
    model = Net()
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(1, 8))
    hook.close()
    assert tp.create_trial(str(tmp_path / "run")).tensor("Net_fc1.weight").steps() == [0, 2]
    other = tp.Hook(out_dir=str(tmp_path / "other"))
    assert tp.get_hook() is other
    tp.del_hook()
    assert tp.get_hook() is None
    other.close()


def test_create_from_json_file_and_register_block(tmp_path):
    """smdebug's way in: a PyTorch hook from a JSON config file, the model hooked with register_block; the
    collections and intervals of the file apply and the values are those the script saw."""
    cfg = tmp_path / "hook.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [{"CollectionName": "weights"},
                                     {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "2"}}],
    }))
    hook = tp.Hook.create_from_json_file(str(cfg))
    assert type(hook) is tp.Hook and hook.out_dir == str(tmp_path / "run")
    model = Net()
    hook.register_block(model)
    rec: list = []
    _train(model, hook, 5, record=rec)
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.tensor("Net_fc1.weight").steps() == [0, 3]
    assert t.tensor("gradient/Net_fc2.bias").steps() == [0, 2, 4]
    assert not [n for n in t.tensor_names() if "Loss" in n]  # (losses: not in the file)
    for s in (0, 3):
        assert np.array_equal(t.tensor("Net_fc1.weight").value(s), rec[s]["w"]["fc1.weight"].numpy())
    for s in (0, 2, 4):
        assert np.array_equal(t.tensor("gradient/Net_fc2.bias").value(s), rec[s]["g"]["fc2.bias"].numpy())


def test_import_tensortap_does_not_import_torch():
    code = "import sys, tensortap; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_a_plain_job_imports_no_dtensor_machinery(tmp_path):
    """A job that never uses DTensors (no FSDP2, no tensor parallelism) pays nothing for them: importing
    tensortap.pytorch and saving weights and gradients imports neither torch.distributed.tensor nor sympy, which
    it brings (~0.5 s and ~40 MB at import). (The job updates its weights itself: making a torch optimizer imports
    torch._dynamo, which imports them.)"""
    code = textwrap.dedent("""
        import sys
        import torch
        import tensortap.pytorch as tp
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        hook = tp.Hook(out_dir=sys.argv[1], save_config=tp.SaveConfig(save_interval=1),
                       include_collections=["weights", "gradients", "losses"])
        hook.register_module(model)
        loss_fn = torch.nn.MSELoss()
        hook.register_loss(loss_fn)
        for _ in range(2):
            model.zero_grad()
            loss_fn(model(torch.randn(5, 4)), torch.randn(5, 2)).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
        hook.close()
        print(sorted(m for m in ("torch.distributed.tensor", "sympy") if m in sys.modules))
    """)
    out = str(tmp_path / "run")
    done = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
    t = tp.create_trial(out)
    assert t.tensor("gradient/Sequential_0.weight").steps() == [0, 1]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_second_backward_of_a_step_replaces_gradients_and_flush_mid_step(tmp_path, writer):
    """Two backward passes in one step save the accumulated gradients once (those the optimizer's step
    consumes); a flush between the optimizer's step and the next step makes the step's gradients readable
    (both writers)."""
    model = Net()
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer=writer, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients"])
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(3):
        x, y = _batch()
        opt.zero_grad()
        out_ = model(x)
        nn.functional.cross_entropy(out_, y).backward(retain_graph=True)
        (out_.square().mean()).backward()  # accumulates into the same .grad
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        if step == 1:
            hook.flush()
            t = tp.create_trial(out)
            assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(1), grads[1]["fc1.weight"].numpy())
    hook.close()
    t = tp.create_trial(out)
    assert t.steps() == [0, 1, 2]
    for step in range(3):
        for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            assert np.array_equal(t.tensor(f"gradient/Net_{n}").value(step), grads[step][n].numpy())


def test_module_inputs_saved_once_a_collection_asks_for_them_mid_run(tmp_path):
    """Inputs nobody saves are skipped cheaply on later steps; a regex added mid-run still takes effect."""
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["losses", "loss_inputs"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    xs = []
    for step in range(4):
        if step == 2:
            hook.get_collection("loss_inputs").include(r"^CrossEntropyLoss_input_0$")
        x, y = _batch()
        out = model(x)
        xs.append(out.detach().clone())
        loss_fn(out, y).backward()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor("CrossEntropyLoss_input_0").steps() == [2, 3]
    for s in (2, 3):
        assert np.array_equal(t.tensor("CrossEntropyLoss_input_0").value(s), xs[s].numpy())
    assert t.tensor("CrossEntropyLoss_output_0").steps() == [0, 1, 2, 3]
    assert not t.has_tensor("CrossEntropyLoss_input_1")


def test_gradients_saved_in_train_after_eval_with_the_same_collections(tmp_path):
    # One collection holding everything saves in EVAL (no gradients there) and in TRAIN: the TRAIN steps
    # must not reuse what EVAL captured (the same set of collections saving, another mode).
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["everything"])
    hook.get_collection("everything").include(".*")
    hook.register_module(model)
    hook.set_mode(tp.modes.EVAL)
    with torch.no_grad():
        model(_batch()[0])
    hook.set_mode(tp.modes.TRAIN)
    rec: list = []
    _train(model, hook, 2, record=rec)
    hook.close()
    trial = tp.create_trial(str(tmp_path / "run"))
    g = trial.tensor("gradient/Net_fc1.weight")
    assert g.steps(tp.modes.TRAIN) == [0, 1] and g.steps(tp.modes.EVAL) == []
    assert np.array_equal(g.value(1), rec[0]["g"]["fc1.weight"].numpy())


def test_one_message_for_weights_and_gradients_and_the_steps_that_break_its_layout(tmp_path):
    """Once learned, a saving step sends its weights, gradients and loss in one message of the writer process.
    Steps without a backward pass, with a flush before it, with two backward passes or without the loss still
    save exactly what the training saw."""
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer="process", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = []
    for step in range(7):
        x, y = _batch()
        opt.zero_grad()
        w = {n: p.detach().clone() for n, p in model.named_parameters()}
        out_ = model(x)
        loss = loss_fn(out_, y)
        if step == 3:
            hook.flush()  # before the backward pass: the weights go alone
            t = tp.create_trial(out)
            assert np.array_equal(t.tensor("Net_fc1.weight").value(3), w["fc1.weight"].numpy())
        if step == 4:
            loss.backward(retain_graph=True)
            out_.square().mean().backward()  # accumulates: the step saves the sum
        elif step == 5:
            loss_fn(out_, y).backward()  # a second call of the loss: two small tensors, not the layout's one
        elif step != 2:  # step 2: no backward pass
            loss.backward()
        rec.append({"w": w, "g": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                    "loss": loss.detach().clone()})
        opt.step()
    hook.close()
    t = tp.create_trial(out)
    assert t.steps() == list(range(7))
    for s in range(7):
        for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            assert np.array_equal(t.tensor(f"Net_{n}").value(s), rec[s]["w"][n].numpy())
            if s != 2:
                assert np.array_equal(t.tensor(f"gradient/Net_{n}").value(s), rec[s]["g"][n].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), rec[s]["loss"].numpy())
    assert t.tensor("gradient/Net_fc1.weight").steps() == [0, 1, 3, 4, 5, 6]


class ScaledMSELoss(nn.Module):
    """A loss taking an optional non-tensor argument, per-sample losses when `per_sample` is set."""

    per_sample = False

    def forward(self, out, target, scale=1.0):
        per = ((out - target) ** 2).mean(dim=1) * scale
        return per if self.per_sample else per.mean()


def test_loss_shortcut_follows_changes_in_what_is_saved(tmp_path):
    """Once a step has shown that a loss module's inputs are saved by no collection and its output travels with
    the gradients, later steps take a shortcut; a collection asking for the inputs, a non-tensor argument, a
    second call and an output of another shape still save exactly what the training saw."""
    model = Net()
    loss_fn = ScaledMSELoss()
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer="process", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses", "loss_inputs"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = []
    for step in range(11):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        if step == 8:
            hook.get_collection("loss_inputs").include(r"^ScaledMSELoss_input_0$")
        loss_fn.per_sample = step == 6
        opt.zero_grad()
        out_ = model(x)
        loss = loss_fn(out_, y, 2.0) if step == 3 else loss_fn(out_, y)
        losses = [loss.detach().clone()]
        if step == 5:
            losses.append(loss_fn(out_, y * 2).detach().clone())  # a second call: ScaledMSELoss_output_1
        (loss.sum() if step == 6 else loss).backward()
        rec.append({"out": out_.detach().clone(), "losses": losses,
                    "g": {n: p.grad.clone() for n, p in model.named_parameters()}})
        opt.step()
    hook.close()
    t = tp.create_trial(out)
    assert t.steps() == list(range(11))
    for s in range(11):
        assert np.array_equal(t.tensor("ScaledMSELoss_output_0").value(s), rec[s]["losses"][0].numpy())
        for n, g in rec[s]["g"].items():
            assert np.array_equal(t.tensor(f"gradient/Net_{n}").value(s), g.numpy())
    assert t.tensor("ScaledMSELoss_input_0").steps() == [8, 9, 10]
    for s in (8, 9, 10):
        assert np.array_equal(t.tensor("ScaledMSELoss_input_0").value(s), rec[s]["out"].numpy())
    assert t.tensor("ScaledMSELoss_output_1").steps() == [5]
    assert np.array_equal(t.tensor("ScaledMSELoss_output_1").value(5), rec[5]["losses"][1].numpy())
    assert t.tensor("ScaledMSELoss_output_0").value(6).shape == (5,)
    assert not t.has_tensor("ScaledMSELoss_input_1") and not t.has_tensor("ScaledMSELoss_input_2")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_model_large_enough_for_direct_writes_saves_exact_losses_and_gradients(tmp_path, writer):
    """Gradients above the writer process's direct-write size (64 KB) go to disk straight from shared memory;
    the loss sent in the same message is kept (it was saved as 0 when the page's tail was cleared)."""
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))  # 136 KB of gradients
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), writer=writer, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = []
    for _ in range(4):
        x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
        opt.zero_grad()
        w = model[0].weight.detach().clone()
        loss = loss_fn(model(x), y)
        loss.backward()
        rec.append((w, model[0].weight.grad.clone(), loss.detach().clone()))
        opt.step()
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    for s, (w, g, loss) in enumerate(rec):
        assert np.array_equal(t.tensor("Sequential_0.weight").value(s), w.numpy())
        assert np.array_equal(t.tensor("gradient/Sequential_0.weight").value(s), g.numpy())
        assert t.tensor("CrossEntropyLoss_output_0").value(s) == loss.item() != 0


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_everything_of_a_large_model_in_train_and_eval_is_saved_exactly(tmp_path, writer):
    """Weights, biases, gradients, losses and every module's inputs and outputs of a model whose tensors are
    large enough for the writer process's direct writes (64 x 512 activations: 128 KB), over TRAIN, EVAL
    and TRAIN again, read back bit-identical to what the training saw."""
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 128), nn.ReLU(), nn.Linear(128, 4))
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), writer=writer, save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients", "losses", "inputs", "outputs"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    seen: dict = {}
    names = {m: ("Sequential" if n == "" else n) for n, m in model.named_modules()}

    def record(m, inputs, output):  # the test's own record of every module's input and output
        seen[f"{names[m]}_input_0"] = inputs[0].detach().clone()
        seen[f"{names[m]}_output_0"] = output.detach().clone()

    for m in model.modules():
        m.register_forward_hook(record)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    expect: dict = {}  # (mode, mode step) -> {name: value}
    plan = [(TRAIN, 5), (EVAL, 2), (TRAIN, 2)]
    for mode, n in plan:
        hook.set_mode(mode)
        for _ in range(n):
            x, y = torch.randn(64, 64), torch.randint(0, 4, (64,))
            seen.clear()
            params = {f"Sequential_{k}": p.detach().clone() for k, p in model.named_parameters()}
            if mode == TRAIN:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                grads = {f"gradient/Sequential_{k}": p.grad.clone() for k, p in model.named_parameters()}
                opt.step()
            else:
                with torch.no_grad():
                    loss = loss_fn(model(x), y)
                grads = {}
            step = hook.mode_steps[mode]
            if step % 2 == 0:
                expect[(mode, step)] = {**params, **grads, **dict(seen), "CrossEntropyLoss_output_0": loss.detach()}
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert list(expect) == [(TRAIN, 0), (TRAIN, 2), (TRAIN, 4), (EVAL, 0), (TRAIN, 6)]
    for (mode, step), values in expect.items():
        if mode == EVAL:
            assert not any(n.startswith("gradient/") for n in values)
            assert step not in t.tensor("gradient/Sequential_0.weight").steps(mode=EVAL)
        for name, v in values.items():
            got = t.tensor(name).value(step, mode=mode)
            assert got.shape == tuple(v.shape) and np.array_equal(got, v.numpy()), (mode, step, name)
