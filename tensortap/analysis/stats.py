"""What the sufficient statistics of a tensor give (docs/format.md §3.2): with its element count n, Σ|x| (l1),
Σx² (l2²) and Σx⁴ (l4⁴), the mean |x|, the RMS and the kurtosis about zero, for one value or numpy arrays of them.

The kurtosis here is the fourth standardised moment about zero, n·Σx⁴/(Σx²)²: 3 for a centred normal
distribution, 1.8 for a uniform one, 1 when every |x| is the same, and up to n when one element holds all the
mass. A layer whose activations grow a few large outliers shows it as a jump of their kurtosis, while their norm
may barely move.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["kurtosis", "mean_abs", "rms"]


def kurtosis(count: Any, l2: Any, l4: Any) -> Any:
    """n·l4⁴/l2⁴ = n·Σx⁴/(Σx²)² (NaN where l2 is 0 or a value is not finite). Computed on the ratio l4/l2 first,
    so that values whose fourth powers overflow float64 still give it."""
    with np.errstate(all="ignore"):
        r = np.divide(np.asarray(l4, dtype=np.float64), np.asarray(l2, dtype=np.float64))
        k = np.asarray(count, dtype=np.float64) * r ** 4
        k = np.where(np.asarray(l2, dtype=np.float64) > 0, k, np.nan)
    return float(k) if k.ndim == 0 else k


def mean_abs(count: Any, l1: Any) -> Any:
    """Σ|x| / n (NaN for an empty tensor)."""
    with np.errstate(all="ignore"):
        m = np.divide(np.asarray(l1, dtype=np.float64), np.asarray(count, dtype=np.float64))
    return float(m) if m.ndim == 0 else m


def rms(count: Any, l2: Any) -> Any:
    """sqrt(Σx² / n) = l2 / sqrt(n) (NaN for an empty tensor)."""
    with np.errstate(all="ignore"):
        r = np.divide(np.asarray(l2, dtype=np.float64), np.sqrt(np.asarray(count, dtype=np.float64)))
    return float(r) if r.ndim == 0 else r


def kurtosis_series(l2: tuple[np.ndarray, np.ndarray], l4: tuple[np.ndarray, np.ndarray],
                    numel: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, kurtosis) of a tensor from its (steps, l2) and (steps, l4) series and {step: element count}: the
    steps that have all three, with l2 > 0 and a finite kurtosis (an all-zero or non-finite tensor has none)."""
    s2, v2 = (np.asarray(x) for x in l2)
    s4, v4 = (np.asarray(x) for x in l4)
    steps, i2, i4 = np.intersect1d(s2, s4, assume_unique=True, return_indices=True)
    n = np.array([numel.get(int(s), 0) for s in steps.tolist()], dtype=np.float64)
    k = np.asarray(kurtosis(n, v2[i2], v4[i4]), dtype=np.float64).reshape(-1)
    ok = np.isfinite(k) & (n > 1)
    return steps[ok].astype(np.int64), k[ok]
