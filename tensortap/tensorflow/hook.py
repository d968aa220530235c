"""The Keras 3 / TensorFlow 2 hook (framework part without the Keras base class; see `keras.py`).

How values leave a compiled step (see docs/tensorflow.md for the names and what each backend captures):

* weights and optimizer variables: the values the step's forward pass uses (read between steps, in
  `on_*_batch_begin`, or at the start of a compiled capturing step);
* losses and metrics come from the logs Keras hands to `on_*_batch_end`;
* gradients (`wrap_optimizer`), layer inputs/outputs, model inputs, labels and predictions are tensors inside
  the step. Outside a `tf.function` (run_eagerly, the PyTorch backend) they are copied when produced, on
  saving steps only. A compiled model runs Keras's own step function on steps that save nothing and a
  second, capturing one on saving steps (`_select_function`). On one device with one step per execution the
  capturing function returns its captures as extra outputs (`_unpacking` takes them off before Keras sees
  them); otherwise each goes into a shadow variable through a `tf.cond` on one variable the callback sets on
  saving steps (the step clears it when it ends, so with steps_per_execution > 1 only the first step of an
  execution is captured). No Python runs inside the graph.
* steps known to save nothing are only counted by the batch callbacks (`_arm_quiet`).
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.collection import ACTIVATION_COLLECTIONS, Collection, CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.hooks.base import Hook, rank_in_env

logger = logging.getLogger("tensortap")

K = CollectionKeys
WEIGHTS_INFIX = "/weights/"
GRADIENT_PREFIX = "gradients/"
GRADIENT_SUFFIX = "Grad"
OPTIMIZER_PREFIX = "optimizer_variables/"
_ACTIVATIONS = tuple(ACTIVATION_COLLECTIONS)  # "relu", "sigmoid", "tanh"
# Collections filled inside a step (everything else is read between steps).
_IN_STEP = frozenset({K.GRADIENTS, K.INPUTS, K.OUTPUTS, K.LAYERS, *(c for p in ACTIVATION_COLLECTIONS.values()
                                                                   for c in p)})
_FUNCTIONS = {_modes.TRAIN: ("train_function", "make_train_function"),
              _modes.EVAL: ("test_function", "make_test_function"),
              _modes.PREDICT: ("predict_function", "make_predict_function")}
_LOG_SKIP = frozenset({"outputs", "batch", "size"})
# keys of what a capturing step function returns in outputs mode: Keras's own outputs and the captures
_OUT, _CAPTURED = "tensortap_step_out", "tensortap_captured"


def _flat(x: Any) -> list[Any]:
    if x is None:
        return []
    if isinstance(x, dict):
        out = []
        for k in sorted(x):
            out.extend(_flat(x[k]))
        return out
    if isinstance(x, list | tuple):
        out = []
        for v in x:
            out.extend(_flat(v))
        return out
    return [x]


def _to_numpy(t: Any) -> np.ndarray:
    """A host copy of a tensor or variable of any Keras backend."""
    if hasattr(t, "numpy"):
        try:
            return np.array(t.numpy(), copy=True)
        except Exception:  # noqa: BLE001 - e.g. a torch tensor that requires grad
            pass
    import keras

    return np.array(keras.ops.convert_to_numpy(t), copy=True)


def _indexed(name: str, values: list[Any]) -> list[tuple[str, Any]]:
    """`name` for a single tensor, `name_<i>` for several (smdebug's naming of nested values)."""
    if len(values) == 1:
        return [(name, values[0])]
    return [(f"{name}_{i}", v) for i, v in enumerate(values)]


def _activation_kind(fn: Any) -> str | None:
    """"relu", "sigmoid" or "tanh" if `fn` is that Keras activation (by identity, then by name)."""
    if fn is None:
        return None
    name = getattr(fn, "__name__", None)
    try:
        import keras

        for kind in _ACTIVATIONS:
            if fn is keras.activations.get(kind):
                return kind
    except Exception:  # noqa: BLE001
        pass
    return name if name in _ACTIVATIONS else None


def _layer_activation_type(layer: Any) -> str | None:
    """The activation a layer IS (keras.layers.ReLU, or Activation("relu"/"sigmoid"/"tanh")), by type."""
    import keras

    if isinstance(layer, keras.layers.ReLU):
        return "relu"
    if isinstance(layer, keras.layers.Activation):
        return _activation_kind(getattr(layer, "activation", None))
    return None


def _local_replica(tf: Any) -> int:
    """The index among this process's devices of the replica being traced (0 outside a strategy, -1 in a
    strategy's cross-replica context)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return -1  # cross-replica context (e.g. an optimizer's merge_call): one value for every device
    rid = getattr(ctx, "_replica_id_in_sync_group", None)
    if not isinstance(rid, int):
        rid = tf.get_static_value(ctx.replica_id_in_sync_group)
    if rid is None:
        return 0
    return int(rid) % _local_devices(ctx.strategy)


def _local_devices(strategy: Any) -> int:
    """How many devices of this process a strategy runs replicas on (1 for the default strategy)."""
    try:
        return len(strategy.extended.worker_devices) or 1
    except Exception:  # noqa: BLE001 - the default strategy has no worker_devices
        return 1


def _rank_from_tf_config() -> tuple[int, int] | None:
    """(rank, world size) of a multi-worker job from $TF_CONFIG (chief first, then the workers), else None."""
    import json
    import os

    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster = cfg.get("cluster", {})
        task = cfg.get("task", {})
        chiefs = len(cluster.get("chief", []))
        workers = len(cluster.get("worker", []))
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    if chiefs + workers <= 1 or kind not in ("chief", "worker"):
        return None
    rank = index if kind == "chief" else chiefs + index
    return rank, chiefs + workers


class _GraphStore:
    """Shadow variables that carry tensors out of a compiled step (TensorFlow backend).

    `gen` is 0 on steps that save nothing; on a saving step the callback sets it to a new positive number,
    every capture in the step copies its tensor into its shadow and stamps it with `gen`, and the step sets
    `gen` back to 0 when it ends. After the step, shadows stamped with that number hold this step's values.
    """

    def __init__(self, xla: bool, saving: bool) -> None:
        import tensorflow as tf

        self.tf = tf
        self.xla = xla
        self.current = int(saving)  # what the callback last assigned
        self.counter = self.current
        with tf.init_scope():
            self.gen = _plain_variable(tf, tf.constant(self.current, tf.int32), "tensortap_capture")
        self.vars: dict[tuple[str, Any], tuple[Any, Any]] = {}  # (name, static shape) -> (value, stamp)
        self.names: dict[Any, list[tuple[str, Any]]] = {}  # mode of the step function -> its shadows' keys
        self.readers: dict[Any, tuple[int, Any]] = {}  # mode -> (number of keys, compiled read of them all)
        self.out_keys: dict[Any, list[Any]] = {}  # mode -> keys of what its step function returns (outputs mode)
        import threading

        # copies deferred to the end of the step being traced (one tf.cond for all), per tracing thread
        # (MirroredStrategy traces its replicas in threads)
        self.local = threading.local()

    def begin_trace(self, outputs: bool = False) -> None:
        """Start tracing a step function; `outputs`: it runs on saving steps only and returns its captures
        as extra outputs (`end_trace`) instead of copying them into shadows."""
        self.local.graph = self.tf.compat.v1.get_default_graph()
        self.local.pending = []
        self.local.outputs = outputs

    def end_trace(self, mode: Any = None) -> tuple[Any, ...] | None:
        """Emit the deferred copies of the step being traced, gated by one tf.cond; in outputs mode, return
        the captured tensors instead (their keys in `out_keys[mode]`)."""
        tf = self.tf
        pending = getattr(self.local, "pending", None)
        outputs = getattr(self.local, "outputs", False)
        self.local.pending = None
        self.local.graph = None
        self.local.outputs = False
        if outputs:
            return self._as_outputs(mode, pending or [])
        if not pending:
            return None
        g = self.gen.read_value()

        def save() -> Any:
            for _key, value, stamp, t in pending:
                value.assign(t)
                stamp.assign(g)
            return tf.constant(True)

        tf.cond(g > 0, save, lambda: tf.constant(False))
        return None

    def _as_outputs(self, mode: Any, pending: list[tuple[Any, Any, Any, Any]]) -> tuple[Any, ...]:
        """The step's captures as few outputs: those of a static shape flattened into one concatenation per
        dtype (each output costs TensorFlow's Python some µs per call), the others as they are; their places
        in `out_keys[mode]` as (key, output index, offset, size, shape), offset None for a whole output."""
        tf = self.tf
        outs: list[Any] = []
        layout: list[tuple[Any, int, int | None, int, tuple[int, ...]]] = []
        groups: dict[Any, list[tuple[Any, Any]]] = {}
        for key, _v, _s, t in pending:
            if key[2] is not None and t.dtype != tf.bool:
                groups.setdefault(t.dtype, []).append((key, t))
            else:
                layout.append((key, len(outs), None, 0, ()))
                outs.append(t)
        for group in groups.values():
            slot, offset = len(outs), 0
            for key, _t in group:
                size = int(np.prod(key[2], dtype=np.int64))
                layout.append((key, slot, offset, size, key[2]))
                offset += size
            outs.append(tf.concat([tf.reshape(t, [-1]) for _k, t in group], 0))
        self.out_keys[mode] = layout
        return tuple(outs)

    def unpack(self, mode: Any, outputs: tuple[Any, ...],
               skip: Iterable[int] = ()) -> list[tuple[str, int, np.ndarray]]:
        """(name, local replica, value) of what a step function in outputs mode returned (views, no copies),
        less the outputs numbered in `skip`."""
        arrays = [None if i in skip else np.asarray(o) for i, o in enumerate(outputs)]
        found = []
        for key, slot, offset, size, shape in self.out_keys.get(mode, []):
            a = arrays[slot]
            if a is None:
                continue
            if offset is not None:
                a = a[offset:offset + size].reshape(shape)
            found.append((key[0], key[1], a))
        return found

    def capture(self, mode: Any, name: str, t: Any, gate: Any = None) -> bool:
        """Add the copy of `t` to the step being traced; False if it cannot be captured here. `gate`: an int32
        tensor to use instead of `gen` (the number of this step if it saves, else 0)."""
        tf = self.tf
        t = tf.convert_to_tensor(t)
        if t.dtype in (tf.string, tf.resource, tf.variant):
            return False
        shape = t.shape
        static = tuple(shape.as_list()) if shape.is_fully_defined() else None
        if static is None and self.xla:
            return False  # XLA needs a variable of a fixed shape
        replica = _local_replica(tf)
        key = (name, replica, static, t.dtype.name)
        pending = getattr(self.local, "pending", None)
        if gate is None and pending is not None and getattr(self.local, "outputs", False) \
                and getattr(t, "graph", None) is self.local.graph:
            pending.append((key, None, None, t))  # (returned by the step function: no shadow)
            return True
        pair = self.vars.get(key)
        if pair is None:
            with tf.init_scope():
                if static is None:
                    value = _plain_variable(tf, tf.zeros([0], dtype=t.dtype), "tensortap_shadow", unknown_shape=True)
                else:
                    value = _plain_variable(tf, tf.zeros(static, dtype=t.dtype), "tensortap_shadow")
                stamp = _plain_variable(tf, tf.constant(0, tf.int32), "tensortap_stamp")
            pair = self.vars[key] = (value, stamp)
        keys = self.names.setdefault(mode, [])
        if key not in keys:
            keys.append(key)
        value, stamp = pair
        if gate is None and pending is not None and getattr(t, "graph", None) is self.local.graph:
            pending.append((key, value, stamp, t))
            return True
        g = self.gen.read_value() if gate is None else gate

        def save() -> Any:
            value.assign(t)
            stamp.assign(g)
            return tf.constant(True)

        tf.cond(g > 0, save, lambda: tf.constant(False))
        return True

    def end_step(self) -> None:
        self.gen.assign(0, read_value=False)

    def start(self, saving: bool) -> None:
        if saving:
            self.counter += 1
            self.current = self.counter
            self.gen.assign(self.current, read_value=False)
        elif self.current:
            self.gen.assign(0, read_value=False)
            self.current = 0

    def read(self, mode: Any, gen: int | None = None) -> list[tuple[str, int, np.ndarray]]:
        """(name, local replica, value) of what the step numbered `gen` captured."""
        if gen is None:
            gen, self.current = self.current, 0
        if not gen:
            return []
        keys = self.names.get(mode, [])
        if not keys:
            return []
        reader = self.readers.get(mode)
        if reader is None or reader[0] != len(keys):
            pairs = [self.vars[k] for k in keys]
            tf = self.tf

            def read_all() -> Any:
                return tf.stack([s.read_value() for _v, s in pairs]), [v.read_value() for v, _s in pairs]

            reader = self.readers[mode] = (len(keys), tf.function(read_all, autograph=False))
        stamps, values = reader[1]()
        stamps = stamps.numpy().tolist()
        # (np.asarray: a view of the read's output tensor, which nothing changes, instead of .numpy()'s copy)
        return [(k[0], k[1], np.asarray(v)) for k, s, v in zip(keys, stamps, values, strict=True) if s == gen]


def _plain_variable(tf: Any, initial: Any, name: str, unknown_shape: bool = False) -> Any:
    """A variable of this process alone, whatever distribution strategy is in scope: made as a
    ResourceVariable directly, it bypasses the strategies' variable creators (no mirroring, and no
    collective op that other workers would have to match)."""
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.ResourceVariable(
        initial, trainable=False, name=name, shape=tf.TensorShape(None) if unknown_shape else None)


class _IteratorStep:
    """Keras's step function (TensorFlow backend) called as Keras's own wrapper calls it on a tf.data iterator:
    its compiled `multi_step_on_iterator`, then the value of the Optional that returns, fetched with the
    output types and shapes kept from the last call (`Optional.get_value` works them out from the element
    spec at every call: ~50 us more for a capturing step's outputs than for Keras's own). Any other call, and
    outputs that are not all plain tensors, go through Keras's wrapper or `get_value`."""

    def __init__(self, fn: Callable[..., Any], compiled: Any) -> None:
        self.fn = fn
        self.compiled = compiled
        self.spec: Any = None
        self.flat: tuple[list[Any], list[Any]] | None = None  # (output types, shapes) of `spec`'s tensors

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> _IteratorStep | None:
        """For a Keras step function made by the TensorFlow trainer's `_make_function`, else None."""
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if getattr(value, "__name__", None) == "multi_step_on_iterator" and hasattr(value, "python_function"):
                return cls(fn, value)
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        if kwargs or len(args) != 1 or not isinstance(args[0], tf.data.Iterator | tf.distribute.DistributedIterator):
            return self.fn(*args, **kwargs)
        opt = self.compiled(args[0])
        if not opt.has_value():
            raise StopIteration
        spec = opt.element_spec
        if spec is not self.spec:
            leaves = tf.nest.flatten(spec)
            self.spec = spec
            self.flat = ([s.dtype for s in leaves], [s.shape for s in leaves]) \
                if all(type(s) is tf.TensorSpec for s in leaves) else None
        variant = getattr(opt, "_variant_tensor", None)
        if self.flat is None or variant is None:
            return opt.get_value()
        values = tf.raw_ops.OptionalGetValue(optional=variant, output_types=self.flat[0], output_shapes=self.flat[1])
        return tf.nest.pack_sequence_as(spec, values)


class _Tally:
    """Steps a hook counted without the step clock (the clock adds `skipped` to its counters when read)."""

    __slots__ = ("skipped",)

    def __init__(self) -> None:
        self.skipped = 0


class KerasHookBase(Hook):
    """The capture logic of KerasHook (see tensortap.tensorflow.KerasHook for the user-facing class)."""

    builtin_collections = (
        K.ALL, K.DEFAULT, K.SCALARS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.METRICS, K.INPUTS,
        K.OUTPUTS, K.LAYERS, K.OPTIMIZER_VARIABLES, K.SM_METRICS,
        *(c for pair in ACTIVATION_COLLECTIONS.values() for c in pair),
    )
    default_include_collections = (K.DEFAULT, K.SCALARS, K.LOSSES, K.METRICS, K.SM_METRICS)
    always_include_collections = (K.METRICS, K.LOSSES, K.SM_METRICS)
    _scalars_wait_for_step = True  # (steps are Keras's batches)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("rank") is None and kwargs.get("world_size") is None:
            found = _rank_from_tf_config()
            if found is not None:
                kwargs["rank"], kwargs["world_size"] = found
        # Without a rank from the launcher, the model's MirroredStrategy (known when the model is registered)
        # may still make this process several workers: claim the out_dir then (or at the first step).
        self._claim_later = kwargs.get("rank") is None and rank_in_env() is None
        super().__init__(*args, **kwargs)
        self._model: Any = None
        self._registered: Any = None
        self._backend: str | None = None
        self._store: _GraphStore | None = None
        self._eager: list[tuple[str, np.ndarray]] = []
        self._eager_on = False  # capturing eagerly in the current step
        self._in_step_fn: Any = None  # mode of the step function running / being traced
        self._saving = False
        self._batch_begin = 0
        self._unobserved = 0  # saving steps inside an execution (steps_per_execution > 1): nothing to read
        self._layer_names: dict[int, str] = {}
        self._weights: list[tuple[str, Any]] = []  # (name, variable)
        self._n_weights = 0
        self._tape_gate: Any = None
        self._replica_hooks: list[Hook] = []  # MirroredStrategy in one process, include_workers="all"
        self._var_readers: dict[tuple[int, ...], tuple[list[Any], Any]] = {}  # (variables, compiled read)
        self._fn_swap = False  # swap Keras's compiled step functions between saving and other steps
        self._functions: dict[str, list[Any]] = {}  # "train_function" -> [plain, capturing]
        self._capture_trace = True  # a compiled step traced now gets the capture ops
        self._outputs_trace = False  # ... and returns them as extra outputs (see _select_function)
        self._out_functions: set[int] = set()  # ids of the unpacking wrappers of such functions
        self._step_outputs: tuple[Any, tuple[Any, ...]] | None = None  # (mode, captures) of the last call
        self._tape_pending: tuple[int, Any] | None = None
        self._wrapped_optimizers: list[Any] = []
        self._wanted_cache: dict[str, bool] = {}
        # mode -> (output layout, collections saving, [(output, batch plan)]) of the concatenations sent whole
        self._output_plans: dict[Any, tuple[Any, Any, list[tuple[int, Any]]]] = {}
        # (collections saving, ids of the optimizers' variables, [(name, variable, collections)] saved of them)
        self._optimizer_chosen: tuple[Any, tuple[int, ...], list[tuple[str, Any, list[Collection]]]] | None = None
        # (collections saving, {log key: the collections of them that take it}) (see _classify_log)
        self._logs_classified: tuple[Any, dict[str, list[Collection]]] = (None, {})
        # (collections saving, the logs' keys, (keys saved, batch plan or None, buffer)) (see _send_logs)
        self._logs_plan: tuple[Any, tuple[Any, ...], tuple[tuple[str, ...], Any, Any]] | None = None
        self._restore: list[Callable[[], None]] = []
        # The next `_quiet_left` batches of mode `_quiet_mode` are known to save nothing: the batch callbacks
        # only count them (until `_quiet_deadline`, the next stop-request check); see `_arm_quiet`.
        # weights the capturing step function of a mode copies at its start (read there, not between steps)
        self._weights_in_step: dict[Any, frozenset[str]] = {}
        self._host_weights: set[str] = set()  # weights read between steps at the current step
        self._quiet_left = 0
        self._quiet_mode: Any = None
        self._quiet_deadline = 0.0
        self._quiet_tally = _Tally()  # the steps only counted, added to the step clock before it is read
        self.clock.tally = self._quiet_tally
        from tensortap.tensorflow import singleton

        singleton.set_hook(self)

    # --- collections --------------------------------------------------------------------------

    def _init_builtin_collections(self) -> None:
        cm = self.collection_manager
        cm.get(K.WEIGHTS).include(r"(^|/)weights/.*(?<!bias)$")
        cm.get(K.BIASES).include(r"(^|/)weights/.*bias$")
        cm.get(K.GRADIENTS).include(r"^gradients/")
        cm.get(K.OPTIMIZER_VARIABLES).include(r"^optimizer_variables/")
        cm.get(K.LOSSES).include(r"^(val_)?([\w.]*_)?loss$")
        cm.get(K.INPUTS).include(r"^inputs(_\d+)?$")
        cm.get(K.OUTPUTS).include(r"^(labels|predictions)(_\d+)?$")
        cm.get(K.LAYERS).include(r"^[^/]+/(inputs|outputs)(_\d+)?$")

    def _programmatic_collections(self) -> set[str]:
        return set(self.builtin_collections)

    def _wanted(self, name: str) -> bool:
        """Whether some included collection takes tensor `name` at some step."""
        hit = self._wanted_cache.get(name)
        if hit is None:
            hit = self._wanted_cache[name] = any(c.matches(name) for c in self._included())
        return hit

    def _any_wanted(self, names: Iterable[str]) -> bool:
        return any(self._wanted(n) for n in names)

    def _collections_changed(self) -> None:
        self._wanted_cache = {}
        self._output_plans = {}
        self._optimizer_chosen = None
        self._logs_classified = (None, {})
        self._logs_plan = None
        self._quiet_left = 0
        super()._collections_changed()

    # --- model registration -------------------------------------------------------------------

    def register_model(self, model: Any) -> None:
        """Capture from `model` (a Keras model; `fit` etc. call this through the callback's set_model)."""
        if model is None or self._registered is model or not self.active:
            return
        with self.guard("register_model"):
            self._unregister()
            import keras

            self._model = model
            self._registered = model
            self._backend = keras.backend.backend()
            self._wanted_cache = {}
            self._name_layers(model)
            self._collect_weights()
            self._setup_replicas(model)
            self._claim()
            rebuild = False
            if self._needs_step_capture():
                self._wrap_steps(model)
                rebuild = self._wrap_layers(model) or True
                self._fn_swap = self._backend == "tensorflow" and not getattr(model, "run_eagerly", False)
                self._functions = {}
            if rebuild:
                # a step function traced before the wrappers went in would not capture
                for attr in ("train_function", "test_function", "predict_function"):
                    if getattr(model, attr, None) is not None:
                        setattr(model, attr, None)

    def _claim(self) -> None:
        """Claim this worker's folder in out_dir once the workers are known (what the base constructor does
        when it knows them); another job's folder: this hook writes nothing, training goes on."""
        if self._claim_later:
            self._claim_later = False
            if self.writes and not self.disabled and not self.dry_run:
                try:
                    self._check_out_dir()
                except InvalidConfiguration as e:
                    self._fail("start of training", e)

    def on_step_begin(self) -> None:
        if self._claim_later:
            self._claim()

    def _setup_replicas(self, model: Any) -> None:
        """MirroredStrategy over several devices of this process: one worker per device (smdebug's naming:
        worker_<i> for the i-th device; only worker_0 writes with include_workers="one")."""
        strategy = getattr(model, "distribute_strategy", None)
        n = _local_devices(strategy) if strategy is not None else 1
        if n <= 1 or self.world_size > 1 or self._replica_hooks:
            return
        if not self._claim_later:
            self._warn_once("late-strategy", "tensortap: the hook began before the model's MirroredStrategy was "
                                             "known; it writes as one worker")
            return
        self.world_size = n
        if self.include_workers == "all":
            self.num_workers = n
            self.collection_manager.set_num_workers(n)
            for i in range(1, n):
                h = Hook(self.out_dir, reduction_config=self.reduction_config, save_config=self.save_config,
                         include_collections=list(self.include_collections), include_workers="all",
                         dry_run=self.dry_run, rank=i, world_size=n, worker=f"worker_{i}")
                h.collection_manager = self.collection_manager  # the same collections, filled by this hook
                h.include_collections = self.include_collections
                while h.mode is not self.mode:
                    h.set_mode(self.mode)
                self._replica_hooks.append(h)

    def _collect_weights(self) -> None:
        model = self._model
        self._weights = []
        seen: set[int] = set()
        for layer in self._all_layers(model):
            lname = self._layer_names.get(id(layer))
            if lname is None:  # a layer made after registration (a subclassed model building late)
                self._name_layers(model)
                lname = self._layer_names[id(layer)]
            for v in self._own_variables(layer):
                if id(v) in seen:
                    continue
                seen.add(id(v))
                self._weights.append((f"{lname}{WEIGHTS_INFIX}{v.path}", v))
        self._n_weights = len(getattr(model, "weights", ()))

    def _needs_step_capture(self) -> bool:
        inc = {c.name for c in self._included()}
        if inc & _IN_STEP:
            return True
        # (a collection of the user's, by regex: it may name tensors inside the step, e.g. add_keras_layer's)
        return bool(self.collection_manager.get(K.DEFAULT).include_regex) or K.ALL in inc or any(
            c.include_regex for c in self._included() if c.name not in self.builtin_collections)

    @staticmethod
    def _all_layers(model: Any) -> list[Any]:
        flatten = getattr(model, "_flatten_layers", None)
        if flatten is not None:
            return list(flatten(include_self=True, recursive=True))
        return [model, *getattr(model, "layers", [])]

    @staticmethod
    def _own_variables(layer: Any) -> list[Any]:
        own = [*getattr(layer, "_trainable_variables", []), *getattr(layer, "_non_trainable_variables", [])]
        if not own and not getattr(layer, "_layers", None):
            own = list(getattr(layer, "weights", []))
        return own

    def _name_layers(self, model: Any) -> None:
        self._layer_names = {}
        used: dict[str, int] = {}
        for layer in self._all_layers(model):
            name = str(getattr(layer, "name", type(layer).__name__)).replace("/", "_")
            n = used.get(name, 0)
            used[name] = n + 1
            self._layer_names[id(layer)] = name if n == 0 else f"{name}_{n}"

    def _wrap_steps(self, model: Any) -> None:
        for attr, mode in (("train_step", _modes.TRAIN), ("test_step", _modes.EVAL), ("predict_step", _modes.PREDICT)):
            orig = getattr(model, attr, None)
            if orig is None:
                continue
            self._set_attr(model, attr, self._step_wrapper(orig, mode))

    def _set_attr(self, obj: Any, attr: str, value: Any) -> None:
        had = attr in obj.__dict__
        old = obj.__dict__.get(attr)
        object.__setattr__(obj, attr, value)

        def restore() -> None:
            if had:
                object.__setattr__(obj, attr, old)
            else:
                obj.__dict__.pop(attr, None)

        self._restore.append(restore)

    def _unregister(self) -> None:
        self._restore_functions()
        self._functions = {}
        self._weights_in_step = {}
        self._fn_swap = False
        for r in reversed(self._restore):
            try:
                r()
            except Exception:  # noqa: BLE001
                pass
        self._restore = []

    def _step_wrapper(self, orig: Callable[..., Any], mode: Any) -> Callable[..., Any]:
        hook = self

        def step(data: Any) -> Any:
            graph = hook._graph_mode()
            if not hook.active or (graph and not hook._capture_trace):
                return orig(data)  # (the plain step function of steps that save nothing)
            outer = hook._in_step_fn
            hook._in_step_fn = mode
            if graph:
                if hook._store is None:
                    hook._store = _GraphStore(xla=bool(getattr(hook._model, "jit_compile", False)),
                                              saving=hook._saving)
                as_outputs = hook._outputs_trace
                hook._store.begin_trace(as_outputs)
                with hook.guard("step capture"):
                    hook._capture_weights(mode)
            extra: Any = None
            try:
                with hook.guard("step capture"):
                    hook._capture_data(mode, data)
                out = orig(data)
                if mode is _modes.PREDICT:
                    with hook.guard("step capture"):
                        hook._capture_many(mode, "predictions", _flat(out))
            finally:
                hook._in_step_fn = outer
                if graph:
                    with hook.guard("step capture"):
                        extra = hook._store.end_trace(mode)
            if graph and as_outputs:
                # (always this structure in such a trace: `_select_function`'s unpacking wrapper expects it)
                return {_OUT: out, _CAPTURED: tuple(extra or ())}
            with hook.guard("step end"):
                if graph:
                    # with several steps per execution only its first step is captured (with one, the
                    # callback clears the flag between steps, and replicas never race on it)
                    if hook._store is not None and int(getattr(hook._model, "steps_per_execution", 1) or 1) > 1:
                        hook._store.end_step()
                else:
                    hook._eager_on = False
            return out

        step.__wrapped__ = orig  # type: ignore[attr-defined]
        return step

    def _capture_weights(self, mode: Any) -> None:
        """In a compiled step traced for saving steps, on one device: copy the weights read at the step's start
        (before the optimizer updates them: the values the forward pass uses, as between steps) with the
        step's other captures, so that a saving step makes one read of everything instead of two."""
        names: frozenset[str] = frozenset()
        model = self._model
        if self._fn_swap and model is not None and _local_devices(getattr(model, "distribute_strategy", None)) == 1 \
                and getattr(model, "built", False):
            import tensorflow as tf

            if len(getattr(model, "weights", ())) != self._n_weights:
                self._collect_weights()
            done = set()
            for name, v in self._weights:
                if self._wanted(name) and self._store.capture(mode, name, tf.identity(getattr(v, "value", v))):
                    done.add(name)
            names = frozenset(done)
        self._weights_in_step[mode] = names

    def _wrap_layers(self, model: Any) -> bool:
        wrapped = False
        for layer in self._all_layers(model):
            lname = self._layer_names[id(layer)]
            is_root = layer is model
            kind = _layer_activation_type(layer)
            io_names = [f"{lname}/inputs", f"{lname}/outputs"]
            if kind is not None:
                cin, cout = ACTIVATION_COLLECTIONS[kind]
                for n, c in zip(io_names, (cin, cout), strict=True):
                    self.collection_manager.get(c).add_tensor_name(n)
            want_io = not is_root and (self._any_wanted(io_names)
                                       or self._any_wanted([f"{lname}/inputs_0", f"{lname}/outputs_0"]))
            want_pred = is_root and self._any_wanted(["predictions", "predictions_0"])
            if want_io or want_pred:
                self._set_attr(layer, "call", self._call_wrapper(layer, lname, layer.call, want_io, want_pred))
                wrapped = True
            act = getattr(layer, "activation", None)
            akind = _activation_kind(act) if kind is None and not is_root else None
            if akind is not None:
                names = [f"{lname}/activation_inputs", f"{lname}/activation_outputs"]
                cin, cout = ACTIVATION_COLLECTIONS[akind]
                for n, c in zip(names, (cin, cout), strict=True):
                    self.collection_manager.get(c).add_tensor_name(n)
                self._wanted_cache = {}
                if self._any_wanted(names):
                    self._set_attr(layer, "activation", self._activation_wrapper(act, names))
                    wrapped = True
        self._wanted_cache = {}
        return wrapped

    def _call_wrapper(self, layer: Any, lname: str, orig: Callable[..., Any], io: bool, pred: bool) -> Any:
        hook = self

        def call(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            mode = hook._in_step_fn
            if mode is not None and hook.active:
                with hook.guard("layer capture"):
                    if io:
                        first = args[0] if args else kwargs.get("inputs")
                        hook._capture_many(mode, f"{lname}/inputs", _flat(first))
                        hook._capture_many(mode, f"{lname}/outputs", _flat(out))
                    if pred and mode is not _modes.PREDICT:
                        hook._capture_many(mode, "predictions", _flat(out))
            return out

        call.__wrapped__ = orig  # type: ignore[attr-defined]
        return call

    def _activation_wrapper(self, fn: Callable[..., Any], names: list[str]) -> Any:
        hook = self

        def activation(x: Any, *args: Any, **kwargs: Any) -> Any:
            out = fn(x, *args, **kwargs)
            mode = hook._in_step_fn
            if mode is not None and hook.active:
                with hook.guard("activation capture"):
                    hook._capture(mode, names[0], x)
                    hook._capture(mode, names[1], out)
            return out

        activation.__name__ = getattr(fn, "__name__", "activation")
        activation.__wrapped__ = fn  # type: ignore[attr-defined]
        return activation

    # --- capture inside a step ----------------------------------------------------------------

    def _graph_mode(self) -> bool:
        if self._backend != "tensorflow":
            return False
        tf = sys.modules.get("tensorflow")
        return tf is not None and tf.inside_function()

    def _capture_data(self, mode: Any, data: Any) -> None:
        import keras

        x, y, _sw = keras.utils.unpack_x_y_sample_weight(data)
        self._capture_many(mode, "inputs", _flat(x))
        if mode is not _modes.PREDICT:
            self._capture_many(mode, "labels", _flat(y))

    def _capture_many(self, mode: Any, name: str, values: list[Any]) -> None:
        for n, v in _indexed(name, values):
            self._capture(mode, n, v)

    def _capture(self, mode: Any, name: str, value: Any) -> None:
        if value is None or not self._wanted(name):
            return
        if self._graph_mode():
            if self._store is None:
                self._store = _GraphStore(xla=bool(getattr(self._model, "jit_compile", False)), saving=self._saving)
            if not self._store.capture(mode, name, value):
                self._warn_once(f"nocapture:{name}", f"tensortap: {name!r} cannot be captured inside this compiled "
                                                      "step (XLA needs static shapes); it is not saved")
        elif self._eager_on:
            self._eager.append((name, _to_numpy(value)))

    def _on_gradients(self, grads: Any, variables: Any) -> None:
        """Called by a wrapped optimizer with the gradients it applies (loss scaling undone)."""
        if not self.active or self._in_step_fn is _modes.EVAL:
            return
        if self._in_step_fn is None and self._graph_mode():
            return  # a compiled step of a function that saves nothing
        with self.guard("gradients"):
            mode = self._in_step_fn or _modes.TRAIN
            for g, v in zip(grads, variables, strict=False):
                if g is None:
                    continue
                path = getattr(v, "path", None) or getattr(v, "name", "variable")
                name = f"{GRADIENT_PREFIX}{str(path).split(':')[0]}{GRADIENT_SUFFIX}"
                if not self._wanted(name):
                    continue
                if self._backend == "tensorflow":
                    import tensorflow as tf

                    if isinstance(g, tf.IndexedSlices):
                        g = tf.convert_to_tensor(g)
                self._capture(mode, name, g)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Capture the gradients `optimizer` applies (a Keras 3 optimizer, also a LossScaleOptimizer: the
        gradients after the loss scale is undone). Returns the same optimizer."""
        inner = optimizer
        while getattr(inner, "inner_optimizer", None) is not None:
            inner = inner.inner_optimizer
        if getattr(inner, "_tensortap_hook", None) is self:
            return optimizer
        attr = "_backend_apply_gradients" if hasattr(inner, "_backend_apply_gradients") else "apply"
        orig = getattr(inner, attr)
        hook = self

        def apply(grads: Any, trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            if hook.active:
                hook._on_gradients(list(grads), list(trainable_variables or []))
            return orig(grads, trainable_variables, *args, **kwargs)

        object.__setattr__(inner, attr, apply)
        object.__setattr__(inner, "_tensortap_hook", self)
        self._wrapped_optimizers.append(optimizer)
        return optimizer

    # --- between steps ------------------------------------------------------------------------

    def _begin_batch(self, mode: Any, batch: int) -> None:
        if self.mode is not mode:
            self.set_mode(mode)
        if self._replica_hooks:
            self._next_step_all()
        else:
            self.next_step()
        self._batch_begin = batch
        saving = bool(self.collections_to_save())
        self._saving = saving
        if self._fn_swap:
            self._select_function(mode, saving)
        store = self._store
        # (with swapped functions, the plain one never reads the flag: it need not be cleared; a capturing
        # function that returns all its captures, traced already, never reads it either)
        if store is not None and (saving or (store.current and not self._fn_swap)) \
                and not (saving and self._outputs_trace and mode in store.out_keys and not store.names.get(mode)):
            store.start(saving)
        self._eager_on = saving
        if not saving:
            self._arm_quiet(mode)
        if saving:
            self._eager = []
            self._step_outputs = None
            items = []
            in_step = self._weights_in_step.get(mode)
            # (a capturing step function collects the weights again whenever it is traced: while it runs,
            # counting the model's weights at every saving step would find nothing new)
            if in_step is None or not self._fn_swap:
                if self._model is not None and len(getattr(self._model, "weights", ())) != self._n_weights:
                    self._collect_weights()
                in_step = self._weights_in_step.get(mode, ())
            if len(in_step) < len(self._weights):
                chosen = [(name, v, colls) for name, v in self._weights
                          if name not in in_step and (colls := self.collections_for(name))]
                self._host_weights = {name for name, _v, _c in chosen}
                values = self._read_variables([v for _n, v, _c in chosen])
                items.extend((name, value, colls) for (name, _v, colls), value in zip(chosen, values, strict=True))
            elif self._host_weights:
                self._host_weights = set()
            if mode is _modes.TRAIN:
                items.extend(self._optimizer_items())
            for h in self._replica_hooks:  # mirrored variables: the same values on every device
                mine = [(n, v, h.collections_for(n)) for n, v, _c in items]
                h.write_tensors([it for it in mine if it[2]], copy=True)
            if items:
                self.write_tensors(items, copy=False)

    def _arm_quiet(self, mode: Any) -> None:
        """After a step that saves nothing and has switched back to Keras's plain step function: let the batch
        callbacks only count the following steps up to the next one that may save (what `next_step` would do
        for them, less telling readers that each passed: the next step that goes through `next_step` does).
        Only with one step per execution and one worker per process; never past the next stop-request check."""
        self._quiet_left = 0
        if self._replica_hooks or self._model is None or self.disabled:
            return
        if int(getattr(self._model, "steps_per_execution", 1) or 1) != 1:
            return
        left = self.next_saving_step() - self.mode_step - 1
        if left > 0:
            self._quiet_left = int(min(left, 1 << 30))
            self._quiet_mode = mode
            self._quiet_deadline = self.counting_deadline()

    def _select_function(self, mode: Any, saving: bool) -> None:
        """Keras's compiled step function for this batch: the plain one Keras made (no tensortap op in it) on
        steps that save nothing, a second one with the capture ops on saving steps (traced with
        `_capture_trace` on, at its first call)."""
        model = self._model
        attr, maker = _FUNCTIONS[mode]
        current = getattr(model, attr, None)
        pair = self._functions.get(attr)
        if pair is None or (current is not pair[0] and current is not pair[1]):
            if current is None:
                return
            pair = self._functions[attr] = [current, None]  # Keras made (or remade) its function
        if saving and pair[1] is None:
            object.__setattr__(model, attr, None)
            getattr(model, maker)()
            made = getattr(model, attr)
            if made is None:  # (a Keras that makes its function elsewhere: capture in the plain one)
                object.__setattr__(model, attr, pair[0])
                pair[1] = pair[0]
            elif self._outputs_possible(model):
                pair[1] = self._unpacking(made, mode)
                self._out_functions.add(id(pair[1]))
            else:
                pair[1] = made
        want = pair[1] if saving else pair[0]
        if current is not want:
            object.__setattr__(model, attr, want)
        self._capture_trace = saving
        self._outputs_trace = saving and id(want) in self._out_functions

    @staticmethod
    def _outputs_possible(model: Any) -> bool:
        """Whether a capturing step function may return its captures as extra outputs: it runs on saving
        steps only, one step per call, on one device (else they go through shadow variables)."""
        return int(getattr(model, "steps_per_execution", 1) or 1) == 1 \
            and _local_devices(getattr(model, "distribute_strategy", None)) == 1

    def _unpacking(self, fn: Callable[..., Any], mode: Any) -> Callable[..., Any]:
        """Keras's capturing step function, returning to Keras what the step returns and keeping the
        captures for `_end_batch`."""
        hook = self
        call = _IteratorStep.of(fn) or fn

        def function(*args: Any, **kwargs: Any) -> Any:
            res = call(*args, **kwargs)
            if isinstance(res, dict) and _CAPTURED in res:
                hook._step_outputs = (mode, res[_CAPTURED])
                return res[_OUT]
            return res

        function.__wrapped__ = fn  # type: ignore[attr-defined]
        return function

    def _restore_functions(self) -> None:
        model = self._model
        for attr, pair in self._functions.items():
            if model is not None and getattr(model, attr, None) is pair[1]:
                object.__setattr__(model, attr, pair[0])
        self._capture_trace = True
        self._outputs_trace = False

    def _optimizer_items(self) -> list[tuple[str, np.ndarray, list[Collection]]]:
        opts = list(self._wrapped_optimizers)
        model_opt = getattr(self._model, "optimizer", None)
        if model_opt is not None and all(o is not model_opt for o in opts):
            opts.append(model_opt)
        variables = [v for opt in opts for v in getattr(opt, "variables", [])]
        now = self.collections_to_save()
        key = tuple(map(id, variables))
        cached = self._optimizer_chosen
        if cached is not None and cached[0] is now and cached[1] == key:
            chosen = cached[2]
        else:
            chosen = []
            for v in variables:
                name = f"{OPTIMIZER_PREFIX}{getattr(v, 'path', None) or v.name}"
                colls = self.collections_for(name)
                if colls:
                    chosen.append((name, v, colls))
            self._optimizer_chosen = (now, key, chosen)
        if not chosen:
            return []
        values = self._read_variables([v for _n, v, _c in chosen])
        return [(name, value, colls) for (name, _v, colls), value in zip(chosen, values, strict=True)]

    def _read_variables(self, variables: list[Any]) -> list[np.ndarray]:
        """Host copies of Keras variables; on TensorFlow in one call of a compiled function."""
        if not variables:
            return []
        if self._backend != "tensorflow":
            return [_to_numpy(v) for v in variables]
        key = tuple(map(id, variables))
        reader = self._var_readers.get(key)
        if reader is None:
            import tensorflow as tf

            held = [getattr(v, "value", v) for v in variables]

            def read_all() -> Any:
                return [tf.identity(v) for v in held]

            reader = self._var_readers[key] = (variables, tf.function(read_all, autograph=False))
        return [np.asarray(t) for t in reader[1]()]  # (views of the read's outputs, which nothing changes)

    def _send_outputs(self, mode: Any, outputs: tuple[Any, ...]) -> tuple[set[int], list[str]]:
        """Send each concatenation the capturing step function returned whose tensors are all saved raw now as
        one batch, its payload the concatenation's bytes as they are: (the outputs sent, their tensors' names)."""
        store = self._store
        layout = store.out_keys.get(mode) if store is not None else None
        if not layout or self._replica_hooks or self.dry_run:
            return set(), []
        now = self.collections_to_save()
        plans = self._output_plans.get(mode)
        if plans is None or plans[0] is not layout or plans[1] is not now:
            plans = self._output_plans[mode] = (layout, now, self._plan_outputs(layout))
        sent: set[int] = set()
        names: list[str] = []
        host = self._host_weights
        for slot, spec in plans[2]:
            if host and not host.isdisjoint(spec.names):
                continue  # (some of them were read before the step)
            arr = np.asarray(outputs[slot])
            if arr.dtype != spec.np_dtype or not arr.flags.c_contiguous:
                continue
            if self._write_planned(spec, [(arr.ctypes.data, arr.nbytes)]):
                sent.add(slot)
                names.extend(spec.names)
        return sent, names

    def _plan_outputs(self, layout: list[tuple[Any, int, int | None, int, tuple[int, ...]]]) -> list[tuple[int, Any]]:
        """(output, batch plan) of the concatenations in `layout` whose tensors the collections saving now all
        take raw."""
        slots: dict[int, list[tuple[Any, tuple[int, ...]]]] = {}
        for key, slot, offset, _size, shape in layout:
            if offset is not None:
                slots.setdefault(slot, []).append((key, shape))
        plans = []
        for slot, entries in slots.items():
            try:
                np_dtype = np.dtype(entries[0][0][3])
            except TypeError:
                continue  # (a TensorFlow dtype numpy has no name for, e.g. bfloat16: sent tensor by tensor)
            if np_dtype.kind not in "biuf" or any(key[1] > 0 for key, _s in entries):
                continue
            items = [(key[0], self.collections_for(key[0])) for key, _s in entries]
            if not all(colls for _n, colls in items):
                continue
            spec = self._batch_spec(items)
            if spec.raw_only:
                spec.shapes = tuple(tuple(shape) for _k, shape in entries)
                spec.np_dtype = np_dtype
                plans.append((slot, spec))
        return plans

    def _end_batch(self, mode: Any, batch: int, logs: Any) -> None:
        if self._saving:
            captured: list[tuple[str, int, Any]] = []
            outs, self._step_outputs = self._step_outputs, None
            sent_names: list[str] = []
            if outs is not None and self._store is not None:
                sent, sent_names = self._send_outputs(outs[0], outs[1])
                if len(sent) < len(outs[1]):
                    captured.extend(self._store.unpack(outs[0], outs[1], sent))
            if self._store is not None:
                captured.extend(self._store.read(mode))
                host = self._host_weights
                if host:  # (a step function traced in this step copied weights already read before it)
                    captured = [c for c in captured if c[0] not in host]
            if self._eager:
                captured.extend((n, 0, v) for n, v in self._eager)
                self._eager = []
            if mode is _modes.PREDICT and isinstance(logs, dict) and "outputs" in logs:
                if not any(n == "predictions" or n.startswith("predictions_")
                           for n in itertools.chain((c[0] for c in captured), sent_names)):
                    captured.extend((n, 0, v) for n, v in _indexed("predictions", _flat(logs["outputs"])))
            logs_items = [] if not self._replica_hooks and self._send_logs(logs) else self._log_items(logs)
            for replica, hook in enumerate([self, *self._replica_hooks] if captured or logs_items else ()):
                items: list[tuple[str, Any, list[Collection]]] = []
                for name, r, value in captured:
                    if r == replica or r < 0:
                        colls = hook.collections_for(name)
                        if colls:
                            items.append((name, np.asarray(value), colls))
                if hook is self:
                    items.extend(logs_items)
                else:
                    items.extend((n, v, hook.collections_for(n)) for n, v, _c in logs_items)
                    items = [it for it in items if it[2]]
                if items:
                    hook.write_tensors(items, copy=hook is not self)
        self._saving = False
        self._eager_on = False
        if batch == self._batch_begin:
            return
        # steps_per_execution > 1: the other steps of this execution
        for _ in range(max(0, int(batch) - int(self._batch_begin))):
            self._next_step_all()
            if self.collections_to_save():
                self._unobserved += 1
                self._warn_once("spe", "tensortap: with steps_per_execution > 1 only the first step of each "
                                       "execution can be captured; choose a save_interval that is a multiple of "
                                       "steps_per_execution (steps not captured are counted and reported at close)")

    def _next_step_all(self) -> None:
        self.next_step()
        for h in self._replica_hooks:
            if h.mode is not self.mode:
                h.set_mode(self.mode)
            h.next_step()

    def _send_logs(self, logs: Any) -> bool:
        """Send the logs' scalars saved now (Python floats, as Keras hands them to callbacks) as one planned
        float64 batch; False when they take the general path (`_log_items`) instead."""
        if not isinstance(logs, dict) or self.dry_run:
            return False
        now = self.collections_to_save()
        keys = tuple(logs)
        plan = self._logs_plan
        if plan is None or plan[0] is not now or plan[1] != keys:
            plan = self._logs_plan = (now, keys, self._plan_logs(logs))
        chosen, spec, buf = plan[2]
        if spec is None:
            return False
        for i, key in enumerate(chosen):
            value = logs[key]
            if type(value) is not float:
                return False
            buf[i] = value
        return self._write_planned(spec, ((buf.ctypes.data, buf.nbytes),))

    def _plan_logs(self, logs: dict[Any, Any]) -> tuple[tuple[str, ...], Any, Any]:
        """(keys saved now, their batch plan, a float64 buffer for their values) of logs like these; the plan
        None when they cannot go as one raw batch."""
        items = self._log_items(logs)
        if not items or any(type(logs[name]) is not float for name, _v, _c in items):
            return (), None, None
        spec = self._batch_spec([(name, colls) for name, _v, colls in items])
        if not spec.raw_only:
            return (), None, None
        spec.shapes = ((),) * len(items)
        spec.np_dtype = np.dtype(np.float64)
        return tuple(name for name, _v, _c in items), spec, np.empty(len(items), dtype=np.float64)

    def _log_items(self, logs: Any) -> list[tuple[str, Any, list[Collection]]]:
        if not isinstance(logs, dict):
            return []
        now = self.collections_to_save()
        classified = self._logs_classified
        if classified[0] is not now:
            classified = self._logs_classified = (now, {})
        items = []
        for key, value in logs.items():
            if key in _LOG_SKIP or not isinstance(key, str):
                continue
            try:
                arr = np.asarray(value)
            except Exception:  # noqa: BLE001
                continue
            if arr.dtype.kind not in "biuf" or arr.size != 1:
                continue
            colls = classified[1].get(key)
            if colls is None:
                self._classify_log(key)
                colls = classified[1][key] = self.collections_for(key)
            if colls:
                items.append((key, arr.reshape(()), colls))
        return items

    def _classify_log(self, key: str) -> None:
        losses = self.collection_manager.get(K.LOSSES)
        metrics = self.collection_manager.get(K.METRICS)
        if losses.matches(key) or metrics.has_tensor_name(key):
            return
        coll = K.LOSSES if re.search(r"loss", key) else K.METRICS
        self.get_collection(coll).add_tensor_name(key)

    def on_close(self) -> None:
        if self._tape_pending is not None:
            self._tape_flush()
        if self._unobserved:
            logger.warning("tensortap: %d saving steps fell inside an execution of steps_per_execution > 1 "
                           "steps and were not captured", self._unobserved)
        self._unregister()
        for h in self._replica_hooks:
            h.close()

    # --- tf.GradientTape loops ----------------------------------------------------------------

    def wrap_tape(self, tape: Any) -> Any:
        """Capture a custom training loop's step: each `with hook.wrap_tape(tf.GradientTape()) as tape:` is
        one step (in the current mode; TRAIN if none was set), and `tape.gradient(loss, variables)` saves
        `loss`, `weights/<variable>` and `gradients/<variable>Grad`. Works eagerly and inside a tf.function
        (not under XLA, where the step is not captured)."""
        return _WrappedTape(self, tape)

    def _tape_begin(self) -> None:
        self._tape_gate = None
        if not self.active:
            return
        with self.guard("tape begin"):
            if self._backend is None:
                self._backend = "tensorflow"
            if self._graph_mode():
                import tensorflow as tf
                from tensorflow.python.ops import control_flow_util

                if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
                    self._warn_once("tape-xla", "tensortap: wrap_tape inside an XLA-compiled function captures "
                                                "nothing (steps cannot be counted there)")
                    return
                if self._store is None:
                    self._store = _GraphStore(xla=False, saving=False)
                self._tape_gate = tf.py_function(self._tape_step, [], tf.int32)
            else:
                self._tape_step()

    def _tape_step(self) -> int:
        """A step boundary of a tape loop (eagerly, or from the graph through py_function): write what the
        previous step captured in a graph, begin the next step; returns its capture number (0: saves nothing)."""
        gen = 0
        if not self.active:
            return gen
        try:
            self._tape_flush()
            if self.mode is _modes.GLOBAL:
                self.set_mode(_modes.TRAIN)
            self.next_step()
            self._saving = saving = bool(self.collections_to_save())
            self._eager_on = saving
            if saving and self._store is not None:
                self._store.counter += 1
                gen = self._store.counter
                self._tape_pending = (gen, self.mode)
        except Exception as e:  # noqa: BLE001 - never break training (this may run inside a graph)
            self._fail("tape step", e)
            gen = 0
        return gen

    def _tape_flush(self) -> None:
        pending, self._tape_pending = self._tape_pending, None
        if pending is None or self._store is None:
            return
        gen, _mode = pending
        items = []
        for name, replica, value in self._store.read("tape", gen):
            if replica > 0:
                continue
            colls = self.collections_for(name)
            if colls:
                items.append((name, value, colls))
        if items:
            self.write_tensors(items, copy=False)

    def _tape_capture(self, target: Any, sources: Any, grads: Any) -> None:
        if not self.active:
            return
        with self.guard("tape gradient"):
            gate = self._tape_gate
            graph = self._graph_mode()
            if graph and gate is None:
                return
            if not graph and not self._saving:
                return
            srcs, gs = _flat(sources), _flat(grads)
            named: list[tuple[str, Any]] = list(_indexed("loss", _flat(target)))
            for v, g in zip(srcs, gs, strict=False):
                path = str(getattr(v, "path", None) or getattr(v, "name", "variable")).split(":")[0]
                named.append((f"weights/{path}", v))
                if g is not None:  # (gradients are saved in TRAIN only: collections_for leaves them out)
                    named.append((f"{GRADIENT_PREFIX}{path}{GRADIENT_SUFFIX}", g))
            if graph:
                import tensorflow as tf

                for name, t in named:
                    if self._wanted(name):
                        if isinstance(t, tf.IndexedSlices):
                            t = tf.convert_to_tensor(t)
                        self._store.capture("tape", name, tf.identity(t), gate=gate)
                return
            items = []
            for name, t in named:
                colls = self.collections_for(name)
                if colls:
                    items.append((name, _to_numpy(t), colls))
            if items:
                self.write_tensors(items, copy=False)

    # --- smdebug's extras ----------------------------------------------------------------------

    def save_smdebug_logs(self, logs: Any) -> None:
        """Save the entries of a Keras logs dict (losses and metrics) at the current step."""
        if not self.active:
            return
        with self.guard("save_smdebug_logs"):
            self._ensure_step()
            items = self._log_items(logs)
            if items:
                self.write_tensors(items, copy=False)


class _WrappedTape:
    """A tf.GradientTape whose `with` block is a step of the hook and whose `gradient()` is captured."""

    def __init__(self, hook: KerasHookBase, tape: Any) -> None:
        self._hook = hook
        self._tape = tape

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> _WrappedTape:
        self._hook._tape_begin()
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, *args, **kwargs)
        self._hook._tape_capture(target, sources, grads)
        return grads
