"""The MXNet Gluon hook against real MXNet 1.9.1 (CPU): saved values are bit-identical to what the script read.

MXNet 1.9.1 imports only with numpy<1.24, so these run in `.venv-mxnet` (`make test-mxnet`); in the main
environment (NumPy 2, no MXNet) they are skipped.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 is not installed in this environment; `make test-mxnet` runs these tests in "
    ".venv-mxnet (MXNet needs numpy<1.24)")
from mxnet import autograd, gluon, nd  # noqa: E402

import tensortap.mxnet as tm  # noqa: E402
from tensortap.exceptions import InvalidConfiguration, TensorUnavailableForStep  # noqa: E402
from tensortap.trials.state import StepState  # noqa: E402

TRAIN, EVAL = tm.modes.TRAIN, tm.modes.EVAL
LOSS = "softmaxcrossentropyloss0_output_0"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Blocks named from 0 in every test (hybridsequential0, dense0, ...), no hook left behind."""
    for var in ("TENSORTAP_DISABLE", "HOROVOD_RANK", "HOROVOD_SIZE", "RANK", "WORLD_SIZE",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with mx.name.NameManager():
        yield
    tm.del_hook()


def mlp(hybrid: bool = False) -> gluon.nn.HybridSequential:
    """dense0 (relu inside: dense0_relu), tanh0 (a standalone activation), dense1, sigmoid0, dense2."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Activation("tanh"), gluon.nn.Dense(8),
            gluon.nn.Activation("sigmoid"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier(rnd_type="gaussian"))
    if hybrid:
        net.hybridize()
    return net


def batch(step: int, n: int = 6):
    rs = np.random.RandomState(step)
    return nd.array(rs.randn(n, 5).astype(np.float32)), nd.array(rs.randint(0, 3, n))


def train(net, steps, hook=None, loss_fn=None, record=None, trainer=None, start=0):
    """Train `net`; `record[(step, name)]` gets the values read by the script itself: weights after the
    forward (before the update), gradients after backward, the loss, and the blocks' outputs (through the
    script's own forward hooks)."""
    loss_fn = loss_fn or gluon.loss.SoftmaxCrossEntropyLoss()
    if hook is not None:
        hook.register_block(net)
        hook.register_block(loss_fn)
    trainer = trainer or gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    seen: dict[str, np.ndarray] = {}
    if record is not None:
        for b in [net, *net._children.values()]:
            b.register_forward_hook(lambda blk, i, o: isinstance(o, nd.NDArray) and seen.__setitem__(blk.name,
                                                                                                     o.asnumpy()))
    for k in range(steps):
        x, y = batch(start + k)
        seen.clear()
        with autograd.record():
            loss = loss_fn(net(x), y)
        weights = {p.name: p.data().asnumpy() for p in net.collect_params().values()}
        loss.backward()
        if record is not None:
            s = start + k
            record.update({(s, n): v for n, v in weights.items()})
            record.update({(s, "gradient/" + p.name): p.grad().asnumpy() for p in net.collect_params().values()})
            record[(s, LOSS)] = loss.asnumpy()
            record.update({(s, f"{n}_output_0"): v for n, v in seen.items()})
        trainer.step(x.shape[0])
    return trainer


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_values_bit_identical_with_smdebug_names(tmp_path, writer):
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=2), writer=writer,
                   include_collections=["weights", "biases", "gradients", "losses", "outputs"])
    rec: dict = {}
    train(mlp(), 5, hook, record=rec)
    hook.close()
    t = tm.create_trial(out)
    assert t.steps() == [0, 2, 4]
    params = ["dense0_weight", "dense0_bias", "dense1_weight", "dense1_bias", "dense2_weight", "dense2_bias"]
    assert set(t.tensor_names(collection="weights")) == {p for p in params if p.endswith("weight")}
    assert set(t.tensor_names(collection="biases")) == {p for p in params if p.endswith("bias")}
    assert set(t.tensor_names(collection="gradients")) == {"gradient/" + p for p in params}
    assert t.tensor_names(collection="losses") == [LOSS]
    outputs = {"hybridsequential0_output_0", "dense0_output_0", "dense0_relu_output_0", "tanh0_output_0",
               "dense1_output_0", "sigmoid0_output_0", "dense2_output_0", LOSS}
    assert set(t.tensor_names(collection="outputs")) == outputs
    checked = 0
    for s in (0, 2, 4):
        for name in [*params, *("gradient/" + p for p in params), *outputs - {"dense0_relu_output_0"}]:
            assert same(t.tensor(name).value(s), rec[(s, name)]), (s, name)
            checked += 1
        # the Dense's activation runs inside it: its output is the Dense's
        assert same(t.tensor("dense0_relu_output_0").value(s), rec[(s, "dense0_output_0")])
    assert checked == 3 * 19
    assert hook.error_count == 0



