"""The step lifecycle (tensortap.capture.engine) as the Keras hook fires it on a real `fit`: step_begin, then at
a TRAIN batch's end optimizer_step, then step_end; EVAL batches begin and end. forward_end and backward_end run
inside Keras's step function, where no Python of tensortap's runs per batch: they are not fired (docs/capture.md)."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap.tensorflow as ttf
from tensortap.capture.engine import EVENTS
from tensortap.trials import create_trial

pytest.importorskip("tensorflow")


def _fit(hook, epochs=2, validation=True):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    kw = {"validation_data": (x[:16], y[:16])} if validation else {}
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=[hook], **kw)
    return model


def test_a_fit_fires_begin_optimizer_step_end_in_order_and_saves_the_same_steps(tmp_path):
    hook = ttf.KerasHook(str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=3),
                         include_collections=["weights", "losses"])
    heard: list[tuple[str, str, int, bool]] = []
    optimizers = []
    for e in EVENTS:
        hook.add_listener(e, lambda ev: heard.append((ev.name, ev.mode.name, ev.mode_step, ev.saving)))
    hook.add_listener("optimizer_step", lambda ev: optimizers.append(ev.data["optimizer"]))
    model = _fit(hook)
    hook.close()
    train = [(n, s) for n, m, s, _sv in heard if m == "TRAIN"]
    assert train == [(n, s) for s in range(10) for n in ("step_begin", "optimizer_step", "step_end")]
    evals = [(n, s) for n, m, s, _sv in heard if m == "EVAL"]
    assert evals == [(n, s) for s in range(4) for n in ("step_begin", "step_end")]
    assert not [n for n, *_ in heard if n in ("forward_end", "backward_end")]
    # events arrive in step order: TRAIN steps 0-4, EVAL 0-1, TRAIN 5-9, EVAL 2-3
    assert [(m, s) for n, m, s, _sv in heard if n == "step_begin"] == \
        [("TRAIN", s) for s in range(5)] + [("EVAL", 0), ("EVAL", 1)] + [("TRAIN", s) for s in range(5, 10)] + \
        [("EVAL", 2), ("EVAL", 3)]
    assert all(o is model.optimizer for o in optimizers) and len(optimizers) == 10
    assert [s for n, m, s, sv in heard if n == "step_begin" and m == "TRAIN" and sv] == [0, 3, 6, 9]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("loss").steps(ttf.modes.TRAIN) == [0, 3, 6, 9]


def test_optimizer_step_alone_is_heard_at_every_batch_while_quiet_steps_are_only_counted(tmp_path):
    """A listener of optimizer_step only leaves the quiet window on: it still hears every TRAIN batch, at its own
    step, and removing it ends that."""
    hook = ttf.KerasHook(str(tmp_path / "run"), save_config=ttf.SaveConfig(save_interval=4),
                         include_collections=["losses"])
    steps: list[tuple[int, int]] = []
    remove = hook.add_listener("optimizer_step", lambda ev: steps.append((ev.step, ev.mode_step)))
    _fit(hook, epochs=1, validation=False)
    remove()
    _fit(hook, epochs=1, validation=False)
    hook.close()
    assert steps == [(s, s) for s in range(5)]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("loss").steps(ttf.modes.TRAIN) == [0, 4, 8]
