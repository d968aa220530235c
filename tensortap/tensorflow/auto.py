"""Zero-script-change capture for Keras 3, used by `tensortap run` (TENSORTAP_AUTO=1).

When the training script imports keras (also through `tf.keras`), `attach` wraps `keras.Model.fit`,
`evaluate` and `predict`: each call gets a KerasHook built from the runner's config ($TENSORTAP_CONFIG)
added to its callbacks, and the model's optimizer is wrapped for gradients when they are saved. If the
script builds its own KerasHook (which then uses the runner's config), that hook is used and nothing is
added.

On Keras's PyTorch backend Keras layers are torch modules, so the PyTorch capture (attached when Keras
imports torch, always before this) would find the Keras model too and write a second record of the same job
into the same out_dir. Keras's capture is the one kept (it knows Keras's names, modes and steps): attaching
to Keras turns the automatic PyTorch capture off, unless it already captures a model (a script that trained
a plain torch model before).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger("tensortap")

_state: dict[str, Any] = {}
_CALLBACKS_POSITION = {"fit": 5, "evaluate": 6, "predict": 3}  # index of `callbacks` among positional args


def attach(keras_module: Any = None) -> None:
    """Wrap keras.Model's fit/evaluate/predict (once per process)."""
    from tensortap.hooks.base import disabled_by_env

    if _state or disabled_by_env():
        return
    import keras

    if keras.backend.backend() == "torch":
        _detach_pytorch_auto()
    model_cls = keras.Model
    _state["originals"] = {}
    for name in ("fit", "evaluate", "predict"):
        orig = getattr(model_cls, name)
        _state["originals"][name] = orig
        setattr(model_cls, name, _wrap(name, orig))


def _detach_pytorch_auto() -> None:
    import sys

    auto = sys.modules.get("tensortap.pytorch.auto")
    state = getattr(auto, "_state", None)
    if state is not None and state.hook is None:
        auto.detach()
        logger.info("tensortap: Keras on the PyTorch backend: the Keras capture is used, not the PyTorch one")


def detach() -> None:
    import keras

    for name, orig in _state.get("originals", {}).items():
        setattr(keras.Model, name, orig)
    _state.clear()


def _hook() -> Any:
    """The script's own KerasHook if it made one, else the runner's (made once); None if that failed."""
    from tensortap.tensorflow import singleton

    current = singleton.get_hook()
    if current is not None:
        return current
    if _state.get("gave_up"):
        return None
    try:
        from tensortap.tensorflow.keras import KerasHook

        hook = KerasHook.create_from_json_file()
        hook._tensortap_auto = True
        return hook
    except Exception as e:  # noqa: BLE001 - never break training
        _state["gave_up"] = True
        logger.error("tensortap: automatic capture is off: %s", e, exc_info=True)
        return None


def _wrap(method: str, orig: Any) -> Any:
    pos = _CALLBACKS_POSITION[method]

    @functools.wraps(orig)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = _with_hook(self, method, pos, args, kwargs)
        except Exception as e:  # noqa: BLE001 - never break training
            logger.error("tensortap: automatic capture of %s failed: %s", method, e, exc_info=True)
        return orig(self, *args, **kwargs)

    return wrapper


def _with_hook(model: Any, method: str, pos: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    from tensortap.tensorflow.hook import KerasHookBase

    hook = _hook()
    if hook is None or not hook.active:
        return args, kwargs
    if len(args) > pos:
        callbacks = args[pos]
    else:
        callbacks = kwargs.get("callbacks")
    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        cbs = callbacks.callbacks
    else:
        cbs = list(callbacks) if isinstance(callbacks, list | tuple) else ([callbacks] if callbacks else [])
    if any(isinstance(c, KerasHookBase) for c in cbs):
        return args, kwargs  # the script passes its own hook
    if method == "fit" and getattr(model, "optimizer", None) is not None \
            and "gradients" in hook.include_collections:
        hook.wrap_optimizer(model.optimizer)
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks.callbacks.append(hook)
        hook.set_model(model)
        return args, kwargs
    cbs = [*cbs, hook]
    if len(args) > pos:
        args = (*args[:pos], cbs, *args[pos + 1:])
    else:
        kwargs = {**kwargs, "callbacks": cbs}
    return args, kwargs
