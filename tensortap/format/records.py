"""What a hook hands a writer: records, batches of raw tensors, rows of scalars and rows of statistics.

These are plain values; `tensortap.format.writer.ChunkEncoder` turns them into payloads and index entries
(docs/format.md), and the writers (`tensortap.transport`) carry them to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.format.entries import reduction_code

#: index-entry mode codes (docs/format.md §3.2) to mode names
MODE_NAME = {1: "TRAIN", 2: "EVAL", 3: "PREDICT", 4: "GLOBAL"}


@dataclass
class Record:
    """One tensor of one step, as handed to the writer.

    `value` is the raw array (already on the host) or None. `reductions` lists (name, abs) to compute
    from `value` in the writer; `reduction_values` holds reductions computed elsewhere
    (e.g. on the GPU). `save_raw` stores the value itself; `save_shape` stores the shape alone when
    nothing else records it.
    """

    name: str
    step: int
    mode: int
    mode_step: int
    value: np.ndarray | None = None
    save_raw: bool = True
    reductions: tuple[tuple[str, bool], ...] = ()
    reduction_values: dict[tuple[str, bool], Any] = field(default_factory=dict)
    save_shape: bool = False
    shape: tuple[int, ...] | None = None

    def nbytes(self) -> int:
        return 256 + (self.value.nbytes if self.value is not None else 0)


class RecordBatch:
    """Several raw tensors of one step in one hand-off (no reductions, no shape-only entries).

    `names` is a tuple the caller keeps stable from step to step (the writer caches the block's table
    ids per names/shapes), `arrays` the host arrays in the same order. `flat`, when given, is one
    C-contiguous array of the arrays' dtype whose bytes are exactly the arrays' bytes concatenated
    in order (the arrays are views of it): the writer then appends runs of payloads with one write
    each. The caller hands the arrays over: it must not change them afterwards.
    """

    __slots__ = ("names", "arrays", "flat", "step", "mode", "mode_step", "size", "reductions")

    def __init__(self, names: tuple[str, ...], arrays: list[np.ndarray], flat: np.ndarray | None,
                 step: int, mode: int, mode_step: int, reductions: tuple | None = None):
        #: per tensor, the (name, abs) reductions the writer computes from it and stores beside it (None: none)
        self.reductions = reductions
        self.names = names
        self.arrays = arrays
        self.flat = flat
        self.step = step
        self.mode = mode
        self.mode_step = mode_step
        self.size = 256 * len(arrays) + (flat.nbytes if flat is not None else sum(a.nbytes for a in arrays))

    def nbytes(self) -> int:
        return self.size

    def records(self) -> list[Record]:
        reds = self.reductions or ((),) * len(self.names)
        return [Record(name=n, step=self.step, mode=self.mode, mode_step=self.mode_step, value=a, reductions=r)
                for n, a, r in zip(self.names, self.arrays, reds, strict=True)]


class ScalarRows:
    """Float scalars of several steps of one mode in one hand-off, each saved raw (no reductions): value
    `values[i]` of tensor `names[name[i]]` at global step `steps[i]` and mode step `mode_steps[i]`, in order.
    The caller hands the lists over: it must not change them afterwards."""

    __slots__ = ("names", "name", "steps", "mode", "mode_steps", "values")

    def __init__(self, names: list[str], name: list[int], steps: list[int], mode: int, mode_steps: list[int],
                 values: list[float]):
        self.names, self.name, self.steps, self.mode = names, name, steps, mode
        self.mode_steps, self.values = mode_steps, values

    def __len__(self) -> int:
        return len(self.values)

    def nbytes(self) -> int:
        return 64 * len(self.values) + 256

    def records(self) -> list[Record]:
        names, mode = self.names, self.mode
        return [Record(names[i], step, mode, mode_step, np.array(v, dtype=np.float64))
                for i, step, mode_step, v in zip(self.name, self.steps, self.mode_steps, self.values, strict=True)]


class StatisticsLayout:
    """Which statistics of which tensors a `StatisticsRows` holds, fixed for a list of tensors saved together
    step after step (build it once and keep it: the writers cache what they derive from it per layout).

    `names[i]` is tensor i; `keys[i]` its (reduction, abs) statistics in order; `dtypes[i]` the numpy dtype each
    of them is stored as (the tensor's floating dtype, int64 for `nonfinite`). The values of a step come as one
    vector (`StatisticsRows.values`), of dtype `vector_dtype`, in which statistic j of tensor i is at
    `positions[i][j]` (default: tensor by tensor, in key order).
    """

    __slots__ = ("names", "keys", "dtypes", "vector_dtype", "order", "tensor", "slot", "codes", "kinds", "kind_of",
                 "vector_size", "_at")

    def __init__(self, names: tuple[str, ...], keys: tuple[tuple[tuple[str, bool], ...], ...],
                 dtypes: tuple[tuple[np.dtype, ...], ...], vector_dtype: Any = np.float64,
                 positions: tuple[tuple[int, ...], ...] | None = None):
        if not (len(names) == len(keys) == len(dtypes)) or any(
                len(k) != len(d) for k, d in zip(keys, dtypes, strict=True)):
            raise ValueError("StatisticsLayout: names, keys and dtypes must describe the same tensors")
        self.names, self.keys, self.vector_dtype = tuple(names), tuple(keys), np.dtype(vector_dtype)
        self.dtypes = tuple(tuple(np.dtype(d) for d in ds) for ds in dtypes)
        n = sum(len(k) for k in keys)
        flat_pos = [p for ps in positions for p in ps] if positions is not None else list(range(n))
        #: where each stored statistic (tensor by tensor, in key order) is in the step's vector
        self.order = np.asarray(flat_pos, dtype=np.intp)
        self.vector_size = int(self.order.max()) + 1 if n else 0
        #: per statistic: its tensor, its reduction code
        self.tensor = np.repeat(np.arange(len(names), dtype=np.intp), [len(k) for k in keys])
        self.slot = [j for ks in keys for j in range(len(ks))]  # ... its place among its tensor's keys
        self.codes = np.asarray([reduction_code(r, a) for ks in keys for r, a in ks], dtype=np.uint8)
        #: the distinct stored dtypes, and per statistic the index of its own among them
        kinds = sorted({codec.dtype_to_str(d) for ds in self.dtypes for d in ds})
        self.kinds = tuple(kinds)
        self.kind_of = np.asarray([kinds.index(codec.dtype_to_str(d)) for ds in self.dtypes for d in ds],
                                  dtype=np.intp)
        self._at = [(np.flatnonzero(self.kind_of == k), codec.dtype_from_str(s)) for k, s in enumerate(kinds)]

    def __len__(self) -> int:
        return len(self.codes)

    def stored(self, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per distinct stored dtype: (the statistics of it, their values cast to it), from a step's vector."""
        ordered = values[self.order]
        return [(at, ordered[at].astype(dtype)) for at, dtype in self._at]

    def to_json(self) -> list:
        """The layout as JSON values (how it travels to a writer process)."""
        return [list(self.names), [[[r, a] for r, a in ks] for ks in self.keys],
                [[codec.dtype_to_str(d) for d in ds] for ds in self.dtypes], codec.dtype_to_str(self.vector_dtype),
                self.order.tolist()]

    @classmethod
    def from_json(cls, obj: list) -> StatisticsLayout:
        names, keys, dtypes, vector, order = obj
        lay = cls(tuple(names), tuple(tuple((r, bool(a)) for r, a in ks) for ks in keys),
                  tuple(tuple(codec.dtype_from_str(d) for d in ds) for ds in dtypes), codec.dtype_from_str(vector))
        lay.order = np.asarray(order, dtype=np.intp)
        lay.vector_size = int(lay.order.max()) + 1 if len(lay.order) else 0
        return lay


class StatisticsRows:
    """The statistics of several tensors at one step, computed by the caller (where the tensors live), in one
    hand-off: `values` holds them as `layout` says. Stored exactly as the same values handed over one `Record`
    per tensor (`reduction_values`) would be. The caller hands `values` over: it must not change it afterwards."""

    __slots__ = ("layout", "values", "step", "mode", "mode_step")

    def __init__(self, layout: StatisticsLayout, values: np.ndarray, step: int, mode: int, mode_step: int):
        self.layout, self.values = layout, values
        self.step, self.mode, self.mode_step = step, mode, mode_step

    def __len__(self) -> int:
        """Records: one per tensor."""
        return len(self.layout.names)

    def nbytes(self) -> int:
        return 256 + self.values.nbytes

    def records(self) -> list[Record]:
        lay = self.layout
        cast: list[Any] = [None] * len(lay)
        for at, vals in lay.stored(self.values):
            for j, v in zip(at.tolist(), vals, strict=True):
                cast[j] = np.asarray(v)
        reds: list[dict[tuple[str, bool], Any]] = [{} for _ in lay.names]
        for j, (i, v) in enumerate(zip(lay.tensor.tolist(), cast, strict=True)):
            reds[i][lay.keys[i][lay.slot[j]]] = v
        return [Record(name=n, step=self.step, mode=self.mode, mode_step=self.mode_step, value=None, save_raw=False,
                       reduction_values=rv) for n, rv in zip(lay.names, reds, strict=True)]


def compute_reduction(arr: np.ndarray, name: str, abs_: bool) -> np.ndarray:
    """A reduction of `arr` as a 0-d array. Norms are flattened vector norms, for every framework."""
    if name == "nonfinite":  # NaN and ±Inf elements (0 for integer and boolean tensors)
        if arr.dtype.kind in "fc" or arr.dtype.kind == "V" or arr.dtype == np.float16:
            x = arr.astype(np.float32) if arr.dtype.kind == "V" else arr
            return np.asarray(np.int64(arr.size - np.count_nonzero(np.isfinite(x))))
        return np.asarray(np.int64(0))
    if name == "zeros":  # elements equal to zero
        return np.asarray(np.int64(arr.size - np.count_nonzero(arr)))
    x = np.abs(arr) if abs_ else arr
    if x.dtype.kind == "b" or x.dtype.kind in "iu" and name in ("mean", "std", "variance", "median", "l2"):
        x = x.astype(np.float64)
    elif x.dtype.kind == "V" or x.dtype == np.float16:
        x = x.astype(np.float32)  # bfloat16 / float16: reduce in float32 like the frameworks do
    flat = x.ravel()
    if name == "min":
        r = np.min(flat)
    elif name == "max":
        r = np.max(flat)
    elif name == "mean":
        r = np.mean(flat)
    elif name == "std":
        r = np.std(flat)
    elif name == "variance":
        r = np.var(flat)
    elif name == "sum":
        r = np.sum(flat)
    elif name == "prod":
        r = np.prod(flat)
    elif name == "median":
        r = np.median(flat)
    elif name == "l1":
        r = np.linalg.norm(flat, ord=1)
    elif name == "l2":
        r = np.linalg.norm(flat, ord=2)
    elif name == "l4":  # (sum |x|^4)^(1/4); sum x^4 = l4**4
        r = np.linalg.norm(flat, ord=4)
    else:
        raise ValueError(f"unknown reduction {name!r}")
    return np.asarray(r)
