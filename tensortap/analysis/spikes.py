"""Spikes in a training curve (a loss, a gradient norm), found robustly, and the layers that moved first.

A value spikes when, against the `window` finite values before it (at least `min_history` of them):

- its robust z-score is above `z_threshold` and it is more than `min_ratio` times the window's median: the
  z-score is (log v - median(log w)) / (1.4826 * MAD(log w)), the MAD floored at `MIN_LOG_SIGMA` (a curve
  that does not move at all would otherwise make any change infinitely significant); or
- it is more than `max_factor` times the largest value seen before it (Megatron-LM's check: > 10x).

Curves with values <= 0 are judged on the values themselves instead of their logarithm (the ratio test then
compares the excess over the median with `min_ratio - 1` times the median's magnitude). Non-finite values are
neither judged nor kept in the history: they are ExplodingTensor's and the non-finite report's business.

Attribution: for a spike at step s, each layer's gradient norm series, and each module output's kurtosis series
(n·Σx⁴/(Σx²)², from the flight recorder's full statistics: activation outliers growing before a loss spike show
there while norms barely move), is judged the same way over the steps from the previous judged point of the
spiking curve (minus `lookback` steps) up to s, against its own values before those steps; the series that moved
(robust z above `ATTR_Z`, ratio above `ATTR_RATIO` or below its inverse, or a non-finite value) are listed
earliest move first, then by how far they moved.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["Spike", "SpikeDetector", "find_spikes", "spike_events", "attribute", "attribute_all", "Mover",
           "MIN_LOG_SIGMA", "ATTR_Z", "ATTR_RATIO", "GRADIENT_NORM", "ACTIVATION_KURTOSIS"]

#: what a mover's series is (Mover.statistic)
GRADIENT_NORM = "gradient norm"
ACTIVATION_KURTOSIS = "activation kurtosis"

#: the smallest spread of log values a window is taken to have (5%): a flat curve is not infinitely sure
MIN_LOG_SIGMA = 0.05
#: a layer's norm moved, for attribution, when its robust z-score is above this and ...
ATTR_Z = 6.0
#: ... it is more than this many times (or less than 1/this) its own median before
ATTR_RATIO = 3.0
_MAD_SIGMA = 1.4826


@dataclass
class Mover:
    """A layer whose gradient norm (or whose output's kurtosis: `statistic`) moved before or at a spike."""

    tensor: str
    step: int  # the first step, in the examined span, where it moved
    value: float
    baseline: float  # its median before the span
    ratio: float  # value / baseline (inf for a non-finite value)
    z: float
    statistic: str = GRADIENT_NORM

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in asdict(self).items()}


@dataclass
class Spike:
    """One spiky value of a curve."""

    step: int
    value: float
    baseline: float  # the median of the trailing window
    ratio: float  # value / baseline (for curves with values <= 0: excess over the median / |median|)
    z: float  # robust z-score (of the log, for positive curves)
    running_max: float  # the largest value seen before
    reason: str  # "z-score" or "running maximum"
    previous_step: int | None = None  # the step of the judged value before it
    movers: list[Mover] = field(default_factory=list)
    # for an event of consecutive spiky values (spike_events): where it ended and its peak
    end_step: int | None = None
    peak_step: int | None = None
    peak_value: float | None = None

    def describe(self, what: str = "value") -> str:
        """One line: what spiked, by how much, against what."""
        if self.reason == "running maximum":
            why = f"more than {self.value / self.running_max:.3g}x the largest earlier value {self.running_max:.4g}"
        else:
            why = f"{self.ratio:.3g}x the median {self.baseline:.4g} of the values before it (robust z {self.z:.3g})"
        return f"{what} {self.value:.4g} at step {self.step}: {why}"

    def to_dict(self) -> dict[str, Any]:
        d = {k: _json_float(v) for k, v in asdict(self).items() if k != "movers"}
        d["movers"] = [m.to_dict() for m in self.movers]
        return d


