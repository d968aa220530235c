"""Zero-script-change capture for XGBoost, used by `tensortap run` (TENSORTAP_AUTO=1).

When the training script imports xgboost, `attach` makes every training call carry a tensortap hook built
from the runner's config ($TENSORTAP_CONFIG), without any tensortap code in the script:

* every `xgboost.callback.CallbackContainer` (what `xgb.train`, `xgb.cv`, the scikit-learn API and
  xgboost.dask's workers build around the callbacks) gets the hook appended to its callbacks;
* `xgboost.train` (also as the scikit-learn API and xgboost.dask call it) gives the hook its params as
  hyperparameters, `dtrain` as the data SHAP values are computed on and the last of `evals` as the
  validation data of predictions and labels.

If the script passes its own tensortap hook (it uses the runner's config), nothing is added.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

logger = logging.getLogger("tensortap")

_state: _Auto | None = None


def attach(xgb_module: Any = None) -> None:
    """Install the wrappers (once per process)."""
    global _state
    from tensortap.hooks.base import disabled_by_env

    if _state is not None or disabled_by_env():
        return
    _state = _Auto()


def detach() -> None:
    global _state
    if _state is not None:
        _state.restore()
        _state = None


class _Auto:
    def __init__(self) -> None:
        import xgboost
        import xgboost.callback as cb
        import xgboost.training as training

        self.hook: Any = None
        self.gave_up = False
        self.tls = threading.local()
        self.restores: list[tuple[Any, str, Any]] = []
        container_init = cb.CallbackContainer.__init__

        @functools.wraps(container_init)
        def init(container: Any, callbacks: Any, *args: Any, **kwargs: Any) -> None:
            container_init(container, self._with_hook(callbacks), *args, **kwargs)

        self._patch(cb.CallbackContainer, "__init__", init)
        real_train = training.train

        @functools.wraps(real_train)
        def train(params: Any, dtrain: Any, *args: Any, **kwargs: Any) -> Any:
            self.tls.call = (params, dtrain, kwargs.get("evals"))
            try:
                return real_train(params, dtrain, *args, **kwargs)
            finally:
                self.tls.call = None

        for module in (training, xgboost, *[m for m in (getattr(xgboost, "sklearn", None),) if m is not None]):
            if getattr(module, "train", None) is real_train:
                self._patch(module, "train", train)
        self._train = train
        self._real_train = real_train

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self.restores.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        for owner, name, value in reversed(self.restores):
            setattr(owner, name, value)
        self.restores = []

    def _get_hook(self) -> Any:
        if self.hook is not None or self.gave_up:
            return self.hook
        from tensortap.xgboost import singleton
        from tensortap.xgboost.hook import Hook

        if singleton.get_hook() is not None:
            self.gave_up = True  # the script made its own hook (with the runner's config): leave it to that
            return None
        self.hook = Hook.create_from_json_file()
        self.hook._tensortap_auto = True
        return self.hook

    def _with_hook(self, callbacks: Any) -> Any:
        try:
            from tensortap.xgboost.hook import Hook

            callbacks = list(callbacks or [])
            if any(isinstance(c, Hook) for c in callbacks):
                return callbacks
            hook = self._get_hook()
            if hook is None or hook.disabled:
                return callbacks
            self._give_data(hook)
            return [*callbacks, hook]
        except Exception as e:  # noqa: BLE001 - never break training
            logger.error("tensortap: automatic capture is off: %s", e, exc_info=True)
            self.gave_up = True
            return callbacks

    def _give_data(self, hook: Any) -> None:
        call = getattr(self.tls, "call", None)
        if call is None:
            return
        params, dtrain, evals = call
        if isinstance(params, dict):
            hook.hyperparameters = {k: v for k, v in params.items() if v is not None}
        import xgboost as xgb

        if isinstance(dtrain, xgb.DMatrix):
            hook.train_data = dtrain
        evals = [e for e in (evals or []) if isinstance(e, tuple | list) and isinstance(e[0], xgb.DMatrix)]
        if evals:
            hook.validation_data = evals[-1][0]
            hook._labels = None
