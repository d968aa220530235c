"""The Keras 3 / TensorFlow 2 hook (framework part without the Keras base class; see `keras.py`).

How values leave a step (see docs/tensorflow.md for the names and what each backend captures):

* weights and optimizer variables: the values the step's forward pass uses (read between steps, in
  `on_*_batch_begin`, or at the start of a compiled capturing step);
* losses and metrics come from the logs Keras hands to `on_*_batch_end`;
* gradients (`wrap_optimizer`), layer inputs/outputs, model inputs, labels and predictions are tensors inside
  the step (step_capture.py). A compiled model runs Keras's own step function on steps that save nothing and
  a second, capturing one on saving steps (step_functions.py), whose captures leave through the graph store
  (graph_store.py). With steps_per_execution > 1 only the first step of an execution is captured.
* `tf.GradientTape` loops: tape.py. What goes to the writer, and how: handoff.py.
* the step policy (what saves, the quiet window, the worker's identity, plans) is the step engine's
  (`tensortap.capture.engine`, `self.engine`); steps known to save nothing are only counted by the batch
  callbacks (`_arm_quiet`).

Modules: common (names), model (layers and weights), graph_store, step_functions, step_capture, handoff, tape;
this one ties them to the steps; keras.py is the callback.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.capture.engine import OPTIMIZER_STEP, Tally
from tensortap.collection import ACTIVATION_COLLECTIONS, Collection
from tensortap.hooks.base import Hook
from tensortap.tensorflow.common import IN_STEP, K, flat, indexed, steps_per_execution
from tensortap.tensorflow.graph_store import local_devices
from tensortap.tensorflow.handoff import Handoff
from tensortap.tensorflow.model import ModelLayout, Patches
from tensortap.tensorflow.step_capture import StepCapture
from tensortap.tensorflow.step_functions import StepFunctions
from tensortap.tensorflow.tape import TapeLoop, WrappedTape

logger = logging.getLogger("tensortap")


def _rank_from_tf_config() -> tuple[int, int] | None:
    """(rank, world size) of a multi-worker job from $TF_CONFIG (chief first, then the workers), else None."""
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
    # A multi-worker job's rank comes from $TF_CONFIG. Without one (nor the caller's, nor the launcher's), the
    # model's MirroredStrategy, known when the model is registered, may still make this process several workers:
    # the engine claims the out_dir then (or at the first step).
    identity_source = staticmethod(_rank_from_tf_config)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._registered: Any = None  # the model registered
        self._backend: str | None = None  # Keras's backend ("tensorflow", "torch")
        self._layout: ModelLayout | None = None
        self._patches = Patches()  # (the registered model's, undone when another is registered or at close)
        self._optimizer_patches = Patches()  # (wrap_optimizer's, undone at close)
        self._functions = StepFunctions()
        self._capture = StepCapture(self, self._functions)
        self._handoff = Handoff(self)
        self._tape_loop = TapeLoop(self)
        self._batch_begin = 0
        self._unobserved = 0  # saving steps inside an execution (steps_per_execution > 1): nothing to read
        self._replica_hooks: list[Hook] = []  # MirroredStrategy in one process, include_workers="all"
        self._wrapped_optimizers: list[Any] = []  # as given to wrap_optimizer
        self._wrapped_inner: list[Any] = []  # the innermost optimizers wrapped (whose method was replaced)
        self._wanted_cache: dict[str, bool] = {}
        self._host_weights: set[str] = set()  # weights read between steps at the current step
        # batches known to save nothing, which the batch callbacks only count (armed by the engine, `_arm_quiet`;
        # the clock adds them to its counters before anything reads them)
        self._quiet = Tally()
        self.clock.tally = self._quiet
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
        super()._collections_changed()

    # --- model registration -------------------------------------------------------------------

    def register_model(self, model: Any) -> None:
        """Capture from `model` (a Keras model; `fit` etc. call this through the callback's set_model)."""
        if model is None or self._registered is model or not self.active:
            return
        with self.guard("register_model"):
            self._unregister()
            import keras

            self._registered = model
            self._backend = keras.backend.backend()
            self._wanted_cache = {}
            self._layout = ModelLayout(model)
            self._setup_replicas(model)
            self.engine.claim()  # (if it waited for the workers to be known)
            if self._needs_step_capture():
                self._capture.instrument(model, self._layout, self._patches)
                self._functions.start(swap=self._backend == "tensorflow" and not getattr(model, "run_eagerly", False))
                # a step function traced before the wrappers went in would not capture
                for attr in ("train_function", "test_function", "predict_function"):
                    if getattr(model, attr, None) is not None:
                        setattr(model, attr, None)

    def _setup_replicas(self, model: Any) -> None:
        """MirroredStrategy over several devices of this process: one worker per device (smdebug's naming:
        worker_<i> for the i-th device; only worker_0 writes with include_workers="one")."""
        strategy = getattr(model, "distribute_strategy", None)
        n = local_devices(strategy) if strategy is not None else 1
        if n <= 1 or self.world_size > 1 or self._replica_hooks:
            return
        if not self.engine.claim_pending or not self.engine.adopt_identity(0, n):
            self._warn_once("late-strategy", "tensortap: the hook began before the model's MirroredStrategy was "
                                             "known; it writes as one worker")
            return
        if self.include_workers == "all":
            for i in range(1, n):
                h = Hook(self.out_dir, reduction_config=self.reduction_config, save_config=self.save_config,
                         include_collections=list(self.include_collections), include_workers="all",
                         dry_run=self.dry_run, rank=i, world_size=n, worker=f"worker_{i}")
                h.collection_manager = self.collection_manager  # the same collections, filled by this hook
                h.include_collections = self.include_collections
                while h.mode is not self.mode:
                    h.set_mode(self.mode)
                self._replica_hooks.append(h)

    def _needs_step_capture(self) -> bool:
        inc = {c.name for c in self._included()}
        if inc & IN_STEP:
            return True
        # (a collection of the user's, by regex: it may name tensors inside the step, e.g. add_keras_layer's)
        return bool(self.collection_manager.get(K.DEFAULT).include_regex) or K.ALL in inc or any(
            c.include_regex for c in self._included() if c.name not in self.builtin_collections)

    def _unregister(self) -> None:
        self._functions.restore(self._registered)
        self._capture.weights_in_step = {}
        self._patches.undo()

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Capture the gradients `optimizer` applies (a Keras 3 optimizer, also a LossScaleOptimizer: the
        gradients after the loss scale is undone). Returns the same optimizer."""
        inner = optimizer
        while getattr(inner, "inner_optimizer", None) is not None:
            inner = inner.inner_optimizer
        if any(w is inner for w in self._wrapped_inner):
            return optimizer
        attr = "_backend_apply_gradients" if hasattr(inner, "_backend_apply_gradients") else "apply"
        orig = getattr(inner, attr)
        hook = self

        def apply(grads: Any, trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            if hook.active:
                hook._capture.gradients(list(grads), list(trainable_variables or []))
            return orig(grads, trainable_variables, *args, **kwargs)

        self._optimizer_patches.set(inner, attr, apply)
        self._wrapped_inner.append(inner)
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
        saving = self.engine.saving
        functions, capture = self._functions, self._capture
        if functions.swap:
            functions.select(self._registered, mode, saving)
        store = capture.store
        # (with swapped functions, the plain one never reads the flag: it need not be cleared; a capturing
        # function that returns all its captures, traced already, never reads it either)
        if store is not None and (saving or (store.current and not functions.swap)) \
                and not (saving and functions.outputs_trace and mode in store.out_keys and not store.names.get(mode)):
            store.start(saving)
        capture.host_on = saving
        if not saving:
            self._arm_quiet()
            return
        capture.host = []
        functions.outputs = None
        items = []
        in_step = capture.weights_in_step.get(mode)
        layout = self._layout
        # (a capturing step function collects the weights again whenever it is traced: while it runs,
        # counting the model's weights at every saving step would find nothing new)
        if in_step is None or not functions.swap:
            if layout is not None:
                layout.refresh()
            in_step = capture.weights_in_step.get(mode, ())
        weights = layout.weights if layout is not None else []
        if len(in_step) < len(weights):
            chosen = [(name, v, colls) for name, v in weights
                      if name not in in_step and (colls := self.collections_for(name))]
            self._host_weights = {name for name, _v, _c in chosen}
            values = self._handoff.read_variables([v for _n, v, _c in chosen])
            items.extend((name, value, colls) for (name, _v, colls), value in zip(chosen, values, strict=True))
        elif self._host_weights:
            self._host_weights = set()
        if mode is _modes.TRAIN:
            items.extend(self._handoff.optimizer_items(self._optimizers()))
        for h in self._replica_hooks:  # mirrored variables: the same values on every device
            mine = [(n, v, h.collections_for(n)) for n, v, _c in items]
            h.write_tensors([it for it in mine if it[2]], copy=True)
        if items:
            self.write_tensors(items, copy=False)

    def _optimizers(self) -> list[Any]:
        opts = list(self._wrapped_optimizers)
        model_opt = getattr(self._registered, "optimizer", None)
        if model_opt is not None and all(o is not model_opt for o in opts):
            opts.append(model_opt)
        return opts

    def _arm_quiet(self) -> None:
        """After a step that saves nothing and has switched back to Keras's plain step function: let the batch
        callbacks only count the steps of the engine's quiet window (what `next_step` would do for them, less
        telling readers that each passed: the next step that goes through `next_step` does). Only with one step
        per execution and one worker per process. The window closes when a step ends or the mode changes."""
        if self._replica_hooks or self._registered is None or self.disabled:
            return
        if steps_per_execution(self._registered) == 1:
            self.engine.arm(self._quiet)

    def _end_batch(self, mode: Any, batch: int, logs: Any) -> None:
        if self.engine.saving:
            self._write_step(mode, logs)
        self._capture.host_on = False
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

    def _write_step(self, mode: Any, logs: Any) -> None:
        """Hand over what the saving step that just ended captured, and its logs."""
        capture, functions, handoff = self._capture, self._functions, self._handoff
        store = capture.store
        captured: list[tuple[str, int, Any]] = []  # (name, local replica (-1: every one), value)
        outs, functions.outputs = functions.outputs, None
        sent_names: list[str] = []
        if outs is not None and store is not None:
            sent: set[int] = set()
            layout = store.out_keys.get(outs[0])
            if layout and not self._replica_hooks and not self.dry_run:
                sent, sent_names = handoff.send_outputs(outs[0], layout, outs[1], self._host_weights)
            if len(sent) < len(outs[1]):
                captured.extend(store.unpack(outs[0], outs[1], sent))
        if store is not None:
            captured.extend(store.read(mode))
            host = self._host_weights
            if host:  # (a step function traced in this step copied weights already read before it)
                captured = [c for c in captured if c[0] not in host]
        if capture.host:
            captured.extend((n, 0, v) for n, v in capture.host)
            capture.host = []
        if mode is _modes.PREDICT and isinstance(logs, dict) and "outputs" in logs:
            if not any(n == "predictions" or n.startswith("predictions_")
                       for n in itertools.chain((c[0] for c in captured), sent_names)):
                captured.extend((n, 0, v) for n, v in indexed("predictions", flat(logs["outputs"])))
        logs_items = [] if not self._replica_hooks and handoff.send_logs(logs) else handoff.log_items(logs)
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

    def _optimizer_stepped(self) -> None:
        """The lifecycle's optimizer_step, at a TRAIN batch's end: Keras's train step ends with the optimizer's
        apply, inside the step function (compiled: no Python of the step runs per batch), so its end is the first
        moment the callback can know it ran (docs/capture.md)."""
        if self.disabled or self._closed:
            return
        try:
            self.engine.fire(OPTIMIZER_STEP, {"optimizer": getattr(self._registered, "optimizer", None)})
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("optimizer_step", e)

    def _next_step_all(self) -> None:
        self.next_step()
        for h in self._replica_hooks:
            if h.mode is not self.mode:
                h.set_mode(self.mode)
            h.next_step()

    def on_close(self) -> None:
        self._tape_loop.flush()
        if self._unobserved:
            logger.warning("tensortap: %d saving steps fell inside an execution of steps_per_execution > 1 "
                           "steps and were not captured", self._unobserved)
        self._unregister()
        self._optimizer_patches.undo()
        for h in self._replica_hooks:
            h.close()

    # --- tf.GradientTape loops ----------------------------------------------------------------

    def wrap_tape(self, tape: Any) -> Any:
        """Capture a custom training loop's step: each `with hook.wrap_tape(tf.GradientTape()) as tape:` is
        one step (in the current mode; TRAIN if none was set), and `tape.gradient(loss, variables)` saves
        `loss`, `weights/<variable>` and `gradients/<variable>Grad`. Works eagerly and inside a tf.function
        (not under XLA, where the step is not captured)."""
        return WrappedTape(self._tape_loop, tape)

    # --- smdebug's extras ----------------------------------------------------------------------

    def save_smdebug_logs(self, logs: Any) -> None:
        """Save the entries of a Keras logs dict (losses and metrics) at the current step."""
        if not self.active:
            return
        with self.guard("save_smdebug_logs"):
            self._ensure_step()
            items = self._handoff.log_items(logs)
            if items:
                self.write_tensors(items, copy=False)
