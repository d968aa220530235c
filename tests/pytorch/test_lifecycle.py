"""The step lifecycle (tensortap.capture.engine) as the PyTorch hook fires it: every event of every step reaches
listeners, a failing listener is removed, the steps saved stay exact; what the hook says it can read."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tensortap as tp  # noqa: E402
import tensortap.pytorch  # noqa: E402, F401
from tensortap.capture.engine import EVENTS  # noqa: E402


def _torch_job(hook, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return model


def test_every_event_of_every_step_reaches_listeners_and_the_saved_steps_stay_exact(tmp_path):
    hook = tp.pytorch.Hook(str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=5),
                           include_collections=["weights"], writer="thread")
    heard: dict[str, list] = {e: [] for e in EVENTS}
    for e in EVENTS:
        hook.add_listener(e, lambda ev: heard[ev.name].append((ev.step, ev.saving, ev.data)))
    _torch_job(hook, 12)
    hook.close()
    assert [s for s, _sv, _d in heard["step_begin"]] == list(range(12))
    assert [s for s, sv, _d in heard["step_begin"] if sv] == [0, 5, 10]
    assert [s for s, _sv, _d in heard["step_end"]] == list(range(12))
    for e in ("forward_end", "backward_end", "optimizer_step"):
        assert [s for s, _sv, _d in heard[e]] == list(range(12)), e
    assert all(d["output"].shape == (16, 2) for _s, _sv, d in heard["forward_end"])
    assert all(isinstance(d["optimizer"], torch.optim.SGD) for _s, _sv, d in heard["optimizer_step"])
    trial = tp.create_trial(str(tmp_path / "run"))
    assert trial.tensor("Sequential_0.weight").steps() == [0, 5, 10]


def test_removed_listeners_leave_the_quiet_window_to_count_steps_again(tmp_path):
    hook = tp.pytorch.Hook(str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=4),
                           include_collections=["weights"], writer="thread")
    seen: list[int] = []
    remove = hook.add_listener("step_begin", lambda ev: seen.append(ev.step))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    for step in range(9):
        if step == 3:
            remove()
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    hook.close()
    assert seen == [0, 1, 2]
    trial = tp.create_trial(str(tmp_path / "run"))
    assert trial.tensor("Sequential_0.weight").steps() == [0, 4, 8]
    assert trial.last_complete_step == 8


def test_an_optimizer_step_listener_added_among_quiet_steps_hears_every_later_step(tmp_path):
    """Steps that save nothing run without the optimizer's post-hook: a listener added then hears every later
    optimizer step, and a later saving step still saves the optimizer's state after its step."""
    hook = tp.pytorch.Hook(str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=6),
                           include_collections=["weights", "optimizer_variables"], writer="thread")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook.register_module(model)
    heard: list[int] = []
    momentum = {}
    for step in range(14):
        if step == 3:
            hook.add_listener("optimizer_step", lambda ev: heard.append(ev.step))
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        momentum[step] = opt.state[model[0].weight]["momentum_buffer"].clone()
    hook.close()
    assert heard == list(range(3, 14))
    trial = tp.create_trial(str(tmp_path / "run"))
    t = trial.tensor("optimizer/Sequential_0.weight/momentum_buffer")
    assert t.steps() == [0, 6, 12]
    for s in (0, 6, 12):
        assert (t.value(s) == momentum[s].numpy()).all()


def test_a_failing_listener_is_removed_and_training_and_capture_go_on(tmp_path, caplog):
    hook = tp.pytorch.Hook(str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=1),
                           include_collections=["weights"], writer="thread")
    calls = []

    def bad(ev):
        calls.append(ev.step)
        raise RuntimeError("listener bug")

    hook.add_listener("step_end", bad)
    _torch_job(hook, 3)
    hook.close()
    assert calls == [0]
    assert not hook.disabled
    assert "step_end listener failed" in caplog.text
    assert tp.create_trial(str(tmp_path / "run")).tensor("Sequential_0.weight").steps() == [0, 1, 2]


def test_pytorch_says_what_it_can_read(tmp_path):
    hook = tp.pytorch.Hook(str(tmp_path / "run"), writer="thread")
    hook.register_module(nn.Linear(3, 2))
    specs = {s.name: s for s in hook.tensor_specs()}
    assert specs["Linear_weight"].shape == (2, 3) and specs["Linear_weight"].source == "weight"
    assert specs["gradient/Linear_bias"].dtype == "float32" and specs["gradient/Linear_bias"].source == "gradient"
    hook.close()