@pytest.mark.parametrize("writer", ["process", "thread"])
def test_every_step_handed_over_after_it_ends_at_its_own_step(tmp_path, writer):
    """A saving step's tensors reach the writer when the step after it ends (the loop never waits for MXNet's
    engine): every step's weights, gradients and loss land at their own step, bit for bit, also when the loss
    changes shape (a smaller last batch) and for the last step, saved at close. A reader sees a step only
    once its tensors are written."""
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), writer=writer,
                   include_collections=["weights", "biases", "gradients", "losses"])
    net, loss_fn = mlp(), gluon.loss.SoftmaxCrossEntropyLoss()
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    params = list(net.collect_params().values())
    copies = []  # (the script's own engine copies: nothing in the loop waits for the engine)
    for k in range(6):
        x, y = batch(k, n=6 if k < 4 else 4)
        with autograd.record():
            loss = loss_fn(net(x), y)
        weights = {p.name: p.data().copy() for p in params}
        loss.backward()
        grads = {"gradient/" + p.name: p.grad().copy() for p in params}
        copies.append({**weights, **grads, LOSS: loss.copy()})
        trainer.step(x.shape[0])
        if k == 2:
            hook.flush()
            live = tm.create_trial(out)
            # create_trial in the training thread ends the open step and hands it over (visible without close)
            assert live.steps() == [0, 1, 2]
            # Every step saves: none may look passed without its tensors (a rule would skip it as not saved).
            states = [live.has_passed_step(s) for s in range(3)]
            assert StepState.UNAVAILABLE not in states, states
            for s in live.steps():  # a step shown complete has all its tensors
                for name, arr in copies[s].items():
                    assert same(live.tensor(name).value(s), arr.asnumpy()), (s, name)
    hook.close()
    t = tm.create_trial(out)
    assert t.steps() == list(range(6))
    for s, rec in enumerate(copies):
        for name, arr in rec.items():
            assert same(t.tensor(name).value(s), arr.asnumpy()), (s, name)
    assert t.tensor(LOSS).value(5).shape == (4,)
    assert hook.error_count == 0 and hook.dropped_records == 0



def test_a_float64_model(tmp_path):
    """Weights, gradients and losses of another dtype than float32: every step's values saved as the script read
    them, in its dtype."""
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    net, loss_fn = mlp(), gluon.loss.SoftmaxCrossEntropyLoss()
    net.cast("float64")
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    copies = []
    for k in range(3):
        x, y = batch(k)
        with autograd.record():
            loss = loss_fn(net(x.astype("float64")), y.astype("float64"))
        weights = {p.name: p.data().copy() for p in net.collect_params().values()}
        loss.backward()
        grads = {"gradient/" + p.name: p.grad().copy() for p in net.collect_params().values()}
        copies.append({**weights, **grads, LOSS: loss.copy()})
        trainer.step(x.shape[0])
    hook.close()
    t = tm.create_trial(out)
    assert t.steps() == [0, 1, 2]
    for s, rec in enumerate(copies):
        for name, arr in rec.items():
            assert same(t.tensor(name).value(s), arr.asnumpy()), (s, name)
    assert t.tensor("gradient/dense0_weight").value(2).dtype == np.float64
    assert hook.error_count == 0



def test_copies_through_mxnet_c_api_failing_fall_back_to_mx_nd(tmp_path, monkeypatch, caplog):
    """If MXNet's C API does not take the hook's direct calls (another MXNet build), it copies with mx.nd
    operations instead: values still saved, the hook stays on, one warning."""
    from tensortap.mxnet import hook as mxhook

    def refuse(self):
        raise mx.base.MXNetError("no such operator")

    monkeypatch.setattr(mxhook._Invoke, "__call__", refuse)
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    rec: dict = {}
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        train(mlp(), 3, hook, record=rec)
        hook.close()
    assert hook.error_count == 0
    assert sum("C API failed" in r.message for r in caplog.records) == 1
    t = tm.create_trial(out)
    assert t.steps() == [0, 1, 2]
    for s in range(3):
        for name in ("dense0_weight", "dense2_bias", "gradient/dense1_weight", LOSS):
            assert same(t.tensor(name).value(s), rec[(s, name)]), (s, name)


