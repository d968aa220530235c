"""Tensor names and small helpers shared by the Keras hook's modules (no TensorFlow or Keras import here)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.collection import ACTIVATION_COLLECTIONS, CollectionKeys

K = CollectionKeys
WEIGHTS_INFIX = "/weights/"
GRADIENT_PREFIX = "gradients/"
GRADIENT_SUFFIX = "Grad"
OPTIMIZER_PREFIX = "optimizer_variables/"
ACTIVATIONS = tuple(ACTIVATION_COLLECTIONS)  # "relu", "sigmoid", "tanh"
# Collections filled inside a step (everything else is read between steps).
IN_STEP = frozenset({K.GRADIENTS, K.INPUTS, K.OUTPUTS, K.LAYERS, *(c for p in ACTIVATION_COLLECTIONS.values()
                                                                  for c in p)})
# Keras's compiled step function of each mode: (model attribute, the model's method that makes it)
FUNCTIONS = {_modes.TRAIN: ("train_function", "make_train_function"),
             _modes.EVAL: ("test_function", "make_test_function"),
             _modes.PREDICT: ("predict_function", "make_predict_function")}


def flat(x: Any) -> list[Any]:
    """The leaves of nested lists, tuples and dicts (dicts in key order)."""
    if x is None:
        return []
    if isinstance(x, dict):
        out = []
        for k in sorted(x):
            out.extend(flat(x[k]))
        return out
    if isinstance(x, list | tuple):
        out = []
        for v in x:
            out.extend(flat(v))
        return out
    return [x]


def indexed(name: str, values: list[Any]) -> list[tuple[str, Any]]:
    """`name` for a single tensor, `name_<i>` for several (smdebug's naming of nested values)."""
    if len(values) == 1:
        return [(name, values[0])]
    return [(f"{name}_{i}", v) for i, v in enumerate(values)]


def variable_path(v: Any) -> str:
    """A Keras 3 variable's path (a TensorFlow variable's name without its `:0`)."""
    return str(getattr(v, "path", None) or getattr(v, "name", "variable")).split(":")[0]


def gradient_name(v: Any) -> str:
    return f"{GRADIENT_PREFIX}{variable_path(v)}{GRADIENT_SUFFIX}"


def to_numpy(t: Any) -> np.ndarray:
    """A host copy of a tensor or variable of any Keras backend."""
    if hasattr(t, "numpy"):
        try:
            return np.array(t.numpy(), copy=True)
        except Exception:  # noqa: BLE001 - e.g. a torch tensor that requires grad
            pass
    import keras

    return np.array(keras.ops.convert_to_numpy(t), copy=True)


def activation_kind(fn: Any) -> str | None:
    """"relu", "sigmoid" or "tanh" if `fn` is that Keras activation (by identity, then by name)."""
    if fn is None:
        return None
    name = getattr(fn, "__name__", None)
    try:
        import keras

        for kind in ACTIVATIONS:
            if fn is keras.activations.get(kind):
                return kind
    except Exception:  # noqa: BLE001
        pass
    return name if name in ACTIVATIONS else None


def layer_activation_type(layer: Any) -> str | None:
    """The activation a layer IS (keras.layers.ReLU, or Activation("relu"/"sigmoid"/"tanh")), by type."""
    import keras

    if isinstance(layer, keras.layers.ReLU):
        return "relu"
    if isinstance(layer, keras.layers.Activation):
        return activation_kind(getattr(layer, "activation", None))
    return None


def steps_per_execution(model: Any) -> int:
    return int(getattr(model, "steps_per_execution", 1) or 1)
