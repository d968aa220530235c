"""Histograms of tensors with TensorFlow's default buckets (as smdebug and tensorboardX compute them).

Edges: 0 and ±1e-12·1.1^k for every k with 1e-12·1.1^k < 1e20 (about 1,500 edges). Bucket j holds the values
v with edges[j] <= v < edges[j+1] (the last one also holds edges[-1]), exactly numpy.histogram's rule, so the
counts equal `np.histogram(finite_values, bins=edges)[0]`. Finite values beyond ±1e20 (outside numpy's
range) go to the outermost buckets instead of being dropped; min and max keep their true values.
Non-finite values (NaN, ±inf) are not in the histogram: they are counted separately, NaN, +inf and -inf each.

float32 values (and float16, bfloat16, which convert to float32 exactly) are counted without a float64 copy:
their bits, mapped to int32 keys in the same order, are sorted and each edge's float32 threshold is searched
in them, only for the edges between the smallest and the largest value.

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
    nonfinite: int  # nan + posinf + neginf
    nan: int = 0
    posinf: int = 0
    neginf: int = 0

    @property
    def nonfinite_counts(self) -> tuple[int, int, int]:
        """(NaN, +inf, -inf) values left out of the buckets."""
        return self.nan, self.posinf, self.neginf


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


def histogrammable(value: np.ndarray) -> bool:
    """Whether `value` gets a histogram (see `as_real`), without converting it."""
    kind = value.dtype.kind
    return value.size > 0 and (kind in "iuf" or (kind == "V" and value.dtype.names is None
                                                  and value.dtype.itemsize <= 2))


def make_histogram(value: np.ndarray) -> Histogram | None:
    """The histogram of `value`'s finite values; None when it has none (or is not histogrammable)."""
    value = as_real(np.asarray(value))
    if value is None:
        return None
    flat = value.reshape(-1)
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)  # exact
    nonfinite = 0
    counts = (0, 0, 0)
    if flat.dtype.kind == "f":
        # a float32/float64 sum of finite values cannot overflow float64: a non-finite sum means NaN/inf inside
        total = flat.sum(dtype=np.float64)
        if not np.isfinite(total):
            finite_mask = np.isfinite(flat)
            bad = flat[~finite_mask]
            flat = flat[finite_mask]
            nonfinite = int(bad.size)
            nan = int(np.count_nonzero(np.isnan(bad)))
            posinf = int(np.count_nonzero(bad > 0))
            counts = (nan, posinf, nonfinite - nan - posinf)
            total = flat.sum(dtype=np.float64)
    if flat.size == 0:
        return Histogram(0.0, 0.0, 0, 0.0, 0.0, np.empty(0), np.empty(0), nonfinite, *counts)
    if flat.dtype == np.float32:
        h = _float32_histogram(np.ascontiguousarray(flat), float(total), nonfinite)
    else:
        h = _float64_histogram(flat.astype(np.float64, copy=False), nonfinite)
    h.nan, h.posinf, h.neginf = counts
    return h


def _float32_histogram(flat: np.ndarray, total: float, nonfinite: int) -> Histogram:
    """Sorts the order-preserving int32 keys of the values and finds each edge in them: only the edges between
    the smallest and the largest value are searched, which are the buckets the proto keeps."""
    keys = _f32_keys(flat)
    keys.sort()
    thresholds = _f32_thresholds()
    n = keys.size
    first = int(thresholds.searchsorted(keys[0], "right"))  # bucket of the smallest value
    last = int(thresholds.searchsorted(keys[-1], "right"))  # bucket of the largest value
    k = last - first + 2  # kept buckets: one empty before the first non-empty one, up to the last non-empty one
    cum = np.empty(k + 1, dtype=np.int64)  # values below each kept bucket's left edge, then all of them
    cum[:2] = 0
    cum[2:k] = keys.searchsorted(thresholds[first:last], "left")
    cum[k] = n
    vmin, vmax = _f32_keys(np.array([keys[0], keys[-1]], dtype=np.int32).view(np.float32)).view(np.float32)
    if max(-float(vmin), float(vmax)) < 1e18:
        sum_squares = float(np.square(flat).sum(dtype=np.float64))  # float32 squares: exact to 2^-24 each
    else:  # (their squares would overflow float32)
        f64 = flat.astype(np.float64)
        sum_squares = float(np.square(f64).sum())
    return Histogram(
        min=float(vmin),
        max=float(vmax),
        num=n,
        sum=total,
        sum_squares=sum_squares,
        bucket_limit=default_edges()[first : last + 2],
        bucket=np.diff(cum).astype(np.float64),
        nonfinite=nonfinite,
    )


def _float64_histogram(f64: np.ndarray, nonfinite: int) -> Histogram:
    """numpy.histogram's rule for float64 (and integer) values."""
    edges = default_edges()
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


@lru_cache(maxsize=1)
def _f32_thresholds() -> np.ndarray:
    """The inner edges as `_f32_keys` of float32 values: threshold j is the key of the smallest float32 that is
    >= edges[j + 1], so float32 v lies in bucket #{j : thresholds[j] <= key(v)} exactly when float64(v) lies in
    numpy's bucket j of `default_edges()` (the outermost buckets also take what is beyond them). The edge 0.0
    gets -0.0's key: -0.0 == 0.0 belongs to the bucket that starts at 0."""
    inner = default_edges()[1:-1]
    up = inner.astype(np.float32)
    below = up.astype(np.float64) < inner
    up[below] = np.nextafter(up[below], np.float32(np.inf))
    keys = _f32_keys(up)
    keys[inner == 0.0] = -1
    if not np.all(np.diff(keys) > 0):
        raise AssertionError("float32 thresholds of the default edges are not increasing")
    keys.setflags(write=False)
    return keys


def _f32_keys(values: np.ndarray) -> np.ndarray:
    """int32 keys in the order of float32 `values` (NaN aside): a non-negative float's bits; a negative one's
    bits with all but the sign bit flipped (-0.0 -> -1, +0.0 -> 0). The mapping is its own inverse."""
    bits = values.view(np.int32)
    keys = bits >> 31
    keys &= 0x7FFFFFFF
    keys ^= bits
    return keys