def test_reductions_beside_raw_values_and_instead_of_them(tmp_path):
    """Weights saved as reductions only, gradients raw with a reduction beside them (the writer computes both)."""
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=2), include_collections=["weights", "gradients"])
    hook.get_collection("weights").reduction_config = tm.ReductionConfig(reductions=["max"], abs_reductions=["mean"])
    hook.get_collection("gradients").reduction_config = tm.ReductionConfig(norms=["l2"], save_raw_tensor=True)
    rec: dict = {}
    train(mlp(), 3, hook, record=rec)
    hook.close()
    assert hook.error_count == 0
    t = tm.create_trial(out)
    for s in (0, 2):
        for p in ("dense0_weight", "dense2_weight"):
            w = rec[(s, p)]
            assert same(t.tensor(p).reduction_value(s, "max"), w.max())
            assert np.isclose(t.tensor(p).reduction_value(s, "mean", abs=True), np.abs(w).mean(), rtol=1e-6)
            g = rec[(s, "gradient/" + p)]
            assert same(t.tensor("gradient/" + p).value(s), g)
            assert np.isclose(t.tensor("gradient/" + p).reduction_value(s, "l2"), np.linalg.norm(g.ravel()),
                              rtol=1e-5)
        with pytest.raises(TensorUnavailableForStep):  # (reductions only)
            t.tensor("dense0_weight").value(s)


def test_default_collections_save_losses_only(tmp_path):
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1))
    assert hook.has_default_hook_configuration()
    rec: dict = {}
    train(mlp(), 3, hook, record=rec)
    hook.close()
    t = tm.create_trial(out)
    assert t.tensor_names() == [LOSS]
    assert all(same(t.tensor(LOSS).value(s), rec[(s, LOSS)]) for s in range(3))
    losses = hook.get_collection("losses")
    # smdebug's MXNet regex: a loss block's outputs, not its inputs
    assert losses.matches(LOSS) and losses.matches("l2loss0_output_0")
    assert not losses.matches("softmaxcrossentropyloss0_input_0") and not losses.matches("dense0_output_0")


@pytest.mark.parametrize("static", [False, True], ids=["hybridize", "hybridize-static"])
def test_hybridized_block(tmp_path, static, caplog):
    """A hybridized model runs as one graph: weights, gradients, losses and its own input and output are
    saved, bit-identical; the blocks inside it are not visible (said once), and nothing breaks."""
    out = str(tmp_path / "run")
    net = mlp()
    net.hybridize(static_alloc=static, static_shape=static)
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "inputs", "outputs", "relu_output"])
    rec: dict = {}
    with caplog.at_level(logging.INFO, logger="tensortap"):
        train(net, 3, hook, record=rec)
    hook.close()
    assert hook.error_count == 0 and not hook.disabled
    assert sum("hybridized" in r.getMessage() for r in caplog.records) == 1
    t = tm.create_trial(out)
    assert t.steps() == [0, 1, 2]
    names = set(t.tensor_names())
    assert {"hybridsequential0_input_0", "hybridsequential0_output_0", LOSS, "softmaxcrossentropyloss0_input_0",
            "softmaxcrossentropyloss0_input_1", "dense0_weight", "gradient/dense2_bias"} <= names
    assert not {n for n in names if n.startswith(("dense0_", "tanh0", "sigmoid0")) and "_output_" in n}
    for s in range(3):
        for name in ("dense0_weight", "dense2_weight", "gradient/dense0_weight", "gradient/dense2_bias", LOSS,
                     "hybridsequential0_output_0"):
            assert same(t.tensor(name).value(s), rec[(s, name)]), (s, name)
        assert same(t.tensor("hybridsequential0_input_0").value(s), batch(s)[0].asnumpy())
        assert same(t.tensor("softmaxcrossentropyloss0_input_1").value(s), batch(s)[1].asnumpy())


def test_plain_sequential_with_hybridized_child(tmp_path):
    """A (non-hybrid) Sequential around a hybridized block: the child's own output is still saved."""
    out = str(tmp_path / "run")
    inner = gluon.nn.HybridSequential()
    inner.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net = gluon.nn.Sequential()
    net.add(inner)
    net.initialize()
    inner.hybridize()
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), include_collections=["outputs", "weights"])
    rec: dict = {}
    train(net, 2, hook, record=rec)
    hook.close()
    t = tm.create_trial(out)
    for s in range(2):
        assert same(t.tensor("hybridsequential0_output_0").value(s), rec[(s, "hybridsequential0_output_0")])
        assert same(t.tensor("sequential0_output_0").value(s), rec[(s, "sequential0_output_0")])
        assert same(t.tensor("dense0_weight").value(s), rec[(s, "dense0_weight")])


