"""Tensors taken inside a Keras step: the model's inputs, labels and predictions, layer inputs/outputs,
activations, gradients (through a wrapped optimizer) and, in a compiled capturing step, the weights.

The model's `train_step` / `test_step` / `predict_step`, its layers' `call` and `activation` are wrapped
(`instrument`). Inside a `tf.function` each capture is traced into the graph store (graph_store.py); run
eagerly (run_eagerly, Keras's PyTorch backend) it is copied to the host when produced, on saving steps only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.collection import ACTIVATION_COLLECTIONS
from tensortap.tensorflow.common import (
    activation_kind,
    flat,
    gradient_name,
    indexed,
    layer_activation_type,
    steps_per_execution,
    to_numpy,
)
from tensortap.tensorflow.graph_store import GraphStore, local_devices
from tensortap.tensorflow.model import ModelLayout, Patches, all_layers
from tensortap.tensorflow.step_functions import CAPTURED, OUT, StepFunctions


class StepCapture:
    """What the current step hands out from inside: into `store` in a graph, into `host` run eagerly."""

    def __init__(self, hook: Any, functions: StepFunctions) -> None:
        self.hook = hook  # (for what it wants saved, its guard and warnings, its model and backend)
        self.functions = functions
        self.store: GraphStore | None = None
        self.host: list[tuple[str, np.ndarray]] = []  # (name, host copy) taken eagerly in the current step
        self.host_on = False  # capturing eagerly in the current step
        self.mode: Any = None  # mode of the step function running / being traced
        # weights the capturing step function of a mode copies at its start (read there, not between steps)
        self.weights_in_step: dict[Any, frozenset[str]] = {}

    def graph_mode(self) -> bool:
        if self.hook._backend != "tensorflow":
            return False
        tf = sys.modules.get("tensorflow")
        return tf is not None and tf.inside_function()

    def graph_store(self, tape: bool = False) -> GraphStore:
        """The graph store, made at the first capture in a graph (for a tape loop: never under XLA)."""
        if self.store is None:
            if tape:
                self.store = GraphStore(xla=False, saving=False)
            else:
                self.store = GraphStore(xla=bool(getattr(self.hook._registered, "jit_compile", False)),
                                        saving=self.hook.engine.saving)
        return self.store

    # --- capture ------------------------------------------------------------------------------

    def capture(self, mode: Any, name: str, value: Any) -> None:
        hook = self.hook
        if value is None or not hook._wanted(name):
            return
        if self.graph_mode():
            if not self.graph_store().capture(mode, name, value):
                hook._warn_once(f"nocapture:{name}", f"tensortap: {name!r} cannot be captured inside this compiled "
                                                      "step (XLA needs static shapes); it is not saved")
        elif self.host_on:
            self.host.append((name, to_numpy(value)))

    def capture_many(self, mode: Any, name: str, values: list[Any]) -> None:
        for n, v in indexed(name, values):
            self.capture(mode, n, v)

    def capture_data(self, mode: Any, data: Any) -> None:
        import keras

        x, y, _sw = keras.utils.unpack_x_y_sample_weight(data)
        self.capture_many(mode, "inputs", flat(x))
        if mode is not _modes.PREDICT:
            self.capture_many(mode, "labels", flat(y))

    def capture_weights(self, mode: Any) -> None:
        """In a compiled step traced for saving steps, on one device: copy the weights read at the step's start
        (before the optimizer updates them: the values the forward pass uses, as between steps) with the
        step's other captures, so that a saving step makes one read of everything instead of two."""
        names: frozenset[str] = frozenset()
        layout: ModelLayout | None = self.hook._layout
        model = layout.model if layout is not None else None
        if self.functions.swap and model is not None \
                and local_devices(getattr(model, "distribute_strategy", None)) == 1 and getattr(model, "built", False):
            import tensorflow as tf

            layout.refresh()
            done = set()
            for name, v in layout.weights:
                if self.hook._wanted(name) and self.store.capture(mode, name, tf.identity(getattr(v, "value", v))):
                    done.add(name)
            names = frozenset(done)
        self.weights_in_step[mode] = names

    def gradients(self, grads: list[Any], variables: list[Any]) -> None:
        """The gradients a wrapped optimizer applies (loss scaling undone)."""
        hook = self.hook
        if not hook.active or self.mode is _modes.EVAL:
            return
        if self.mode is None and self.graph_mode():
            return  # a compiled step of a function that saves nothing
        with hook.guard("gradients"):
            mode = self.mode or _modes.TRAIN
            for g, v in zip(grads, variables, strict=False):
                if g is None:
                    continue
                name = gradient_name(v)
                if not hook._wanted(name):
                    continue
                if hook._backend == "tensorflow":
                    import tensorflow as tf

                    if isinstance(g, tf.IndexedSlices):
                        g = tf.convert_to_tensor(g)
                self.capture(mode, name, g)

    # --- the model's methods, wrapped ---------------------------------------------------------

    def instrument(self, model: Any, layout: ModelLayout, patches: Patches) -> None:
        """Wrap `model`'s step methods, and the `call` / `activation` of the layers whose tensors are wanted."""
        for attr, mode in (("train_step", _modes.TRAIN), ("test_step", _modes.EVAL), ("predict_step", _modes.PREDICT)):
            orig = getattr(model, attr, None)
            if orig is not None:
                patches.set(model, attr, self._step_wrapper(orig, mode))
        hook = self.hook
        cm = hook.collection_manager
        for layer in all_layers(model):
            lname = layout.layer_names[id(layer)]
            is_root = layer is model
            kind = layer_activation_type(layer)
            io_names = [f"{lname}/inputs", f"{lname}/outputs"]
            if kind is not None:
                for n, c in zip(io_names, ACTIVATION_COLLECTIONS[kind], strict=True):
                    cm.get(c).add_tensor_name(n)
            want_io = not is_root and (hook._any_wanted(io_names)
                                       or hook._any_wanted([f"{lname}/inputs_0", f"{lname}/outputs_0"]))
            want_pred = is_root and hook._any_wanted(["predictions", "predictions_0"])
            if want_io or want_pred:
                patches.set(layer, "call", self._call_wrapper(lname, layer.call, want_io, want_pred))
            act = getattr(layer, "activation", None)
            akind = activation_kind(act) if kind is None and not is_root else None
            if akind is not None:
                names = [f"{lname}/activation_inputs", f"{lname}/activation_outputs"]
                for n, c in zip(names, ACTIVATION_COLLECTIONS[akind], strict=True):
                    cm.get(c).add_tensor_name(n)
                hook._wanted_cache = {}
                if hook._any_wanted(names):
                    patches.set(layer, "activation", self._activation_wrapper(act, names))
        hook._wanted_cache = {}

    def _step_wrapper(self, orig: Callable[..., Any], mode: Any) -> Callable[..., Any]:
        capture = self
        hook = self.hook
        functions = self.functions

        def step(data: Any) -> Any:
            graph = capture.graph_mode()
            if not hook.active or (graph and not functions.capture_trace):
                return orig(data)  # (the plain step function of steps that save nothing)
            outer = capture.mode
            capture.mode = mode
            if graph:
                as_outputs = functions.outputs_trace
                capture.graph_store().begin_trace(as_outputs)
                with hook.guard("step capture"):
                    capture.capture_weights(mode)
            extra: Any = None
            try:
                with hook.guard("step capture"):
                    capture.capture_data(mode, data)
                out = orig(data)
                if mode is _modes.PREDICT:
                    with hook.guard("step capture"):
                        capture.capture_many(mode, "predictions", flat(out))
            finally:
                capture.mode = outer
                if graph:
                    with hook.guard("step capture"):
                        extra = capture.store.end_trace(mode)
            if graph and as_outputs:
                # (always this structure in such a trace: the unpacking wrapper of StepFunctions expects it)
                return {OUT: out, CAPTURED: tuple(extra or ())}
            with hook.guard("step end"):
                if graph:
                    # with several steps per execution only its first step is captured (with one, the
                    # callback clears the flag between steps, and replicas never race on it)
                    if capture.store is not None and steps_per_execution(hook._registered) > 1:
                        capture.store.end_step()
                else:
                    capture.host_on = False
            return out

        step.__wrapped__ = orig  # type: ignore[attr-defined]
        return step

    def _call_wrapper(self, lname: str, orig: Callable[..., Any], io: bool, pred: bool) -> Any:
        capture = self
        hook = self.hook

        def call(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            mode = capture.mode
            if mode is not None and hook.active:
                with hook.guard("layer capture"):
                    if io:
                        first = args[0] if args else kwargs.get("inputs")
                        capture.capture_many(mode, f"{lname}/inputs", flat(first))
                        capture.capture_many(mode, f"{lname}/outputs", flat(out))
                    if pred and mode is not _modes.PREDICT:
                        capture.capture_many(mode, "predictions", flat(out))
            return out

        call.__wrapped__ = orig  # type: ignore[attr-defined]
        return call

    def _activation_wrapper(self, fn: Callable[..., Any], names: list[str]) -> Any:
        capture = self
        hook = self.hook

        def activation(x: Any, *args: Any, **kwargs: Any) -> Any:
            out = fn(x, *args, **kwargs)
            mode = capture.mode
            if mode is not None and hook.active:
                with hook.guard("activation capture"):
                    capture.capture(mode, names[0], x)
                    capture.capture(mode, names[1], out)
            return out

        activation.__name__ = getattr(fn, "__name__", "activation")
        activation.__wrapped__ = fn  # type: ignore[attr-defined]
        return activation
