"""Torch tensors to host numpy arrays: single tensors, and batches with one copy per (device, dtype)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from tensortap.format.records import StatisticsLayout, StatisticsRows
from tensortap.pytorch._dtensor import is_dtensor

# torch dtypes numpy lacks, stored through ml_dtypes when it is installed (else upcast to float32).
_ML_DTYPE_NAMES = {
    torch.bfloat16: "bfloat16",
    getattr(torch, "float8_e4m3fn", None): "float8_e4m3fn",
    getattr(torch, "float8_e5m2", None): "float8_e5m2",
}
_ML_DTYPE_NAMES.pop(None, None)
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16}

_MAX_DEPTH = 16


def iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors in a module's inputs or outputs, in order: tensors, tuples, lists, dicts, dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from iter_tensors(v, depth + 1)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None), depth + 1)


def capturable(t: torch.Tensor) -> bool:
    """Whether `t` holds real, dense data we can copy (not sparse, meta, fake or nested)."""
    # (a DTensor has no storage of its own: its local shard is what is captured, see _dtensor)
    return (t.layout is torch.strided and not t.is_meta and not getattr(t, "is_nested", False)
            and not is_dtensor(t))


def host_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy array of a CPU tensor, sharing its memory when the dtype allows."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    name = _ML_DTYPE_NAMES.get(t.dtype)
    if name is not None:
        try:
            import ml_dtypes
        except ImportError:
            return t.float().numpy()
        return t.view(_SAME_WIDTH_INT[t.element_size()]).numpy().view(getattr(ml_dtypes, name))
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        return t.float().numpy()  # e.g. complex32, quantized: a readable approximation beats nothing


_NUMPY_DTYPES: dict[torch.dtype, np.dtype | None] = {}


def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype with the same bytes as `dtype`, or None when numpy has none (bfloat16, ...)."""
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        try:
            nd: np.dtype | None = torch.empty(0, dtype=dtype).numpy().dtype
        except (TypeError, RuntimeError):
            nd = None
        _NUMPY_DTYPES[dtype] = nd
        return nd


def ring_sources(tensors: list[torch.Tensor], shapes: tuple[tuple[int, ...], ...] | None
                 ) -> tuple[list[tuple[int, int]], tuple[tuple[int, ...], ...]] | None:
    """(address, byte count) of each tensor and their shapes (`shapes` itself when they match it) when
    they are dense contiguous CPU tensors of one dtype, else None."""
    sources = []
    dtype = tensors[0].dtype
    same = shapes is not None and len(shapes) == len(tensors)
    i = 0
    for t in tensors:  # (one loop of attribute tests: this runs in saving steps)
        if t.layout is not _STRIDED or not t.is_cpu or t.dtype is not dtype or t.is_nested or not t.is_contiguous():
            return None
        if same and t.shape != shapes[i]:
            same = False
        ptr = t.data_ptr()
        if not ptr and t.nbytes:
            return None  # a wrapper with no storage of its own (a DTensor)
        sources.append((ptr, t.nbytes))
        i += 1
    return sources, shapes if same else tuple(tuple(t.shape) for t in tensors)


_STRIDED = torch.strided


