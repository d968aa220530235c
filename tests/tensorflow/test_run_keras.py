"""`tensortap run` on a Keras script with no tensortap code in it (zero script change)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

pytest.importorskip("tensorflow")

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras
    explicit = len(sys.argv) > 1 and sys.argv[1] == "explicit"
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32"); y = rng.integers(0, 3, 64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    callbacks = []
    opt = keras.optimizers.SGD(0.1)
    if explicit:
        import tensortap.tensorflow as ttf
        hook = ttf.KerasHook(out_dir="ignored-out-dir", include_collections=["weights", "gradients", "losses"])
        opt = hook.wrap_optimizer(opt)
        callbacks = [hook]
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, validation_data=(x[:32], y[:32]),
              callbacks=callbacks, verbose=0)
    model.evaluate(x, y, batch_size=32, callbacks=callbacks, verbose=0)
    """
)


def tensortap(*args, timeout=300, cwd=None, backend="tensorflow"):
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend)
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


# On the PyTorch backend Keras layers are torch modules and `import keras` imports torch: the runner attaches
# to both, and only the Keras capture may write (a second writer of worker_0 would fail to claim out_dir and
# the job would be recorded under PyTorch's names).
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_zero_script_change_captures_what_an_explicit_hook_captures(tmp_path, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    trials = {}
    for variant in ("auto", "explicit"):
        out = str(tmp_path / variant)
        r = tensortap("run", "--out-dir", out, "--save-interval", "3", "--collection", "weights",
                      "--collection", "gradients", "--collection", "losses", "--json",
                      "--", sys.executable, str(script), variant, cwd=str(tmp_path), backend=backend)
        assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
        assert "already used by another job" not in r.stderr, r.stderr[-3000:]
        trials[variant] = tt.create_trial(out)
    auto, explicit = trials["auto"], trials["explicit"]
    assert not (tmp_path / "ignored-out-dir").exists()  # the script's own hook used the runner's out_dir
    names = auto.tensor_names()
    assert names == explicit.tensor_names()
    assert {"loss", "dense/weights/sequential/dense/kernel", "gradients/sequential/dense_1/biasGrad"} <= set(names)
    for mode in (tt.modes.TRAIN, tt.modes.EVAL):
        assert auto.steps(mode=mode) == explicit.steps(mode=mode)
    assert auto.steps(mode=tt.modes.TRAIN) == [0, 3, 6]
    # 2 + 2 validation batches, then 2 of evaluate: the losses of every EVAL step are saved (the default)
    assert auto.steps(mode=tt.modes.EVAL) == [0, 1, 2, 3, 4, 5]
    for n in names:
        assert auto.tensor(n).steps() == explicit.tensor(n).steps(), n
        for s in auto.tensor(n).steps():
            assert np.asarray(auto.tensor(n).value(s)).tobytes() == np.asarray(explicit.tensor(n).value(s)).tobytes()
