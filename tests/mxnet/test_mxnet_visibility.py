"""Every step an MXNet Gluon job saved is readable right after its training loop, without close() (issue #35,
item 1). Runs in `.venv-mxnet` (`make test-mxnet`); skipped where MXNet is not installed."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 is not installed in this environment; `make test-mxnet` runs these tests in "
    ".venv-mxnet (MXNet needs numpy<1.24)")
from mxnet import autograd, gluon, nd  # noqa: E402

import tensortap as tt  # noqa: E402
import tensortap.mxnet as tm  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    with mx.name.NameManager():
        yield
    tm.del_hook()


def test_every_saved_step_is_readable_right_after_the_loop(tmp_path):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    out = str(tmp_path / "run")
    hook = tm.Hook(out_dir=out, save_config=tm.SaveConfig(save_interval=2), include_collections=["weights", "losses"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rs = np.random.RandomState(0)
    losses = {}
    for step in range(9):
        x, y = nd.array(rs.randn(6, 5).astype(np.float32)), nd.array(rs.randint(0, 3, 6))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(6)
        losses[step] = loss.asnumpy()
    trial = tt.create_trial(out)  # no close(), no flush(): the loop has ended
    assert trial.steps() == [0, 2, 4, 6, 8]
    name = trial.tensor_names(collection="losses")[0]
    for step in trial.steps():
        assert np.array_equal(trial.tensor(name).value(step), losses[step])
    hook.close()
