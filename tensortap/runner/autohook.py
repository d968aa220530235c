"""Post-import hooks: when the training script imports a framework, attach tensortap's capture to it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("tensortap")

#: framework module → "module:function" called with the imported module
ATTACHERS = {
    "torch": "tensortap.pytorch.auto:attach",
    "keras": "tensortap.tensorflow.auto:attach",
    "xgboost": "tensortap.xgboost.auto:attach",
    # trainers: their callback captures the trainer's steps, loss and logs (docs/trainers.md)
    "lightning.pytorch": "tensortap.lightning:attach",
    "pytorch_lightning": "tensortap.lightning:attach",
    "transformers": "tensortap.huggingface:attach",
}


def _resolve(target: str) -> Callable[[Any], None]:
    mod, _, fn = target.partition(":")
    return getattr(importlib.import_module(mod), fn)


class _LoaderWrapper(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[Any], None]):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        try:
            self.callback(module)
        except Exception as e:  # noqa: BLE001 - never break the training script
            logger.error("tensortap: could not attach to %s: %s", module.__name__, e, exc_info=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, attachers: dict[str, str]):
        self.attachers = dict(attachers)
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.attachers or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        target = self.attachers.pop(fullname)
        spec.loader = _LoaderWrapper(spec.loader, lambda m: _resolve(target)(m))
        return spec


def install(attachers: dict[str, str] | None = None) -> None:
    """Attach on import; frameworks imported already are attached at once."""
    attachers = dict(ATTACHERS if attachers is None else attachers)
    for name in list(attachers):
        if name in sys.modules:
            _resolve(attachers.pop(name))(sys.modules[name])
    if attachers:
        sys.meta_path.insert(0, _PostImportFinder(attachers))
