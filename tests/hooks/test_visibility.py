"""When saved data becomes readable without close() (issue #35, item 1): every saved step as soon as training ends
(a trial made right after the training loop, `xgb.train` or `model.fit` sees them all), and within a run a step's
data no later than when the next step ends (for steps at least a tenth of the flush interval long; faster
loops within the flush interval), with the default flush settings, with either writer."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import tensortap as tt

WRITERS = ["thread", "process"] if sys.platform.startswith("linux") else ["thread"]


def _steps_seen_from_another_thread(out: str) -> list[int]:
    """The complete steps a reader sees that is not the training thread (nothing there makes the hook write)."""
    seen: list[list[int]] = []
    t = threading.Thread(target=lambda: seen.append(tt.create_trial(out).steps()))
    t.start()
    t.join()
    return seen[0]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("interval", [1, 3])
def test_a_step_is_readable_once_the_next_step_has_ended(tmp_path, writer, interval):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer=writer, save_config=tt.SaveConfig(save_interval=interval))
    hook.save_scalar("started", 1.0)  # (the writer starts at the first hand-off; the training thread never waits
    hook.flush()  # for a writer process to start: the guarantee holds from then on)
    saved = []
    for step in range(12):
        if step:
            hook.next_step()  # (ends the step before: it passed)
        if step >= 2:  # every saving step up to the one before the step that just ended is readable now
            seen = _steps_seen_from_another_thread(out)
            assert seen[:len([s for s in saved if s <= step - 2])] == [s for s in saved if s <= step - 2], step
            assert set(seen) <= {s for s in saved if s <= step - 1}, step
        hook.save_tensor("w", np.full(500, step, dtype=np.float32))
        if step % interval == 0:
            saved.append(step)
        time.sleep(0.06)  # (steps at least a tenth of the flush interval long: docs/format.md §7)
    hook.close()


def test_pytorch_every_saved_step_is_readable_right_after_the_loop(tmp_path):
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    losses = {}
    for step in range(9):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    trial = tt.create_trial(out)  # no close(), no flush(): the loop has ended
    assert trial.steps() == [0, 2, 4, 6, 8]
    name = [n for n in trial.tensor_names(collection="losses")][0]
    for step in trial.steps():
        assert trial.tensor(name).value(step) == np.float32(losses[step])
    hook.close()


def test_xgboost_every_saved_round_is_readable_when_train_returns(tmp_path):
    xgb = pytest.importorskip("xgboost")
    import tensortap.xgboost as txgb

    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 5))
    y = (x[:, 0] > 0).astype(float)
    dtrain = xgb.DMatrix(x, label=y)
    out = str(tmp_path / "run")
    hook = txgb.Hook(out_dir=out, save_config=txgb.SaveConfig(save_interval=3), include_collections=["metrics"],
                     train_data=dtrain)
    xgb.train({"objective": "binary:logistic", "eval_metric": "logloss", "nthread": 1}, dtrain,
              num_boost_round=20, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    trial = tt.create_trial(out)  # no close()
    assert trial.steps() == list(range(0, 20, 3))
    assert trial.tensor("train-logloss").steps() == list(range(0, 20, 3))
    hook.close()


def test_keras_every_saved_step_is_readable_after_fit(tmp_path):
    keras = pytest.importorskip("keras")
    import tensortap.tensorflow as ttf

    keras.utils.set_random_seed(0)
    out = str(tmp_path / "run")
    hook = ttf.KerasHook(out_dir=out, save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["weights", "losses"])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((80, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook], verbose=0)  # 10 steps
    trial = tt.create_trial(out)  # no close()
    assert trial.steps() == [0, 2, 4, 6, 8]
    hook.close()
