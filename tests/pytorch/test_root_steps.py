"""A registered root module's forwards are the job's steps (its forward pre-hook): counted once per forward on
every call path of torch, and out of the way of everything else a module does (its own hooks, copies, pickling)."""

from __future__ import annotations

import copy
import io
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tensortap.pytorch as tp  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    monkeypatch.delenv("TENSORTAP_DISABLE", raising=False)
    torch.manual_seed(0)
    yield
    tp.del_hook()


def _hook(tmp_path, **cfg):
    return tp.Hook(out_dir=str(tmp_path / "run"), save_config=tp.SaveConfig(**cfg),
                   include_collections=["weights", "gradients", "losses"])


def _step(model, loss_fn=None):
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    loss = loss_fn(model(torch.randn(5, 8, requires_grad=True)), torch.randint(0, 4, (5,)))
    loss.backward()
    return loss


def test_each_forward_of_the_root_is_one_step_and_close_leaves_no_hook(tmp_path):
    model = Net()
    hook = _hook(tmp_path, save_interval=3)
    hook.register_module(model)
    for _ in range(7):
        _step(model)
    assert hook.step == 6
    hook.close()
    for m in model.modules():  # nothing of the hook's left on the model
        assert not m._forward_pre_hooks and not m._forward_hooks and not m._backward_hooks
    model(torch.randn(2, 8))  # and the model still runs
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 3, 6]


def test_steps_counted_once_per_forward_on_torch_slow_path_too(tmp_path):
    """A user's own forward, pre- and full backward hooks on the root: each forward is still one step and
    their hooks all run."""
    model = Net()
    hook = _hook(tmp_path, save_interval=2)
    hook.register_module(model)
    seen = {"pre": 0, "fwd": 0, "bwd": 0}
    h1 = model.register_forward_pre_hook(lambda m, a: seen.__setitem__("pre", seen["pre"] + 1))
    h2 = model.register_forward_hook(lambda m, a, o: seen.__setitem__("fwd", seen["fwd"] + 1))
    h3 = model.register_full_backward_hook(lambda m, gi, go: seen.__setitem__("bwd", seen["bwd"] + 1))
    grads = []
    for _ in range(5):
        model.zero_grad()
        _step(model)
        grads.append(model.fc1.weight.grad.clone())
    assert seen == {"pre": 5, "fwd": 5, "bwd": 5}
    assert hook.step == 4
    for h in (h1, h2, h3):
        h.remove()
    assert len(model._backward_hooks) == 0
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 2, 4]
    for s in (0, 2, 4):
        assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(s), grads[s].numpy())


def test_submodule_calls_and_hook_inspection_do_not_count(tmp_path):
    model = Net()
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model)
    model(torch.randn(2, 8))
    for _ in range(3):
        assert not model._backward_hooks  # e.g. a library inspecting the module's hooks
        model.fc1(torch.randn(2, 8))  # a submodule called on its own
    assert hook.step == 0
    hook.close()


def test_pickled_and_deepcopied_models_do_not_count(tmp_path):
    model = Net()
    hook = _hook(tmp_path, save_steps=[0])
    hook.register_module(model)
    model(torch.randn(2, 8))
    model(torch.randn(2, 8))  # a step that saves nothing: no hooks of the saving step left on the model
    buf = io.BytesIO()
    torch.save(model, buf)  # a whole-model save must not drag the hook along
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    twin = copy.deepcopy(model)
    x = torch.randn(2, 8)
    assert torch.equal(loaded(x), model.fc2(torch.relu(model.fc1(x))))
    assert torch.equal(twin(x), loaded(x))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    sys.modules["tensortap"], saved = None, sys.modules["tensortap"]  # a process without tensortap loads it
    try:
        again = torch.load(buf, weights_only=False)
    finally:
        sys.modules["tensortap"] = saved
    assert torch.equal(again(x), loaded(x))
    assert hook.step == 1  # no copy advanced the hook
    model(torch.randn(2, 8))
    assert hook.step == 2
    assert torch.equal(loaded.fc1.weight, model.fc1.weight)
    hook.close()