def test_include_regex_and_a_block_called_twice(tmp_path):
    """include_regex selects block I/O by name (smdebug's `default` collection); a block that runs twice in a
    step continues its index (dense0_output_0, dense0_output_1), with each call's own values."""
    out = str(tmp_path / "run")
    shared = gluon.nn.Dense(8, in_units=8)
    net = gluon.nn.HybridSequential()
    net.add(shared, gluon.nn.Activation("relu"), shared)
    net.initialize()
    calls: list = []
    shared.register_forward_hook(lambda blk, i, o: calls.append((i[0].asnumpy(), o.asnumpy())))
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), include_regex=[r"^dense0_(in|out)put_\d+$"])
    hook.register_block(net)
    for k in range(2):
        calls.clear()
        net(nd.array(np.random.RandomState(k).randn(4, 8).astype(np.float32)))
        first, second = list(calls)
    hook.close()
    t = tm.create_trial(out)
    assert set(t.tensor_names()) == {"dense0_input_0", "dense0_input_1", "dense0_output_0", "dense0_output_1"}
    assert same(t.tensor("dense0_input_0").value(1), first[0]) and same(t.tensor("dense0_output_0").value(1), first[1])
    assert same(t.tensor("dense0_input_1").value(1), second[0])
    assert same(t.tensor("dense0_output_1").value(1), second[1])


def test_activation_collections_by_block_type(tmp_path):
    """relu/tanh/sigmoid blocks (standalone, or the one a Dense makes for activation=...) fill the activation
    collections by type, whatever their names; their inputs and outputs are bit-identical."""
    out = str(tmp_path / "run")
    acts = ["relu_input", "relu_output", "tanh_input", "tanh_output", "sigmoid_input", "sigmoid_output"]
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), include_collections=acts)
    net = mlp()
    seen: dict = {}
    for b in (net[1], net[3], net[0].act):
        b.register_forward_hook(lambda blk, i, o: isinstance(o, nd.NDArray) and seen.update(
            {(blk.name, "in"): i[0].asnumpy(), (blk.name, "out"): o.asnumpy()}))
    hook.register_block(net)
    x, _ = batch(0)
    net(x)
    hook.close()
    t = tm.create_trial(out)
    expect = {"relu_input": "dense0_relu_input_0", "relu_output": "dense0_relu_output_0",
              "tanh_input": "tanh0_input_0", "tanh_output": "tanh0_output_0",
              "sigmoid_input": "sigmoid0_input_0", "sigmoid_output": "sigmoid0_output_0"}
    for coll, name in expect.items():
        assert t.tensor_names(collection=coll) == [name]
        block, kind = name.rsplit("_", 2)[0], "in" if "_input_" in name else "out"
        assert same(t.tensor(name).value(0), seen[(block, kind)]), name
    assert set(t.tensor_names()) == set(expect.values())  # (no other block's I/O: no collection asked)


def test_modes_and_mode_steps(tmp_path):
    """TRAIN and EVAL count their own steps; gradients are saved in TRAIN only."""
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=2),
                   include_collections=["losses", "gradients", "weights"])
    net, loss_fn = mlp(), gluon.loss.SoftmaxCrossEntropyLoss()
    rec: dict = {}
    hook.set_mode(TRAIN)
    trainer = train(net, 3, hook, loss_fn=loss_fn, record=rec)
    hook.set_mode(EVAL)
    eval_losses = []
    for k in range(3):
        x, y = batch(100 + k)
        eval_losses.append(loss_fn(net(x), y).asnumpy())
    hook.set_mode(TRAIN)
    train(net, 2, None, loss_fn=loss_fn, trainer=trainer, start=3)  # (the hook is registered already)
    hook.close()
    t = tm.create_trial(out)
    # TRAIN 0, 2 | EVAL 0, 1, 2 (global 3, 4, 5: EVAL losses are saved at every step) | TRAIN 4 (global 7)
    assert t.steps() == [0, 2, 3, 4, 5, 7]
    assert t.steps(mode=TRAIN) == [0, 2, 4] and t.steps(mode=EVAL) == [0, 1, 2]
    assert [t.mode(s) for s in t.steps()] == [TRAIN, TRAIN, EVAL, EVAL, EVAL, TRAIN]
    g = t.tensor("gradient/dense0_weight")
    assert g.steps(mode=TRAIN) == [0, 2, 4] and g.steps(mode=EVAL) == []
    assert same(g.value(0, mode=TRAIN), rec[(0, "gradient/dense0_weight")])
    assert same(g.value(2, mode=TRAIN), rec[(2, "gradient/dense0_weight")])
    assert same(t.tensor(LOSS).value(0, mode=EVAL), eval_losses[0])
    assert same(t.tensor(LOSS).value(2, mode=EVAL), eval_losses[2])
    assert t.tensor("dense0_weight").steps(mode=EVAL) == [0, 2]


