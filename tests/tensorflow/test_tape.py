"""wrap_tape: tf.GradientTape custom loops, eager and inside tf.function; save_tensor / save_scalar."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap.tensorflow as ttf
from tensortap.trials import create_trial

pytest.importorskip("tensorflow")

TRAIN, EVAL = ttf.modes.TRAIN, ttf.modes.EVAL


@pytest.mark.parametrize("compiled", [False, True])
def test_tape_loop_captures_loss_weights_gradients(tmp_path, compiled):
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 8, 3)).astype("float32")
    y = rng.normal(size=(6, 8, 1)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="h"),
                              keras.layers.Dense(1, name="o")])
    opt = keras.optimizers.SGD(0.1)
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["weights", "biases", "gradients", "losses"])
    seen = []  # what the script itself computed: (loss, weights before the update, gradients)

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        before = [tf.identity(v) for v in model.trainable_variables]
        opt.apply(grads, model.trainable_variables)
        return loss, before, grads

    fn = tf.function(step) if compiled else step
    for i in range(6):
        loss, before, grads = fn(x[i], y[i])
        seen.append((loss.numpy(), [b.numpy() for b in before], [g.numpy() for g in grads]))
    hook.close()
    assert hook.error_count == 0
    tr = create_trial(str(tmp_path / "run"))
    assert tr.steps(mode=TRAIN) == [0, 2, 4]
    paths = [v.path for v in model.trainable_variables]
    for s in (0, 2, 4):
        loss, before, grads = seen[s]
        assert tr.tensor("loss").value(s, mode=TRAIN) == loss
        for p, b, g in zip(paths, before, grads, strict=True):
            np.testing.assert_array_equal(tr.tensor(f"weights/{p}").value(s, mode=TRAIN), b)
            np.testing.assert_array_equal(tr.tensor(f"gradients/{p}Grad").value(s, mode=TRAIN), g)
    assert set(tr.tensor_names(collection="biases")) == {f"weights/{p}" for p in paths if p.endswith("bias")}
    assert hook.mode_steps[TRAIN] == 5



def test_tape_inside_an_xla_function_captures_nothing_and_training_goes_on(tmp_path, caplog):
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 8, 3)).astype("float32")
    y = rng.normal(size=(3, 8, 1)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="o")])
    opt = keras.optimizers.SGD(0.1)
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses"])

    def step(xb, yb):
        with hook.wrap_tape(tf.GradientTape()) as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    fn = tf.function(step, jit_compile=True)
    with caplog.at_level("WARNING", logger="tensortap"):
        losses = [float(fn(x[i], y[i])) for i in range(3)]
    hook.close()
    assert all(np.isfinite(losses)) and losses[2] < losses[0]  # the script trained
    assert hook.error_count == 0
    assert sum("wrap_tape inside an XLA-compiled function" in r.getMessage() for r in caplog.records) == 1
    assert create_trial(str(tmp_path / "run")).steps(mode=TRAIN) == []

def test_save_tensor_save_scalar_set_mode_get_hook(tmp_path):
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1))
    assert ttf.get_hook() is hook
    hook.set_mode(ttf.modes.EVAL)
    hook.next_step()
    hook.save_tensor("custom/t", np.arange(3.0), collections_to_write="mine")
    hook.save_scalar("lr", 0.5)
    hook.close()
    tr = create_trial(str(tmp_path / "run"))
    np.testing.assert_array_equal(tr.tensor("custom/t").value(0, mode=EVAL), np.arange(3.0))
    assert tr.tensor("scalar/lr").value(0, mode=EVAL) == 0.5
    assert "custom/t" in tr.tensor_names(collection="mine")


def test_create_from_json_file(tmp_path, monkeypatch):
    import json

    cfg = tmp_path / "hook.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "losses"}],
    }))
    hook = ttf.KerasHook.create_from_json_file(str(cfg))
    assert isinstance(hook, ttf.KerasHook)
    assert {"weights", "losses"} <= set(hook.include_collections)
    assert hook.out_dir == str(tmp_path / "run")
    hook.close()
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "run"), str(tmp_path / "run2")))
    monkeypatch.setenv("TENSORTAP_CONFIG", str(cfg))
    ttf.del_hook()
    made = ttf.get_hook(create_if_not_exists=True)
    assert isinstance(made, ttf.KerasHook) and made is not hook and made.out_dir == str(tmp_path / "run2")
    made.close()
