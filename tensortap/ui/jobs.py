"""The jobs a dashboard or report shows: one Trial each (the only reader of tensor data), the kinds of
tensors it holds, and the statuses and reports of the rules that watch it."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensortap.trials import Trial, create_trial
from tensortap.trials.summary import RULE_STATUSES, rule_runs, rule_summary  # noqa: F401 - named here for callers
from tensortap.ui.series import is_scalar

#: bytes of per-step statistics a Job keeps for the tensors drawn last (the layers page and the heatmap draw
#: the same ones); the least recently drawn go first
STATS_CACHE_BYTES = 64 << 20

_XGB_NON_SCALAR = re.compile(
    r"^(feature_importance|average_shap|full_shap|hyperparameters|trees)/|^(labels|predictions)$")
_METRIC_COLLECTIONS = ("losses", "metrics", "sm_metrics", "scalars")
_PARAM_COLLECTIONS = ("weights", "biases")
_GRAD_PREFIX = re.compile(r"^gradients?/")
_WEIGHT_PREFIX = re.compile(r"^weights?/")
#: Keras' weight names: `<layer>/weights/<variable path>` (d1/weights/sequential/d1/kernel); its gradient is
#: gradients/<variable path>Grad
_KERAS_WEIGHT = re.compile(r"^[^/]+/weights/(.+)$")
#: steps at which a job's wall times are sent to the page (between them, linear interpolation)
WALL_POINTS = 1000
#: bytes of scalar series a Job keeps (the curves and their zoomed windows read them)
SERIES_CACHE_BYTES = 64 << 20


@dataclass
class Kinds:
    """Tensor names of one trial by what a view draws of them."""

    scalars: list[str] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)
    gradients: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # non-scalar tensors that are neither
    xgboost: dict[str, Any] = field(default_factory=dict)


def layer_of(name: str) -> str:
    """The layer (parameter) a weight or gradient tensor belongs to: `gradient/Net_fc1.weight` and
    `Net_fc1.weight` are both `Net_fc1.weight`; Keras' `gradients/sequential/d1/kernelGrad` and
    `d1/weights/sequential/d1/kernel` are both `sequential/d1/kernel`."""
    if _GRAD_PREFIX.match(name):
        base = _GRAD_PREFIX.sub("", name)
        return base[: -len("Grad")] if base.endswith("Grad") else base
    m = _KERAS_WEIGHT.match(name)
    if m:
        return m.group(1)
    return _WEIGHT_PREFIX.sub("", name)


def classify(trial: Trial) -> Kinds:
    names = trial.tensor_names()
    colls = trial.collections()

    def members(cname: str) -> set[str]:
        return set(trial.tensor_names(collection=cname)) if cname in colls else set()

    metric = set().union(*(members(c) for c in _METRIC_COLLECTIONS))
    params = set().union(*(members(c) for c in _PARAM_COLLECTIONS))
    grads = members("gradients") | {n for n in names if _GRAD_PREFIX.match(n)}
    k = Kinds()
    xgb_fi: dict[str, list[str]] = {}
    xgb_shap: list[str] = []
    for n in names:
        if n.startswith("feature_importance/"):
            parts = n.split("/", 2)
            if len(parts) == 3:
                xgb_fi.setdefault(parts[1], []).append(n)
            continue
        if n.startswith("average_shap/"):
            if not n.endswith("/bias"):
                xgb_shap.append(n)
            continue
        if _XGB_NON_SCALAR.match(n):
            continue
        if n in grads:
            k.gradients.append(n)
        elif n in params:
            k.weights.append(n)
        elif n in metric or is_scalar(trial, n):
            k.scalars.append(n)
        else:
            k.others.append(n)
    if xgb_fi or xgb_shap or "labels" in names or "predictions" in names:
        k.xgboost = {
            "feature_importance": {t: sorted(v) for t, v in sorted(xgb_fi.items())},
            "average_shap": sorted(xgb_shap),
            "labels": "labels" in names,
            "predictions": "predictions" in names,
        }
    return k


class Job:
    """One job on show: its Trial, opened once and refreshed as the job grows, behind a lock (one request
    at a time reads it)."""

    def __init__(self, index: int, path: str, name: str | None = None, trial: Trial | None = None):
        self.index = index
        self.path = path
        self.trial = trial if trial is not None else create_trial(path, name=name)
        self.name = self.trial.name
        self.lock = threading.RLock()
        self._kinds: Kinds | None = None
        self._kinds_generation = -1
        self._stats: OrderedDict[tuple[str, str | None], tuple[int, dict, set]] = OrderedDict()
        self._stats_bytes = 0  # of the arrays in self._stats
        self._wall: tuple[int, dict | None] | None = None
        self._series: OrderedDict[tuple[str, str], tuple[int, tuple]] = OrderedDict()

    @classmethod
    def of_trial(cls, trial: Trial, index: int = 0) -> Job:
        """A Job over a trial opened elsewhere (a notebook's)."""
        return cls(index, str(trial.path), trial.name, trial)

    def refresh(self) -> None:
        with self.lock:
            if not self.trial.loaded_all_steps:
                self.trial.refresh_data()

    @property
    def kinds(self) -> Kinds:
        with self.lock:
            if self._kinds is None or self._kinds_generation != self.trial.generation:
                self._kinds = classify(self.trial)
                self._kinds_generation = self.trial.generation
            return self._kinds

    @property
    def is_xgboost(self) -> bool:
        """Whether this is an XGBoost job: its steps are boosting rounds, never drawn on one axis with a
        neural net's steps."""
        return bool(self.kinds.xgboost)

    def scalar(self, name: str, mode: Any) -> tuple[Any, Any, Any]:
        """(global steps, values, mode steps) of scalar tensor `name` in `mode` (GLOBAL: every step), read
        once per generation of the trial and kept (up to SERIES_CACHE_BYTES): a zoom re-reads a window of it."""
        import numpy as np

        from tensortap import modes as _modes
        from tensortap.ui.series import scalar_series

        with self.lock:
            key = (name, mode.name)
            hit = self._series.pop(key, None)
            if hit is not None and hit[0] == self.trial.generation:
                got = hit[1]
            else:
                steps, vals = scalar_series(self.trial.tensor(name), mode)
                if mode == _modes.GLOBAL or not len(steps):
                    gsteps = np.asarray(steps, dtype=np.int64)
                else:
                    gsteps = self._global_steps(mode, steps)
                got = (gsteps, vals, np.asarray(steps, dtype=np.int64))
            self._series[key] = (self.trial.generation, got)
            size = sum(sum(a.nbytes for a in e[1]) for e in self._series.values())
            while len(self._series) > 1 and size > SERIES_CACHE_BYTES:
                _, (_, old) = self._series.popitem(last=False)
                size -= sum(a.nbytes for a in old)
            return got

    def _global_steps(self, mode: Any, steps: Any) -> Any:
        """The global steps of `mode`'s steps `steps` (-1 where unknown). The trial's own mode-to-global table
        when it has one (one dict lookup per step: Trial.global_step checks its arguments at each call, ~25 us
        a step, 25 s for a million), else Trial.global_step."""
        import numpy as np

        table = getattr(self.trial, "_mode_to_global", {}).get(mode)
        if table is not None:
            get = table.get
            return np.fromiter((get(s, -1) for s in steps.tolist()), dtype=np.int64, count=len(steps))
        to_global = self.trial.global_step
        return np.fromiter((-1 if (g := to_global(mode, s)) is None else g for s in steps.tolist()),
                           dtype=np.int64, count=len(steps))

    def wall_table(self, points: int = WALL_POINTS) -> dict[str, list] | None:
        """When the job's steps were written, for an x axis of wall time: {"step": global steps, "s": seconds
        since the first of them} at up to `points` of its saved steps (evenly spread, the first and the last
        always; of the steps one flush wrote, the first and the last only); a page puts any step between two of
        them by linear interpolation. Times are those of
        Trial.wall_time (the index flush that made a step readable: within a flush interval of its save). None
        when the job records no times (smdebug out_dirs)."""
        with self.lock:
            gen = self.trial.generation
            if self._wall is not None and self._wall[0] == gen:
                return self._wall[1]
            steps = np.asarray(self.trial.steps(show_incomplete_steps=True), dtype=np.int64)
            if len(steps) > points:
                steps = steps[np.unique(np.linspace(0, len(steps) - 1, points).round().astype(np.int64))]
            t = self.trial.wall_time(steps) if len(steps) else np.empty(0)
            ok = np.isfinite(t)
            table = None
            if ok.any():
                steps, t = steps[ok], t[ok]
                # steps of one flush share its time: only the first and last of each run are needed
                keep = np.ones(len(t), dtype=bool)
                keep[1:-1] = (t[1:-1] != t[:-2]) | (t[1:-1] != t[2:])
                steps, t = steps[keep], t[keep]
                table = {"step": steps.tolist(), "s": [round(float(x), 3) for x in (t - t[0]).tolist()]}
            self._wall = (gen, table)
            return table

    def epoch_table(self, points: int = WALL_POINTS) -> dict[str, list] | None:
        """The epoch of the job's steps, for an x axis of epochs, where the job saved it: {"step": global steps,
        "epoch": values} of its scalar named `epoch` (or `<...>/epoch`: the Hugging Face Trainer logs one), at up to
        `points` of its steps (evenly spread); a page puts any step between two of them by linear interpolation,
        and beyond them by the nearest two. None when the job saved no such scalar."""
        import numpy as np

        from tensortap import modes as _modes

        with self.lock:
            name = next((n for n in self.kinds.scalars if n == "epoch" or n.endswith("/epoch")), None)
            if name is None:
                return None
            g, v, _ = self.scalar(name, _modes.GLOBAL)
            ok = np.isfinite(v) & (g >= 0)
            g, v = g[ok], v[ok]
            if not len(g):
                return None
            if len(g) > points:
                keep = np.unique(np.linspace(0, len(g) - 1, points).round().astype(np.int64))
                g, v = g[keep], v[keep]
            return {"step": g.tolist(), "epoch": [round(float(x), 4) for x in v.tolist()]}

    def warm(self) -> None:
        """Index the job and read its curves now (the dashboard's start), not on the page's first request."""
        from tensortap import modes as _modes

        with self.lock:
            self.wall_table()
            for mode in self.trial.modes() or [_modes.GLOBAL]:
                for name in self.kinds.scalars:
                    self.scalar(name, mode)
                    if sum(sum(a.nbytes for a in e[1]) for e in self._series.values()) > SERIES_CACHE_BYTES // 2:
                        return

    def stats(self, name: str, worker: str | None = None,
              which: tuple[str, ...] = ("l2", "min", "max", "nonfinite")) -> dict[str, tuple[Any, Any]]:
        """{stat: (steps, values)} of tensor `name`'s statistics `which` (see stats_many)."""
        return self.stats_many([name], worker, which)[name]

    def stats_many(self, names: list[str], worker: str | None = None,
                   which: tuple[str, ...] = ("l2", "min", "max", "nonfinite")) -> dict[str, dict[str, tuple[Any, Any]]]:
        """{tensor: {stat: (steps, values)}} of the statistics `which` (of L2 norm, min, max, mean, non-finite
        count) of tensors `names` at every saved step (series.stat_series' values), kept (up to
        STATS_CACHE_BYTES) and extended as the job grows. What is not kept yet is read for all the tensors at
        once (Trial.statistics: one pass over the index and the raw values): a statistic asked for later is
        read then (the heatmap asks for norms only), a live job's new steps only are read."""
        from tensortap.ui.series import stat_bulk

        with self.lock:
            gen = self.trial.generation
            out: dict[str, dict[str, tuple[Any, Any]]] = {}
            fresh: list[str] = []  # read whole
            grow: dict[int, list[str]] = {}  # last step kept -> tensors to extend past it
            for n in dict.fromkeys(names):
                hit = self._stats.get((n, worker))
                if hit is not None and hit[0] == gen and all(s in hit[2] for s in which):
                    out[n] = hit[1]
                    continue
                last = None
                if hit is not None and all(s in hit[2] for s in which):
                    last = max((int(st[-1]) for st, _ in hit[1].values() if len(st)), default=None)
                if last is None:
                    fresh.append(n)
                else:
                    grow.setdefault(last, []).append(n)
            asked = set(which)
            if fresh:
                for n, got in stat_bulk(self.trial, fresh, which, worker=worker).items():
                    out[n] = got
                    self._keep(n, worker, got, asked)
            for last, group in grow.items():
                new = stat_bulk(self.trial, group, tuple(self._stats[(group[0], worker)][2]), worker=worker,
                                steps=(last + 1, None))
                for n in group:
                    old, kept = self._stats[(n, worker)][1], self._stats[(n, worker)][2]
                    got = {}
                    for k in kept:
                        st, v = old.get(k, (np.empty(0, np.int64), np.empty(0)))
                        add = new[n].get(k)
                        got[k] = (st, v) if add is None else (np.concatenate([st, add[0]]),
                                                               np.concatenate([v, add[1]]))
                    got = {k: v for k, v in got.items() if len(v[0])}
                    out[n] = got
                    self._keep(n, worker, got, kept)
            return {n: {k: v for k, v in out[n].items() if k in which} for n in dict.fromkeys(names)}

    def _keep(self, name: str, worker: str | None, got: dict, asked: set) -> None:
        """Keep `got` (the statistics `asked` of `name`) for this generation, the least recently drawn going first
        beyond STATS_CACHE_BYTES."""
        def nbytes(stats: dict) -> int:
            return sum(a.nbytes + b.nbytes for a, b in stats.values())

        key = (name, worker)
        old = self._stats.pop(key, None)
        if old is not None:
            self._stats_bytes -= nbytes(old[1])
        self._stats[key] = (self.trial.generation, got, set(asked))
        self._stats_bytes += nbytes(got)
        while len(self._stats) > 1 and self._stats_bytes > STATS_CACHE_BYTES:
            _, (_, gone, _) = self._stats.popitem(last=False)
            self._stats_bytes -= nbytes(gone)

    def rules(self) -> list[dict[str, Any]]:
        """Every rule of the job (see rules_of)."""
        storage = getattr(self.trial.source, "storage", None)
        if storage is None:
            from tensortap.storage import open_storage

            storage = open_storage(self.path)
        return self.rules_of(storage)

    @staticmethod
    def rules_of(storage: Any) -> list[dict[str, Any]]:
        """Every rule run of a job (tensortap.trials.summary.rule_runs)."""
        return rule_runs(storage)

    def signature(self) -> dict[str, Any]:
        """What changes when the job or its rules move on: the dashboard polls this."""
        with self.lock:
            steps = self.trial.steps(show_incomplete_steps=True)
            return {
                "generation": self.trial.generation,
                "last_step": steps[-1] if steps else None,
                "ended": self.trial.loaded_all_steps,
                "rules": [(r["name"], r["run"], r["status"], r.get("updated_at")) for r in self.rules()],
            }


class JobSet:
    """The jobs given on the command line, addressed only by their index (a URL cannot name a path)."""

    def __init__(self, paths: list[str]):
        if not paths:
            raise ValueError("give at least one OUT_DIR")
        names = _unique_names(paths)
        self.jobs = [Job(i, p, n) for i, (p, n) in enumerate(zip(paths, names, strict=True))]

    def get(self, ref: Any) -> Job:
        """The job at index `ref` (an int or a decimal string); KeyError for anything else."""
        s = str(ref)
        if not s.isdigit() or int(s) >= len(self.jobs):
            raise KeyError(f"job {ref!r}: allowed are 0..{len(self.jobs) - 1}")
        return self.jobs[int(s)]

    def select(self, refs: list[str] | None) -> list[Job]:
        if not refs:
            return list(self.jobs)
        return [self.get(r) for r in refs]


def _unique_names(paths: list[str]) -> list[str]:
    import os

    base = [os.path.basename(p.rstrip("/")) or p for p in paths]
    return [b if base.count(b) == 1 else f"{b} ({i})" for i, b in enumerate(base)]