def test_steps_between_saving_steps_are_counted_across_modes(tmp_path):
    """Steps that save nothing are counted in their mode (and globally) however they are counted."""
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=4), include_collections=["losses", "gradients"])
    net, loss_fn = mlp(), gluon.loss.SoftmaxCrossEntropyLoss()
    rec: dict = {}
    hook.set_mode(TRAIN)
    trainer = train(net, 10, hook, loss_fn=loss_fn, record=rec)
    assert hook.step == 9 and hook.mode_steps[TRAIN] == 9
    hook.set_mode(EVAL)
    eval_losses = [loss_fn(net(x), y).asnumpy() for x, y in (batch(100 + k) for k in range(5))]
    assert hook.step == 14 and hook.mode_steps[EVAL] == 4
    hook.set_mode(TRAIN)
    train(net, 3, None, loss_fn=loss_fn, trainer=trainer, start=10, record=rec)
    assert hook.step == 17 and hook.mode_steps[TRAIN] == 12
    hook.close()
    t = tm.create_trial(out)
    assert t.steps(mode=TRAIN) == [0, 4, 8, 12] and t.steps(mode=EVAL) == [0, 1, 2, 3, 4]  # (EVAL losses: every step)
    assert t.steps() == [0, 4, 8, 10, 11, 12, 13, 14, 17]
    for s in (0, 4, 8, 12):
        assert same(t.tensor("gradient/dense0_weight").value(s, mode=TRAIN), rec[(s, "gradient/dense0_weight")])
    assert same(t.tensor(LOSS).value(4, mode=EVAL), eval_losses[4])


def test_save_tensor_and_save_scalar(tmp_path):
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=2))
    net = mlp()
    hook.register_block(net)
    custom = []
    for k in range(3):
        x, _ = batch(k)
        net(x)
        v = np.arange(6, dtype=np.float64).reshape(2, 3) * k
        custom.append(v)
        hook.save_tensor("my/tensor", v, "mine")
        hook.save_scalar("lr", 0.5 / (k + 1))
    hook.close()
    t = tm.create_trial(out)
    assert t.tensor("my/tensor").steps() == [0, 2]
    assert same(t.tensor("my/tensor").value(2), custom[2])
    assert t.tensor_names(collection="mine") == ["my/tensor"]
    assert t.tensor("scalar/lr").steps() == [0, 1, 2]  # (scalars: every step)
    assert float(t.tensor("scalar/lr").value(1)) == 0.25


def test_get_hook_and_json_config(tmp_path, monkeypatch):
    """smdebug's way in: get_hook(create_if_not_exists=True) from the JSON config, and
    Hook.create_from_json_file(); the file's collections and intervals apply."""
    assert tm.get_hook() is None
    monkeypatch.delenv("TENSORTAP_CONFIG", raising=False)
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "missing.json"))
    assert tm.get_hook(create_if_not_exists=True) is None
    cfg = tmp_path / "hook.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [{"CollectionName": "weights"},
                                     {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "2"}}],
    }))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(cfg))
    hook = tm.get_hook(create_if_not_exists=True)
    assert type(hook) is tm.Hook and tm.get_hook() is hook and hook.out_dir == str(tmp_path / "run")
    rec: dict = {}
    train(mlp(), 5, hook, record=rec)
    hook.close()
    t = tm.create_trial(str(tmp_path / "run"))
    assert t.tensor("dense0_weight").steps() == [0, 3]
    assert t.tensor("gradient/dense1_bias").steps() == [0, 2, 4]
    assert same(t.tensor("gradient/dense1_bias").value(4), rec[(4, "gradient/dense1_bias")])
    assert t.tensor(LOSS).steps() == [0, 3]  # (losses: always saved, as in smdebug, at the hook's interval)
    other = tm.Hook.create_from_json_file(str(cfg), out_dir=str(tmp_path / "other"))
    assert type(other) is tm.Hook and "weights" in other.include_collections and tm.get_hook() is other
    other.close()