class HostBatch:
    """Host copies of several tensors: one host buffer per (device, dtype) group.

    CPU groups are copied at once. Tensors on other devices are copied one by one, asynchronously where the
    accelerator supports it (CUDA), into one pinned host buffer per group (nothing is allocated on the device)
    and waited for in `arrays()`, normally at the end of the step, long after the copies finished.
    """

    __slots__ = ("_groups", "_n", "_flat")

    def __init__(self, tensors: list[torch.Tensor], force_async: bool = False):
        """Copy `tensors` (detached, none requiring grad) to the host."""
        self._n = len(tensors)
        self._flat: np.ndarray | None = None
        t0 = tensors[0]
        dev, dt = t0.device, t0.dtype
        if all(t.dtype == dt and t.device == dev for t in tensors):
            groups = [((dev, dt), list(range(len(tensors))))]
        else:
            by_key: dict[tuple, list[int]] = {}
            for i, t in enumerate(tensors):
                by_key.setdefault((t.device, t.dtype), []).append(i)
            groups = list(by_key.items())
        # each group: (positions, layout, torch host tensor, event, keep-alive of the source)
        self._groups: list[tuple[Any, ...]] = []
        for (device, _dtype), idx in groups:
            parts = [tensors[i] for i in idx] if len(groups) > 1 else tensors
            if device.type == "cpu" and not force_async:
                host = torch.cat([p.reshape(-1) for p in parts]) if len(parts) > 1 else parts[0].reshape(-1).clone()
                self._groups.append((idx, _layout(parts), host, None, None))
                continue
            pin = device.type == "cuda"
            layout = _layout(parts)
            host = torch.empty(layout[-1][1], dtype=_dtype, pin_memory=pin)
            # each tensor straight into its place in the host buffer: no concatenation on the device, whose copy
            # of everything saved would add the saved bytes to the device's peak memory
            for p, (a, b, shape) in zip(parts, layout, strict=True):
                host[a:b].view(shape).copy_(p, non_blocking=pin)
            event = None
            if pin:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))  # (the stream the copies were queued on)
            self._groups.append((idx, layout, host, event, parts))

    def arrays(self) -> list[np.ndarray]:
        """Host arrays in the order of the tensors given (views of private buffers: the caller owns them)."""
        if len(self._groups) == 1:
            _idx, layout, host, event, _k = self._groups[0]
            if event is not None:
                event.synchronize()
            flat = self._flat = host_numpy(host)
            return [flat[a:b].reshape(shape) for a, b, shape in layout]
        out: list[Any] = [None] * self._n
        for idx, layout, host, event, _keep in self._groups:
            if event is not None:
                event.synchronize()
            flat = host_numpy(host)
            for i, (a, b, shape) in zip(idx, layout, strict=True):
                out[i] = flat[a:b].reshape(shape)
        return out

    def flat(self) -> np.ndarray | None:
        """After `arrays()`: the one host array they are all views of, in order (None when the tensors
        were copied in several groups)."""
        return self._flat


def _layout(parts: list[torch.Tensor]) -> list[tuple[int, int, tuple[int, ...]]]:
    out = []
    off = 0
    for p in parts:
        k = p.numel()
        out.append((off, off + k, tuple(p.shape)))
        off += k
    return out


_FOREACH_MAX = getattr(torch, "_foreach_max", None)

try:  # the one-pass statistics of CPU tensors (tensortap/capture/_moments.c), built at install with a compiler
    from tensortap.capture._moments import moments as _c_moments
except ImportError:  # pragma: no cover - no compiler at install time: torch's own reductions
    _c_moments = None
#: element types `_c_moments` reads (its `kind`)
_MOMENT_KINDS = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
#: where each reduction is in `_c_moments`'s 10 values per tensor (those it gives)
_MOMENT_FIELD = {
    ("min", False): 0, ("max", False): 1, ("sum", False): 2, ("sum", True): 4, ("l1", False): 4, ("l1", True): 4,
    ("nonfinite", False): 5, ("nonfinite", True): 5, ("mean", False): 6, ("l2", False): 7, ("l2", True): 7,
    ("max", True): 8, ("mean", True): 9,
}
_MOMENT_FIELDS = 10
_TORCH_REDUCTION = {
    "min": torch.min, "max": torch.max, "mean": torch.mean, "sum": torch.sum, "prod": torch.prod,
    "median": lambda x: x.median(), "std": lambda x: x.std(correction=0), "variance": lambda x: x.var(correction=0),
}
_NORM_ORDER = {"l1": 1.0, "l2": 2.0}
#: reductions with no value over zero elements (torch raises, or gives NaN for the mean)
_UNDEFINED_WHEN_EMPTY = frozenset({"min", "max", "mean", "median", "std", "variance"})


def _nonfinite(x: torch.Tensor) -> torch.Tensor:
    return (x.numel() - torch.isfinite(x).sum()).to(x.dtype)


