"""Custom training loops with `tf.GradientTape`: `with hook.wrap_tape(tf.GradientTape()) as tape:` is one step.

`tape.gradient(loss, variables)` saves `loss`, `weights/<variable>` and `gradients/<variable>Grad`. Run eagerly,
the values are copied when the gradient is taken. Inside a `tf.function`, the step boundary runs in Python through
one `tf.py_function` at the start of the tape (it returns the step's capture number, 0 on steps that save
nothing) and the values are copied into the graph store, gated by that number; they are written at the next
step boundary (or at close). Not under XLA, where the step cannot be counted.
"""

from __future__ import annotations

from typing import Any

from tensortap import modes as _modes
from tensortap.tensorflow.common import flat, gradient_name, indexed, to_numpy, variable_path

_TAPE = "tape"  # the graph store's key for the tape loop's captures


def _in_xla(tf: Any) -> bool | None:
    """Whether the function being traced is XLA-compiled; None when TensorFlow cannot tell."""
    try:
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):
        return None


class TapeLoop:
    """The steps of a tape loop, for one hook."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self._gate: Any = None  # in a graph: the tensor of the step's capture number
        self._pending: int | None = None  # capture number of a step in a graph whose values are not written yet

    def begin(self) -> None:
        hook = self.hook
        self._gate = None
        if not hook.active:
            return
        with hook.guard("tape begin"):
            if hook._backend is None:
                hook._backend = "tensorflow"
            if hook._capture.graph_mode():
                import tensorflow as tf

                in_xla = _in_xla(tf)
                if in_xla is None:
                    hook._warn_once("tape-graph", "tensortap: this TensorFlow cannot tell an XLA-compiled function; "
                                                  "wrap_tape captures nothing inside a tf.function")
                    return
                if in_xla:
                    hook._warn_once("tape-xla", "tensortap: wrap_tape inside an XLA-compiled function captures "
                                                "nothing (steps cannot be counted there)")
                    return
                hook._capture.graph_store(tape=True)
                self._gate = tf.py_function(self.step, [], tf.int32)
            else:
                self.step()

    def step(self) -> int:
        """A step boundary (eagerly, or from the graph through py_function): write what the previous step
        captured in a graph, begin the next step; returns its capture number (0: saves nothing)."""
        hook = self.hook
        gen = 0
        if not hook.active:
            return gen
        try:
            self.flush()
            if hook.mode is _modes.GLOBAL:
                hook.set_mode(_modes.TRAIN)
            hook.next_step()
            saving = hook.engine.saving
            hook._capture.host_on = saving
            store = hook._capture.store
            if saving and store is not None:
                store.counter += 1
                gen = store.counter
                self._pending = gen
        except Exception as e:  # noqa: BLE001 - never break training (this may run inside a graph)
            hook._fail("tape step", e)
            gen = 0
        return gen

    def flush(self) -> None:
        """Write what the last step in a graph captured."""
        gen, self._pending = self._pending, None
        hook = self.hook
        store = hook._capture.store
        if gen is None or store is None:
            return
        items = []
        for name, replica, value in store.read(_TAPE, gen):
            if replica > 0:
                continue
            colls = hook.collections_for(name)
            if colls:
                items.append((name, value, colls))
        if items:
            hook.write_tensors(items, copy=False)

    def gradient(self, target: Any, sources: Any, grads: Any) -> None:
        hook = self.hook
        if not hook.active:
            return
        with hook.guard("tape gradient"):
            gate = self._gate
            graph = hook._capture.graph_mode()
            if graph and gate is None:
                return
            if not graph and not hook.engine.saving:
                return
            named: list[tuple[str, Any]] = list(indexed("loss", flat(target)))
            for v, g in zip(flat(sources), flat(grads), strict=False):
                named.append((f"weights/{variable_path(v)}", v))
                if g is not None:  # (gradients are saved in TRAIN only: collections_for leaves them out)
                    named.append((gradient_name(v), g))
            if graph:
                import tensorflow as tf

                for name, t in named:
                    if hook._wanted(name):
                        if isinstance(t, tf.IndexedSlices):
                            t = tf.convert_to_tensor(t)
                        hook._capture.store.capture(_TAPE, name, tf.identity(t), gate=gate)
                return
            items = []
            for name, t in named:
                colls = hook.collections_for(name)
                if colls:
                    items.append((name, to_numpy(t), colls))
            if items:
                hook.write_tensors(items, copy=False)


class WrappedTape:
    """A tf.GradientTape whose `with` block is a step of the hook and whose `gradient()` is captured."""

    def __init__(self, loop: TapeLoop, tape: Any) -> None:
        self._loop = loop
        self._tape = tape

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> WrappedTape:
        self._loop.begin()
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, *args, **kwargs)
        self._loop.gradient(target, sources, grads)
        return grads
