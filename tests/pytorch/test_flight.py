"""The flight recorder on real PyTorch jobs (docs/pytorch.md "The flight recorder", docs/format.md §11): where a
non-finite value first appeared, the ring of the steps before a failure, and every trigger."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

import tensortap.pytorch as tp
from tensortap.capture.flight import FlightConfig
from tensortap.exceptions import InvalidConfiguration, StepUnavailable
from tensortap.format.control import TrainingStopped, request_stop
from tensortap.trials import create_trial

torch.set_num_threads(1)


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)


def _hook(out: str, steps=8, **kw) -> tp.Hook:
    return tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=500), writer="thread",
                   flight_recorder=FlightConfig(steps=steps) if isinstance(steps, int) else steps, **kw)


def test_a_layer_that_outputs_inf_at_step_k_is_named_with_the_ring_before_it(tmp_path):
    """The third Linear overflows (its weights scaled up before step k's forward): a `forward` non_finite incident
    names it at step k, with its input's statistics; with save_interval=500 the ring holds the N steps up to k,
    equal to what the script itself reads; the failing step's raw tensors are saved."""
    k, n = 20, 8
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=n)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: dict[int, dict] = {}
    outputs: dict[str, torch.Tensor] = {}
    model[4].register_forward_hook(lambda m, i, o: outputs.update(out=o.detach().clone(), inp=i[0].detach().clone()))
    for step in range(k + 5):
        if step == k:
            with torch.no_grad():
                model[4].weight.fill_(3e38)  # (finite weights; their products overflow)
        x, y = _batch(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        seen[step] = {"w": model[2].weight.detach().norm().item(), "g": model[2].weight.grad.norm().item()}
        if step == k:
            at_k = dict(outputs)
        opt.step()
    hook.close()
    assert hook.error_count == 0
    trial = create_trial(str(tmp_path))
    inc = trial.first_nonfinite()
    assert inc["step"] == k and inc["mode_step"] == k and inc["worker"] == "worker_0"
    d = inc["detail"]
    assert (d["phase"], d["module"], d["parameter"], d["tensor"]) == ("forward", "4", None, "4_output_0")
    assert d["nan"] + d["posinf"] + d["neginf"] == int((~torch.isfinite(at_k["out"])).sum()) > 0
    assert d["posinf"] == int(torch.isposinf(at_k["out"]).sum())
    (inp,) = d["inputs"]
    assert inp["name"] == "4_input_0" and inp["count"] == at_k["inp"].numel() and inp["nonfinite"] == 0
    assert inp["l2"] == pytest.approx(at_k["inp"].norm().item(), rel=1e-5)
    assert inp["max_abs"] == pytest.approx(at_k["inp"].abs().max().item(), rel=1e-6)
    assert inc["ring"] == {"first_step": k - n + 1, "last_step": k}
    assert [i["kind"] for i in trial.incidents()] == ["non_finite"]  # (every later step is non-finite too)
    # the ring: the N steps up to the failure, nothing before them, equal to the script's own norms
    w, g = trial.tensor("Sequential_2.weight"), trial.tensor("gradient/Sequential_2.weight")
    assert "Sequential_2.weight" in trial.tensor_names(collection="flight")
    for step in range(k - n + 1, k + 1):
        assert float(w.reduction_value(step, "l2")) == pytest.approx(seen[step]["w"], rel=1e-5)
        assert float(g.reduction_value(step, "l2")) == pytest.approx(seen[step]["g"], rel=1e-5)
        assert int(w.reduction_value(step, "nonfinite")) == 0
    assert int(trial.tensor("4_output_0").reduction_value(k, "nonfinite")) > 0
    assert int(trial.tensor("2_output_0").reduction_value(k, "nonfinite")) == 0
    with pytest.raises(StepUnavailable):
        w.reduction_value(k - n, "l2")
    # the failing step's raw output, bit for bit as the script read it
    assert trial.tensor("4_output_0").value(k).tobytes() == at_k["out"].numpy().tobytes()


class _Amplify(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by `factor` (float32 overflows to inf)."""

    @staticmethod
    def forward(ctx, w, factor):
        ctx.factor = factor
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _LinearWithLoudGrad(nn.Linear):
    factor = 1.0

    def forward(self, x):
        return nn.functional.linear(x, _Amplify.apply(self.weight, self.factor), self.bias)


def test_a_gradient_that_overflows_in_backward_names_its_parameter(tmp_path):
    k = 6
    torch.manual_seed(0)
    loud = _LinearWithLoudGrad(16, 16)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), loud, nn.Tanh(), nn.Linear(16, 4))
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(k + 3):
        loud.factor = 1e39 if step == k else 1.0
        x, y = _batch(step)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if step == k:
            grad_k = model[2].weight.grad.clone()
            assert torch.isfinite(model[0].weight.grad).all()  # (the input gradients stay finite)
        opt.step()
    hook.close()
    inc = create_trial(str(tmp_path)).first_nonfinite()
    assert inc["step"] == k
    d = inc["detail"]
    assert (d["phase"], d["module"], d["parameter"], d["tensor"]) == (
        "backward", None, "Sequential_2.weight", "gradient/Sequential_2.weight")
    assert d["nan"] + d["posinf"] + d["neginf"] == int((~torch.isfinite(grad_k)).sum()) > 0
    assert d["inputs"] == []


def test_exception_in_a_with_block_and_the_hook_lives_on(tmp_path):
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    with pytest.raises(RuntimeError, match="the data loader died"):
        with _hook(str(tmp_path)) as hook:
            hook.register_module(model)
            hook.register_loss(loss_fn)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            for step in range(5):
                x, y = _batch(step)
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            model(x)
            raise RuntimeError("the data loader died")
    trial = create_trial(str(tmp_path))
    (inc,) = trial.incidents()
    assert inc["kind"] == "exception" and inc["step"] == 5
    assert inc["detail"] == {"type": "RuntimeError", "message": "the data loader died"}
    assert inc["ring"] == {"first_step": 0, "last_step": 5}  # (the step in progress too: its forward)
    assert trial.tensor("gradient/Sequential_0.weight").reduction_value(4, "l2") > 0
    assert float(trial.tensor("0_output_0").reduction_value(5, "l2")) == pytest.approx(
        model[0](x).norm().item(), rel=1e-6)
    # the step in progress: its weights as they are (CPU outputs are not kept)
    assert trial.tensor("Sequential_0.weight").value(5).tobytes() == model[0].weight.detach().numpy().tobytes()


def test_an_uncaught_exception_in_a_script(tmp_path):
    """sys.excepthook: the exception that ends a script is an incident, and its traceback is still printed."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch import nn
        import tensortap.pytorch as tp
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        hook = tp.Hook(out_dir={str(tmp_path / 'out')!r}, flight_recorder=16, writer="thread")
        hook.register_module(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            if step == 7:
                raise ValueError("bad batch " + str(step))
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    """))
    os.makedirs(tmp_path / "out")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 1 and "ValueError: bad batch 7" in proc.stderr
    (inc,) = create_trial(str(tmp_path / "out")).incidents()
    assert (inc["kind"], inc["step"], inc["detail"]["type"]) == ("exception", 6, "ValueError")
    assert inc["ring"] == {"first_step": 0, "last_step": 6}


def test_a_stop_request_writes_the_ring(tmp_path):
    model = _mlp()
    hook = _hook(str(tmp_path))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    deadline = time.monotonic() + 60
    with pytest.raises(TrainingStopped):
        step = 0
        while time.monotonic() < deadline:
            if step == 3:
                request_stop(str(tmp_path), rule="exploding_tensor", step=2, reason="NaN in gradients")
            x, _y = _batch(step)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            step += 1
    (inc,) = create_trial(str(tmp_path)).incidents()
    assert inc["kind"] == "stop" and inc["detail"] == {"rule": "exploding_tensor", "reason": "NaN in gradients"}
    assert inc["ring"]["last_step"] == inc["step"] >= 3


def test_a_rule_that_found_an_issue(tmp_path):
    model = _mlp()
    hook = _hook(str(tmp_path))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    deadline = time.monotonic() + 60
    step = 0
    status = tmp_path / "rules" / "vanishing_gradient" / "status.json"
    while time.monotonic() < deadline and not (tmp_path / "incidents").exists():
        if step == 2:
            status.parent.mkdir(parents=True)
            status.write_text(json.dumps({"name": "vanishing_gradient", "status": "IssuesFound", "first_step": 1,
                                          "message": "gradients below 1e-7"}))
        x, _y = _batch(step)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        step += 1
    hook.close()
    (inc,) = create_trial(str(tmp_path)).incidents()
    assert inc["kind"] == "rule" and inc["step"] >= 2
    assert inc["detail"] == {"rule": "vanishing_gradient", "message": "gradients below 1e-7", "first_step": 1}


def test_a_loss_spike(tmp_path):
    k = 40
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=64)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(k + 3):
        x, y = _batch(step % 4)
        if step == k:
            x = x * 300.0
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    kinds = {(i["kind"], i["step"]) for i in create_trial(str(tmp_path)).incidents()}
    assert ("loss_spike", k) in kinds or ("grad_norm_spike", k) in kinds, kinds
    assert all(s == k for _k, s in kinds), kinds
    spike = create_trial(str(tmp_path)).incidents()[0]["detail"]
    assert spike["value"] > spike["median"] and spike["why"]


def test_the_recorder_never_breaks_training(tmp_path, caplog):
    """An incident that cannot be written (a file where the incidents folder goes) turns the recorder off with one
    error; training goes on and ends exactly as without tensortap."""
    def train(hook):
        model = _mlp()
        loss_fn = nn.CrossEntropyLoss()
        if hook is not None:
            hook.register_module(model)
            hook.register_loss(loss_fn)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(12):
            if step == 5:
                with torch.no_grad():
                    model[2].bias[0] = float("nan")
            x, y = _batch(step)
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return model

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "incidents").write_text("in the way")
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        hook = _hook(str(tmp_path / "job"))
        hooked = train(hook)
        hook.close()
    plain = train(None)
    for a, b in zip(hooked.parameters(), plain.parameters(), strict=True):
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()
    errors = [r for r in caplog.records if "flight recorder" in r.getMessage()]
    assert len(errors) == 1 and hook.error_count >= 1


@pytest.mark.parametrize("order", ["register_then_compile", "compile_then_register"])
def test_compiled_models_train_with_no_graph_break(tmp_path, order, caplog):
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _mlp()
    hook = _hook(str(tmp_path))
    if order == "register_then_compile":
        hook.register_module(model)
        run = torch.compile(model, backend="aot_eager", fullgraph=True)
    else:
        run = torch.compile(model, backend="aot_eager", fullgraph=True)
        hook.register_module(run)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        with pytest.raises(KeyError):
            with hook:
                for step in range(4):
                    x, _y = _batch(step)
                    opt.zero_grad()
                    run(x).square().mean().backward()
                    opt.step()
                raise KeyError("stop here")
    assert dict(counters["graph_break"]) == {}
    assert hook.error_count == 0
    trial = create_trial(str(tmp_path))
    assert [i["kind"] for i in trial.incidents()] == ["exception"]
    for s in range(4):
        assert trial.tensor("gradient/Sequential_0.weight").reduction_value(s, "l2") > 0
        assert trial.tensor("Sequential_0.weight").reduction_value(s, "l2") > 0
    said = [r.getMessage() for r in caplog.records if "flight recorder" in r.getMessage() and "not" in r.getMessage()]
    assert len(said) == 1, said


def test_bad_settings_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(InvalidConfiguration, match="flight_recorder='yes'"):
        tp.Hook(out_dir=str(tmp_path), flight_recorder="yes")
    with pytest.raises(InvalidConfiguration, match="statistics='all': allowed are norms, full"):
        FlightConfig(statistics="all")
    monkeypatch.setenv("TENSORTAP_FLIGHT", "lots")
    with pytest.raises(InvalidConfiguration, match="TENSORTAP_FLIGHT='lots'"):
        tp.Hook(out_dir=str(tmp_path), flight_recorder=True)


def test_off_by_env_and_by_default(tmp_path, monkeypatch):
    """Off unless asked on an explicit hook; TENSORTAP_FLIGHT=0 turns it off even when asked."""
    for name, kw, env in (("default", {}, None), ("env-off", {"flight_recorder": True}, "0")):
        if env is not None:
            monkeypatch.setenv("TENSORTAP_FLIGHT", env)
        out = tmp_path / name
        out.mkdir()
        model = _mlp()
        hook = tp.Hook(out_dir=str(out), writer="thread", **kw)
        hook.register_module(model)
        for step in range(3):
            if step == 2:
                with torch.no_grad():
                    model[0].bias[0] = float("inf")
            model(_batch(step)[0])
        hook.close()
        assert not (out / "incidents").exists()


def test_eval_steps_are_recorded_as_their_own_steps(tmp_path):
    """TRAIN steps end at the optimizer's step, EVAL steps when the next forward begins: each keeps its own
    outputs (EVAL: no gradients), at its own mode step."""
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=32)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    eval_out = []
    with pytest.raises(KeyError):
        with hook:
            for _epoch in range(2):
                hook.set_mode(tp.modes.TRAIN)
                for step in range(3):
                    x, y = _batch(step)
                    opt.zero_grad()
                    loss_fn(model(x), y).backward()
                    opt.step()
                hook.set_mode(tp.modes.EVAL)
                with torch.no_grad():
                    for step in range(2):
                        x, y = _batch(100 + step)
                        out = model(x)
                        eval_out.append(out.norm().item())
                        loss_fn(out, y)
            raise KeyError("end")
    trial = create_trial(str(tmp_path))
    assert trial.steps(mode=tp.modes.EVAL) == [0, 1, 2, 3]
    assert trial.steps(mode=tp.modes.TRAIN) == [0, 1, 2, 3, 4, 5]
    root = trial.tensor("Sequential_output_0")
    got = [float(root.reduction_value(s, "l2", mode=tp.modes.EVAL)) for s in range(4)]
    assert got == pytest.approx(eval_out, rel=1e-6)
    grad = trial.tensor("gradient/Sequential_0.weight")
    assert grad.steps(mode=tp.modes.TRAIN) == [0, 1, 2, 3, 4, 5] and grad.steps(mode=tp.modes.EVAL) == []
    assert trial.tensor("CrossEntropyLoss_output_0").steps(mode=tp.modes.EVAL) == [0, 1, 2, 3]


def test_a_module_computing_with_a_non_finite_weight_names_the_weight(tmp_path):
    k = 4
    model = _mlp()
    hook = _hook(str(tmp_path))
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(k + 2):
        if step == k:
            with torch.no_grad():
                model[2].bias[3] = float("nan")
        x, _y = _batch(step)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    hook.close()
    inc = create_trial(str(tmp_path)).first_nonfinite()
    assert inc["step"] == k
    d = inc["detail"]
    assert (d["phase"], d["module"], d["parameter"], d["tensor"], d["nan"]) == (
        "weights", "2", "Sequential_2.bias", "Sequential_2.bias", 1)
    assert d["inputs"][0]["nonfinite"] == 0  # (what came in was finite)


@pytest.mark.parametrize("outputs", ["parameterized", "none"])
def test_outputs_of_fewer_modules(tmp_path, outputs):
    """outputs="parameterized" records modules with parameters of their own (and the model's and the loss's own
    outputs); "none" only those two; weights and gradients always."""
    model = _mlp()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=FlightConfig(steps=4, outputs=outputs))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(KeyError):
        with hook:
            for step in range(3):
                x, y = _batch(step)
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            raise KeyError("end")
    names = set(create_trial(str(tmp_path)).tensor_names(collection="flight"))
    assert {"Sequential_output_0", "CrossEntropyLoss_output_0", "Sequential_0.weight",
            "gradient/Sequential_6.bias"} <= names
    assert "1_output_0" not in names  # (a Tanh)
    assert ("0_output_0" in names) == (outputs == "parameterized")
    with pytest.raises(InvalidConfiguration, match="outputs='some': allowed are all, parameterized, none"):
        FlightConfig(outputs="some")


def test_a_step_the_grad_scaler_skips_is_its_own_step_without_gradients(tmp_path):
    """GradScaler skips the optimizer's step whose scaled gradients overflow (AMP's normal work, not an incident):
    the step keeps its own outputs, records no gradients, and the next step is recorded apart."""
    model = _mlp()
    hook = _hook(str(tmp_path), steps=16)
    hook.register_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    hook.register_scaler(scaler)
    with pytest.raises(KeyError):
        with hook:
            for step in range(6):
                x, _y = _batch(step)
                opt.zero_grad()
                loss = model(x).square().mean() * (1e36 if step == 3 else 1.0)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            raise KeyError("end")
    trial = create_trial(str(tmp_path))
    assert [i["kind"] for i in trial.incidents()] == ["exception"]
    assert trial.tensor("Sequential_output_0").steps() == [0, 1, 2, 3, 4, 5]
    assert trial.tensor("gradient/Sequential_0.weight").steps() == [0, 1, 2, 4, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_statistics_equal_what_torch_computes_on_the_same_tensors(tmp_path, dtype):
    """statistics="full": every weight's, gradient's and module output's l2, Σ|x|, max|x|, count of zeros, l4 and
    non-finite count at every step of the ring equal those the script computes with torch on the tensors it reads
    itself (outputs in a forward hook, weights and gradients in the optimizer's pre-hook); mean|x|, RMS and
    kurtosis follow from them."""
    from tensortap.analysis.stats import kurtosis, mean_abs, rms

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)
    with torch.no_grad():
        model[0].weight[:3] = 0.0  # (zeros in a weight; the ReLUs' outputs have theirs)
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=FlightConfig(steps=6, statistics="full"))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    step = 0

    def keep(name: str, t: torch.Tensor) -> None:
        seen.setdefault(step, {})[name] = t.detach().clone().double()

    for i, m in enumerate(model):
        m.register_forward_hook(lambda m, a, o, i=i: keep(f"{i}_output_0", o))

    def before_step(o, a, k) -> None:
        for n, p in model.named_parameters():
            keep(f"Sequential_{n}", p)
            keep(f"gradient/Sequential_{n}", p.grad)

    opt.register_step_pre_hook(before_step)
    with pytest.raises(RuntimeError, match="stop here"):
        with hook:
            for step in range(8):
                x, y = _batch(step)
                opt.zero_grad()
                out = model(x.to(dtype))
                keep("Sequential_output_0", out)
                loss_fn(out, y).backward()
                opt.step()
            raise RuntimeError("stop here")
    trial = create_trial(str(tmp_path))
    (inc,) = trial.incidents()
    assert inc["ring"] == {"first_step": 2, "last_step": 7}
    checked = 0
    for s in range(2, 8):
        for name, t in seen[s].items():
            tensor = trial.tensor(name)
            n = t.numel()
            want = {"l2": t.norm().item(), "l1": t.abs().sum().item(), "zeros": int((t == 0).sum()),
                    "l4": t.abs().pow(4).sum().pow(0.25).item(), "nonfinite": 0}
            got = {r: float(tensor.reduction_value(s, r)) for r in ("l2", "l1", "zeros", "l4", "nonfinite")}
            assert got == pytest.approx(want, rel=1e-5), (name, s)
            assert float(tensor.reduction_value(s, "max", abs=True)) == pytest.approx(t.abs().max().item(), rel=1e-6)
            assert kurtosis(n, got["l2"], got["l4"]) == pytest.approx(
                n * t.pow(4).sum().item() / t.pow(2).sum().item() ** 2, rel=1e-4)
            assert mean_abs(n, got["l1"]) == pytest.approx(t.abs().mean().item(), rel=1e-5)
            assert rms(n, got["l2"]) == pytest.approx(t.pow(2).mean().sqrt().item(), rel=1e-5)
            checked += 1
    assert checked == 6 * (6 + 12)  # (5 module outputs and the model's; 6 weights and 6 gradients)
    assert int(trial.tensor("1_output_0").reduction_value(7, "zeros")) > 0
    assert int(trial.tensor("Sequential_0.weight").reduction_value(7, "zeros")) == 3 * 8


def test_full_statistics_of_finite_values_past_float32s_range(tmp_path):
    """A finite float32 weight whose squares and fourth powers overflow float32: its statistics are computed again
    in float64, not reported as non-finite."""
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1e20, 0.0, 2.0, -3e19], [0.0, 0.0, 1.0, 1.0]]))
    hook = _hook(str(tmp_path), steps=FlightConfig(steps=4, statistics="full"))
    hook.register_module(model)
    with pytest.raises(RuntimeError, match="stop here"):
        with hook:
            model(torch.zeros(3, 4))
            model(torch.zeros(3, 4))
            raise RuntimeError("stop here")
    trial = create_trial(str(tmp_path))
    w = trial.tensor("Linear_weight")
    t = model.weight.detach().double()
    step = w.steps()[0]
    assert int(w.reduction_value(step, "nonfinite")) == 0
    assert int(w.reduction_value(step, "zeros")) == 3
    assert float(w.reduction_value(step, "l2")) == pytest.approx(t.norm().item(), rel=1e-6)
    assert float(w.reduction_value(step, "l4")) == pytest.approx(t.pow(4).sum().pow(0.25).item(), rel=1e-6)
    assert float(w.reduction_value(step, "l1")) == pytest.approx(t.abs().sum().item(), rel=1e-6)


_DDP_WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    import tensortap.pytorch as tp
    from tensortap.capture.flight import FlightConfig

    out_dir, k = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    model = nn.parallel.DistributedDataParallel(net)
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=500), include_workers="all",
                   writer="thread", flight_recorder=FlightConfig(steps=6))
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)  # (the wrapper: the inner module's names)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(k + 2):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        if rank == 1 and step == k:
            x[3, 5] = float("inf")  # (a corrupt sample on rank 1 only)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.close()
    dist.barrier()
    dist.destroy_process_group()
""")


def test_inside_ddp_the_rank_whose_forward_went_non_finite_is_named(tmp_path):
    """Two gloo processes of a DDP job, the flight recorder on in each (the wrapper registered): a corrupt sample
    on rank 1 at step k makes its first Linear output inf (forward, its input non-finite); the all-reduced
    gradients are then non-finite on rank 0 too (backward). Each worker writes its own incident with its ring;
    `first_nonfinite()` names rank 1's forward; before step k the ring's gradients, what each rank's optimizer
    consumed after the all-reduce, are the same on both ranks."""
    import socket

    k = 9
    script = tmp_path / "ddp_worker.py"
    script.write_text(_DDP_WORKER)
    out = tmp_path / "out"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("TENSORTAP_DISABLE", None)
        procs.append(subprocess.Popen([sys.executable, str(script), str(out), str(k)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _o, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    trial = create_trial(str(out))
    incs = {i["worker"]: i for i in trial.incidents() if i["kind"] == "non_finite"}
    assert set(incs) == {"worker_0", "worker_1"} and {i["step"] for i in incs.values()} == {k}
    d1, d0 = incs["worker_1"]["detail"], incs["worker_0"]["detail"]
    assert (d1["phase"], d1["module"], d1["tensor"]) == ("forward", "0", "0_output_0")
    assert d1["inputs"][0]["nonfinite"] == 1 and d1["posinf"] + d1["neginf"] + d1["nan"] > 0
    assert (d0["phase"], d0["parameter"]) == ("backward", "Sequential_0.weight")  # (inf x tanh' = 0: NaN)
    first = trial.first_nonfinite()
    assert (first["worker"], first["detail"]["phase"]) == ("worker_1", "forward")
    assert incs["worker_0"]["ring"] == incs["worker_1"]["ring"] == {"first_step": k - 5, "last_step": k}
    g = trial.tensor("gradient/Sequential_2.weight")
    for step in range(k - 5, k):
        a = float(g.reduction_value(step, "l2", worker="worker_0"))
        b = float(g.reduction_value(step, "l2", worker="worker_1"))
        assert a == b > 0
    assert int(g.reduction_value(k, "nonfinite", worker="worker_0")) == 0
    g0 = trial.tensor("gradient/Sequential_0.weight")
    assert int(g0.reduction_value(k, "nonfinite", worker="worker_0")) > 0


_FSDP_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import init_device_mesh
    import tensortap.pytorch as tp
    from tensortap.capture.flight import FlightConfig

    out_dir, rec_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    mesh = init_device_mesh("cpu", (2,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=500), include_workers="all",
                   writer="thread", flight_recorder=FlightConfig(steps=8, statistics="full"))
    hook.register_module(model)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = {}
    step_now = [0]

    def read(optimizer, args, kwargs):
        for n, p in model.named_parameters():
            rec[f"w{step_now[0]}/{n}"] = p.full_tensor().detach().double().numpy().copy()
            rec[f"g{step_now[0]}/{n}"] = p.grad.full_tensor().double().numpy().copy()

    opt.register_step_pre_hook(read)
    try:
        with hook:
            for step in range(4):
                step_now[0] = step
                torch.manual_seed(100 + step + 10 * rank)
                x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            raise RuntimeError("the job ends")
    except RuntimeError:
        pass
    if rank == 0:
        np.savez(rec_path, **rec)
    print("errors", hook.error_count, flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_fsdp2_parameters_are_recorded_as_shards_and_read_whole(tmp_path):
    """FSDP2 (`fully_shard`, two gloo processes), the flight recorder on with its full statistics: each worker
    records its local shards of the weights and gradients, the reader merges them, and every merged statistic at
    every step of the ring equals the one of the full tensor the script reads itself (`full_tensor()` in the
    optimizer's pre-hook)."""
    import socket

    script = tmp_path / "fsdp_worker.py"
    script.write_text(_FSDP_WORKER)
    out, rec_path = tmp_path / "out", tmp_path / "rec.npz"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("TENSORTAP_DISABLE", None)
        procs.append(subprocess.Popen([sys.executable, str(script), str(out), str(rec_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        o, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "errors 0" in o, err[-3000:]
    import numpy as np

    rec = np.load(rec_path)
    trial = create_trial(str(out))
    assert {i["worker"] for i in trial.incidents()} == {"worker_0", "worker_1"}
    checked = 0
    for key in rec.files:
        kind, name = key.split("/", 1)
        step = int(kind[1:])
        t = rec[key].ravel()
        tensor = trial.tensor(("gradient/Sequential_" if kind[0] == "g" else "Sequential_") + name)
        want = {"l2": np.linalg.norm(t), "l1": np.abs(t).sum(), "zeros": float((t == 0).sum()),
                "l4": (t ** 4).sum() ** 0.25, "nonfinite": 0.0}
        got = {r: float(tensor.reduction_value(step, r)) for r in want}
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), key
        assert float(tensor.reduction_value(step, "max", abs=True)) == pytest.approx(np.abs(t).max(), rel=1e-6)
        checked += 1
    assert checked == 4 * 8  # (4 steps, 4 weights and 4 gradients)


class _Transposed(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x.t(), None


class _Strided(nn.Module):
    def forward(self, x: tuple[torch.Tensor, None]) -> torch.Tensor:
        return x[0][:, ::2]


class _BFloat16(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


class _Layouts(nn.Module):
    """Tensors of every layout the norms are read from: a channels-last convolution (its weight and gradient dense,
    not contiguous), a layer used only on odd steps (no gradient on even ones), and outputs transposed (dense, in a
    tuple with a None), strided (not dense) and bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1).to(memory_format=torch.channels_last)
        self.lin = nn.Linear(4 * 6 * 6, 8)
        self.odd = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.extra = nn.Sequential(_Transposed(), _Strided(), _BFloat16())

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = self.conv(x.to(memory_format=torch.channels_last)).relu().flatten(1)
        h = self.lin(h)
        if step % 2:
            h = self.odd(h)
        out = self.head(h)
        self.extra(out)
        return out


def test_norms_of_every_layout_equal_what_torch_computes(tmp_path):
    """statistics="norms" (the default): the l2 norm and non-finite count of every weight, gradient and module
    output at every step of the ring equal torch's on the tensors the script reads itself, whatever their layout
    (contiguous, channels-last, transposed, strided, bfloat16), with a parameter that has no gradient on some
    steps, after weights are replaced (`.data` set; one by a view that is not dense) and after the model is
    converted to float64 mid-run."""
    torch.manual_seed(0)
    model = _Layouts()
    loss_fn = nn.CrossEntropyLoss()
    hook = _hook(str(tmp_path), steps=16)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    step = 0

    def keep(name: str, t: torch.Tensor | None) -> None:
        if t is not None:
            seen.setdefault(step, {})[name] = t.detach().clone().double()

    for name, m in model.named_modules():
        m.register_forward_hook(lambda m, a, o, name=name or "_Layouts": keep(
            f"{name}_output_0", o if torch.is_tensor(o) else o[0]))

    def before_step(o, a, k) -> None:
        for n, p in model.named_parameters():
            keep(f"_Layouts_{n}", p)
            keep(f"gradient/_Layouts_{n}", p.grad)

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.register_step_pre_hook(before_step)
    dtype = torch.float32
    with pytest.raises(RuntimeError, match="stop here"):
        with hook:
            for step in range(12):
                if step == 4:
                    model.lin.weight.data = model.lin.weight.data * 2  # (a new address)
                if step == 5:
                    w = model.head.weight.data
                    model.head.weight.data = torch.cat([w, -w], 1)[:, ::2]  # (a weight not dense)
                if step == 8:
                    model.double()  # (new addresses and another dtype)
                    dtype = torch.float64
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(5, 3, 6, 6, generator=g, dtype=dtype), torch.randint(0, 3, (5,), generator=g)
                opt.zero_grad()
                out = model(x, step)
                loss_fn(out, y).backward()
                opt.step()
            raise RuntimeError("stop here")
    assert hook.error_count == 0
    trial = create_trial(str(tmp_path))
    checked = 0
    for s in range(12):
        assert ("gradient/_Layouts_odd.weight" in seen[s]) == (s % 2 == 1)
        for name, t in seen[s].items():
            tensor = trial.tensor(name)
            assert float(tensor.reduction_value(s, "l2")) == pytest.approx(t.norm().item(), rel=1e-6), (name, s)
            assert int(tensor.reduction_value(s, "nonfinite")) == 0
            checked += 1
    assert {"gradient/_Layouts_conv.weight", "extra.0_output_0", "extra.1_output_0", "extra.2_output_0"} <= set(
        n for v in seen.values() for n in v)
    assert checked == sum(len(v) for v in seen.values()) > 12 * 20
