"""The activation rules (DeadRelu, SaturatedActivation, CheckInputImages) on real MXNet Gluon trainings captured
by tensortap.mxnet, with the hook configured by the rules' own configs (tensortap.rules.configs): each problem is
really produced by the training (ReLUs pushed dead, sigmoids saturated, images not normalised) and a healthy
training keeps the rule quiet, having seen data."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 is not installed in this environment; `make test-mxnet` runs these tests in "
    ".venv-mxnet (MXNet needs numpy<1.24)")
from mxnet import autograd, gluon, nd  # noqa: E402

import tensortap.mxnet as tm  # noqa: E402
from tensortap.rules import configs, invoke_rule  # noqa: E402
from tensortap.rules.builtin import CheckInputImages, DeadRelu, SaturatedActivation  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("TENSORTAP_DISABLE", raising=False)
    with mx.name.NameManager():  # blocks named from 0 (hybridsequential0, ...)
        yield
    tm.del_hook()


def net_of(act: str, standalone: bool, bias: float | None) -> gluon.nn.HybridSequential:
    """Two hidden layers with `act`, as nn.Activation blocks (`standalone`) or Dense(activation=...); every
    hidden bias set to `bias` (None: the usual initialisation)."""
    net = gluon.nn.HybridSequential()
    for _ in range(2):
        if standalone:
            net.add(gluon.nn.Dense(32), gluon.nn.Activation(act))
        else:
            net.add(gluon.nn.Dense(32, activation=act))
    net.add(gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(nd.zeros((1, 8)))  # (deferred initialisation)
    if bias is not None:
        for p in net.collect_params().values():
            if p.name.endswith("bias") and p.shape == (32,):
                p.set_data(nd.full(p.shape, bias))
    return net


def train(out: str, net, rule_configs, steps: int = 4, data=None, lr: float = 0.01):
    hook = tm.Hook(out, save_config=tm.SaveConfig(save_interval=1), include_collections=["losses"])
    for cfg in rule_configs:
        cfg.apply(hook)
    hook.register_block(net)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    for step in range(steps):
        rs = np.random.RandomState(step)
        x = data(rs) if data is not None else nd.array(rs.randn(64, 8).astype(np.float32))
        y = nd.array(rs.randint(0, 3, x.shape[0]))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    hook.close()
    assert hook.error_count == 0
    return tm.create_trial(out)


def run(rule):
    return invoke_rule(rule, stop_at_job_end=True)


def fired(rep) -> bool:
    return rep.triggered and rep.first_fired_step == 0


def quiet(rep) -> bool:
    return not rep.triggered and rep.datapoints > 0  # (quiet having seen data)


# --- DeadRelu: hidden biases of -20 keep every ReLU at 0 -------------------------------------------------------


def test_dead_relu_dense_activation_defaults(tmp_path):
    """Dense(activation='relu'): the ReLU block is dense0_relu, its output dense0_relu_output_0."""
    cfg = configs.dead_relu(save_interval=1)
    dead = train(str(tmp_path / "dead"), net_of("relu", False, -20.0), [cfg])
    assert set(dead.tensor_names(collection="relu_output")) == {"dense0_relu_output_0", "dense1_relu_output_0"}
    assert fired(run(DeadRelu(dead)))
    assert quiet(run(DeadRelu(train(str(tmp_path / "ok"), net_of("relu", False, None), [cfg]))))


def test_dead_relu_standalone_activation_explicit_regex(tmp_path):
    """nn.Activation('relu') blocks (relu0, relu1) are in relu_output by type; the rule finds them with a regex."""
    cfg = configs.dead_relu(save_interval=1)
    dead = train(str(tmp_path / "dead"), net_of("relu", True, -20.0), [cfg])
    assert set(dead.tensor_names(collection="relu_output")) == {"relu0_output_0", "relu1_output_0"}
    assert fired(run(DeadRelu(dead, tensor_regex=r"^relu\d+_output_0$")))
    healthy = train(str(tmp_path / "ok"), net_of("relu", True, None), [cfg])
    assert quiet(run(DeadRelu(healthy, tensor_regex=r"^relu\d+_output_0$")))


def test_dead_relu_standalone_activation_defaults(tmp_path):
    """relu0_output_0 matches no name regex of the rule's: it finds the tensors through relu_output."""
    cfg = configs.dead_relu(save_interval=1)
    assert fired(run(DeadRelu(train(str(tmp_path / "dead"), net_of("relu", True, -20.0), [cfg]))))
    assert quiet(run(DeadRelu(train(str(tmp_path / "ok"), net_of("relu", True, None), [cfg]))))


# --- SaturatedActivation: hidden biases of +40 push every sigmoid / tanh input out of range --------------------


@pytest.mark.parametrize("act", ["sigmoid", "tanh"])
def test_saturated_activation_dense_activation_defaults(tmp_path, act):
    cfg = configs.saturated_activation(save_interval=1)
    bad = train(str(tmp_path / "bad"), net_of(act, False, 40.0), [cfg])
    assert set(bad.tensor_names(collection=f"{act}_input")) == {f"dense0_{act}_input_0", f"dense1_{act}_input_0"}
    assert fired(run(SaturatedActivation(bad)))
    assert quiet(run(SaturatedActivation(train(str(tmp_path / "ok"), net_of(act, False, None), [cfg]))))


def test_saturated_activation_standalone_explicit_collections(tmp_path):
    cfg = configs.saturated_activation(save_interval=1)
    bad = train(str(tmp_path / "bad"), net_of("sigmoid", True, 40.0), [cfg])
    assert set(bad.tensor_names(collection="sigmoid_input")) == {"sigmoid0_input_0", "sigmoid1_input_0"}
    explicit = dict(collection_names=["sigmoid_input", "tanh_input"], tensor_regex=None)
    assert fired(run(SaturatedActivation(bad, **explicit)))
    healthy = train(str(tmp_path / "ok"), net_of("sigmoid", True, None), [cfg])
    assert quiet(run(SaturatedActivation(healthy, **explicit)))


def test_saturated_activation_standalone_defaults(tmp_path):
    cfg = configs.saturated_activation(save_interval=1)
    assert fired(run(SaturatedActivation(train(str(tmp_path / "bad"), net_of("tanh", True, 40.0), [cfg]))))
    assert quiet(run(SaturatedActivation(train(str(tmp_path / "ok"), net_of("tanh", True, None), [cfg]))))


# --- CheckInputImages: raw pixel values (0..255) instead of normalised ones ------------------------------------


def convnet() -> gluon.nn.HybridSequential:
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()  # hybridsequential0: its input is the rule's default regex
        net.add(gluon.nn.Conv2D(4, 3, activation="relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    return net


def test_check_input_images_defaults(tmp_path):
    cfg = configs.check_input_images(save_interval=1)

    def raw(rs):
        return nd.array(rs.randint(0, 256, (128, 3, 6, 6)).astype(np.float32))

    def normalised(rs):
        return nd.array(rs.randn(128, 3, 6, 6).astype(np.float32))

    bad = train(str(tmp_path / "bad"), convnet(), [cfg], data=raw, lr=1e-6)
    assert bad.tensor_names(collection="input_image") == ["hybridsequential0_input_0"]
    rep = run(CheckInputImages(bad))
    assert rep.triggered and rep.first_fired_step == 3  # (500 images seen at the 4th step of 128)
    assert quiet(run(CheckInputImages(train(str(tmp_path / "ok"), convnet(), [cfg], data=normalised))))
