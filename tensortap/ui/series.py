"""Series for drawing: statistics of a tensor over steps, read through the trial API, and a min/max
envelope that shortens long series without hiding a spike.

Everything returned here is plain JSON data: non-finite values become None (a gap), and their steps are
reported separately so that a view can mark them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.trials import Tensor, Trial

#: a drawn series keeps at most this many points; longer ones become a min/max envelope
MAX_POINTS = 2000

#: statistics a view may ask for; `nonfinite` is the count of NaN/inf elements
STATS = ("l2", "min", "max", "mean", "nonfinite")


def envelope_index(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of the points a min/max envelope of `values` keeps, at most `max_points` (all when fewer): in
    each of max_points/2 equal runs of points, the minimum and the maximum, in order. Every local extreme
    survives: a spike stays drawn. A run holding a NaN or inf keeps it (the interesting one) and its finite
    extremes. (Each the first of its run where several points tie; vectorised over the runs.)"""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    buckets = max(1, max_points // 2)
    starts = np.unique(np.linspace(0, n, buckets + 1).astype(np.int64))[:-1]
    run = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    finite = np.isfinite(values)
    low = np.where(finite, values, np.inf)
    high = np.where(finite, values, -np.inf)
    mins = np.minimum.reduceat(low, starts)
    maxs = np.maximum.reduceat(high, starts)

    def first_of_each_run(mask: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(mask)
        _, at = np.unique(run[idx], return_index=True)
        return idx[at]

    keep = [first_of_each_run(finite & (low == mins[run])), first_of_each_run(finite & (high == maxs[run]))]
    if not finite.all():
        keep.append(first_of_each_run(~finite))
    return np.unique(np.concatenate(keep)).astype(np.int64)


def envelope(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) shortened to at most `max_points` by a min/max envelope (envelope_index)."""
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=np.float64)
    k = envelope_index(values, max_points)
    return steps[k], values[k]


def window_index(steps: np.ndarray, values: np.ndarray, lo: float, hi: float, max_points: int = MAX_POINTS,
                 outside: int = 200) -> np.ndarray:
    """Indices to draw when steps [lo, hi] are shown: every point inside (a min/max envelope of them beyond
    `max_points`), and an envelope of `outside` points on each side, so that panning shows the shape and a
    spike outside the window is still there."""
    steps = np.asarray(steps)
    a, b = int(np.searchsorted(steps, lo, side="left")), int(np.searchsorted(steps, hi, side="right"))
    parts = [envelope_index(values[:a], outside), a + envelope_index(values[a:b], max_points),
             b + envelope_index(values[b:], outside)]
    return np.concatenate(parts).astype(np.int64)


#: significant digits of a drawn value (a plot cannot show more; the JSON stays short)
DIGITS = 7


def to_json_values(values: np.ndarray) -> list[float | None]:
    """Floats for JSON, to DIGITS significant digits: NaN and +-inf become None (drawn as a gap). Rounded with
    numpy (x·10^k rounded, then divided by 10^k: the double nearest the decimal, which prints short), each
    value whose power of ten is out of exact range by Python's formatting."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    fin = np.isfinite(v)
    x = np.where(fin, v, 0.0)
    nz = x != 0
    with np.errstate(all="ignore"):
        k = (DIGITS - 1) - np.floor(np.log10(np.abs(np.where(nz, x, 1.0))))
    exact = nz & (np.abs(k) <= 22)  # 10^k is exact: the rounding is the decimal's
    up, down = exact & (k >= 0), exact & (k < 0)
    if up.any():
        p = 10.0 ** k[up]
        x[up] = np.round(x[up] * p) / p
    if down.any():
        p = 10.0 ** -k[down]
        x[down] = np.round(x[down] / p) * p
    out: list[float | None] = x.tolist()
    fmt = f"%.{DIGITS}g"
    for i in np.flatnonzero(nz & ~exact).tolist():
        out[i] = float(fmt % v[i])
    for i in np.flatnonzero(~fin).tolist():
        out[i] = None
    return out


def series_json(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """{x, y, n, downsampled, nonfinite_steps} of one series, enveloped to `max_points`."""
    steps = np.asarray(steps)
    values = np.asarray(values, dtype=np.float64)
    bad = steps[~np.isfinite(values)]
    xs, ys = envelope(steps, values, max_points)
    return {
        "x": [int(s) for s in xs.tolist()],
        "y": to_json_values(ys),
        "n": int(len(values)),
        "downsampled": bool(len(xs) < len(values)),
        "nonfinite_steps": [int(s) for s in bad[:100].tolist()],
    }


def scalar_series(
    tensor: Tensor, mode: Any = _modes.GLOBAL, worker: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a scalar tensor (its raw value, or the mean of a small one)."""
    steps, vals = tensor.stacked(mode, worker)
    if isinstance(vals, list):
        vals = np.array([float(np.mean(np.asarray(v, dtype=np.float64))) if np.size(v) else np.nan for v in vals])
    vals = np.asarray(vals)
    if vals.ndim > 1:
        vals = vals.reshape(len(vals), -1).astype(np.float64).mean(axis=1)
    return np.asarray(steps), vals.astype(np.float64).reshape(-1) if len(steps) else np.empty(0)


def stat_bulk(
    trial: Trial, names: list[str], stats: tuple[str, ...] = ("l2", "min", "max", "nonfinite"),
    mode: Any = _modes.GLOBAL, worker: str | None = None, steps: Any = None,
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{tensor: {stat: (steps, values)}} for each asked statistic of many tensors, read at once
    (Trial.statistics): at each step the saved reduction, else computed from the raw value. A tensor saved with
    reductions only and no `nonfinite` count still tells its non-finite steps: 1 where a saved reduction is NaN
    or inf. A statistic with no value is absent."""
    for s in stats:
        if s not in STATS:
            raise ValueError(f"unknown statistic {s!r}: allowed are {', '.join(STATS)}")
    got = trial.statistics(names, stats, mode=mode, worker=worker, steps=steps)
    if "nonfinite" in stats:
        for per in got.values():
            if "nonfinite" not in per:
                for s in ("l2", "min", "max", "mean"):
                    if s in per:
                        st, v = per[s]
                        per["nonfinite"] = (st, (~np.isfinite(v)).astype(np.float64))
                        break
    return got


def stat_series(
    tensor: Tensor, stats: tuple[str, ...] = ("l2", "min", "max", "nonfinite"), mode: Any = _modes.GLOBAL,
    worker: str | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{stat: (steps, values)} of one tensor (stat_bulk)."""
    return stat_bulk(tensor.trial, [tensor.name], stats, mode, worker)[tensor.name]


def quantile_bands(
    tensor: Tensor, mode: Any = _modes.GLOBAL, max_steps: int = 200,
    qs: tuple[float, ...] = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0),
) -> dict[str, Any]:
    """Quantiles of a tensor's raw values at up to `max_steps` of the steps it has a raw value at (evenly spread,
    always the first and last): {steps, quantiles: {q: [..]}}. Reads the raw values of those steps only, at
    once (Trial.values_of)."""
    steps = np.asarray(tensor.steps(mode, raw_only=True), dtype=np.int64)
    if len(steps) > max_steps:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_steps).round().astype(int))
        steps = steps[idx]
    rows: dict[float, list[float | None]] = {q: [] for q in qs}
    kept = []
    got = tensor.trial.values_of([tensor.name], mode=mode, steps=steps.tolist()).get(tensor.name)
    for s, v in zip(*(got if got is not None else ([], [])), strict=True):
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        kept.append(int(s))
        if v.size == 0:
            for q in qs:
                rows[q].append(None)
            continue
        for q, x in zip(qs, np.quantile(v, qs).tolist(), strict=True):
            rows[q].append(float(x))
    return {"steps": kept, "quantiles": {str(q): rows[q] for q in qs}}


def is_scalar(trial: Trial, name: str) -> bool:
    """Whether the tensor's saved values are scalars (shape () or (1,)) at its first step."""
    t = trial.tensor(name)
    steps = t.steps(show_incomplete_steps=True)
    if not steps:
        return False
    try:
        shp = t.shape(steps[0])
    except Exception:  # noqa: BLE001 - no shape saved: judge by the value
        try:
            shp = np.shape(t.value(steps[0]))
        except Exception:  # noqa: BLE001
            return False
    return int(np.prod(shp)) == 1 if shp is not None else False
