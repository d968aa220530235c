"""Collections: named groups of tensors (by exact name or regex) with their own save and reduction configs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode, parse_bool, parse_int
from tensortap.exceptions import InvalidConfiguration, TensorTapError

__all__ = [
    "CollectionKeys",
    "SCALAR_COLLECTIONS",
    "SM_METRIC_COLLECTIONS",
    "NON_REDUCTION_COLLECTIONS",
    "NON_HISTOGRAM_COLLECTIONS",
    "TRAIN_ONLY_COLLECTIONS",
    "ACTIVATION_COLLECTIONS",
    "Collection",
    "CollectionManager",
    "CollectionNotFound",
]


class CollectionKeys:
    """Names of the built-in collections."""

    ALL = "all"
    DEFAULT = "default"
    WEIGHTS = "weights"
    BIASES = "biases"
    GRADIENTS = "gradients"
    LOSSES = "losses"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    LAYERS = "layers"
    METRICS = "metrics"
    SCALARS = "scalars"
    OPTIMIZER_VARIABLES = "optimizer_variables"
    SM_METRICS = "sm_metrics"
    TENSORFLOW_SUMMARIES = "tensorflow_summaries"
    # PyTorch: a registered torch.amp.GradScaler's scale and skipped steps (grad_scaler/scale, grad_scaler/skipped)
    GRAD_SCALER = "grad_scaler"
    # XGBoost
    HYPERPARAMETERS = "hyperparameters"
    PREDICTIONS = "predictions"
    LABELS = "labels"
    FEATURE_IMPORTANCE = "feature_importance"
    AVERAGE_SHAP = "average_shap"
    FULL_SHAP = "full_shap"
    TREES = "trees"
    # Activations, found by the layer's type (not its name): each framework hook puts the input and output
    # tensors of its ReLU / sigmoid / tanh layers into these, and saves them when the collection is included.
    RELU_INPUT = "relu_input"
    RELU_OUTPUT = "relu_output"
    SIGMOID_INPUT = "sigmoid_input"
    SIGMOID_OUTPUT = "sigmoid_output"
    TANH_INPUT = "tanh_input"
    TANH_OUTPUT = "tanh_output"


SCALAR_COLLECTIONS: frozenset[str] = frozenset(
    {
        CollectionKeys.LOSSES,
        CollectionKeys.METRICS,
        CollectionKeys.FEATURE_IMPORTANCE,
        CollectionKeys.AVERAGE_SHAP,
        CollectionKeys.SM_METRICS,
        CollectionKeys.SCALARS,
        CollectionKeys.GRAD_SCALER,
    }
)
SM_METRIC_COLLECTIONS: frozenset[str] = frozenset(
    {CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.SM_METRICS}
)
NON_REDUCTION_COLLECTIONS: frozenset[str] = SCALAR_COLLECTIONS
NON_HISTOGRAM_COLLECTIONS: frozenset[str] = SCALAR_COLLECTIONS
TRAIN_ONLY_COLLECTIONS: frozenset[str] = frozenset({CollectionKeys.GRADIENTS, CollectionKeys.OPTIMIZER_VARIABLES})
#: activation type -> (collection of its layers' inputs, collection of their outputs)
ACTIVATION_COLLECTIONS: dict[str, tuple[str, str]] = {
    "relu": (CollectionKeys.RELU_INPUT, CollectionKeys.RELU_OUTPUT),
    "sigmoid": (CollectionKeys.SIGMOID_INPUT, CollectionKeys.SIGMOID_OUTPUT),
    "tanh": (CollectionKeys.TANH_INPUT, CollectionKeys.TANH_OUTPUT),
}

_MATCH_CACHE_LIMIT = 1 << 16


class CollectionNotFound(TensorTapError, KeyError):
    """No collection of that name (a KeyError, so `except KeyError` works)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "collection not found"


def _compile(regex: Any) -> re.Pattern[str]:
    if not isinstance(regex, str):
        raise InvalidConfiguration(f"include_regex item {regex!r} must be a string, not {type(regex).__name__}")
    try:
        return re.compile(regex)
    except re.error as e:
        raise InvalidConfiguration(f"include_regex {regex!r} is not a valid regular expression: {e}") from None


def _check_io(method: str, inputs: Any, outputs: Any) -> None:
    for flag, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, bool):
            raise InvalidConfiguration(f"{method}(..., {flag}={value!r}): {flag} must be True or False")