class ReductionProgram:
    """How to compute the reductions `reds[i]` of each of a fixed list of tensors where they live (docs/pytorch.md,
    "Statistics on the device"). CPU tensors of one floating dtype (float32, float64, bfloat16) whose reductions
    are among min, max, mean, sum, l1, l2, nonfinite (and max|x|, mean|x|, sum|x|): one pass over each, all of
    them in one call (`tensortap.capture._moments`). Otherwise torch's: the norms (and maxima) of all of them in
    one batched kernel each (`torch._foreach_norm`, `torch._foreach_max`), the rest per tensor, and every value
    brought to the host in one transfer. Built once per list of tensors saved together (their reductions and
    dtypes); `run` gives {(name, abs): value} per tensor, values of the tensor's numpy dtype (float64 where numpy
    has none; int64 for `nonfinite`) as the writer's own are (format.writer.compute_reduction)."""

    __slots__ = ("dtypes", "groups", "singles", "keys", "positions", "out_dtypes", "widen", "layouts", "means",
                 "numels", "divisor", "kind", "take", "table", "sources", "with_abs")

    def __init__(self, tensors: list[torch.Tensor], reds: list[tuple[tuple[str, bool], ...]]):
        self.dtypes = tuple(t.dtype for t in tensors)
        # integer and boolean tensors are reduced in float64 (torch's norms and means take floating point)
        self.widen = [i for i, t in enumerate(tensors) if not (t.dtype.is_floating_point or t.dtype.is_complex)]
        # Means of CPU tensors all of one dtype, float32 or float64: torch's CPU mean is the sum divided by the
        # element count (ATen's mean_out), so the sums are taken per tensor and divided together, in one kernel
        # (the same values, bit for bit). Other devices compute the mean another way: torch.mean there.
        same = len(set(self.dtypes)) == 1 and self.dtypes[0] in (torch.float32, torch.float64)
        divide = same and all(t.device.type == "cpu" for t in tensors)
        mean_at: list[tuple[int, tuple[str, bool]]] = []
        groups: dict[tuple[str, float], list[int]] = {}
        slots: list[tuple[int, tuple[str, bool], Any]] = []  # (tensor, key, group key or op)
        for i, (t, rs) in enumerate(zip(tensors, reds, strict=True)):
            for key in rs:
                name, abs_ = key
                if not t.numel() and name in _UNDEFINED_WHEN_EMPTY:
                    continue  # (no value over zero elements: none is saved, never an invented one)
                if name in _NORM_ORDER or (name == "max" and abs_):
                    g = ("norm", _NORM_ORDER.get(name, float("inf")))
                elif name == "max" and _FOREACH_MAX is not None and t.numel():
                    g = ("max", 0.0)
                else:
                    g = None
                if g is not None:
                    groups.setdefault(g, []).append(i)
                    slots.append((i, key, g))
                elif name == "nonfinite":
                    slots.append((i, key, _nonfinite))
                elif name == "mean" and not abs_ and divide:
                    slots.append((i, key, torch.sum))
                    mean_at.append((i, key))
                else:
                    fn = _TORCH_REDUCTION[name]
                    slots.append((i, key, (lambda x, fn=fn: fn(x.abs())) if abs_ else fn))
        self.groups = list(groups.items())
        self.singles = [(i, op) for i, _k, op in slots if not isinstance(op, tuple)]
        # where each value lands in the stacked vector: the groups' first, in order, then the singles
        pos: dict[tuple[int, tuple[str, bool]], int] = {}
        n = 0
        for g, idx in self.groups:
            for i in idx:
                key = next(k for j, k, op in slots if j == i and op == g and (j, k) not in pos)
                pos[(i, key)] = n
                n += 1
        for i, k, op in slots:
            if not isinstance(op, tuple):
                pos[(i, k)] = n
                n += 1
        self.keys = [[k for j, k, _op in slots if j == i] for i in range(len(tensors))]
        #: (tensor, position in the vector) of each mean taken as a sum, the counts its divisor was made for
        self.means = [(i, pos[(i, k)]) for i, k in mean_at]
        self.numels: list[int] = []
        self.divisor: torch.Tensor | None = None
        self.positions = [[pos[(i, k)] for k in self.keys[i]] for i in range(len(tensors))]
        self.out_dtypes = []
        for i, t in enumerate(tensors):
            nd = numpy_dtype(t.dtype) if t.dtype.is_floating_point else None
            nd = nd if nd is not None else np.dtype(np.float64)
            self.out_dtypes.append([np.dtype(np.int64) if k[0] == "nonfinite" else nd for k in self.keys[i]])
        self.layouts: dict[tuple, StatisticsLayout] = {}  # (names, the vector's dtype) -> the writers' layout
        # In one pass (_c_moments): where each value of the vector is in its table of 10 values per tensor
        self.kind = _MOMENT_KINDS.get(self.dtypes[0]) if (
            _c_moments is not None and bool(tensors) and same_dtype(self.dtypes)
            and all(t.device.type == "cpu" for t in tensors)
            and all(k in _MOMENT_FIELD for ks in self.keys for k in ks)) else None
        self.sources: list[tuple[int, int]] | None = None  # (address, element count) of each tensor, when fixed
        if self.kind is not None:
            take = [0] * n
            for i in range(len(tensors)):
                for k, q in zip(self.keys[i], self.positions[i], strict=True):
                    take[q] = i * _MOMENT_FIELDS + _MOMENT_FIELD[k]
            self.take = np.asarray(take, dtype=np.intp)
            self.with_abs = any(_MOMENT_FIELD[k] in (4, 9) for ks in self.keys for k in ks)  # (Σ|x| wanted)
            self.table = np.empty(len(tensors) * _MOMENT_FIELDS, dtype=np.float64)

    def run(self, tensors: list[torch.Tensor], fixed: bool = False) -> Reduced:
        """The reductions of `tensors` (alike those the program was made for). `fixed`: they are the tensors
        of the last call with `fixed`, with the same storage."""
        if self.kind is not None:
            sources = self.sources if fixed else None
            if sources is None:
                sources = []
                kept = []  # (contiguous copies of the rare tensor that is not: alive until the call is over)
                dtype = self.dtypes[0]
                for t in tensors:
                    if not t.is_cpu or t.dtype is not dtype:
                        self.kind = None  # (moved to a device, or another dtype: torch's reductions from now on)
                        break
                    if not t.is_contiguous():
                        t = t.contiguous()
                        kept.append(t)
                        fixed = False
                    sources.append((t.data_ptr(), t.numel()))
                if fixed:
                    self.sources = sources
            if self.kind is not None:
                _c_moments(self.kind, sources, self.table, self.with_abs)
                # (a float64 vector: each value is rounded once, to its stored dtype, where it is stored; counts
                # stay exact past 2**24)
                return Reduced(self, self.table[self.take])
        if self.widen:
            tensors = list(tensors)
            for i in self.widen:
                tensors[i] = tensors[i].double()
        vals: list[torch.Tensor] = []
        for (kind, order), idx in self.groups:
            src = [tensors[i] for i in idx]
            vals.extend(torch._foreach_norm(src, order) if kind == "norm" else _FOREACH_MAX(src))
        for i, op in self.singles:
            vals.append(op(tensors[i]))
        if not vals:
            return Reduced(self, np.empty(0))
        dtype = vals[0].dtype
        for v in vals:
            if v.dtype is not dtype:
                vals = [v.to(torch.float64) for v in vals]
                break
        vector = torch.stack(vals)
        if self.means:
            numels = [tensors[i].numel() for i, _p in self.means]
            if numels != self.numels or self.divisor is None:
                d = [1] * len(vals)  # (x / 1 is x, bit for bit: the other statistics pass through)
                for (_i, at), k in zip(self.means, numels, strict=True):
                    d[at] = k
                self.divisor, self.numels = torch.tensor(d, dtype=vector.dtype), numels
            vector = vector / self.divisor
        if numpy_dtype(vector.dtype) is None:
            vector = vector.to(torch.float64)  # (bfloat16, float8: stored as float64, out_dtypes says so)
        if vector.is_cpu:
            return Reduced(self, vector.numpy())
        return Reduced.transfer(self, vector)  # (the one transfer to the host)

    def layout(self, names: tuple[str, ...], vector: np.dtype) -> StatisticsLayout:
        """How a run's vector is stored for tensors `names` (built once per names and vector dtype)."""
        key = (names, vector)
        lay = self.layouts.get(key)
        if lay is None:
            lay = self.layouts[key] = StatisticsLayout(
                names, tuple(tuple(k) for k in self.keys), tuple(tuple(d) for d in self.out_dtypes), vector,
                tuple(tuple(p) for p in self.positions))
        return lay


