"""KerasHook against real Keras 3 / TensorFlow on CPU: saved values bit-identical to what the script saw."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

import tensortap.tensorflow as ttf
from tensortap.trials import create_trial

pytest.importorskip("tensorflow")

TRAIN, EVAL, PREDICT = ttf.modes.TRAIN, ttf.modes.EVAL, ttf.modes.PREDICT
ALL_KERAS = ["weights", "biases", "gradients", "losses", "metrics", "outputs", "inputs", "layers",
             "optimizer_variables", "relu_input", "relu_output"]


def _data(n=48, d=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype("float32"), rng.integers(0, classes, n).astype("int64")


def _mlp():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="d1"),
                             keras.layers.Dense(3, name="d2")])


def _recording_adam(target_iteration: int):
    """An Adam that keeps, independently of tensortap, the gradients it applies at one iteration."""
    import keras
    import tensorflow as tf

    class RecordingAdam(keras.optimizers.Adam):
        def build(self, variables):
            super().build(variables)
            self.recorded = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
            self.paths = [v.path for v in variables]

        def apply(self, grads, trainable_variables=None):
            if not self.built:
                raise AssertionError("build the RecordingAdam before fit")
            it = self.iterations

            def keep():
                for r, g in zip(self.recorded, grads, strict=True):
                    r.assign(g)
                return tf.constant(True)

            tf.cond(tf.equal(it, target_iteration), keep, lambda: tf.constant(False))
            return super().apply(grads, trainable_variables)

    return RecordingAdam(learning_rate=0.01)


class Spy:
    """A second callback reading what Keras exposes: weights before each train batch, logs after it."""

    @staticmethod
    def make():
        import keras

        class _Spy(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.weights, self.logs, self.eval_logs = [], [], []

            def on_train_batch_begin(self, batch, logs=None):
                self.weights.append({v.path: v.numpy().copy() for v in self.model.weights})

            def on_train_batch_end(self, batch, logs=None):
                self.logs.append(dict(logs))

            def on_test_batch_end(self, batch, logs=None):
                self.eval_logs.append(dict(logs))

        return _Spy()


@pytest.mark.parametrize("how", ["graph", "eager", "xla"])
def test_fit_evaluate_predict_values_modes_steps(tmp_path, how):
    import keras

    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=ALL_KERAS)
    opt = _recording_adam(target_iteration=2)
    model.compile(optimizer=hook.wrap_optimizer(opt), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], run_eagerly=how == "eager", jit_compile=how == "xla")
    opt.build(model.trainable_variables)
    spy = Spy.make()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, validation_data=(x[:32], y[:32]),
              callbacks=[hook, spy], verbose=0)
    preds = model.predict(x[:20], batch_size=10, callbacks=[hook], verbose=0)
    hook.close()
    assert hook.error_count == 0

    tr = create_trial(str(tmp_path / "run"))
    # 3 train batches per epoch (mode steps 0..5), 2 eval batches per epoch, 2 predict batches
    assert tr.steps(mode=TRAIN) == [0, 2, 4]
    assert tr.steps(mode=EVAL) == [0, 1, 2, 3]  # losses and metrics are saved at every EVAL step
    assert tr.steps(mode=PREDICT) == [0]
    assert len(tr.steps()) == 8

    kernel = "d1/weights/sequential/d1/kernel"
    assert set(tr.tensor_names(collection="weights")) == {kernel, "d2/weights/sequential/d2/kernel"}
    assert set(tr.tensor_names(collection="biases")) == {"d1/weights/sequential/d1/bias",
                                                         "d2/weights/sequential/d2/bias"}
    for s in (0, 2, 4):
        for v_path, value in spy.weights[s].items():
            layer = v_path.split("/")[1]
            np.testing.assert_array_equal(tr.tensor(f"{layer}/weights/{v_path}").value(s, mode=TRAIN), value)
        assert tr.tensor("loss").value(s, mode=TRAIN) == spy.logs[s]["loss"]
        assert tr.tensor("accuracy").value(s, mode=TRAIN) == spy.logs[s]["accuracy"]
    assert tr.tensor("loss").value(2, mode=EVAL) == spy.eval_logs[2]["loss"]

    # gradients: what the optimizer applied at iteration 2 (= train step 2), never in EVAL/PREDICT
    for path, rec in zip(opt.paths, opt.recorded, strict=True):
        name = f"gradients/{path}Grad"
        np.testing.assert_array_equal(tr.tensor(name).value(2, mode=TRAIN), rec.numpy())
        assert tr.tensor(name).steps(mode=EVAL) == [] and tr.tensor(name).steps(mode=PREDICT) == []

    # model inputs, labels, predictions; layer and activation tensors
    np.testing.assert_array_equal(tr.tensor("inputs").value(2, mode=TRAIN), x[32:48])
    np.testing.assert_array_equal(tr.tensor("labels").value(2, mode=TRAIN), y[32:48])
    np.testing.assert_array_equal(tr.tensor("predictions").value(0, mode=PREDICT), preds[:10])
    np.testing.assert_array_equal(tr.tensor("inputs").value(0, mode=PREDICT), x[:10])
    assert tr.tensor("labels").steps(mode=PREDICT) == []
    d1_in = tr.tensor("d1/inputs").value(2, mode=TRAIN)
    np.testing.assert_array_equal(d1_in, x[32:48])
    d1_out = tr.tensor("d1/outputs").value(2, mode=TRAIN)
    pre = tr.tensor("d1/activation_inputs").value(2, mode=TRAIN)
    np.testing.assert_array_equal(tr.tensor("d1/activation_outputs").value(2, mode=TRAIN), d1_out)
    np.testing.assert_array_equal(d1_out, np.maximum(pre, 0))
    np.testing.assert_array_equal(tr.tensor("d2/inputs").value(2, mode=TRAIN), d1_out)
    assert set(tr.tensor_names(collection="relu_input")) == {"d1/activation_inputs"}
    assert set(tr.tensor_names(collection="relu_output")) == {"d1/activation_outputs"}
    # the layer output the step computed, recomputed from the weights it used
    w, b = spy.weights[2]["sequential/d1/kernel"], spy.weights[2]["sequential/d1/bias"]
    np.testing.assert_allclose(pre, x[32:48] @ w + b, rtol=1e-5, atol=1e-6)
    opt_names = tr.tensor_names(collection="optimizer_variables")
    assert "optimizer_variables/adam/iteration" in opt_names or any("iteration" in n for n in opt_names)
    assert keras.backend.backend() == "tensorflow"


def test_defaults_save_losses_and_metrics_only(tmp_path):
    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1))
    model.compile(optimizer=hook.wrap_optimizer(__import__("keras").optimizers.SGD()),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[hook], verbose=0)
    hook.close()
    tr = create_trial(str(tmp_path / "run"))
    assert set(tr.tensor_names()) == {"loss", "accuracy"}
    assert tr.steps(mode=TRAIN) == [0, 1, 2]


def test_steps_per_execution(tmp_path):
    x, y = _data(n=64)
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=4),
                         include_collections=["weights", "gradients", "losses", "layers"])
    model.compile(optimizer=hook.wrap_optimizer(_recording_adam(target_iteration=4)),
                  loss="sparse_categorical_crossentropy", steps_per_execution=2)
    model.optimizer.build(model.trainable_variables)
    spy = Spy.make()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook, spy], verbose=0)
    hook.close()
    assert hook.error_count == 0
    tr = create_trial(str(tmp_path / "run"))
    assert tr.steps(mode=TRAIN) == [0, 4]  # 8 steps counted, in 4 executions of 2
    assert hook.mode_steps[TRAIN] == 7
    opt = model.optimizer
    for path, rec in zip(opt.paths, opt.recorded, strict=True):
        np.testing.assert_array_equal(tr.tensor(f"gradients/{path}Grad").value(4, mode=TRAIN), rec.numpy())
    np.testing.assert_array_equal(tr.tensor("d1/weights/sequential/d1/kernel").value(4, mode=TRAIN),
                                  spy.weights[2]["sequential/d1/kernel"])  # the callback's 3rd call: step 4
    np.testing.assert_array_equal(tr.tensor("d1/inputs").value(4, mode=TRAIN), x[32:40])


def test_functional_multi_io_subclassed_and_frozen(tmp_path):
    import keras

    class Block(keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.inner = keras.layers.Dense(4, activation="tanh", name="inner")
            self.act = keras.layers.Activation("sigmoid", name="sig")

        def call(self, x):
            return self.act(self.inner(x))

    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    frozen = keras.layers.Dense(5, name="frozen")
    frozen.trainable = False
    h = keras.layers.Concatenate(name="cat")([frozen(a), b])
    h = Block(name="block")(h)
    h = keras.layers.ReLU(name="relu")(h)
    out1 = keras.layers.Dense(1, name="out1")(h)
    out2 = keras.layers.Dense(2, name="out2")(h)
    model = keras.Model({"a": a, "b": b}, {"out1": out1, "out2": out2})
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=[*ALL_KERAS, "sigmoid_output", "tanh_input", "tanh_output"])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)),
                  loss={"out1": "mse", "out2": "mse"})
    rng = np.random.default_rng(1)
    xa, xb = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    y1, y2 = rng.normal(size=(16, 1)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    spy = Spy.make()
    model.fit({"a": xa, "b": xb}, {"out1": y1, "out2": y2}, batch_size=8, epochs=1, shuffle=False,
              callbacks=[hook, spy], verbose=0)
    hook.close()
    assert hook.error_count == 0
    tr = create_trial(str(tmp_path / "run"))
    names = set(tr.tensor_names())
    # frozen layer: its weights are saved, it gets no gradients
    assert "frozen/weights/frozen/kernel" in names
    np.testing.assert_array_equal(tr.tensor("frozen/weights/frozen/kernel").value(1, mode=TRAIN),
                                  spy.weights[1]["frozen/kernel"])
    assert not any(n.startswith("gradients/frozen") for n in names)
    assert "gradients/out1/kernelGrad" in names and "gradients/block/inner/kernelGrad" in names
    # several inputs and outputs: indexed names (dicts in key order)
    np.testing.assert_array_equal(tr.tensor("inputs_0").value(1, mode=TRAIN), xa[8:])
    np.testing.assert_array_equal(tr.tensor("inputs_1").value(1, mode=TRAIN), xb[8:])
    np.testing.assert_array_equal(tr.tensor("labels_0").value(1, mode=TRAIN), y1[8:])
    assert {"predictions_0", "predictions_1", "cat/inputs_0", "cat/inputs_1", "cat/outputs"} <= names
    # losses of each output and the total, as Keras logs them
    assert {"loss", "out1_loss", "out2_loss"} <= set(tr.tensor_names(collection="losses"))
    assert tr.tensor("out1_loss").value(1, mode=TRAIN) == spy.logs[1]["out1_loss"]
    # activations found by layer type: the ReLU layer, Activation("sigmoid") and Dense(activation="tanh")
    assert set(tr.tensor_names(collection="relu_input")) == {"relu/inputs"}
    assert set(tr.tensor_names(collection="sigmoid_output")) == {"sig/outputs"}
    assert set(tr.tensor_names(collection="tanh_input")) == {"inner/activation_inputs"}
    relu_in = tr.tensor("relu/inputs").value(1, mode=TRAIN)
    np.testing.assert_array_equal(relu_in, tr.tensor("sig/outputs").value(1, mode=TRAIN))
    np.testing.assert_array_equal(tr.tensor("relu/outputs").value(1, mode=TRAIN), np.maximum(relu_in, 0))


def test_subclassed_model(tmp_path):
    import keras

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.h = keras.layers.Dense(6, activation="relu", name="h")
            self.o = keras.layers.Dense(3, name="o")

        def call(self, x):
            return self.o(self.h(x))

    x, y = _data()
    model = Net()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses", "layers", "outputs"])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)), loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    tr = create_trial(str(tmp_path / "run"))
    names = set(tr.tensor_names())
    assert {"h/outputs", "o/outputs", "predictions", "loss"} <= names
    np.testing.assert_array_equal(tr.tensor("o/outputs").value(0, mode=TRAIN),
                                  tr.tensor("predictions").value(0, mode=TRAIN))
    assert any(n.startswith("h/weights/") and n.endswith("kernel") for n in names)
    assert any(n.startswith("gradients/") for n in names)


def test_injected_failure_turns_hook_off_and_training_goes_on(tmp_path, caplog, monkeypatch):
    import keras

    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses"])
    calls = {"n": 0}
    real = hook.collections_to_save  # (asked at every step; what a saving step sends goes several ways)

    def broken():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return real()

    monkeypatch.setattr(hook, "collections_to_save", broken)
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)), loss="sparse_categorical_crossentropy")
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[hook], verbose=0)
    assert len(history.history["loss"]) == 2  # training finished
    assert hook.disabled and hook.error_count == 1
    assert sum("turns itself off" in r.getMessage() for r in caplog.records) == 1
    hook.close()


def test_disable_env(tmp_path, monkeypatch):
    import keras

    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), include_collections=["weights", "losses"])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)), loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[hook], verbose=0)
    hook.close()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.idx*"))
    assert hook.step == -1


def test_import_does_not_import_tensorflow():
    code = ("import sys, tensortap, tensortap.tensorflow as ttf; ttf.SaveConfig; ttf.get_hook();"
            "print([m for m in ('tensorflow', 'keras') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_gradients_after_loss_scaling_is_undone(tmp_path):
    import keras

    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["gradients"])
    inner = _recording_adam(target_iteration=2)
    opt = keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0 ** 10)
    assert hook.wrap_optimizer(opt) is opt
    model.compile(optimizer=hook.wrap_optimizer(opt), loss="sparse_categorical_crossentropy")  # (wrapped once)
    assert not [k for o in (opt, inner) for k in vars(o) if "tensortap" in k]  # no mark left on the user's objects
    opt.build(model.trainable_variables)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
    hook.close()
    assert hook.error_count == 0
    tr = create_trial(str(tmp_path / "run"))
    for path, rec in zip(inner.paths, inner.recorded, strict=True):
        # what the inner optimizer received: the loss scale divided out
        np.testing.assert_array_equal(tr.tensor(f"gradients/{path}Grad").value(2, mode=TRAIN), rec.numpy())
    assert np.abs(tr.tensor("gradients/sequential/d2/biasGrad").value(2, mode=TRAIN)).max() < 10


def test_steps_between_saves_counted_across_modes(tmp_path):
    """Steps that save nothing are only counted: the saved steps, their weights and losses stay right across
    epochs, validation inside fit and a later evaluate (save_interval=4: up to 3 quiet steps in a row)."""
    x, y = _data(n=112)
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=4),
                         include_collections=["weights", "biases", "gradients", "losses"])
    model.compile(optimizer=hook.wrap_optimizer(__import__("keras").optimizers.SGD(0.1)),
                  loss="sparse_categorical_crossentropy")
    spy = Spy.make()
    # 7 train batches per epoch (mode steps 0..13), 6 validation batches per epoch (0..11), then 7 of evaluate
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, validation_data=(x[:96], y[:96]),
                        callbacks=[hook, spy], verbose=0)
    model.evaluate(x, y, batch_size=16, callbacks=[hook], verbose=0)
    # what the capturing step returns besides Keras's logs never reaches Keras
    assert set(history.history) == {"loss", "val_loss"}
    assert all(set(logs) == {"loss"} for logs in spy.logs)
    hook.close()
    assert hook.error_count == 0, hook.first_error
    tr = create_trial(str(tmp_path / "run"))
    assert tr.steps(mode=TRAIN) == [0, 4, 8, 12]
    # losses are saved at every EVAL step, the rest every 4 EVAL steps
    assert tr.steps(mode=EVAL) == list(range(19))
    assert tr.tensor("loss").steps(mode=EVAL) == list(range(19))
    assert tr.tensor("gradients/sequential/d1/kernelGrad").steps(mode=TRAIN) == [0, 4, 8, 12]
    # global steps: 0-6 train, 7-12 eval, 13-19 train, 20-25 eval, 26-32 eval (evaluate)
    assert tr.steps() == [0, 4, *range(7, 13), 14, 18, *range(20, 33)]
    for s in (0, 4, 8, 12):
        for v_path, value in spy.weights[s].items():
            layer = v_path.split("/")[1]
            np.testing.assert_array_equal(tr.tensor(f"{layer}/weights/{v_path}").value(s, mode=TRAIN), value)
        assert tr.tensor("loss").value(s, mode=TRAIN) == spy.logs[s]["loss"]
        assert tr.tensor("gradients/sequential/d1/kernelGrad").value(s, mode=TRAIN).shape == (4, 8)


def test_collections_saving_at_different_steps_and_with_reductions(tmp_path):
    """A step saves only some of what the capturing step function returns (weights every 2 steps, gradients
    every 3, biases as a norm only): every value saved is the one the step saw, nothing else is saved."""
    import tensortap as tt

    x, y = _data()
    model = _mlp()
    hook = ttf.KerasHook(out_dir=str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["weights", "biases", "gradients", "losses"])
    hook.get_collection("gradients").save_config = ttf.SaveConfig(save_interval=3)
    hook.get_collection("biases").reduction_config = tt.ReductionConfig(norms=["l2"])
    opt = _recording_adam(target_iteration=3)
    model.compile(optimizer=hook.wrap_optimizer(opt), loss="sparse_categorical_crossentropy")
    opt.build(model.trainable_variables)
    spy = Spy.make()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[hook, spy], verbose=0)
    hook.close()
    assert hook.error_count == 0

    tr = create_trial(str(tmp_path / "run"))
    kernel, bias = "d1/weights/sequential/d1/kernel", "d1/weights/sequential/d1/bias"
    assert tr.tensor(kernel).steps() == [0, 2, 4]
    for s in (0, 2, 4):
        np.testing.assert_array_equal(tr.tensor(kernel).value(s), spy.weights[s]["sequential/d1/kernel"])
        b = spy.weights[s]["sequential/d1/bias"]
        assert tr.tensor(bias).reduction_value(s, "l2") == pytest.approx(np.linalg.norm(b), rel=1e-6)
        assert tr.tensor("loss").value(s) == spy.logs[s]["loss"]
    with pytest.raises(tt.exceptions.TensorUnavailableForStep):  # a norm only: no raw value saved
        tr.tensor(bias).value(0)
    grads = tr.tensor_names(collection="gradients")
    assert grads and all(tr.tensor(n).steps() == [0, 3] for n in grads)
    for path, rec in zip(opt.paths, opt.recorded, strict=True):
        np.testing.assert_array_equal(tr.tensor(f"gradients/{path}Grad").value(3), rec.numpy())


def test_wrap_optimizer_is_undone_at_close_and_leaves_nothing_on_the_optimizer(tmp_path):
    """wrap_optimizer replaces the optimizer's apply on that instance while the hook runs (gradients saved); close
    gives the optimizer back as it was: nothing of tensortap's left in its attributes."""
    import keras

    keras.utils.set_random_seed(0)
    model = _mlp()
    opt = keras.optimizers.SGD(0.1)
    before = dict(vars(opt))
    hook = ttf.KerasHook(str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=["gradients"])
    model.compile(optimizer=hook.wrap_optimizer(opt), loss="sparse_categorical_crossentropy")
    assert set(vars(opt)) - set(before)  # (the wrapper, on the instance)
    x, y = _data(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hook])
    hook.close()
    assert {k for k in vars(opt) if "apply" in k} == {k for k in before if "apply" in k}
    assert create_trial(str(tmp_path / "run")).tensor_names(collection="gradients")