def _json_float(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class SpikeDetector:
    """Judges one curve value by value (`add`), with the method of the module docstring."""

    def __init__(self, window: int = 50, z_threshold: float = 6.0, min_ratio: float = 2.0,
                 max_factor: float = 10.0, min_history: int = 10):
        self.window = int(window)
        self.z_threshold = float(z_threshold)
        self.min_ratio = float(min_ratio)
        self.max_factor = float(max_factor)
        self.min_history = int(min_history)
        self._hist: deque[float] = deque(maxlen=self.window)
        self._max = -math.inf
        self._nonpositive = False
        self.judged = 0
        self.last_step: int | None = None

    @property
    def has_nonpositive(self) -> bool:
        """Whether a value <= 0 was seen (the curve is then judged on its values, not their logarithm)."""
        return self._nonpositive

    def add(self, step: int, value: float) -> Spike | None:
        """Judge `value` at `step` (steps in increasing order), then keep it in the history."""
        v = float(value)
        if not math.isfinite(v):
            return None
        spike = None
        prev = self.last_step
        if len(self._hist) >= self.min_history:
            self.judged += 1
            spike = self._judge(step, v)
            if spike is not None:
                spike.previous_step = prev
        self._hist.append(v)
        self._max = max(self._max, v)
        self._nonpositive = self._nonpositive or v <= 0
        self.last_step = int(step)
        return spike

    def _judge(self, step: int, v: float) -> Spike | None:
        w = np.fromiter(self._hist, dtype=np.float64, count=len(self._hist))
        if not self._nonpositive and v > 0:
            lw = np.log(w)
            med = float(np.median(lw))
            sigma = max(_MAD_SIGMA * float(np.median(np.abs(lw - med))), MIN_LOG_SIGMA)
            z = (math.log(v) - med) / sigma
            base = math.exp(med)
            ratio = v / base
            ratio_ok = ratio > self.min_ratio
        else:
            base = float(np.median(w))
            sigma = _MAD_SIGMA * float(np.median(np.abs(w - base)))
            sigma = max(sigma, MIN_LOG_SIGMA * abs(base), 1e-12)
            z = (v - base) / sigma
            ratio = (v - base) / abs(base) if base else math.inf
            ratio_ok = ratio > self.min_ratio - 1.0
        if z > self.z_threshold and ratio_ok:
            return Spike(int(step), v, base, ratio, z, self._max, "z-score")
        if self._max > 0 and v > self.max_factor * self._max:
            return Spike(int(step), v, base, ratio, z, self._max, "running maximum")
        return None


def find_spikes(steps: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray, **params: Any
                ) -> list[Spike]:
    """Every spiky value of a curve (steps increasing), as SpikeDetector(**params) judges them in order."""
    det = SpikeDetector(**params)
    out = []
    for s, v in zip(np.asarray(steps).tolist(), np.asarray(values, dtype=np.float64).tolist(), strict=True):
        sp = det.add(int(s), v)
        if sp is not None:
            out.append(sp)
    return out


def spike_events(spikes: list[Spike], steps: Sequence[int] | np.ndarray, gap: int = 10) -> list[Spike]:
    """Spiky values of a curve (`steps`: all its steps) less than `gap` points apart merged into one event (a
    spike and its aftershocks while training recovers): the first spike, with `end_step`, `peak_step` and
    `peak_value` set."""
    pos = {int(s): i for i, s in enumerate(np.asarray(steps).tolist())}
    events: list[Spike] = []
    last_i = None
    for sp in spikes:
        i = pos.get(sp.step)
        if events and i is not None and last_i is not None and i - last_i <= gap:
            ev = events[-1]
            ev.end_step = sp.step
            if sp.value > (ev.peak_value or -math.inf):
                ev.peak_step, ev.peak_value = sp.step, sp.value
        else:
            sp.end_step, sp.peak_step, sp.peak_value = sp.step, sp.step, sp.value
            events.append(sp)
        last_i = i
    return events


def attribute_all(spike_step: int, layers: Mapping[str, tuple[Iterable[int], Iterable[float]]],
                  kurtosis: Mapping[str, tuple[Iterable[int], Iterable[float]]] | None = None,
                  since: int | None = None, lookback: int = 8, window: int = 50, top: int = 5) -> list[Mover]:
    """The layers whose gradient norm (`layers`) or output kurtosis (`kurtosis`: {tensor: (steps, kurtosis)})
    moved first at a spike at `spike_step`, earliest first (see `attribute`)."""
    movers = attribute(spike_step, layers, since=since, lookback=lookback, window=window, top=top)
    if kurtosis:
        movers += attribute(spike_step, kurtosis, since=since, lookback=lookback, window=window, top=top,
                            statistic=ACTIVATION_KURTOSIS)
        movers.sort(key=_first_then_farthest)
    return movers[:top]


def _first_then_farthest(m: Mover) -> tuple[int, float]:
    return m.step, (-abs(math.log(m.ratio)) if m.ratio > 0 and math.isfinite(m.ratio) else -math.inf)


def attribute(spike_step: int, layers: Mapping[str, tuple[Iterable[int], Iterable[float]]],
              since: int | None = None, lookback: int = 8, window: int = 50, top: int = 5,
              min_baseline: int = 3, statistic: str = GRADIENT_NORM) -> list[Mover]:
    """The layers whose series (gradient norms by default; `statistic` names what the values are) moved first at
    a spike at `spike_step`. `layers`: {tensor: (steps, values)}, steps increasing. The examined span is
    (since - lookback, spike_step] (`since`: the previous judged step of the spiking curve; None: spike_step);
    each layer is judged there against its last `window` values before the span (at least `min_baseline` of
    them)."""
    lo = (spike_step if since is None else min(int(since), spike_step)) - int(lookback)
    movers: list[Mover] = []
    for name, (st, vals) in layers.items():
        st = np.asarray(list(st) if not isinstance(st, np.ndarray) else st, dtype=np.int64)
        vals = np.asarray(list(vals) if not isinstance(vals, np.ndarray) else vals, dtype=np.float64)
        before = vals[(st <= lo) & np.isfinite(vals) & (vals > 0)][-int(window):]
        span = np.flatnonzero((st > lo) & (st <= spike_step))
        if not len(span):
            continue
        if len(before) < min_baseline:
            bad = [i for i in span.tolist() if not math.isfinite(vals[i])]
            if bad:
                movers.append(Mover(name, int(st[bad[0]]), float(vals[bad[0]]), math.nan, math.inf, math.inf,
                                    statistic))
            continue
        lb = np.log(before)
        med = float(np.median(lb))
        sigma = max(_MAD_SIGMA * float(np.median(np.abs(lb - med))), MIN_LOG_SIGMA)
        base = math.exp(med)
        for i in span.tolist():
            v = float(vals[i])
            if not math.isfinite(v):
                movers.append(Mover(name, int(st[i]), v, base, math.inf, math.inf, statistic))
                break
            if v <= 0:
                continue
            z = (math.log(v) - med) / sigma
            ratio = v / base
            if abs(z) > ATTR_Z and (ratio > ATTR_RATIO or ratio < 1.0 / ATTR_RATIO):
                movers.append(Mover(name, int(st[i]), v, base, ratio, z, statistic))
                break
    movers.sort(key=_first_then_farthest)
    return movers[:top]
