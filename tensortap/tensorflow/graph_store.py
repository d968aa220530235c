"""The graph store: shadow variables that carry tensors out of a compiled step (TensorFlow backend).

A tensor captured while a step function is traced is either returned by the step as an extra output (a
capturing function that runs on saving steps only, on one device: `begin_trace(outputs=True)`), or copied into
a shadow variable of this process through one `tf.cond` on the capture number `gen` at the end of the step.
No Python runs inside the graph.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import numpy as np


def local_replica(tf: Any) -> int:
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
    return int(rid) % local_devices(ctx.strategy)


def local_devices(strategy: Any) -> int:
    """How many devices of this process a strategy runs replicas on (1 for the default strategy)."""
    try:
        return len(strategy.extended.worker_devices) or 1
    except Exception:  # noqa: BLE001 - the default strategy has no worker_devices
        return 1


class GraphStore:
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
            self.gen = plain_variable(tf, tf.constant(self.current, tf.int32), "tensortap_capture")
        self.vars: dict[tuple[str, Any], tuple[Any, Any]] = {}  # (name, static shape) -> (value, stamp)
        self.names: dict[Any, list[tuple[str, Any]]] = {}  # mode of the step function -> its shadows' keys
        self.readers: dict[Any, tuple[int, Any]] = {}  # mode -> (number of keys, compiled read of them all)
        self.out_keys: dict[Any, list[Any]] = {}  # mode -> keys of what its step function returns (outputs mode)
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
        replica = local_replica(tf)
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
                    value = plain_variable(tf, tf.zeros([0], dtype=t.dtype), "tensortap_shadow", unknown_shape=True)
                else:
                    value = plain_variable(tf, tf.zeros(static, dtype=t.dtype), "tensortap_shadow")
                stamp = plain_variable(tf, tf.constant(0, tf.int32), "tensortap_stamp")
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


def plain_variable(tf: Any, initial: Any, name: str, unknown_shape: bool = False) -> Any:
    """A variable of this process alone, whatever distribution strategy is in scope: made as a
    ResourceVariable directly, it bypasses the strategies' variable creators (no mirroring, and no
    collective op that other workers would have to match). Without TensorFlow's `resource_variable_ops`:
    a `tf.Variable` (a strategy's own variable when one is in scope)."""
    shape = tf.TensorShape(None) if unknown_shape else None
    try:
        from tensorflow.python.ops import resource_variable_ops

        make = resource_variable_ops.ResourceVariable
    except (ImportError, AttributeError):
        make = tf.Variable
    return make(initial, trainable=False, name=name, shape=shape)
