"""How a saving Keras step's values reach the writer, between steps.

Variables are read in one call of a compiled function; the logs' scalars and each concatenation a capturing
step function returned whose tensors are all saved raw go as one planned batch each (their bytes as they are);
everything else through `write_tensors`. What is derived from the collections saving now (which variables,
log keys and outputs are saved, and how) is kept in the step engine's plan cache (`engine.plans`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tensortap.collection import Collection
from tensortap.tensorflow.common import OPTIMIZER_PREFIX, K, to_numpy

_LOG_SKIP = frozenset({"outputs", "batch", "size"})


class Handoff:
    def __init__(self, hook: Any) -> None:
        self.hook = hook  # (for its collections, its backend, its engine and its writer)
        self._var_readers: dict[tuple[int, ...], tuple[list[Any], Any]] = {}  # (variables, compiled read)

    # --- variables ------------------------------------------------------------------------------

    def read_variables(self, variables: list[Any]) -> list[np.ndarray]:
        """Host copies of Keras variables; on TensorFlow in one call of a compiled function."""
        if not variables:
            return []
        if self.hook._backend != "tensorflow":
            return [to_numpy(v) for v in variables]
        key = tuple(map(id, variables))
        reader = self._var_readers.get(key)
        if reader is None:
            import tensorflow as tf

            held = [getattr(v, "value", v) for v in variables]

            def read_all() -> Any:
                return [tf.identity(v) for v in held]

            reader = self._var_readers[key] = (variables, tf.function(read_all, autograph=False))
        return [np.asarray(t) for t in reader[1]()]  # (views of the read's outputs, which nothing changes)

    def optimizer_items(self, optimizers: list[Any]) -> list[tuple[str, np.ndarray, list[Collection]]]:
        """(name, value, collections) of the optimizers' variables saved now, read before the step."""
        hook = self.hook
        variables = [v for opt in optimizers for v in getattr(opt, "variables", [])]

        def choose(_now: Any, _key: Any) -> list[tuple[str, Any, list[Collection]]]:
            chosen = []
            for v in variables:
                name = f"{OPTIMIZER_PREFIX}{getattr(v, 'path', None) or v.name}"
                colls = hook.collections_for(name)
                if colls:
                    chosen.append((name, v, colls))
            return chosen

        # (keyed by the variables' ids: their list grows when an optimizer builds its slots)
        chosen = hook.engine.plans.get(hook.collections_to_save(), ("optimizer", *map(id, variables)), choose)
        if not chosen:
            return []
        values = self.read_variables([v for _n, v, _c in chosen])
        return [(name, value, colls) for (name, _v, colls), value in zip(chosen, values, strict=True)]

    # --- a capturing step function's outputs ------------------------------------------------------

    def send_outputs(self, mode: Any, layout: Any, outputs: tuple[Any, ...],
                     read_before: set[str]) -> tuple[set[int], list[str]]:
        """Send each concatenation the capturing step function returned whose tensors are all saved raw now
        (and none of them in `read_before`, read before the step) as one batch, its payload the
        concatenation's bytes as they are: (the outputs sent, their tensors' names)."""
        hook = self.hook
        # [layout, its plans]: a step function traced again returns another layout, planned in place
        plans = hook.engine.plans.get(hook.collections_to_save(), ("outputs", mode), lambda _n, _k: [None, []])
        if plans[0] is not layout:
            plans[1] = self._plan_outputs(layout)
            plans[0] = layout
        sent: set[int] = set()
        names: list[str] = []
        for slot, spec in plans[1]:
            if read_before and not read_before.isdisjoint(spec.names):
                continue
            arr = np.asarray(outputs[slot])
            if arr.dtype != spec.np_dtype or not arr.flags.c_contiguous:
                continue
            if hook.write_planned(spec, [(arr.ctypes.data, arr.nbytes)]):
                sent.add(slot)
                names.extend(spec.names)
        return sent, names

    def _plan_outputs(self, layout: list[tuple[Any, int, int | None, int, tuple[int, ...]]]) -> list[tuple[int, Any]]:
        """(output, batch plan) of the concatenations in `layout` whose tensors the collections saving now all
        take raw."""
        hook = self.hook
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
            items = [(key[0], hook.collections_for(key[0])) for key, _s in entries]
            if not all(colls for _n, colls in items):
                continue
            spec = hook.batch_spec(items)
            if spec.raw_only:
                spec.shapes = tuple(tuple(shape) for _k, shape in entries)
                spec.np_dtype = np_dtype
                plans.append((slot, spec))
        return plans

    # --- the logs Keras hands to on_*_batch_end -------------------------------------------------

    def send_logs(self, logs: Any) -> bool:
        """Send the logs' scalars saved now (Python floats, as Keras hands them to callbacks) as one planned
        float64 batch; False when they take the general path (`log_items`) instead."""
        hook = self.hook
        if not isinstance(logs, dict) or hook.dry_run:
            return False
        chosen, spec, buf = hook.engine.plans.get(hook.collections_to_save(), ("logs", *logs),
                                                  lambda _n, _k: self._plan_logs(logs))
        if spec is None:
            return False
        for i, key in enumerate(chosen):
            value = logs[key]
            if type(value) is not float:
                return False
            buf[i] = value
        return hook.write_planned(spec, ((buf.ctypes.data, buf.nbytes),))

    def _plan_logs(self, logs: dict[Any, Any]) -> tuple[tuple[str, ...], Any, Any]:
        """(keys saved now, their batch plan, a float64 buffer for their values) of logs like these; the plan
        None when they cannot go as one raw batch."""
        items = self.log_items(logs)
        if not items or any(type(logs[name]) is not float for name, _v, _c in items):
            return (), None, None
        spec = self.hook.batch_spec([(name, colls) for name, _v, colls in items])
        if not spec.raw_only:
            return (), None, None
        spec.shapes = ((),) * len(items)
        spec.np_dtype = np.dtype(np.float64)
        return tuple(name for name, _v, _c in items), spec, np.empty(len(items), dtype=np.float64)

    def log_items(self, logs: Any) -> list[tuple[str, Any, list[Collection]]]:
        """(key, value, collections) of the logs' numeric scalars saved now."""
        if not isinstance(logs, dict):
            return []
        hook = self.hook
        # {log key: the collections saving now that take it} (see _classify_log)
        classified: dict[str, list[Collection]] = hook.engine.plans.get(hook.collections_to_save(), "log keys",
                                                                        lambda _n, _k: {})
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
            colls = classified.get(key)
            if colls is None:
                self._classify_log(key)
                colls = classified[key] = hook.collections_for(key)
            if colls:
                items.append((key, arr.reshape(()), colls))
        return items

    def _classify_log(self, key: str) -> None:
        """A logs key neither collection names yet: a loss if it says so, else a metric."""
        cm = self.hook.collection_manager
        if cm.get(K.LOSSES).matches(key) or cm.get(K.METRICS).has_tensor_name(key):
            return
        coll = K.LOSSES if re.search(r"loss", key) else K.METRICS
        self.hook.get_collection(coll).add_tensor_name(key)
