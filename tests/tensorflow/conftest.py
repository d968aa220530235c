"""Keras 3 on TensorFlow, on CPU; these tests skip when TensorFlow is not installed."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


@pytest.fixture(autouse=True)
def _fresh_keras():
    try:
        import keras
    except ImportError:  # the test module skips itself
        yield
        return
    from tensortap.tensorflow import singleton

    keras.utils.clear_session()
    keras.utils.set_random_seed(0)
    yield
    hook = singleton.get_hook()
    if hook is not None:
        hook.close()
    singleton.del_hook()