def test_module_with_a_pre_hook_keeps_the_pre_hook_path_and_its_order(tmp_path):
    """A forward pre-hook already on the module (here: one that sets the mode) must run before the step
    starts: the hook then counts with a pre-hook of its own, registered after it."""
    model = Net()
    hook = _hook(tmp_path, save_interval=1)

    def to_eval(m, a):
        hook.set_mode(tp.modes.EVAL)

    model.register_forward_pre_hook(to_eval)
    hook.register_module(model)
    with torch.no_grad():
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))
    assert hook.mode_steps[tp.modes.EVAL] == 1  # both forwards counted as EVAL steps
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps(mode=tp.modes.EVAL) == [0, 1]


def test_user_backward_hook_registered_before_keeps_working(tmp_path):
    model = Net()
    calls = []
    handle = model.register_full_backward_hook(lambda m, gi, go: calls.append(1))
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model)
    _step(model)
    handle.remove()
    _step(model)
    assert calls == [1]
    assert hook.step == 1
    hook.close()


def test_registering_a_parent_makes_it_the_root(tmp_path):
    model = Net()
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model.fc1)
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(1, 8))  # one step each, not two (fc1 is no longer a root)
    assert hook.step == 2
    hook.close()


def test_known_quiet_steps_are_only_counted_and_steps_stay_exact(tmp_path):
    """Between saving steps forwards are only counted; every read of the step, a mode switch, a scalar saved
    mid-gap and the next saving step see the exact counts."""
    model = Net()
    hook = _hook(tmp_path, save_interval=10)
    hook.register_module(model)
    hook.set_mode(tp.modes.TRAIN)
    for _ in range(5):
        model(torch.randn(2, 8))  # steps 0 (saves), 1, 2, 3, 4
    assert hook.step == 4 and hook.mode_steps[tp.modes.TRAIN] == 4
    hook.save_scalar("lr", 0.5)  # lands on step 4
    for _ in range(8):
        model(torch.randn(2, 8))  # steps 5..12: step 10 saves
    hook.set_mode(tp.modes.EVAL)  # mid-gap
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 8))  # EVAL mode steps 0, 1, 2 = global 13, 14, 15
    hook.set_mode(tp.modes.TRAIN)
    for _ in range(8):
        model(torch.randn(2, 8))  # TRAIN mode steps 13..20 = global 16..23: mode step 20 saves
    assert hook.step == 23
    assert hook.mode_steps[tp.modes.TRAIN] == 20 and hook.mode_steps[tp.modes.EVAL] == 2
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps(mode=tp.modes.TRAIN) == [0, 4, 10, 20]
    assert t.steps(mode=tp.modes.EVAL) == [0]
    assert t.tensor("Net_fc1.weight").steps(mode=tp.modes.TRAIN) == [0, 10, 20]
    assert t.tensor("scalar/lr").steps() == [4]
    assert t.steps() == [0, 4, 10, 13, 23]


