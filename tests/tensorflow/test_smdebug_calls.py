"""smdebug's Keras calls, as its docs and tests make them, on tensortap's KerasHook (Keras 3 on TensorFlow, CPU):
losses and metrics always saved, `save_scalar(name, value, sm_metric, timestamp)`, and
`Collection.add_keras_layer(layer, inputs, outputs)` saving exactly that layer's inputs and outputs."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensortap.tensorflow as ttf
from tensortap.trials import create_trial

pytest.importorskip("tensorflow")

TRAIN, EVAL = ttf.modes.TRAIN, ttf.modes.EVAL


def _data(n=48, d=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype("float32"), rng.integers(0, classes, n).astype("int64")


def _model():
    """`d1` (relu) and `d10` share a prefix: add_keras_layer(d1) must not take d10's tensors."""
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="d1"),
                             keras.layers.Dense(8, name="d10"), keras.layers.Dense(3, name="d2")])


def _spy():
    import keras

    class Spy(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.logs = []

        def on_train_batch_end(self, batch, logs=None):
            self.logs.append(dict(logs))

    return Spy()


def _fit(hook, model, x, y, spy=None, epochs=1):
    import keras

    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.05)), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, callbacks=[hook, *([spy] if spy else [])], verbose=0)


def test_losses_and_metrics_are_saved_whatever_include_collections_names(tmp_path):
    x, y = _data()
    hook = ttf.KerasHook(out_dir=str(tmp_path), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["weights"])
    spy = _spy()
    _fit(hook, _model(), x, y, spy)
    hook.close()
    tr = create_trial(str(tmp_path))
    assert tr.tensor_names(collection="losses") == ["loss"]
    assert tr.tensor_names(collection="metrics") == ["accuracy"]
    assert tr.tensor_names(collection="weights")
    for s in (0, 2):
        assert tr.tensor("loss").value(s, mode=TRAIN) == spy.logs[s]["loss"]
        assert tr.tensor("accuracy").value(s, mode=TRAIN) == spy.logs[s]["accuracy"]


def test_a_default_collection_is_turned_off_as_smdebugs_keras_tests_do(tmp_path):
    """tests/tensorflow/keras/test_keras.py: `hook.get_collection(name).save_config = SaveConfig(end_step=0)` for
    each default collection not wanted."""
    x, y = _data()
    hook = ttf.KerasHook(out_dir=str(tmp_path), save_config=ttf.SaveConfig(save_interval=1),
                         include_collections=["losses"])
    for name in hook.include_collections:
        if name not in ("losses",):
            hook.get_collection(name).save_config = ttf.SaveConfig(end_step=0)
    _fit(hook, _model(), x, y)
    hook.close()
    tr = create_trial(str(tmp_path))
    assert tr.tensor_names() == ["loss"]
    assert tr.tensor("loss").steps(mode=TRAIN) == [0, 1, 2]


def test_save_scalar_as_smdebugs_keras_fit_test(tmp_path):
    """tests/tensorflow2/test_keras.py::test_keras_fit: save_scalar("foobar", 1, sm_metric=True, timestamp=ts)
    before fit; a TensorFlow tensor as the value; training's steps are unchanged."""
    import tensorflow as tf

    x, y = _data()
    hook = ttf.KerasHook(out_dir=str(tmp_path), save_config=ttf.SaveConfig(save_interval=1))
    hook.save_scalar("foobar", 1, sm_metric=True, timestamp=time.time())
    _fit(hook, _model(), x, y)
    hook.save_scalar("lr", tf.constant(0.05), False)
    hook.close()
    tr = create_trial(str(tmp_path))
    assert set(tr.tensor_names(regex="^scalar/")) == {"scalar/foobar", "scalar/lr"}
    assert tr.tensor_names(collection="sm_metrics") == ["scalar/foobar"]
    foobar = tr.tensor("scalar/foobar")
    assert float(foobar.value(foobar.steps()[0])) == 1
    lr = tr.tensor("scalar/lr")
    assert np.float32(lr.value(lr.steps()[0])) == np.float32(0.05)
    assert tr.steps(mode=TRAIN) == [0, 1, 2]


@pytest.mark.parametrize("inputs", [True, False])
def test_add_keras_layer_saves_exactly_that_layers_inputs_and_outputs(tmp_path, inputs):
    """tests/tensorflow/keras/test_keras.py::test_collection_add: a `relu` collection holding one layer's inputs
    and outputs (outputs only by default)."""
    x, y = _data()
    model = _model()
    relu_layer = model.get_layer("d1")
    hook = ttf.KerasHook(out_dir=str(tmp_path), save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["relu", "weights", "biases"])
    if inputs:
        hook.get_collection("relu").add_keras_layer(relu_layer, inputs=True, outputs=True)
    else:
        hook.get_collection("relu").add_keras_layer(relu_layer)
    _fit(hook, model, x, y)
    hook.close()
    tr = create_trial(str(tmp_path))
    want = ["d1/inputs", "d1/outputs"] if inputs else ["d1/outputs"]
    assert tr.tensor_names(collection="relu") == want
    assert not [n for n in tr.tensor_names() if n.endswith(("/inputs", "/outputs"))
                and not n.startswith("d1/")]
    # step 2's batch is rows 32..47: the layer's output is relu(x @ kernel + bias) with the step's weights
    out = tr.tensor("d1/outputs").value(2, mode=TRAIN)
    kernel = tr.tensor("d1/weights/sequential/d1/kernel").value(2, mode=TRAIN)
    bias = tr.tensor("d1/weights/sequential/d1/bias").value(2, mode=TRAIN)
    np.testing.assert_allclose(out, np.maximum(x[32:48] @ kernel + bias, 0), rtol=1e-5, atol=1e-6)
    if inputs:
        np.testing.assert_array_equal(tr.tensor("d1/inputs").value(2, mode=TRAIN), x[32:48])
