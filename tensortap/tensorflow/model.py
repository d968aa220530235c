"""A Keras model as tensortap sees it: its layers named, the variables each owns, and what tensortap sets on it."""

from __future__ import annotations

from typing import Any

from tensortap.tensorflow.common import WEIGHTS_INFIX


def all_layers(model: Any) -> list[Any]:
    """Every layer of `model`, nested ones included, in Keras's order, the model first."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=True, recursive=True))
    return [model, *getattr(model, "layers", [])]


def own_variables(layer: Any) -> list[Any]:
    """The variables `layer` itself owns (not those of its sublayers, which it also lists in `weights`)."""
    own = [*getattr(layer, "_trainable_variables", []), *getattr(layer, "_non_trainable_variables", [])]
    if not own and not getattr(layer, "_layers", None):
        own = list(getattr(layer, "weights", []))
    return own


class ModelLayout:
    """The layers of a Keras model by name (Keras's names, `_1`, `_2`... on a clash) and its weights as
    (`<layer>/weights/<variable path>`, variable), each variable named after the layer that owns it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layer_names: dict[int, str] = {}  # id(layer) -> name
        self.weights: list[tuple[str, Any]] = []
        self._count = 0  # len(model.weights) when `weights` was listed
        self.name_layers()
        self.collect()

    def name_layers(self) -> None:
        self.layer_names = {}
        used: dict[str, int] = {}
        for layer in all_layers(self.model):
            name = str(getattr(layer, "name", type(layer).__name__)).replace("/", "_")
            n = used.get(name, 0)
            used[name] = n + 1
            self.layer_names[id(layer)] = name if n == 0 else f"{name}_{n}"

    def collect(self) -> None:
        model = self.model
        self.weights = []
        seen: set[int] = set()
        for layer in all_layers(model):
            lname = self.layer_names.get(id(layer))
            if lname is None:  # a layer made after registration (a subclassed model building late)
                self.name_layers()
                lname = self.layer_names[id(layer)]
            for v in own_variables(layer):
                if id(v) in seen:
                    continue
                seen.add(id(v))
                self.weights.append((f"{lname}{WEIGHTS_INFIX}{v.path}", v))
        self._count = len(getattr(model, "weights", ()))

    def refresh(self) -> None:
        """List the weights again if the model has made variables since (a model built at its first step)."""
        if len(getattr(self.model, "weights", ())) != self._count:
            self.collect()


class Patches:
    """Attributes tensortap sets on the user's objects (a model's step methods, its layers' `call` and
    `activation`), each put back by `undo()`."""

    def __init__(self) -> None:
        self._undo: list[Any] = []

    def set(self, obj: Any, attr: str, value: Any) -> None:
        had = attr in obj.__dict__
        old = obj.__dict__.get(attr)
        object.__setattr__(obj, attr, value)

        def undo() -> None:
            if had:
                object.__setattr__(obj, attr, old)
            else:
                obj.__dict__.pop(attr, None)

        self._undo.append(undo)

    def undo(self) -> None:
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # noqa: BLE001
                pass
        self._undo = []
