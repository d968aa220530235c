"""SessionHook: smdebug's hook for TF1-style graph code (`tf.compat.v1` sessions), on TensorFlow 2.

TensorFlow 2.21 still runs `tf.compat.v1.train.MonitoredTrainingSession` / `MonitoredSession` with
`tf.compat.v1.train.SessionRunHook`s under `tf.compat.v1.disable_eager_execution()` (what TF1 code calls);
`tf.estimator` is gone, so smdebug's EstimatorHook has no successor. Each `run` of the monitored session is
one step. On a saving step the hook

* reads the weights (trainable variables) with one `run` of the raw session in `before_run`, before the step
  updates them (the values the step uses: fetched in the same run as the train op they could be read before
  or after the update);
* adds the step's gradients (`wrap_optimizer` / `add_gradients`), losses (`tf.compat.v1.losses`, the graph's
  LOSSES collection) and tensors given to `add_to_collection` as fetches of the step;
* writes them in `after_run` with one `write_tensors` call.

Steps that save nothing fetch nothing: the hook only counts them. Names: `weights/<variable>`,
`gradients/<variable>Grad`, `loss` (`loss_<i>` for several), and a tensor's op name for `add_to_collection`.

This module imports TensorFlow; `tensortap.tensorflow` imports it only when `SessionHook` is first used.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tensortap import modes as _modes
from tensortap.collection import CollectionKeys
from tensortap.hooks.base import Hook
from tensortap.tensorflow.model import Patches

K = CollectionKeys


def _var_name(v: Any) -> str:
    return str(getattr(getattr(v, "op", None), "name", None) or v.name.split(":")[0])


class SessionHook(Hook, tf.compat.v1.train.SessionRunHook):
    """Capture a `tf.compat.v1` graph job: pass it in `hooks=[hook]` of a MonitoredTrainingSession.

    Same keyword arguments as `tensortap.Hook` (out_dir, save_config, include_collections, ...).
    """

    builtin_collections = (K.ALL, K.DEFAULT, K.SCALARS, K.WEIGHTS, K.BIASES, K.GRADIENTS, K.LOSSES, K.METRICS,
                           K.INPUTS, K.OUTPUTS, K.OPTIMIZER_VARIABLES, K.SM_METRICS)
    default_include_collections = (K.DEFAULT, K.SCALARS, K.LOSSES, K.METRICS, K.SM_METRICS)
    always_include_collections = (K.METRICS, K.LOSSES, K.SM_METRICS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tensors: dict[str, Any] = {}  # name -> graph tensor (gradients, losses, add_to_collection)
        self._weights: dict[str, Any] = {}  # name -> read of a trainable variable
        self._step_items: list[tuple[str, np.ndarray, Any]] = []  # weights read before the saving step
        self._graph: Any = None
        self._pending = False  # after_run has fetched values to write
        self._wrapped_optimizers: list[Any] = []
        self._optimizer_patches = Patches()  # (wrap_optimizer's, undone at close)

    def _init_builtin_collections(self) -> None:
        cm = self.collection_manager
        cm.get(K.WEIGHTS).include(r"^weights/.*(?<!bias)$")
        cm.get(K.BIASES).include(r"^weights/.*bias$")
        cm.get(K.GRADIENTS).include(r"^gradients/")

    def _programmatic_collections(self) -> set[str]:
        return set(self.builtin_collections)

    # --- what to capture ------------------------------------------------------------------------

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Capture the gradients a `tf.compat.v1.train.Optimizer` applies (`apply_gradients`, also through
        `minimize`). Returns the same optimizer."""
        if any(o is optimizer for o in self._wrapped_optimizers):
            return optimizer
        orig = optimizer.apply_gradients
        hook = self

        def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            grads_and_vars = list(grads_and_vars)
            hook.add_gradients(grads_and_vars)
            return orig(grads_and_vars, *args, **kwargs)

        self._optimizer_patches.set(optimizer, "apply_gradients", apply_gradients)
        self._wrapped_optimizers.append(optimizer)
        return optimizer

    def add_gradients(self, grads_and_vars: Any) -> None:
        """Save `(gradient, variable)` pairs as `gradients/<variable>Grad` (TRAIN steps only)."""
        if not self.active:
            return
        with self.guard("add_gradients"):
            for g, v in grads_and_vars:
                if g is None:
                    continue
                if isinstance(g, tf.IndexedSlices):
                    g = tf.convert_to_tensor(g)
                self._tensors[f"gradients/{_var_name(v)}Grad"] = g

    def add_to_collection(self, collection_name: str, tensor: Any) -> None:
        """Save graph tensor `tensor` (under its op name) in collection `collection_name`."""
        name = tensor.op.name
        self._tensors[name] = tensor
        self.get_collection(collection_name).add_tensor_name(name)

    def _discover(self) -> None:
        """The graph's trainable variables and losses (once the graph is final, in `begin`)."""
        graph = tf.compat.v1.get_default_graph()
        self._graph = graph
        for v in tf.compat.v1.trainable_variables():
            name = f"weights/{_var_name(v)}"
            if name not in self._weights:  # (the read op is made now: the monitored session finalizes the graph)
                self._weights[name] = v.read_value() if hasattr(v, "read_value") else v.value()
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        coll = self.get_collection(K.LOSSES)
        for i, t in enumerate(losses):
            name = "loss" if len(losses) == 1 else f"loss_{i}"
            self._tensors.setdefault(name, t)
            coll.add_tensor_name(name)

    # --- SessionRunHook ---------------------------------------------------------------------------

    def begin(self) -> None:
        if self.active:
            with self.guard("begin"):
                self._discover()

    def before_run(self, run_context: Any) -> Any:
        self._pending = False
        if not self.active:
            return None
        try:
            if self.mode is _modes.GLOBAL:
                self.set_mode(_modes.TRAIN)
            self.next_step()
            if not self.collections_to_save():
                return None
            weights = [(n, v, c) for n, v in self._weights.items() if (c := self.collections_for(n))]
            self._step_items = []
            if weights:  # the values this step uses: read before it runs
                values = run_context.session.run([t for _n, t, _c in weights])
                self._step_items = [(n, np.asarray(val), c) for (n, _v, c), val in zip(weights, values, strict=True)]
            fetches = {n: t for n, t in self._tensors.items() if self.collections_for(n)}
            self._pending = True
            return tf.compat.v1.train.SessionRunArgs(fetches) if fetches else None
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("before_run", e)
            return None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if not self._pending or not self.active:
            return
        self._pending = False
        try:
            items = list(self._step_items)
            self._step_items = []
            results = run_values.results or {}
            for name, value in results.items():
                colls = self.collections_for(name)
                if colls:
                    items.append((name, np.asarray(value), colls))
            if items:
                self.write_tensors(items, copy=False)
        except Exception as e:  # noqa: BLE001
            self._fail("after_run", e)

    def on_close(self) -> None:
        self._optimizer_patches.undo()

    def end(self, session: Any) -> None:
        if self.active:
            with self.guard("end"):
                self.end_step()
                self.flush()