def test_bad_input_is_refused_at_once(tmp_path):
    hook = tm.Hook(str(tmp_path / "run"))
    with pytest.raises(InvalidConfiguration, match="mxnet.gluon.Block"):
        hook.register_block(np.zeros(3))
    hook.close()


def test_injected_failure_turns_the_hook_off_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """An error inside tensortap (here: the hand-off to the writer fails) is logged once, counted, the hook
    turns itself off, and the training is exactly that of an unhooked run."""
    hooked, plain = mlp(), mlp()
    hooked(batch(0)[0]), plain(batch(0)[0])  # (deferred initialisation)
    for p, q in zip(hooked.collect_params().values(), plain.collect_params().values(), strict=True):
        q.set_data(p.data().copy())
    hook = tm.Hook(str(tmp_path / "run"), save_config=tm.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "outputs"])
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise OSError("injected: the disk is gone")

    writer = hook._get_writer()  # (whatever way the hook hands its tensors over)
    for handoff in ("reserve_batch", "submit", "submit_many", "submit_batch"):  # (the writer contract's hand-offs)
        monkeypatch.setattr(writer, handoff, broken)
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        train(hooked, 4, hook)
        train(plain, 4)
    hook.close()
    assert hook.disabled and hook.error_count == 1 and len(calls) == 1
    assert isinstance(hook.first_error, OSError)
    assert sum("turns itself off" in r.getMessage() for r in caplog.records) == 1
    for p, q in zip(hooked.collect_params().values(), plain.collect_params().values(), strict=True):
        assert same(p.data().asnumpy(), q.data().asnumpy()), p.name


def test_disabled_by_env_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    out = tmp_path / "run"
    hook = tm.Hook(str(out), save_config=tm.SaveConfig(save_interval=1), include_collections=["weights"])
    train(mlp(), 2, hook)
    hook.close()
    assert not out.exists() or not any(out.rglob("*.idx*"))
    assert hook.error_count == 0


def test_horovod_rank_from_its_environment(tmp_path, monkeypatch):
    """Horovod cannot be built here, so its rank comes from the variables horovodrun sets (HOROVOD_RANK,
    HOROVOD_SIZE); with include_workers="all" rank 1 writes as worker_1, with "one" it writes nothing."""
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    out = str(tmp_path / "run")
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), include_workers="all")
    assert (hook.rank, hook.world_size, hook.worker, hook.num_workers) == (1, 2, "worker_1", 2)
    rec: dict = {}
    train(mlp(), 2, hook, record=rec)
    hook.close()
    silent = tm.Hook(str(tmp_path / "silent"), include_workers="one")
    assert silent.rank == 1 and not silent.writes
    train(mlp(), 1, silent)
    silent.close()
    assert not (tmp_path / "silent").exists() or not any((tmp_path / "silent").rglob("*worker*"))
    t = tm.create_trial(out)
    assert t.workers() == ["worker_1"]
    assert same(t.tensor(LOSS).value(1, worker="worker_1"), rec[(1, LOSS)])


def test_horovod_initialised_after_the_hook(tmp_path, monkeypatch):
    """A hook made before hvd.init() takes Horovod's rank at its first step. `horovod.mxnet` is a stand-in
    module here (Horovod cannot be built in this environment), with Horovod's rank()/size() API."""
    import types

    hvd = types.ModuleType("horovod.mxnet")
    state = {"init": False}

    def size():
        if not state["init"]:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        return 4

    hvd.size, hvd.rank = size, lambda: 2
    monkeypatch.setitem(sys.modules, "horovod.mxnet", hvd)
    hook = tm.Hook(str(tmp_path / "run"), include_workers="all")
    assert hook.rank == 0
    state["init"] = True  # hvd.init()
    train(mlp(), 1, hook)
    hook.close()
    assert (hook.rank, hook.world_size, hook.worker, hook.num_workers) == (2, 4, "worker_2", 4)
    assert tm.create_trial(str(tmp_path / "run")).workers() == ["worker_2"]


def test_importing_tensortap_does_not_import_mxnet():
    code = "import sys, tensortap, tensortap.trials; print('mxnet' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
