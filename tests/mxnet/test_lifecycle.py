"""The step lifecycle (tensortap.capture.engine) as the MXNet hook fires it: step_begin, forward_end after each
forward of a registered block (with its output), step_end. A Gluon backward and `Trainer.step` run with no
hook tensortap could use without changing the user's objects: backward_end and optimizer_step are not fired
(docs/capture.md). Runs in `.venv-mxnet` (`make test-mxnet`)."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip(
    "mxnet", reason="MXNet 1.9.1 is not installed in this environment; `make test-mxnet` runs these tests in "
    ".venv-mxnet (MXNet needs numpy<1.24)")
from mxnet import autograd, gluon, nd  # noqa: E402

import tensortap.mxnet as tm  # noqa: E402
from tensortap.capture.engine import EVENTS  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    with mx.name.NameManager():
        yield
    tm.del_hook()


def test_events_in_order_with_the_forward_outputs_and_the_saved_steps_unchanged(tmp_path):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    hook = tm.Hook(str(tmp_path / "run"), save_config=tm.SaveConfig(save_interval=3), include_collections=["weights"])
    heard: list[tuple[str, int]] = []
    outputs: list[tuple[int, object]] = []
    for e in EVENTS:
        hook.add_listener(e, lambda ev: heard.append((ev.name, ev.step)))
    hook.add_listener("forward_end", lambda ev: outputs.append((ev.step, ev.data["output"])))
    hook.register_block(net)
    hook.register_loss(loss_fn)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    returned = []
    rs = np.random.RandomState(0)
    for _step in range(7):
        x, y = nd.array(rs.randn(4, 5).astype(np.float32)), nd.array(rs.randint(0, 3, 4))
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
        returned.append(out)
        loss.backward()
        trainer.step(4)
    hook.close()
    assert heard == [(n, s) for s in range(7) for n in ("step_begin", "forward_end", "step_end")]
    assert [s for s, _o in outputs] == list(range(7))
    assert all(o is r for (_s, o), r in zip(outputs, returned, strict=True))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("dense0_weight").steps() == [0, 3, 6]
