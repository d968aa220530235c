"""The step is the optimizer's step: gradients are what `optimizer.step()` consumes (read by the test inside the
optimizer's own step pre-hook): accumulated over micro-batches, after clipping, unscaled by GradScaler; a step
the scaler skips is recorded as skipped. A model called several times per step, an eval pass inside a TRAIN
step and activation checkpointing neither shift the step nor drop or duplicate tensors; DDP keeps the inner
module's names."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tensortap.pytorch as tp  # noqa: E402

NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _grad_recorder(opt, model, store: list) -> None:
    """What the optimizer consumes, read inside its own step pre-hook."""
    opt.register_step_pre_hook(
        lambda o, a, k: store.append({n: p.grad.clone() for n, p in model.named_parameters()}))


def _registered(tmp_path, interval: int, collections: list[str]):
    """A seeded Net, its SGD optimizer and a writer-thread hook saving `collections` every `interval` steps, both
    registered; and the list the optimizer's own pre-hook fills with what each of its steps consumes."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=interval),
                   include_collections=collections)
    hook.register_module(model)
    hook.register_optimizer(opt)
    grads: list[dict] = []
    _grad_recorder(opt, model, grads)
    return model, opt, hook, grads


def _assert_grads(t, steps: list[int], grads: list[dict]) -> None:
    for s, g in zip(steps, grads, strict=True):
        for n in NAMES:
            assert t.tensor(f"gradient/Net_{n}").value(s).tobytes() == g[n].numpy().tobytes(), (s, n)


@pytest.mark.parametrize("register", [True, False])
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_accumulation_and_clipping(tmp_path, writer, register):
    """4 micro-batches per optimizer step, clip_grad_norm_ before the step: one step per optimizer step, its
    gradients those the optimizer used (registered, or found at its first step: then from that step on)."""
    torch.manual_seed(0)
    model = Net()
    hook = tp.Hook(out_dir=str(tmp_path), writer=writer, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if register:
        hook.register_optimizer(opt)
    grads: list[dict] = []
    weights: list[dict] = []
    _grad_recorder(opt, model, grads)
    for step in range(12):
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        opt.zero_grad()
        for micro in range(4):
            x, y = _batch(step * 4 + micro)
            (nn.functional.cross_entropy(model(x), y) / 4).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    first = 0 if register else 3  # (found at its first step: the micro-batches before it counted as steps)
    assert t.steps() == list(range(12 + first))
    saved = t.tensor("gradient/Net_fc1.weight").steps()[first:]
    assert saved == list(range(first, 12 + first))
    _assert_grads(t, saved, grads)
    for s in range(first + 1, 12 + first):
        assert t.tensor("Net_fc1.weight").value(s).tobytes() == weights[s - first]["fc1.weight"].numpy().tobytes()


def test_grad_scaler_unscaled_and_skipped_steps(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["gradients", "losses", "grad_scaler"])
    hook.register_module(model)
    hook.register_optimizer(opt)
    hook.register_scaler(scaler)
    grads: list[dict] = []
    _grad_recorder(opt, model, grads)
    scales = []
    for step in range(5):
        x, y = _batch(step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if step == 2:
            loss = loss * float("inf")  # non-finite gradients: the scaler skips this step
        scaler.scale(loss).backward()
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2, 3, 4]
    assert t.tensor("gradient/Net_fc1.weight").steps() == [0, 1, 3, 4]
    _assert_grads(t, [0, 1, 3, 4], grads)  # unscaled: what the optimizer consumed
    g = t.tensor("gradient/Net_fc1.weight").value(0)
    assert np.abs(g).max() < 10  # (scaled by 65536 they would not be)
    assert t.tensor("grad_scaler/skipped").steps() == [2]
    assert t.tensor("grad_scaler/scale").value(2) == np.float32(scales[2])
    assert t.tensor("grad_scaler/scale").value(3) == np.float32(scales[3]) < scales[2]


@pytest.mark.parametrize("case", ["accumulation", "zero_grad_after_forward", "growth_then_skip",
                                  "skips_in_a_row", "skip_before_eval_and_close", "found_at_first_step"])
def test_grad_scaler_skips_found_from_its_public_state(tmp_path, case):
    """The scaler is only read, never changed: each step it skips is its own step, recorded as skipped with the
    scale it skipped with, whatever the loop does around it (gradient accumulation, zero_grad between forward and
    backward, a skip right after the scale grew, skips in a row, a skip ending in set_mode or close, the
    optimizer found at its first step); no other step is marked skipped and no step is split or merged."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # growth_interval 2 with factors 2 and 0.5: a skip right after a growth leaves the scale where it was
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["gradients", "grad_scaler"])
    hook.register_module(model)
    if case != "found_at_first_step":
        hook.register_optimizer(opt)
    hook.register_scaler(scaler)
    hook.set_mode(tp.modes.TRAIN)
    micro = 3 if case == "accumulation" else 1
    skip = {"accumulation": {2, 5}, "zero_grad_after_forward": {1, 4}, "growth_then_skip": {2, 5},
            "skips_in_a_row": {2, 3, 4}, "skip_before_eval_and_close": {3, 6},
            "found_at_first_step": {0, 3}}[case]
    steps = 7
    scales, skipped, optimizer_steps = [], [], []
    opt.register_step_post_hook(lambda *a: optimizer_steps.append(1))
    for step in range(steps):
        if case != "zero_grad_after_forward":
            opt.zero_grad()
        for m in range(micro):
            x, y = _batch(step * micro + m)
            loss = nn.functional.cross_entropy(model(x), y) / micro
            if case == "zero_grad_after_forward" and m == 0:
                opt.zero_grad()
            if step in skip and m == micro - 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
        scales.append(scaler.get_scale())
        before = len(optimizer_steps)
        scaler.step(opt)
        if len(optimizer_steps) == before:
            skipped.append(step)
        scaler.update()
        if case == "skip_before_eval_and_close" and step == 3:
            hook.set_mode(tp.modes.EVAL)
            with torch.no_grad():
                model(_batch(99)[0])
            hook.set_mode(tp.modes.TRAIN)
    assert "step" not in vars(scaler)  # (nothing of tensortap's on the user's scaler)
    hook.close()
    assert skipped == sorted(skip)
    t = tp.create_trial(str(tmp_path))
    assert t.steps(tp.modes.TRAIN) == list(range(steps))
    g = [t.global_step(tp.modes.TRAIN, s) for s in range(steps)]
    # (a step skipped before the hook knows the optimizer, found at its first step, is not known as skipped)
    known = [s for s in skipped if not (case == "found_at_first_step" and s == 0)]
    assert t.tensor("grad_scaler/skipped").steps() == [g[s] for s in known]
    scale = t.tensor("grad_scaler/scale")
    assert [scale.value(g[s]) for s in known] == [np.float32(scales[s]) for s in known]
    assert t.tensor("gradient/Net_fc1.weight").steps() == [g[s] for s in range(steps) if s not in known]
    if case == "growth_then_skip":
        assert scales[5] == scales[4] * 2  # (the scale grew at the update before the skip)


def test_two_calls_and_an_eval_pass_per_step(tmp_path):
    """A siamese step (the model called twice) with an eval pass inside the TRAIN step, no set_mode: one step
    per optimizer step, gradients at every step, each call's outputs under its own name."""
    model, opt, hook, grads = _registered(tmp_path, 1, ["gradients", "relu_output"])
    relu_out: list[torch.Tensor] = []
    model.relu.register_forward_hook(lambda m, i, o: relu_out.append(o.detach().clone()))
    for step in range(4):
        relu_out.clear()
        (x1, y), (x2, _y) = _batch(2 * step), _batch(2 * step + 1)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x1) - model(x2), y)
        loss.backward()
        model.eval()
        with torch.no_grad():
            model(_batch(100 + step)[0])
        model.train()
        opt.step()
        calls = list(relu_out)
        hook.flush()
        t = tp.create_trial(str(tmp_path))
        for k, v in enumerate(calls):
            assert t.tensor(f"relu_output_{k}").value(step).tobytes() == v.numpy().tobytes()
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2, 3]
    _assert_grads(t, [0, 1, 2, 3], grads)
    assert {"relu_output_0", "relu_output_1", "relu_output_2"} <= set(t.tensor_names())
    assert "relu_output_3" not in t.tensor_names()


