"""The PyTorch hook's saving steps against real torch (CPU), with the writer process: the usual saving steps
and every kind of unusual one (moved parameters, transposed gradients, no or two backwards, EVAL steps between,
close or a stop request mid-job) save values bit-identical to what the training script saw, at the steps the
schedule names."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tensortap.pytorch as tp  # noqa: E402
from tensortap.transport.process_writer import ProcessChunkWriter  # noqa: E402
from tensortap.trials import StepState  # noqa: E402

TRAIN, EVAL = tp.modes.TRAIN, tp.modes.EVAL
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
LOSS = "CrossEntropyLoss_output_0"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(autouse=True)
def _reset_hook(monkeypatch):
    monkeypatch.delenv("TENSORTAP_DISABLE", raising=False)
    torch.manual_seed(0)
    yield
    tp.del_hook()


def _hook(tmp_path, interval=3, **kw):
    return tp.Hook(out_dir=str(tmp_path / "run"), writer="process",
                   save_config=kw.pop("save_config", tp.SaveConfig(save_interval=interval)),
                   include_collections=kw.pop("include", ["weights", "biases", "gradients", "losses"]), **kw)


def _run(tmp_path, steps, body=None, interval=3, hook=None, model=None, mode=None, prep=None):
    """Train `steps` steps (`prep(step, model)` first, then `body(step, model, loss_fn, x, y, hook)` does a
    step's forward and backward and returns its loss, else the usual ones): what each step saw, the hook, the
    trial."""
    model = model or Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = hook or _hook(tmp_path, interval)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if mode is not None:
        hook.set_mode(mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    for step in range(steps):
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        opt.zero_grad()
        if prep is not None:
            prep(step, model)
        w = {n: p.detach().clone() for n, p in model.named_parameters()}
        loss = body(step, model, loss_fn, x, y, hook) if body else None
        if loss is None:
            loss = loss_fn(model(x), y)
            loss.backward()
        seen.append({"w": w, "g": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                     "loss": loss.detach().clone()})
        opt.step()
    hook.close()
    return seen, hook, tp.create_trial(str(tmp_path / "run"))


def _check(t, seen, steps, grads=None, mode=None):
    """The trial holds exactly what training saw at `steps` (gradients at `grads`, default: the same), steps of
    `mode` if given."""
    grads = steps if grads is None else grads
    kw = {} if mode is None else {"mode": mode}
    assert t.steps(**kw) == steps
    for n in PARAMS:
        assert t.tensor(f"Net_{n}").steps(**kw) == steps
        assert t.tensor(f"gradient/Net_{n}").steps(**kw) == [s for s in grads if n in seen[s]["g"]]
        for s in steps:
            assert np.array_equal(t.tensor(f"Net_{n}").value(s, **kw), seen[s]["w"][n].numpy()), (n, s)
        for s in grads:
            if n in seen[s]["g"]:
                assert np.array_equal(t.tensor(f"gradient/Net_{n}").value(s, **kw), seen[s]["g"][n].numpy()), (n, s)
    for s in steps:
        assert np.array_equal(t.tensor(LOSS).value(s, **kw), seen[s]["loss"].numpy()), s


def test_the_usual_saving_steps_save_exactly(tmp_path):
    seen, hook, t = _run(tmp_path, 40)
    _check(t, seen, list(range(0, 40, 3)))
    assert hook.error_count == 0


def test_saving_steps_count_mode_steps(tmp_path):
    seen, hook, t = _run(tmp_path, 40, mode=TRAIN)
    _check(t, seen, list(range(0, 40, 3)), mode=TRAIN)
    assert t.steps() == list(range(0, 40, 3))
    assert hook.mode_steps[TRAIN] == 39 and hook.step == 39


@pytest.mark.parametrize("start", [0, 7])
def test_saving_steps_follow_the_schedule(tmp_path, start):
    hook = _hook(tmp_path, save_config=tp.SaveConfig(save_interval=5, start_step=start))
    seen, _hook_, t = _run(tmp_path, 41, hook=hook)
    saved = [s for s in range(41) if s % 5 == 0 and s >= start]
    _check(t, seen, saved)


def _forwards_and_backwards(tmp_path, steps, mode=None):
    """A hooked model (saving every 3 steps) after `steps` forward and backward passes: (step, hook)."""
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(tmp_path)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if mode is not None:
        hook.set_mode(mode)

    def step():
        loss_fn(model(torch.randn(5, 8)), torch.randint(0, 4, (5,))).backward()

    for _ in range(steps):
        step()
    return step, hook


def test_optimizer_variables_saved_beside_weights_and_gradients(tmp_path):
    """The optimizer's state goes in messages of its own after optimizer.step(); the weights, gradients and loss
    of the same steps are saved as usual."""
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(tmp_path, include=["weights", "biases", "gradients", "losses", "optimizer_variables"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    hook.register_optimizer(opt)
    bufs, grads = [], []
    for _ in range(20):
        opt.zero_grad()
        loss_fn(model(torch.randn(5, 8)), torch.randint(0, 4, (5,))).backward()
        grads.append(model.fc1.weight.grad.clone())
        opt.step()
        bufs.append(opt.state[model.fc1.weight]["momentum_buffer"].clone())
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    saved = list(range(0, 20, 3))
    assert t.tensor("optimizer/Net_fc1.weight/momentum_buffer").steps() == saved
    assert t.tensor("optimizer/param_group_0/lr").steps() == saved
    for s in saved:
        assert np.array_equal(t.tensor("optimizer/Net_fc1.weight/momentum_buffer").value(s), bufs[s].numpy())
        assert np.array_equal(t.tensor("gradient/Net_fc1.weight").value(s), grads[s].numpy())


def test_readers_learn_that_a_saving_step_has_passed_at_the_next_step(tmp_path):
    _step, hook = _forwards_and_backwards(tmp_path, 14, TRAIN)
    hook.flush()
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.last_complete_step == 12  # step 13 began: 12 is over
    assert t.has_passed_step(12, TRAIN) == StepState.AVAILABLE
    assert t.has_passed_step(15, TRAIN) == StepState.NOT_YET_AVAILABLE
    hook.close()


_kept = []


def _move_a_parameter(step, model):
    if step == 12:
        _kept.append(model.fc1.weight.data)  # (the old storage stays, with the old values)
        model.fc1.weight.data = model.fc1.weight.data * 2  # new storage, new values


def _a_gradient_that_is_not_contiguous(step, model, loss_fn, x, y, hook):
    if step == 12:
        # a hook that leaves fc1's gradient transposed in memory (the .grad setter checks shape, not strides)
        handle = model.fc1.weight.register_post_accumulate_grad_hook(
            lambda p: setattr(p, "grad", p.grad.t().contiguous().t()))
        loss = loss_fn(model(x), y)
        loss.backward()
        handle.remove()
        assert not model.fc1.weight.grad.is_contiguous()
        return loss


def _no_backward(step, model, loss_fn, x, y, hook):
    if step == 12:
        return loss_fn(model(x), y)  # e.g. a validation batch in TRAIN mode


def _two_backward_passes(step, model, loss_fn, x, y, hook):
    if step == 12:
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward(retain_graph=True)
        out.square().mean().backward()  # accumulates: the step saves the sum
        return loss


def _second_loss_call(step, model, loss_fn, x, y, hook):
    if step == 12:
        out = model(x)
        loss = loss_fn(out, y)
        (loss + loss_fn(out, 3 - y)).backward()
        return loss


def _a_parameter_without_gradient(step, model, loss_fn, x, y, hook):
    if step == 12:
        model.fc2.bias.requires_grad_(False)
        loss = loss_fn(model(x), y)
        loss.backward()
        model.fc2.bias.requires_grad_(True)
        return loss


def _flush_and_scalar_mid_step(step, model, loss_fn, x, y, hook):
    if step == 12:
        loss = loss_fn(model(x), y)
        hook.save_scalar("mid", 1.5)
        hook.flush()  # before the backward pass
        loss.backward()
        return loss


def _recorded_tensor(step, model, loss_fn, x, y, hook):
    if step == 12:
        loss = loss_fn(model(x), y)
        hook.record_tensor_value("aux_loss", loss * 2)
        loss.backward()
        return loss


@pytest.mark.parametrize("body", [
    _move_a_parameter, _a_gradient_that_is_not_contiguous, _no_backward, _two_backward_passes, _second_loss_call,
    _a_parameter_without_gradient, _flush_and_scalar_mid_step, _recorded_tensor,
], ids=lambda v: getattr(v, "__name__", "")[1:] or None)
def test_an_unusual_saving_step_saves_exactly(tmp_path, body):
    if body is _move_a_parameter:
        seen, hook, t = _run(tmp_path, 24, prep=body)
    else:
        seen, hook, t = _run(tmp_path, 24, body)
    saved = list(range(0, 24, 3))
    assert hook.error_count == 0
    _check(t, seen, saved, [s for s in saved if s != 12 or body is not _no_backward])
    if body is _a_parameter_without_gradient:
        assert "fc2.bias" not in seen[12]["g"] and "fc1.bias" in seen[12]["g"]
    if body is _second_loss_call:
        assert t.tensor("CrossEntropyLoss_output_1").steps() == [12]
    if body is _recorded_tensor:
        assert t.tensor("aux_loss_output_0").steps() == [12]
        assert np.array_equal(t.tensor("aux_loss_output_0").value(12), 2 * seen[12]["loss"].numpy())
    if body is _flush_and_scalar_mid_step:
        assert t.tensor("scalar/mid").steps() == [12]


def test_eval_steps_between_saving_steps(tmp_path):
    def body(step, model, loss_fn, x, y, hook):
        if step == 12:
            hook.set_mode(EVAL)
            with torch.no_grad():
                for _ in range(4):  # global steps 12-15: EVAL steps 0-3
                    model(x)
            hook.set_mode(TRAIN)

    seen, hook, t = _run(tmp_path, 24, body, mode=TRAIN)
    assert hook.error_count == 0
    # TRAIN step 12 is global step 16, TRAIN step 21 global step 25
    train = list(range(0, 24, 3))
    _check(t, seen, train, mode=TRAIN)
    assert t.steps(mode=EVAL) == [0, 3]
    assert t.steps() == [0, 3, 6, 9, 12, 15, 16, 19, 22, 25]
    assert t.tensor("gradient/Net_fc1.weight").steps(mode=EVAL) == []


def test_a_failure_in_a_saving_step_turns_the_hook_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    commit = ProcessChunkWriter.commit
    calls = []

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("injected")
        return commit(self, *args)

    monkeypatch.setattr(ProcessChunkWriter, "commit", failing)
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        seen, hook, t = _run(tmp_path, 24)
    assert len(seen) == 24  # training went on
    assert hook.disabled and hook.error_count == 1 and "injected" in str(hook.first_error)
    assert len([r for r in caplog.records if r.name == "tensortap" and r.levelno >= logging.ERROR]) == 1
    saved = t.tensor("Net_fc1.weight").steps()
    assert 0 in saved and len(saved) < 8  # some saving steps, then none
    whole = [s for s in saved if all(s in t.tensor(f"gradient/Net_{n}").steps() for n in PARAMS)]
    _check(t, seen, whole)  # what was saved before the failure stays readable


def test_closing_the_hook_in_a_saving_step(tmp_path):
    def body(step, model, loss_fn, x, y, hook):
        loss = loss_fn(model(x), y)
        if step == 12:
            hook.close()  # after the forward pass: the step's weights and loss are saved, its gradients are not
        loss.backward()
        return loss

    seen, hook, t = _run(tmp_path, 18, body)
    assert hook.error_count == 0 and len(seen) == 18
    _check(t, seen, [0, 3, 6, 9, 12], [0, 3, 6, 9])
    assert hook.step == 12  # nothing counted after close


def test_a_stop_request_ends_training_between_saving_steps(tmp_path):
    import time

    from tensortap.rules.actions import TrainingStopped, request_stop

    step, hook = _forwards_and_backwards(tmp_path, 13)
    request_stop(str(tmp_path / "run"), rule="R", step=12, reason="test")
    deadline = time.monotonic() + 10
    with pytest.raises(TrainingStopped):
        while time.monotonic() < deadline:  # the hook looks once a second
            step()
            time.sleep(0.01)
    assert hook._closed
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.steps()[:5] == [0, 3, 6, 9, 12] and t.loaded_all_steps


def test_optimizer_state_saved_from_the_step_it_appears(tmp_path):
    """A collection holding only an optimizer state key saves it from the first saving step at which the optimizer
    has it (the steps before saved nothing of the optimizer), the weights as usual."""
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path / "run"), save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "momenta"])
    hook.get_collection("momenta").include("momentum_buffer$")
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.0)  # (no momentum buffers yet)
    hook.register_optimizer(opt)
    bufs = {}
    for step in range(5):
        if step == 2:
            opt.param_groups[0]["momentum"] = 0.9  # (buffers from this step's optimizer step on)
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(5, 8)), torch.randint(0, 4, (5,))).backward()
        opt.step()
        if model.fc1.weight in opt.state and "momentum_buffer" in opt.state[model.fc1.weight]:
            bufs[step] = opt.state[model.fc1.weight]["momentum_buffer"].clone()
    hook.close()
    t = tp.create_trial(str(tmp_path / "run"))
    assert sorted(bufs) == [2, 3, 4]
    assert t.tensor("optimizer/Net_fc1.weight/momentum_buffer").steps() == [2, 3, 4]
    for s, buf in bufs.items():
        assert np.array_equal(t.tensor("optimizer/Net_fc1.weight/momentum_buffer").value(s), buf.numpy())
    assert not any(n.startswith("optimizer/param_group") for n in t.tensor_names())
    assert t.tensor("Net_fc1.weight").steps() == [0, 1, 2, 3, 4]
