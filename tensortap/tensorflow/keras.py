"""KerasHook: a `keras.callbacks.Callback` that captures a Keras 3 job (TensorFlow or PyTorch backend).

This module imports Keras; `tensortap.tensorflow` imports it only when `KerasHook` is first used.
"""

from __future__ import annotations

from typing import Any

import keras

from tensortap import modes as _modes
from tensortap.capture.engine import OPTIMIZER_STEP
from tensortap.tensorflow.hook import KerasHookBase

_TRAIN, _EVAL, _PREDICT = _modes.TRAIN, _modes.EVAL, _modes.PREDICT


class KerasHook(KerasHookBase, keras.callbacks.Callback):
    """Captures weights, gradients (with `wrap_optimizer`), losses, metrics, model inputs/labels/predictions
    and layer inputs/outputs of `model.fit` / `evaluate` / `predict`; pass it in `callbacks=[hook]`.

    Same keyword arguments as `tensortap.Hook` (out_dir, save_config, include_collections, ...).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        keras.callbacks.Callback.__init__(self)
        KerasHookBase.__init__(self, *args, **kwargs)

    def set_model(self, model: Any) -> None:
        keras.callbacks.Callback.set_model(self, model)
        self.register_model(model)

    def _mode_begin(self, mode: Any) -> None:
        if self.active:
            with self.guard("begin"):
                self.register_model(self.model)  # (Callback.model: the model set_model was given)
                if self.mode is not mode:
                    self.set_mode(mode)

    def on_train_begin(self, logs: Any = None) -> None:
        self._mode_begin(_modes.TRAIN)

    def on_test_begin(self, logs: Any = None) -> None:
        self._outer_mode = self.mode
        self._mode_begin(_modes.EVAL)

    def on_predict_begin(self, logs: Any = None) -> None:
        self._mode_begin(_modes.PREDICT)

    # The batch callbacks run at every step: try/except instead of guard() (no generator per step).
    def _on_batch_begin(self, mode: Any, batch: int, where: str) -> None:
        quiet = self._quiet
        if quiet.left and self.clock.mode is mode and quiet.take():
            self._batch_begin = batch  # a step known to save nothing: counted (see _arm_quiet)
            return
        if not self.disabled and self.writes and not self._closed:
            try:
                self._begin_batch(mode, batch)
            except Exception as e:  # noqa: BLE001 - never break training
                self._fail(where, e)

    def _on_batch_end(self, mode: Any, batch: int, logs: Any, where: str) -> None:
        if mode is _TRAIN and self.engine.listening(OPTIMIZER_STEP):
            self._optimizer_stepped()
        if not self.engine.saving and batch == self._batch_begin:
            return  # a step that saved nothing (what _end_batch would find)
        if not self.disabled and self.writes and not self._closed:
            try:
                self._end_batch(mode, batch, logs)
            except Exception as e:  # noqa: BLE001 - never break training
                self._fail(where, e)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._on_batch_begin(_TRAIN, batch, "on_train_batch_begin")

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._on_batch_end(_TRAIN, batch, logs, "on_train_batch_end")

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._on_batch_begin(_EVAL, batch, "on_test_batch_begin")

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self._on_batch_end(_EVAL, batch, logs, "on_test_batch_end")

    def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._on_batch_begin(_PREDICT, batch, "on_predict_batch_begin")

    def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
        self._on_batch_end(_PREDICT, batch, logs, "on_predict_batch_end")

    def on_test_end(self, logs: Any = None) -> None:
        if self.active:
            with self.guard("on_test_end"):
                self.end_step()
                outer = getattr(self, "_outer_mode", None)
                if outer is _modes.TRAIN:  # evaluation inside fit: back to training
                    self.set_mode(outer)

    def on_predict_end(self, logs: Any = None) -> None:
        if self.active:
            with self.guard("on_predict_end"):
                self.end_step()

    def on_train_end(self, logs: Any = None) -> None:
        if self.active:
            with self.guard("on_train_end"):
                self.end_step()
                self.flush()
