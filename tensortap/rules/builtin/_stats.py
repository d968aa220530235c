"""Vectorised per-step statistics shared by the built-in rules (rows = one step's value per row)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tensortap.rules._data import Stat

__all__ = ["ABS_MEAN", "MEAN", "VARIANCE", "NAN_INF", "ZERO_PCT", "flat", "unit_inactive_pct", "scalar"]


def flat(rows: np.ndarray) -> np.ndarray:
    """(N, ...) → (N, size): floats keep their dtype (reductions accumulate in float64), other numbers become
    float64, non-numeric data gives NaN rows."""
    r = np.asarray(rows)
    n = r.shape[0] if r.ndim else 1
    r = r.reshape(n, -1)
    if np.issubdtype(r.dtype, np.floating):
        return r
    if not np.issubdtype(r.dtype, np.number) and r.dtype != np.bool_:
        return np.full((n, max(1, r.shape[1])), np.nan)
    return r.astype(np.float64)


def _mean_or_nan(x: np.ndarray) -> np.ndarray:
    if x.shape[1] == 0:
        return np.full(x.shape[0], np.nan)
    return x.mean(axis=1, dtype=np.float64)


ABS_MEAN = Stat("abs_mean", lambda r: _mean_or_nan(np.abs(flat(r))), reduction=("mean", True))
MEAN = Stat("mean", lambda r: _mean_or_nan(flat(r)), reduction=("mean", False))


def _variance(r: np.ndarray) -> np.ndarray:
    x = flat(r)
    return np.full(x.shape[0], np.nan) if x.shape[1] == 0 else x.var(axis=1, dtype=np.float64)


VARIANCE = Stat("variance", _variance, reduction=("variance", False))


def _nan_inf(r: np.ndarray) -> np.ndarray:
    """2: holds a NaN, 1: holds ±inf (and no NaN), 0: finite (non-float data is always 0)."""
    r = np.asarray(r)
    n = r.shape[0] if r.ndim else 1
    if not np.issubdtype(r.dtype, np.inexact):
        return np.zeros(n)
    x = r.reshape(n, -1)
    out = np.zeros(n)
    # one pass: a float64 sum of finite float32/16 values is finite, so only rows whose sum is not finite
    # (or, for float64 data, overflowed) need the exact check
    bad = np.flatnonzero(~np.isfinite(x.sum(axis=1, dtype=np.float64)))
    if len(bad):
        xb = x[bad]
        out[bad] = np.where(np.isnan(xb).any(axis=1), 2.0, np.where(np.isinf(xb).any(axis=1), 1.0, 0.0))
    return out


NAN_INF = Stat("nan_inf", _nan_inf)


def _zero_pct(r: np.ndarray) -> np.ndarray:
    r = np.asarray(r)
    n = r.shape[0] if r.ndim else 1
    x = r.reshape(n, -1)
    if x.shape[1] == 0:
        return np.full(n, np.nan)
    return (x == 0).mean(axis=1) * 100.0


ZERO_PCT = Stat("zero_pct", _zero_pct)


def scalar(v: object) -> float:
    """A loss-like value as a float (the mean if it is not a scalar)."""
    a = np.asarray(v, dtype=np.float64)
    return float(a.reshape(-1)[0]) if a.size == 1 else float(a.mean())


def unit_inactive_pct(active: Callable[[np.ndarray], np.ndarray], threshold_inactivity: float
                      ) -> Callable[[np.ndarray], np.ndarray]:
    """Per step: % of units whose activity (% of batch samples where `active(x)`) is below the threshold.
    A step's value with ndim >= 2 has the batch on axis 0 and a unit per remaining element; with ndim <= 1
    every element is its own unit."""

    def fn(rows: np.ndarray) -> np.ndarray:
        r = np.asarray(rows)
        n = r.shape[0]
        if r.ndim >= 3:
            a = active(r).reshape(n, r.shape[1], -1).mean(axis=1) * 100.0
        else:
            a = active(r).reshape(n, -1) * 100.0
        if a.shape[1] == 0:
            return np.full(n, np.nan)
        return (a < threshold_inactivity).mean(axis=1) * 100.0

    return fn