def same_dtype(dtypes: tuple[torch.dtype, ...]) -> bool:
    return all(d is dtypes[0] for d in dtypes)


class Reduced(Sequence):
    """A run's statistics, as brought to the host in one vector: per tensor {(name, abs): value} (`[i]`, values of
    the tensor's numpy dtype, int64 for `nonfinite`, as format.records.compute_reduction's), or all of them as one
    hand-off to a writer (`rows`). From a CUDA device the vector is copied asynchronously into pinned memory and
    waited for when it is first read (`host`), normally when the step's statistics are handed off as it ends: the
    training thread does not wait for the device in the middle of the step."""

    __slots__ = ("program", "_host", "_copy")

    def __init__(self, program: ReductionProgram, host: np.ndarray):
        self.program, self._host = program, host
        self._copy: tuple[torch.Tensor, Any] | None = None

    @classmethod
    def transfer(cls, program: ReductionProgram, vector: torch.Tensor) -> Reduced:
        """The statistics in device vector `vector`, on their way to the host."""
        if vector.device.type != "cuda":
            return cls(program, vector.cpu().numpy())
        pinned = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
        pinned.copy_(vector, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(vector.device))  # (the stream the copy was queued on)
        out = cls(program, None)  # type: ignore[arg-type]
        out._copy = (pinned, event)
        return out

    @property
    def host(self) -> np.ndarray:
        """The vector on the host (waits for its copy from the device, the first time)."""
        host = self._host
        if host is None:
            pinned, event = self._copy
            event.synchronize()
            host = self._host = pinned.numpy()
            self._copy = None
        return host

    def __len__(self) -> int:
        return len(self.program.keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        p = self.program
        return {k: np.asarray(self.host[q], dtype=d) for k, q, d in zip(p.keys[i], p.positions[i], p.out_dtypes[i],
                                                                         strict=True)}

    def rows(self, names: tuple[str, ...], step: int, mode: int, mode_step: int) -> StatisticsRows:
        """The statistics of tensors `names` (in the program's order) at that step, as one writer hand-off."""
        return StatisticsRows(self.program.layout(names, self.host.dtype), self.host, step, mode, mode_step)


def device_reductions(tensors: list[torch.Tensor], reds: list[tuple[tuple[str, bool], ...]]) -> Reduced:
    """`ReductionProgram(tensors, reds).run(tensors)`: for tensors saved once."""
    return ReductionProgram(tensors, reds).run(tensors)


def step_statistics(plan: Any, weights: Reduced | None, grads: Reduced | None,
                    at: tuple[int, int, int]) -> StatisticsRows:
    """The statistics of a step's weights and of its gradients (either may be None) as one writer hand-off at step
    `at`: one vector, the weights' then the gradients', with a layout made once per plan (`plan.weight_items`,
    `plan.grad_items` name them; `plan.statistics_layout` keeps it)."""
    if grads is None:
        return weights.rows(tuple(name for name, _c in plan.weight_items), *at)
    if weights is None:
        return grads.rows(tuple(name for name, _c in plan.grad_items), *at)
    wp, gp = weights.program, grads.program
    values = np.concatenate((weights.host, grads.host))
    key = (wp, gp, weights.host.dtype, grads.host.dtype)
    kept = plan.statistics_layout
    if kept is None or kept[0] != key:
        shift = len(weights.host)
        lay = StatisticsLayout(
            tuple(name for name, _c in plan.weight_items) + tuple(name for name, _c in plan.grad_items),
            tuple(tuple(k) for k in wp.keys + gp.keys), tuple(tuple(d) for d in wp.out_dtypes + gp.out_dtypes),
            values.dtype, tuple(tuple(p) for p in wp.positions) + tuple(tuple(p + shift for p in ps)
                                                                        for ps in gp.positions))
        kept = plan.statistics_layout = (key, lay)
    return StatisticsRows(kept[1], values, *at)
