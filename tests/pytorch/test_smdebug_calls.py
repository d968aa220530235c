"""smdebug's PyTorch calls, as its docs and tests make them, on tensortap's hook (real torch, CPU): the default
`losses` collection is always saved, `save_scalar(name, value, sm_metric, timestamp)`, and
`Collection.add_module_tensors(module, inputs, outputs)` saving exactly that module's inputs and outputs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import tensortap.pytorch as tp  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402

TRAIN, EVAL = tp.modes.TRAIN, tp.modes.EVAL


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    monkeypatch.delenv("TENSORTAP_DISABLE", raising=False)
    torch.manual_seed(0)
    yield
    tp.del_hook()


class Net(nn.Module):
    """smdebug's test net (tests/pytorch/utils.py) made small, plus `fc10` beside `fc1` (names that share a
    prefix). `relu1` is put in the `relu_activations` collection by the model itself, before it is registered,
    through get_hook(), as smdebug's test does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.relu1 = nn.ReLU()
        hook = tp.get_hook()
        if hook is not None:
            hook.get_collection("relu_activations").add_module_tensors(self.relu1)
        self.fc10 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(self.fc10(self.relu1(self.fc1(x)))), dim=1)


def _record_io(module, seen, name):
    def fn(_m, inputs, output):
        seen.setdefault(name, []).append(([t.detach().clone() for t in inputs], output.detach().clone()))

    return module.register_forward_hook(fn)


def _train(model, steps, loss_fn=None, seen=None):
    loss_fn = loss_fn or nn.NLLLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        losses.append(loss.detach().clone())
        loss.backward()
        opt.step()
    return losses


# --- default collections ------------------------------------------------------------------------------------


def test_losses_are_saved_whatever_include_collections_names(tmp_path):
    """smdebug's 'default collections saved': a PyTorch hook saves `losses` in addition to include_collections."""
    model, loss_fn = Net(), nn.NLLLoss()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=2), include_collections=["weights"])
    assert "losses" in hook.include_collections
    hook.register_module(model)
    hook.register_loss(loss_fn)
    losses = _train(model, 5, loss_fn)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names(collection="losses") == ["NLLLoss_output_0"]
    assert t.tensor("NLLLoss_output_0").steps() == [0, 2, 4]
    for s in (0, 2, 4):
        assert np.array_equal(t.tensor("NLLLoss_output_0").value(s), losses[s].numpy())
    assert set(t.tensor_names(collection="weights")) == {"Net_fc1.weight", "Net_fc10.weight", "Net_fc2.weight"}


def test_a_default_collection_is_turned_off_by_a_save_config_that_saves_nothing(tmp_path):
    """smdebug's documented way (docs/api.md, and its own Keras tests): the collection's end_step=0."""
    model, loss_fn = Net(), nn.NLLLoss()
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1), include_collections=["biases"])
    hook.get_collection("losses").save_config = tp.SaveConfig(end_step=0)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    _train(model, 3, loss_fn)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names(collection="losses") == []
    assert t.tensor("Net_fc1.bias").steps() == [0, 1, 2]
    with pytest.raises(AttributeError, match=r"SaveConfig\(end_step=...\)"):
        hook.get_collection("losses").save_config.end_step = 0  # (docs/api.md's one-liner: a clear error)


def test_tensortap_run_keeps_losses_whatever_rules_and_collections_are_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
        for step in range(12):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        """))
    out = str(tmp_path / "job")
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    r = subprocess.run([exe, "run", "--out-dir", out, "--save-interval", "5", "--rule", "vanishing_gradient",
                        "--collection", "weights", "--json", "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode in (0, 3), (r.stdout, r.stderr[-3000:])
    t = tp.create_trial(out)
    assert t.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    assert t.tensor("CrossEntropyLoss_output_0").steps() == [0, 5, 10]
    assert t.tensor_names(collection="weights") and t.tensor_names(collection="gradients")
    assert json.loads(r.stdout)["rules"][0]["name"] == "vanishing_gradient"


# --- save_scalar ----------------------------------------------------------------------------------------------


def test_save_scalar_as_smdebugs_test_calls_it(tmp_path):
    """tests/pytorch/test_hook_save_scalar_pytorch.py: scalars before, during and after training, with sm_metric
    and timestamp given by keyword; every one is saved, whatever the save config; sm_metric=True ones are also in
    `sm_metrics`; the other tensors keep to the save config."""
    save_config = tp.SaveConfig(mode_save_configs={TRAIN: tp.SaveConfigMode(save_interval=2),
                                                   EVAL: tp.SaveConfigMode(save_interval=1)})
    hook = tp.Hook(out_dir=str(tmp_path), include_collections=["weights", "scalars"], save_config=save_config)
    model, criterion = Net(), nn.NLLLoss()
    hook.register_module(model)
    hook.register_loss(criterion)
    ts = time.time()
    hook.save_scalar("pt_num_steps", 4, sm_metric=True, timestamp=ts)
    hook.save_scalar("pt_before_train", 1, sm_metric=False, timestamp=None)
    hook.set_mode(TRAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        x, y = torch.rand(6, 8), torch.randint(0, 4, (6,))
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        hook.save_scalar("pt_loss", loss, True)  # (a one-element tensor; sm_metric positional, as smdebug's)
        opt.step()
    hook.save_scalar("pt_after_train", 1.5, sm_metric=False, timestamp=ts)
    hook.set_mode(EVAL)
    with torch.no_grad():
        for _ in range(3):
            criterion(model(torch.rand(6, 8)), torch.randint(0, 4, (6,)))
    hook.close()

    t = tp.create_trial(str(tmp_path))
    scalars = {"scalar/pt_num_steps", "scalar/pt_before_train", "scalar/pt_loss", "scalar/pt_after_train"}
    assert set(t.tensor_names(regex="^scalar/")) == scalars
    assert set(t.tensor_names(collection="sm_metrics")) == {"scalar/pt_num_steps", "scalar/pt_loss"}
    assert set(t.tensor_names(collection="scalars")) == scalars
    assert t.tensor("scalar/pt_loss").steps(mode=TRAIN) == [0, 1, 2, 3]  # (every step, whatever the config)
    # before training: saved at the first step, whose global step stays 0 (as in smdebug); after the loop: in its
    # last step, still open
    assert t.tensor("scalar/pt_num_steps").steps() == [0] and t.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert float(t.tensor("scalar/pt_num_steps").value(0, mode=TRAIN)) == 4
    assert float(t.tensor("scalar/pt_after_train").value(3, mode=TRAIN)) == 1.5
    assert t.tensor("Net_fc1.weight").steps(mode=TRAIN) == [0, 2]
    assert t.tensor("Net_fc1.weight").steps(mode=EVAL) == [0, 1, 2]
    assert t.tensor("NLLLoss_output_0").steps(mode=TRAIN) == [0, 2]  # (losses: saved though not named)


def test_save_scalar_refuses_a_non_bool_sm_metric_naming_it(tmp_path):
    """tensortap's old third parameter was `timestamp`: a script passing it positionally gets a clear error."""
    hook = tp.Hook(out_dir=str(tmp_path))
    with pytest.raises(InvalidConfiguration, match=r"sm_metric=1700000000\.5.*True or False"):
        hook.save_scalar("lr", 0.1, 1700000000.5)
    with pytest.raises(InvalidConfiguration, match="timestamp='now'"):
        hook.save_scalar("lr", 0.1, timestamp="now")
    hook.close()


