"""tensortap for TensorFlow 2 and Keras 3, mirroring `smdebug.tensorflow`.

    import tensortap.tensorflow as ttf
    hook = ttf.KerasHook(out_dir="runs/k1", save_config=ttf.SaveConfig(save_interval=10),
                         include_collections=["weights", "biases", "gradients", "losses", "metrics"])
    model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.Adam()), loss="mse")
    model.fit(x, y, callbacks=[hook])

Importing this package imports neither TensorFlow nor Keras: `KerasHook` loads Keras when first used,
`SessionHook` (TF1-style `tf.compat.v1` sessions) TensorFlow.
Tensor names and what each Keras backend captures: docs/tensorflow.md.
"""

from __future__ import annotations

from typing import Any

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.tensorflow.singleton import del_hook, get_hook, set_hook
from tensortap.trials import create_trial

__all__ = [
    "KerasHook",
    "SessionHook",
    "SaveConfig",
    "SaveConfigMode",
    "ReductionConfig",
    "Collection",
    "CollectionKeys",
    "modes",
    "create_trial",
    "get_hook",
    "set_hook",
    "del_hook",
]


def __getattr__(name: str) -> Any:
    if name == "KerasHook":
        from tensortap.tensorflow.keras import KerasHook

        return KerasHook
    if name == "SessionHook":
        from tensortap.tensorflow.session import SessionHook

        return SessionHook
    raise AttributeError(f"module 'tensortap.tensorflow' has no attribute {name!r}")