def _layer_name(layer: Any, method: str, kind: str) -> str:
    name = getattr(layer, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidConfiguration(f"{method} takes {kind} (an object with a name), not {type(layer).__name__}")
    return name


class Collection:
    """A named group of tensors: exact `tensor_names` plus `include_regex` patterns (re.search anywhere)."""

    def __init__(
        self,
        name: str,
        include_regex: str | Iterable[str] | None = None,
        tensor_names: Iterable[str] | None = None,
        reduction_config: ReductionConfig | Mapping[str, Any] | None = None,
        save_config: SaveConfig | SaveConfigMode | Mapping[Any, Any] | None = None,
        save_histogram: bool = True,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidConfiguration(f"collection name {name!r} must be a non-empty string")
        self._name = name
        self._include_regex: list[str] = []
        self._patterns: list[re.Pattern[str]] = []
        self._match_cache: dict[str, bool] = {}
        # PyTorch modules given to add_module_tensors: id -> (module, inputs, outputs), until a hook names them
        self._pending_modules: dict[int, tuple[Any, bool, bool]] = {}
        self.include_regex = include_regex
        self.tensor_names = tensor_names
        self.reduction_config = reduction_config
        self.save_config = save_config
        self.save_histogram = save_histogram

    # -- properties ---------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def include_regex(self) -> list[str]:
        """A copy of the regexes; use include() to add one."""
        return list(self._include_regex)

    @include_regex.setter
    def include_regex(self, value: str | Iterable[str] | None) -> None:
        self._include_regex, self._patterns = [], []
        self._match_cache.clear()
        if value is not None:
            self.include(value)

    @property
    def tensor_names(self) -> set[str]:
        """The exact names in this collection (the live set)."""
        return self._tensor_names

    @tensor_names.setter
    def tensor_names(self, value: Iterable[str] | None) -> None:
        if value is None:
            names: set[str] = set()
        elif isinstance(value, str) or not isinstance(value, Iterable):
            raise InvalidConfiguration(
                f"tensor_names={value!r} must be a list or set of strings, not {type(value).__name__}"
            )
        else:
            names = set(value)
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise InvalidConfiguration(f"tensor_names must hold strings, got {bad[0]!r}")
        self._tensor_names = names
        self._match_cache.clear()

    @property
    def reduction_config(self) -> ReductionConfig | None:
        return self._reduction_config

    @reduction_config.setter
    def reduction_config(self, value: ReductionConfig | Mapping[str, Any] | None) -> None:
        if value is None or isinstance(value, ReductionConfig):
            self._reduction_config = value
        elif isinstance(value, Mapping):
            self._reduction_config = ReductionConfig.from_dict(value)
        else:
            raise InvalidConfiguration(
                f"reduction_config={value!r} must be a ReductionConfig, dict or None, not {type(value).__name__}"
            )

    @property
    def save_config(self) -> SaveConfig | None:
        return self._save_config

    @save_config.setter
    def save_config(self, value: SaveConfig | SaveConfigMode | Mapping[Any, Any] | None) -> None:
        self._save_config = None if value is None else SaveConfig.coerce(value)

    @property
    def save_histogram(self) -> bool:
        return self._save_histogram

    @save_histogram.setter
    def save_histogram(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise InvalidConfiguration(f"save_histogram={value!r} must be a bool (True or False)")
        self._save_histogram = value

    # -- membership ---------------------------------------------------------------------------------------

    def include(self, regex: str | Iterable[str]) -> None:
        """Add one regex or a list of them; each must compile."""
        items = [regex] if isinstance(regex, str) else regex
        if not isinstance(items, Iterable):
            raise InvalidConfiguration(f"include() takes a regex string or a list of them, not {regex!r}")
        items = list(items)
        patterns = [_compile(r) for r in items]  # validate all before changing anything
        for r, p in zip(items, patterns, strict=True):
            if r not in self._include_regex:
                self._include_regex.append(r)
                self._patterns.append(p)
        self._match_cache.clear()

    def add_tensor_name(self, name: str) -> None:
        self._tensor_names.add(name)
        self._match_cache.pop(name, None)

    def remove_tensor_name(self, name: str) -> None:
        self._tensor_names.discard(name)
        self._match_cache.pop(name, None)

    def has_tensor_name(self, name: str) -> bool:
        return name in self._tensor_names

    def matches(self, name: str) -> bool:
        """True if `name` is in tensor_names or any include_regex matches it (re.search)."""
        if name in self._tensor_names:
            return True
        hit = self._match_cache.get(name)
        if hit is None:
            hit = any(p.search(name) for p in self._patterns)
            if len(self._match_cache) >= _MATCH_CACHE_LIMIT:
                self._match_cache.clear()
            self._match_cache[name] = hit
        return hit

    # -- a layer's inputs and outputs (smdebug's framework collections) -----------------------------------

    def add_module_tensors(self, module: Any, inputs: bool = False, outputs: bool = True) -> None:
        """(PyTorch) Save this torch.nn.Module's inputs and/or outputs in this collection: exactly its
        `<module>_input_<i>` / `<module>_output_<i>`. The module gets its name when the hook's registered model
        holds it (at `register_module` or the first step); a module in no registered model is warned about then."""
        _check_io("add_module_tensors", inputs, outputs)
        if not hasattr(module, "named_modules"):
            raise InvalidConfiguration(f"add_module_tensors takes a torch.nn.Module, not {type(module).__name__}")
        if inputs or outputs:
            self._pending_modules[id(module)] = (module, inputs, outputs)

    def add_block_tensors(self, block: Any, inputs: bool = False, outputs: bool = True) -> None:
        """(MXNet) Save this Gluon block's inputs and/or outputs in this collection: exactly its
        `<block.name>_input_<i>` / `<block.name>_output_<i>`."""
        _check_io("add_block_tensors", inputs, outputs)
        name = _layer_name(block, "add_block_tensors", "an mxnet.gluon.Block")
        self._include_io(name, r"_input_\d+$" if inputs else None, r"_output_\d+$" if outputs else None)

    def add_keras_layer(self, layer: Any, inputs: bool = False, outputs: bool = True) -> None:
        """(Keras) Save this layer's inputs and/or outputs in this collection: exactly its
        `<layer.name>/inputs` / `<layer.name>/outputs` (`_<i>` appended when there are several)."""
        _check_io("add_keras_layer", inputs, outputs)
        name = _layer_name(layer, "add_keras_layer", "a Keras layer").replace("/", "_")
        self._include_io(name, r"/inputs(_\d+)?$" if inputs else None, r"/outputs(_\d+)?$" if outputs else None)

    def _include_io(self, name: str, input_suffix: str | None, output_suffix: str | None) -> None:
        self.include([f"^{re.escape(name)}{s}" for s in (input_suffix, output_suffix) if s is not None])

    def pending_modules(self) -> list[tuple[Any, bool, bool]]:
        """The (module, inputs, outputs) given to add_module_tensors that no hook has named yet."""
        return list(self._pending_modules.values())

    def name_module(self, module: Any, name: str) -> None:
        """A hook found `module` (given to add_module_tensors) as `name`: its tensors join the collection."""
        found = self._pending_modules.pop(id(module), None)
        if found is not None:
            _m, inputs, outputs = found
            self._include_io(name, r"_input_\d+$" if inputs else None, r"_output_\d+$" if outputs else None)

    # -- serialization ------------------------------------------------------------------------------------

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's form (spec 4.1); tensor_names sorted."""
        return {
            "name": self._name,
            "include_regex": list(self._include_regex),
            "tensor_names": sorted(self._tensor_names),
            "reduction_config": self._reduction_config.to_json_dict() if self._reduction_config else None,
            "save_config": self._save_config.to_json_dict() if self._save_config else None,
            "save_histogram": self._save_histogram,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Collection:
        """Parse smdebug's form; missing keys take the constructor defaults (include_regex [])."""
        if not isinstance(d, Mapping):
            raise InvalidConfiguration(f"a collection must be a dict, not {type(d).__name__}: {d!r}")
        if "name" not in d:
            raise InvalidConfiguration(f"collection dict has no 'name': {dict(d)!r}")
        save_config = d.get("save_config")
        histogram = d.get("save_histogram", True)
        return cls(
            name=d["name"],
            include_regex=d.get("include_regex") or [],
            tensor_names=d.get("tensor_names") or [],
            reduction_config=d.get("reduction_config"),
            save_config=SaveConfig.from_dict(save_config) if save_config is not None else None,
            save_histogram=parse_bool(histogram, "save_histogram") if histogram is not None else True,
        )

    @classmethod
    def from_json(cls, s: str) -> Collection:
        return cls.from_dict(json.loads(s))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Collection):
            return NotImplemented
        return (
            self._name == other._name
            and self._include_regex == other._include_regex
            and self._tensor_names == other._tensor_names
            and self._reduction_config == other._reduction_config
            and self._save_config == other._save_config
            and self._save_histogram == other._save_histogram
        )

    def __hash__(self) -> int:
        return hash(self._name)

    def __repr__(self) -> str:
        return (
            f"Collection(name={self._name!r}, include_regex={self._include_regex!r}, "
            f"tensor_names={len(self._tensor_names)} names, reduction_config={self._reduction_config!r}, "
            f"save_config={self._save_config!r}, save_histogram={self._save_histogram})"
        )


class CollectionManager:
    """The collections of one hook or trial, by name, plus `_meta` (num_workers)."""

    def __init__(
        self,
        collections: Mapping[str, Collection] | Iterable[Collection] | None = None,
        create_default: bool = False,
    ) -> None:
        self._collections: dict[str, Collection] = {}
        self._meta: dict[str, Any] = {"num_workers": 1}
        if create_default:
            self.add(CollectionKeys.DEFAULT)
        if collections is not None:
            values = collections.values() if isinstance(collections, Mapping) else collections
            for c in values:
                if not isinstance(c, Collection):
                    raise InvalidConfiguration(f"collections must hold Collection objects, got {c!r}")
                self.add(c)

    def get(self, name: str, create: bool = True) -> Collection:
        """The collection `name`; a missing one is created, or CollectionNotFound (KeyError) if not create."""
        coll = self._collections.get(name)
        if coll is None:
            if not create:
                known = ", ".join(sorted(self._collections)) or "none"
                raise CollectionNotFound(f"no collection named {name!r} (known: {known})")
            coll = self._collections[name] = Collection(name)
        return coll

    def add(self, name_or_collection: str | Collection) -> Collection:
        """Add a collection: a name creates it if missing; a Collection replaces any of the same name."""
        if isinstance(name_or_collection, Collection):
            self._collections[name_or_collection.name] = name_or_collection
            return name_or_collection
        if isinstance(name_or_collection, str):
            return self.get(name_or_collection, create=True)
        raise InvalidConfiguration(
            f"add() takes a collection name or a Collection, not {type(name_or_collection).__name__}: "
            f"{name_or_collection!r}"
        )

    def get_collections(self) -> dict[str, Collection]:
        """A copy of {name: Collection}."""
        return dict(self._collections)

    def get_num_workers(self) -> int:
        return self._meta["num_workers"]

    def set_num_workers(self, num_workers: int) -> None:
        n = parse_int(num_workers, "num_workers")
        if n < 1:
            raise InvalidConfiguration(f"num_workers={num_workers!r} must be >= 1")
        self._meta["num_workers"] = n

    def to_json_dict(self) -> dict[str, Any]:
        """smdebug's collections JSON: {"collections": {name: {...}}, "_meta": {"num_workers": N}}."""
        return {
            "collections": {name: c.to_json_dict() for name, c in self._collections.items()},
            "_meta": dict(self._meta),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any], collection_class: type[Collection] = Collection) -> CollectionManager:
        """Parse the collections JSON; only the keys `collections` and `_meta` are allowed."""
        if not isinstance(d, Mapping):
            raise InvalidConfiguration(f"collections JSON must be an object, not {type(d).__name__}")
        unknown = sorted(set(d) - {"collections", "_meta"})
        if unknown:
            raise InvalidConfiguration(f"unknown key(s) {unknown} in collections JSON: allowed are collections, _meta")
        cm = cls()
        colls = d.get("collections") or {}
        if not isinstance(colls, Mapping):
            raise InvalidConfiguration(f"'collections' must be an object, not {type(colls).__name__}")
        for key, cd in colls.items():
            coll = collection_class.from_dict(cd)
            if coll.name != key:
                raise InvalidConfiguration(f"collection stored under {key!r} is named {coll.name!r}")
            cm.add(coll)
        meta = d.get("_meta") or {}
        if not isinstance(meta, Mapping):
            raise InvalidConfiguration(f"'_meta' must be an object, not {type(meta).__name__}")
        cm._meta.update(meta)
        cm.set_num_workers(cm._meta.get("num_workers", 1))
        return cm

    @classmethod
    def load_from_string(cls, s: str | bytes, collection_class: type[Collection] = Collection) -> CollectionManager:
        """Parse a collections JSON string."""
        try:
            d = json.loads(s)
        except json.JSONDecodeError as e:
            raise InvalidConfiguration(f"collections JSON is not valid JSON: {e}") from None
        return cls.from_json_dict(d, collection_class)

    def __iter__(self) -> Iterator[Collection]:
        return iter(list(self._collections.values()))

    def __len__(self) -> int:
        return len(self._collections)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Collection):
            return item.name in self._collections
        return item in self._collections

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CollectionManager):
            return NotImplemented
        return self._collections == other._collections and self._meta == other._meta

    def __repr__(self) -> str:
        return f"CollectionManager({sorted(self._collections)}, num_workers={self.get_num_workers()})"