# --- add_module_tensors -------------------------------------------------------------------------------------


def test_add_module_tensors_saves_exactly_that_modules_inputs_and_outputs(tmp_path):
    """tests/pytorch/test_simple_write.py's "module-input-output" hook: weights, gradients, biases and a
    collection `l_mod` holding one module's inputs and outputs."""
    model = Net()
    seen: dict = {}
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_steps=[0, 2]),
                   include_collections=["weights", "gradients", "biases", "l_mod"])
    hook.get_collection("l_mod").add_module_tensors(model.fc1, inputs=True, outputs=True)
    hook.register_hook(model)
    handles = [_record_io(model.fc1, seen, "fc1"), _record_io(model.fc10, seen, "fc10")]
    _train(model, 3)
    hook.close()
    for h in handles:
        h.remove()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names(collection="l_mod") == ["fc1_input_0", "fc1_output_0"]  # (not fc10's)
    assert not [n for n in t.tensor_names() if n.startswith("fc10_")]
    for s in (0, 2):
        inputs, output = seen["fc1"][s]
        assert np.array_equal(t.tensor("fc1_input_0").value(s), inputs[0].numpy())
        assert np.array_equal(t.tensor("fc1_output_0").value(s), output.numpy())
    assert t.tensor("fc1_output_0").steps() == [0, 2]
    assert "fc1_input_0" not in t.tensor_names(collection="weights")


def test_add_module_tensors_defaults_to_outputs_before_the_model_is_registered(tmp_path):
    """tests/pytorch/utils.py: the model's constructor puts `relu1` in `relu_activations` through get_hook()
    (outputs only, the default) before the hook has seen the model; the root module by its class name."""
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["relu_activations", "root_io"])
    tp.set_hook(hook)
    model = Net()
    hook.get_collection("root_io").add_module_tensors(model, inputs=True, outputs=False)
    seen: dict = {}
    handles = [_record_io(model.relu1, seen, "relu1"), _record_io(model, seen, "Net")]
    hook.register_module(model)
    _train(model, 2)
    hook.close()
    for h in handles:
        h.remove()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names(collection="relu_activations") == ["relu1_output_0"]
    assert t.tensor_names(collection="root_io") == ["Net_input_0"]
    for s in (0, 1):
        assert np.array_equal(t.tensor("relu1_output_0").value(s), seen["relu1"][s][1].numpy())
        assert np.array_equal(t.tensor("Net_input_0").value(s), seen["Net"][s][0][0].numpy())


def test_add_module_tensors_of_a_module_outside_the_model_warns_once(tmp_path, caplog):
    model, stray = Net(), nn.Linear(3, 3)
    hook = tp.Hook(out_dir=str(tmp_path), save_config=tp.SaveConfig(save_interval=1), include_collections=["mine"])
    hook.get_collection("mine").add_module_tensors(stray, outputs=True)
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        _train(model, 2)
    hook.close()
    warned = [r.getMessage() for r in caplog.records if "add_module_tensors" in r.getMessage()]
    assert len(warned) == 1 and "mine.add_module_tensors(Linear)" in warned[0]
    assert tp.create_trial(str(tmp_path)).tensor_names(collection="mine") == []
    with pytest.raises(InvalidConfiguration, match="inputs='yes'"):
        hook.get_collection("mine").add_module_tensors(model.fc1, inputs="yes")
    with pytest.raises(InvalidConfiguration, match="torch.nn.Module"):
        hook.get_collection("mine").add_module_tensors("fc1")
