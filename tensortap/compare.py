"""Where runs diverge: per tensor and statistic, the first step at which another run's value differs from the
reference run's beyond a tolerance (`tensortap compare A B [C...]`), on the export's scalars table
(docs/export.md): scalars, saved reductions and statistics computed from raw values.

Values are matched by (tensor, statistic, worker, mode, mode step); a value differs when
`|b - a| > atol + rtol * |a|`, or when one is NaN and the other is not, or when they are infinities of
different signs. Keys present in one run only are counted, not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap.exceptions import InvalidConfiguration


@dataclass
class Divergence:
    """The first differing value of one (tensor, statistic) between the reference run and another."""

    tensor: str
    statistic: str
    worker: str
    mode: str
    mode_step: int
    step: int  # the reference run's global step
    reference: float
    other: float
    compared: int  # values of this (tensor, statistic) compared in both runs
    differing: int  # of them, how many differ

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "reference": _json_num(self.reference), "other": _json_num(self.other)}


@dataclass
class Comparison:
    reference: str
    other: str
    compared: int = 0
    only_reference: int = 0
    only_other: int = 0
    divergences: list[Divergence] = field(default_factory=list)  # sorted by step

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "other": self.other, "compared": self.compared,
                "only_reference": self.only_reference, "only_other": self.only_other,
                "first_divergent_step": self.first.step if self.first else None,
                "divergences": [d.to_dict() for d in self.divergences]}


def _json_num(v: float) -> float | str:
    return v if np.isfinite(v) else str(v)


def _table(trial: Any, names: list[str] | None, mode: int | None) -> Any:
    from tensortap.trials.columns import Extract

    return Extract(trial, names, mode, complete_only=True).scalars()


def _keys(s: Any, tensors: list[str], workers: list[str]) -> np.ndarray:
    """(tensor, statistic, worker, mode, mode step) of each row, in the shared vocabularies, as one void value."""
    t = np.searchsorted(tensors, np.asarray(s.tensors, dtype=object))[s.tensor] if len(s) else np.empty(0, int)
    w = np.searchsorted(workers, np.asarray(s.workers, dtype=object))[s.worker] if len(s) else np.empty(0, int)
    k = np.zeros(len(s), dtype=[("t", ">u4"), ("s", ">u2"), ("w", ">u4"), ("m", "u1"), ("ms", ">i8")])
    k["t"], k["s"], k["w"], k["m"], k["ms"] = t, s.statistic, w, s.mode, s.mode_step
    return k.view(f"V{k.dtype.itemsize}")


def compare_trials(reference: Any, other: Any, *, rtol: float = 1e-5, atol: float = 1e-8,
                   names: list[str] | None = None, mode: int | None = None) -> Comparison:
    """Compare `other` to `reference` (Trials): per (tensor, statistic, worker), the first differing step."""
    from tensortap.trials.columns import MODE_NAMES, STATISTICS

    for k, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
            raise InvalidConfiguration(f"{k}={v!r} must be a non-negative number")
    a, b = _table(reference, names, mode), _table(other, names, mode)
    out = Comparison(reference.name, other.name)
    tensors = np.array(sorted(set(a.tensors) | set(b.tensors)), dtype=object)
    workers = np.array(sorted(set(a.workers) | set(b.workers)), dtype=object)
    ka, kb = _keys(a, tensors, workers), _keys(b, tensors, workers)
    _, ia = np.unique(ka, return_index=True)
    _, ib = np.unique(kb, return_index=True)
    common, pa_, pb_ = np.intersect1d(ka[ia], kb[ib], assume_unique=True, return_indices=True)
    ia, ib = ia[pa_], ib[pb_]
    out.compared = len(common)
    out.only_reference = len(np.unique(ka)) - len(common)
    out.only_other = len(np.unique(kb)) - len(common)
    va, vb = a.value[ia], b.value[ib]
    with np.errstate(invalid="ignore", over="ignore"):
        both_nan = np.isnan(va) & np.isnan(vb)
        same_inf = np.isinf(va) & (va == vb)
        diff = ~(both_nan | same_inf) & ~(np.abs(vb - va) <= atol + rtol * np.abs(va))
    # per (tensor, statistic, worker): rows compared, rows differing, the first differing (by global step)
    g = (a.tensor[ia].astype(np.int64) * 64 + a.statistic[ia]) * 65536 + a.worker[ia]
    order = np.lexsort((a.step[ia], g))
    g, d = g[order], diff[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.empty(0, np.int64)
    ends = np.r_[starts[1:], len(g)].astype(np.int64)
    for s0, e0 in zip(starts.tolist(), ends.tolist(), strict=True):
        bad = np.flatnonzero(d[s0:e0])
        if not len(bad):
            continue
        j = order[s0 + bad[0]]
        i = ia[j]
        out.divergences.append(Divergence(
            a.tensors[int(a.tensor[i])], STATISTICS[int(a.statistic[i])], a.workers[int(a.worker[i])],
            MODE_NAMES[int(a.mode[i])], int(a.mode_step[i]), int(a.step[i]), float(va[j]), float(vb[j]),
            e0 - s0, len(bad)))
    out.divergences.sort(key=lambda d: (d.step, d.tensor, d.statistic, d.worker))
    return out


def compare(paths: list[str], **kwargs: Any) -> list[Comparison]:
    """Compare every run of `paths[1:]` to the reference run `paths[0]` (out_dirs, local or s3://)."""
    from tensortap.trials import create_trial

    if len(paths) < 2:
        raise InvalidConfiguration("compare needs at least two runs")
    trials = [create_trial(p, name=p) for p in paths]
    return [compare_trials(trials[0], t, **kwargs) for t in trials[1:]]
