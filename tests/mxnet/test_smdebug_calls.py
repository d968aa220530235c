"""smdebug's MXNet calls, as its docs and tests make them, on tensortap's hook (real MXNet 1.9.1, CPU): `losses`
always saved, `save_scalar(name, value, sm_metric, timestamp)`, and `Collection.add_block_tensors(block, inputs,
outputs)` saving exactly that block's inputs and outputs. (Run in .venv-mxnet: `make test-mxnet`.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 is not installed in this environment; `make test-mxnet` runs these tests in "
    ".venv-mxnet (MXNet needs numpy<1.24)")
from mxnet import autograd, gluon, nd  # noqa: E402

import tensortap.mxnet as tm  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402

TRAIN, EVAL = tm.modes.TRAIN, tm.modes.EVAL
LOSS = "softmaxcrossentropyloss0_output_0"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for var in ("TENSORTAP_DISABLE", "HOROVOD_RANK", "HOROVOD_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with mx.name.NameManager():
        yield
    tm.del_hook()


def net():
    """fc1 and fc10 share a prefix: add_block_tensors(fc1) must not take fc10's tensors."""
    n = gluon.nn.HybridSequential(prefix="model_")
    with n.name_scope():
        n.add(gluon.nn.Dense(8, activation="relu", prefix="fc1_"), gluon.nn.Dense(8, prefix="fc10_"),
              gluon.nn.Dense(3, prefix="fc2_"))
    n.initialize(mx.init.Xavier())
    return n


def _batch(k):
    rs = np.random.RandomState(k)
    return nd.array(rs.randn(6, 5).astype(np.float32)), nd.array(rs.randint(0, 3, 6))


def _train(model, hook, steps, seen=None, save_scalars=False):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook.register_block(model)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 0.1})
    losses = []
    for k in range(steps):
        x, y = _batch(k)
        with autograd.record():
            loss = loss_fn(model(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        losses.append(loss.asnumpy())
        if save_scalars:
            hook.save_scalar("mx_loss", loss.mean(), sm_metric=True)  # (a one-element NDArray)
    return losses


def test_losses_are_saved_whatever_include_collections_names(tmp_path):
    hook = tm.Hook(str(tmp_path), save_config=tm.SaveConfig(save_interval=2), include_collections=["weights"])
    losses = _train(net(), hook, 5)
    hook.close()
    t = tm.create_trial(str(tmp_path))
    assert t.tensor_names(collection="losses") == [LOSS]
    assert t.tensor(LOSS).steps() == [0, 2, 4]
    for s in (0, 2, 4):
        assert np.array_equal(t.tensor(LOSS).value(s), losses[s])


def test_losses_are_turned_off_by_a_save_config_that_saves_nothing(tmp_path):
    hook = tm.Hook(str(tmp_path), save_config=tm.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.get_collection("losses").save_config = tm.SaveConfig(end_step=0)
    _train(net(), hook, 3)
    hook.close()
    t = tm.create_trial(str(tmp_path))
    assert t.tensor_names(collection="losses") == []
    assert t.tensor("model_fc1_weight").steps() == [0, 1, 2]


def test_save_scalar_as_smdebugs_test(tmp_path):
    """tests/mxnet/test_hook_save_scalar_mxnet.py: scalars before, during and after training; an NDArray value."""
    hook = tm.Hook(str(tmp_path), include_collections=["weights"],
                   save_config=tm.SaveConfig(mode_save_configs={TRAIN: tm.SaveConfigMode(save_interval=2)}))
    ts = time.time()
    hook.save_scalar("mx_num_steps", 4, sm_metric=True, timestamp=ts)
    hook.save_scalar("mx_before_train", 1, sm_metric=False, timestamp=None)
    hook.set_mode(TRAIN)
    losses = _train(net(), hook, 4, save_scalars=True)
    hook.save_scalar("mx_after_train", 1.5, sm_metric=False, timestamp=ts)
    hook.close()
    t = tm.create_trial(str(tmp_path))
    assert set(t.tensor_names(regex="^scalar/")) == {"scalar/mx_num_steps", "scalar/mx_before_train",
                                                    "scalar/mx_loss", "scalar/mx_after_train"}
    assert set(t.tensor_names(collection="sm_metrics")) == {"scalar/mx_num_steps", "scalar/mx_loss"}
    loss = t.tensor("scalar/mx_loss")
    assert loss.steps(mode=TRAIN) == [0, 1, 2, 3]
    for s in range(4):
        # (MXNet's mean of the NDArray the script handed over; numpy sums in another order)
        assert float(loss.value(s, mode=TRAIN)) == pytest.approx(float(losses[s].mean()), rel=1e-6)
    assert t.tensor("model_fc1_weight").steps(mode=TRAIN) == [0, 2]
    # before training: at the first step, whose global step stays 0; after it: in the last step, still open
    assert t.steps() == [0, 1, 2, 3] and t.tensor("scalar/mx_num_steps").steps(mode=TRAIN) == [0]
    assert float(t.tensor("scalar/mx_after_train").value(3, mode=TRAIN)) == 1.5
    with pytest.raises(InvalidConfiguration, match="single value"):
        tm.Hook(str(tmp_path / "b")).save_scalar("v", nd.array([1.0, 2.0]))


@pytest.mark.parametrize("inputs", [True, False])
def test_add_block_tensors_saves_exactly_that_blocks_inputs_and_outputs(tmp_path, inputs):
    model = net()
    fc1 = model[0]
    seen: list = []
    fc1.register_forward_hook(lambda blk, i, o: seen.append((i[0].asnumpy(), o.asnumpy())))
    hook = tm.Hook(str(tmp_path), save_config=tm.SaveConfig(save_steps=[0, 2]), include_collections=["fc1_io"])
    if inputs:
        hook.get_collection("fc1_io").add_block_tensors(fc1, inputs=True, outputs=True)
    else:
        hook.get_collection("fc1_io").add_block_tensors(fc1)
    _train(model, hook, 3)
    hook.close()
    t = tm.create_trial(str(tmp_path))
    want = ["model_fc1_input_0", "model_fc1_output_0"] if inputs else ["model_fc1_output_0"]
    assert t.tensor_names(collection="fc1_io") == want
    assert not [n for n in t.tensor_names() if "fc10" in n or "fc2" in n]
    for s in (0, 2):
        assert np.array_equal(t.tensor("model_fc1_output_0").value(s), seen[s][1])
        if inputs:
            assert np.array_equal(t.tensor("model_fc1_input_0").value(s), seen[s][0])
    with pytest.raises(InvalidConfiguration, match="mxnet.gluon.Block"):
        hook.get_collection("x").add_block_tensors(object())