def test_activation_checkpointing_saves_the_forward_once(tmp_path):
    from torch.utils.checkpoint import checkpoint

    class Ckpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8))
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    torch.manual_seed(0)
    model = Ckpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["relu_output", "gradients"])
    hook.register_module(model)
    seen: list[torch.Tensor] = []
    model.block[1].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    firsts = []
    for step in range(3):
        seen.clear()
        x, y = _batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        assert len(seen) == 2  # the forward, and its recomputation in the backward pass
        firsts.append(seen[0])
    hook.close()
    t = tp.create_trial(str(tmp_path))
    assert [n for n in t.tensor_names() if "output" in n] == ["block.1_output_0"]
    for step in range(3):
        assert t.tensor("block.1_output_0").value(step).tobytes() == firsts[step].numpy().tobytes()


@pytest.mark.parametrize("order", ["register_then_compile", "compile_then_register", "module_compile"])
def test_torch_compile_fullgraph(tmp_path, order, caplog):
    """torch.compile(fullgraph=True) in every order: no graph break, weights, gradients and losses bit for bit
    as the script reads them, and one warning naming the collection that cannot be captured inside it."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Net()
    loss_fn = nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "relu_output"])
    hook.register_loss(loss_fn)
    if order == "register_then_compile":
        hook.register_module(model)
        run = torch.compile(model, fullgraph=True)
    elif order == "compile_then_register":
        run = torch.compile(model, fullgraph=True)
        hook.register_module(run)
    else:
        model.compile(fullgraph=True)
        hook.register_module(model)
        run = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads: list[dict] = []
    _grad_recorder(opt, model, grads)
    weights, losses = [], []
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for step in range(4):
            weights.append(model.fc1.weight.detach().clone())
            x, y = _batch(step)
            opt.zero_grad()
            loss = loss_fn(run(x), y)
            loss.backward()
            losses.append(loss.detach().clone())
            opt.step()
        hook.close()
    assert dict(counters["graph_break"]) == {}
    assert hook.error_count == 0
    warnings = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]
    assert len(warnings) == 1 and "relu_output" in warnings[0], warnings
    t = tp.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2, 3]
    _assert_grads(t, [0, 1, 2, 3], grads)
    for s in range(4):
        assert t.tensor("Net_fc1.weight").value(s).tobytes() == weights[s].numpy().tobytes()
    for s in range(4):
        assert t.tensor("CrossEntropyLoss_output_0").value(s).tobytes() == losses[s].numpy().tobytes()


@pytest.mark.parametrize("register", ["wrapper", "module"])
def test_ddp_keeps_the_inner_module_names(tmp_path, register):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = Net()
        ddp = nn.parallel.DistributedDataParallel(net)
        hook = tp.Hook(out_dir=str(tmp_path), writer="thread", save_config=tp.SaveConfig(save_interval=1),
                       include_collections=["weights", "gradients"])
        hook.register_module(ddp if register == "wrapper" else net)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        grads: list[dict] = []
        _grad_recorder(opt, net, grads)
        for step in range(2):
            x, y = _batch(step)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        hook.close()
    finally:
        dist.destroy_process_group()
    t = tp.create_trial(str(tmp_path))
    assert t.tensor_names() == sorted([f"Net_{n}" for n in ("fc1.weight", "fc2.weight")]
                                      + [f"gradient/Net_{n}" for n in NAMES])
    _assert_grads(t, [0, 1], grads)


@pytest.mark.parametrize("registered", [True, False])
def test_step_with_a_closure_saves_what_the_closure_computed(tmp_path, caplog, registered):
    """`optimizer.step(closure)` (LBFGS-style, and how Lightning steps): the forward and backward run inside the
    optimizer's step, after its pre-hook. The gradients saved are those the closure's backward left (what the
    step consumed), the weights those its forward used; the model is not taken for a compiled one."""
    torch.manual_seed(0)
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = str(tmp_path / "job")
    hook = tp.Hook(out, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if registered:
        hook.register_optimizer(opt)
    seen = []
    with caplog.at_level(logging.INFO, logger="tensortap"):
        for k in range(4):
            x, y = _batch(k)

            def closure(x=x, y=y):
                opt.zero_grad()
                weights = {n: p.detach().clone() for n, p in model.named_parameters()}
                loss = loss_fn(model(x), y)
                loss.backward()
                seen.append((weights, {n: p.grad.clone() for n, p in model.named_parameters()}))
                return loss

            opt.step(closure)
    hook.close()
    assert not [r for r in caplog.records if "compiled" in r.getMessage()]
    trial = tp.create_trial(out)
    assert trial.tensor("gradient/Net_fc1.weight").steps() == [0, 1, 2, 3]
    for k in range(4):
        weights, grads = seen[k]
        for n in NAMES:
            assert np.array_equal(trial.tensor(f"gradient/Net_{n}").value(k), grads[n].numpy()), (k, n)
            assert np.array_equal(trial.tensor(f"Net_{n}").value(k), weights[n].numpy()), (k, n)


@pytest.mark.parametrize("loop", ["accumulation", "two_optimizer_steps", "eval_pass_after_step", "plain"])
def test_quiet_steps_between_saving_steps_are_counted_exactly(tmp_path, loop):
    """Between saving steps the steps are only counted (the engine's quiet window), wherever they begin (a
    forward, an optimizer step with no forward before it): the saving steps, their gradients and the step count
    are those of a hook that saves at every step."""
    # (the optimizer registered: else the micro-batches before its first step are steps)
    model, opt, hook, grads = _registered(tmp_path, 4, ["weights", "gradients"])
    for i in range(10):
        x, y = _batch(i)
        opt.zero_grad()
        for _ in range(3 if loop == "accumulation" else 1):
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if loop == "two_optimizer_steps":
            opt.step()  # (the same gradients again: a second optimizer step, no forward before it)
        if loop == "eval_pass_after_step":
            with torch.no_grad():
                model(_batch(100 + i)[0])  # (an eval pass, no set_mode: it runs inside the next step)
    steps = len(grads)
    assert hook.step == steps - 1 + (loop == "eval_pass_after_step")  # (the last eval pass began a step)
    hook.close()
    t = tp.create_trial(str(tmp_path))
    saving = list(range(0, steps, 4))
    assert t.tensor("gradient/Net_fc1.weight").steps() == saving
    assert t.tensor("Net_fc1.weight").steps() == saving
    _assert_grads(t, saving, [grads[s] for s in saving])