def test_quiet_steps_of_an_optimizer_loop_stay_exact_through_inspection_user_hooks_and_copies(tmp_path):
    """With an optimizer, between saving steps: a library inspecting the root's hooks between the optimizer's step
    and the next forward, a user's pre-hook added and removed mid-gap, a copy of the model run mid-gap and a scalar
    saved between the backward and the optimizer's step: every forward is one step, the user's hook runs at every
    forward while it is registered and at none after, and what is saved lands on the script's own steps."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = _hook(tmp_path, save_interval=10)
    hook.register_module(model)
    seen, grads, handle, now = [], {}, None, [0]
    for i in range(25):
        now[0] = i  # (the iteration the user's hook sees)
        if i == 5:
            handle = model.register_forward_pre_hook(lambda m, a: seen.append(now[0]) if m is model else None)
        if i == 15:
            handle.remove()
        if i == 12:
            copy.deepcopy(model)(torch.randn(2, 8))  # (a copy's forwards are not the job's steps)
        opt.zero_grad()
        loss = _step(model)
        if i == 7:
            hook.save_scalar("loss_seen", loss)  # between the backward and the optimizer's step: step 7
        grads[i] = model.fc1.weight.grad.clone()
        opt.step()
        for _ in range(3):
            bool(model._forward_pre_hooks)  # e.g. a library inspecting the module's hooks
        assert hook.step == i
    assert seen == list(range(5, 15))
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 7, 10, 20]
    assert t.tensor("scalar/loss_seen").steps() == [7]
    for s in (0, 10, 20):
        assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(s), grads[s].numpy())


def test_a_stop_request_is_seen_within_a_long_quiet_gap(tmp_path):
    from tensortap.rules.actions import TrainingStopped, request_stop

    model = Net()
    hook = _hook(tmp_path, save_interval=10_000)
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(2, 8))
    request_stop(str(tmp_path / "run"), rule="R", step=2, reason="test")
    import time

    deadline = time.monotonic() + 10
    with pytest.raises(TrainingStopped):
        while time.monotonic() < deadline:  # the hook looks once a second
            model(torch.randn(2, 8))
            time.sleep(0.01)
    assert hook._closed


def test_a_module_class_with_its_own_call(tmp_path):
    class OwnCall(Net):
        def __call__(self, x):  # e.g. a wrapper class that adds behaviour around the call
            return super().__call__(x) * 1.0

    model = OwnCall()
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model)
    for _ in range(3):
        model(torch.randn(2, 8))
    assert hook.step == 2
    hook.close()


def test_a_failing_step_start_never_breaks_the_forward(tmp_path, caplog):
    model = Net()
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model)
    model(torch.randn(2, 8))

    def broken():
        raise RuntimeError("injected")

    hook.next_step = broken  # what the root's forward calls to begin a step
    for _ in range(3):
        out = model(torch.randn(2, 8))  # training goes on
    assert out.shape == (2, 4)
    assert caplog.text.count("turns itself off") == 1 and "injected" in caplog.text  # logged once
    assert hook.error_count == 1
    hook.close()


def test_a_closed_hook_lets_its_model_be_collected(tmp_path):
    import gc
    import weakref

    model = Net()
    hook = _hook(tmp_path, save_interval=1)
    hook.register_module(model)
    model(torch.randn(2, 8))
    hook.close()
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_mode_and_collection_changes_right_after_a_saving_step(tmp_path):
    """The step after a saving one begins without the schedule's tests when it is known to be quiet; a mode
    switch or a collection change in between is still seen."""
    model = Net()
    hook = _hook(tmp_path, save_interval=3)
    hook.register_module(model)
    hook.set_mode(tp.modes.TRAIN)
    model(torch.randn(2, 8))  # TRAIN 0 (saves)
    hook.set_mode(tp.modes.EVAL)  # right after the saving step; EVAL 0 saves
    with torch.no_grad():
        model(torch.randn(2, 8))  # EVAL 0 (saves) = global 1
    hook.set_mode(tp.modes.TRAIN)
    model(torch.randn(2, 8))  # TRAIN 1 = global 2
    model(torch.randn(2, 8))  # TRAIN 2 = global 3
    model(torch.randn(2, 8))  # TRAIN 3 (saves) = global 4
    hook.get_collection("weights").save_config = tp.SaveConfig(save_interval=1)  # mid saving step
    hook.get_collection("gradients").save_config = tp.SaveConfig(save_interval=1)
    hook.get_collection("losses").save_config = tp.SaveConfig(save_interval=1)
    model(torch.randn(2, 8))  # TRAIN 4 = global 5: saves now
    model(torch.randn(2, 8))  # TRAIN 5 = global 6
    assert hook.step == 6 and hook.mode_steps[tp.modes.TRAIN] == 5 and hook.mode_steps[tp.modes.EVAL] == 0
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.tensor("Net_fc1.weight").steps(mode=tp.modes.TRAIN) == [0, 3, 4, 5]
    assert t.tensor("Net_fc1.weight").steps(mode=tp.modes.EVAL) == [0]
    assert t.tensor("Net_fc1.weight").steps() == [0, 1, 4, 5, 6]
