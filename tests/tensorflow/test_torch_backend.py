"""The same KerasHook on Keras 3's PyTorch backend (KERAS_BACKEND=torch, in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

pytest.importorskip("tensorflow")

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras
    assert keras.backend.backend() == "torch"
    import tensortap.tensorflow as ttf
    OUT = sys.argv[1]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype("float32"); y = rng.integers(0, 3, 48)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="d1"),
                              keras.layers.Dense(3, name="d2")])
    hook = ttf.KerasHook(out_dir=OUT, save_config=ttf.SaveConfig(save_interval=2),
                         include_collections=["weights", "biases", "gradients", "losses", "metrics", "outputs",
                                              "inputs", "layers", "relu_output"])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    class Spy(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.w, self.logs = [], []
        def on_train_batch_begin(self, b, logs=None):
            self.w.append(keras.ops.convert_to_numpy(self.model.layers[0].kernel).copy())
        def on_train_batch_end(self, b, logs=None):
            self.logs.append(logs["loss"])

    spy = Spy()
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, validation_data=(x[:16], y[:16]),
              callbacks=[hook, spy], verbose=0)
    preds = model.predict(x[:16], batch_size=16, callbacks=[hook], verbose=0)
    hook.close()
    assert hook.error_count == 0, hook.first_error
    np.save(OUT + "_kernel2.npy", spy.w[2]); np.save(OUT + "_loss2.npy", np.array(spy.logs[2]))
    np.save(OUT + "_preds.npy", preds)
    """
)


def test_torch_backend(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = str(tmp_path / "run")
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, str(script), out], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    tr = tt.create_trial(out)
    names = set(tr.tensor_names())
    assert tr.steps(mode=tt.modes.TRAIN) == [0, 2]
    assert tr.steps(mode=tt.modes.EVAL) == [0] and tr.steps(mode=tt.modes.PREDICT) == [0]
    np.testing.assert_array_equal(tr.tensor("d1/weights/sequential/d1/kernel").value(2, mode=tt.modes.TRAIN),
                                  np.load(out + "_kernel2.npy"))
    assert tr.tensor("loss").value(2, mode=tt.modes.TRAIN) == np.load(out + "_loss2.npy")
    np.testing.assert_array_equal(tr.tensor("predictions").value(0, mode=tt.modes.PREDICT), np.load(out + "_preds.npy"))
    assert {"accuracy", "d1/outputs", "d2/outputs", "inputs", "labels", "d1/activation_outputs",
            "gradients/sequential/d1/kernelGrad"} <= names
    d1_out = tr.tensor("d1/outputs").value(2, mode=tt.modes.TRAIN)
    np.testing.assert_array_equal(tr.tensor("d2/inputs").value(2, mode=tt.modes.TRAIN), d1_out)
    assert tr.tensor("gradients/sequential/d1/kernelGrad").steps(mode=tt.modes.EVAL) == []
