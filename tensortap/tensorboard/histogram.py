"""Histograms of tensors with TensorFlow's default buckets (as smdebug and tensorboardX compute them).

Edges: 0 and ±1e-12·1.1^k for every k with 1e-12·1.1^k < 1e20 (about 1,500 edges). Bucket j holds the values
v with edges[j] <= v < edges[j+1] (the last one also holds edges[-1]), exactly numpy.histogram's rule, so the
counts equal `np.histogram(finite_values, bins=edges)[0]`. Finite values beyond ±1e20 (outside numpy's
range) go to the outermost buckets instead of being dropped; min and max keep their true values.
Non-finite values (NaN, ±inf) are not in the histogram: they are counted separately.

The proto keeps the buckets from one before the first non-empty one to the last non-empty one (bucket_limit
holds each bucket's right edge), as tensorboardX's `make_histogram` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: tensors up to this many values are sorted whole; bigger ones go through numpy.histogram's blocks
_SORT_MAX = 1 << 16


@lru_cache(maxsize=1)
def default_edges() -> np.ndarray:
    """TensorFlow's default histogram bucket edges (computed by the same repeated product as tensorboardX)."""
    v = 1e-12
    pos = []
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    edges = np.array([-x for x in reversed(pos)] + [0.0] + pos, dtype=np.float64)
    edges.setflags(write=False)
    return edges


@dataclass
class Histogram:
    """A histogram of the finite values of a tensor, plus how many values were not finite."""

    min: float
    max: float
    num: int
    sum: float
    sum_squares: float
    bucket_limit: np.ndarray  # right edge of each kept bucket
    bucket: np.ndarray  # count of each kept bucket
    nonfinite: int


def as_real(value: np.ndarray) -> np.ndarray | None:
    """`value` as an int or float array (ml_dtypes floats such as bfloat16 as float32); None for bool,
    complex, string and empty tensors, which get no histogram (smdebug skips bool and empty tensors too)."""
    if value.size == 0:
        return None
    kind = value.dtype.kind
    if kind in "iuf":
        return value
    if kind == "V" and value.dtype.names is None and value.dtype.itemsize <= 2:  # ml_dtypes: bfloat16, float8
        try:
            return value.astype(np.float32)
        except (TypeError, ValueError):
            return None
    return None


def make_histogram(value: np.ndarray) -> Histogram | None:
    """The histogram of `value`'s finite values; None when it has none (or is not histogrammable)."""
    value = as_real(np.asarray(value))
    if value is None:
        return None
    flat = value.reshape(-1)
    if flat.dtype.kind == "f":
        finite_mask = np.isfinite(flat)
        nonfinite = int(flat.size - np.count_nonzero(finite_mask))
        if nonfinite:
            flat = flat[finite_mask]
    else:
        nonfinite = 0
    if flat.size == 0:
        return Histogram(0.0, 0.0, 0, 0.0, 0.0, np.empty(0), np.empty(0), nonfinite)
    edges = default_edges()
    f64 = flat.astype(np.float64, copy=False)
    if f64.size <= _SORT_MAX:
        # numpy.histogram's rule, without its per-call checks: sort, then find each edge
        f64 = np.sort(f64)
        vmin, vmax = float(f64[0]), float(f64[-1])
        below = f64.searchsorted(edges, "left")  # values < each edge
        counts = np.diff(below)
        counts[0] += below[0]  # below the first edge: the first bucket
        counts[-1] += f64.size - below[-1]  # the last edge and beyond: the last bucket (closed, as numpy's)
    else:
        vmin, vmax = float(f64.min()), float(f64.max())
        counts, _ = np.histogram(f64, bins=edges)  # its blocked search is cache-friendly on big tensors
        if vmin < edges[0]:
            counts[0] += int(np.count_nonzero(f64 < edges[0]))
        if vmax > edges[-1]:
            counts[-1] += int(np.count_nonzero(f64 > edges[-1]))
    nz = np.flatnonzero(counts)
    start, end = int(nz[0]), int(nz[-1]) + 1
    if start > 0:
        kept = counts[start - 1 : end]
    else:
        kept = np.concatenate([[0], counts[:end]])
    limits = edges[start : end + 1]
    return Histogram(
        min=vmin,
        max=vmax,
        num=int(f64.size),
        sum=float(f64.sum()),
        sum_squares=float(np.square(f64).sum()),  # (not np.dot: BLAS threads cost more than the sum)
        bucket_limit=limits,
        bucket=kept.astype(np.float64),
        nonfinite=nonfinite,
    )
