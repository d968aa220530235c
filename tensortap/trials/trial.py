"""A Trial: the queryable view of one training job's saved data, live or finished."""

from __future__ import annotations

import bisect
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.exceptions import (
    InvalidConfiguration,
    NoMoreData,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from tensortap.format.entries import ENTRY_DTYPE
from tensortap.format.entries import concat as entries_concat
from tensortap.format.source import CollectionInfo, Source
from tensortap.modes import ModeKeys
from tensortap.trials import args as _args
from tensortap.trials.state import StepState
from tensortap.trials.tensor import Tensor

logger = logging.getLogger("tensortap")

_NEVER = np.iinfo(np.int64).max
#: seconds between looks, while waiting for a step, at whether the job's writers are gone without closing
_WRITERS_LOOK_S = 2.0
_MODE_BY_VALUE = {m.value: m for m in ModeKeys}


def natural_key(s: str) -> tuple:
    """Sort key that orders worker_2 before worker_10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


class Trial:
    """Saved tensors of one job, read through a Source, refreshed incrementally while the job runs."""

    def __init__(
        self,
        source: Source,
        name: str,
        range_steps: tuple[int | None, int | None] | None = None,
        refresh_interval: float = 0.05,
    ):
        self.source = source
        self.name = name
        self.path = source.location
        self.range_steps = range_steps
        self.refresh_interval = refresh_interval
        self.dynamic_refresh = True
        self._assumed_ended = False
        self._last_refresh = 0.0
        self._chunks: list[np.ndarray] = []
        self._all = np.empty(0, dtype=ENTRY_DTYPE)
        self._groups: dict[int, tuple[int, int]] = {}  # name id -> [start, end) in self._all
        self._dirty = False
        self.generation = 0
        self._tensors: dict[str, Tensor] = {}
        self._name_ids: dict[str, int] = {}
        # step bookkeeping
        self._global_to_mode: dict[int, tuple[ModeKeys, int]] = {}
        self._mode_to_global: dict[ModeKeys, dict[int, int]] = {}
        self._sorted_steps: list[int] = []
        self.refresh_data()

    @classmethod
    def from_storage(
        cls, storage: Any, name: str, range_steps: tuple[int | None, int | None] | None = None, *,
        refresh_interval: float = 0.05,
    ) -> Trial:
        """A trial of this class over an opened Storage, its format detected (what create_trial uses)."""
        from tensortap.trials.pending import open_source

        trial = cls.__new__(cls)
        Trial.__init__(trial, open_source(storage, range_steps), name, range_steps, refresh_interval)
        return trial

    # --- refresh ----------------------------------------------------------------------------

    def refresh_data(self) -> None:
        """Read what the job wrote since the last refresh."""
        self.source = self.source.resolved()
        new = self.source.refresh()
        self._last_refresh = time.monotonic()
        if len(new):
            self._chunks.append(new)
            self._dirty = True
            self.generation += 1
            self._index_steps(new)
        for i in range(len(self._name_ids), len(self.source.names)):
            self._name_ids[self.source.names[i]] = i

    def maybe_refresh(self) -> None:
        if not self.dynamic_refresh or self.loaded_all_steps:
            return
        if time.monotonic() - self._last_refresh >= self.refresh_interval:
            self.refresh_data()

    def _index_steps(self, new: np.ndarray) -> None:
        steps = new["step"]
        uniq, first = np.unique(steps, return_index=True)
        g2m = self._global_to_mode
        added = False
        for step, mode, mode_step in zip(
            uniq.tolist(), new["mode"][first].tolist(), new["mode_step"][first].tolist(), strict=True
        ):
            if step not in g2m:
                m = _MODE_BY_VALUE[mode]
                g2m[step] = (m, mode_step)
                self._mode_to_global.setdefault(m, {})[mode_step] = step
                added = True
        if added:
            self._sorted_steps = sorted(g2m)

    def _consolidate(self) -> None:
        if not self._dirty:
            return
        all_ = entries_concat([self._all, *self._chunks])
        self._chunks = []
        order = np.lexsort((all_["worker"], all_["step"], all_["reduction"], all_["kind"], all_["name"]))
        # rows moved as bytes: numpy's fancy indexing of a packed structured dtype copies field by field
        all_ = np.take(all_.view(np.uint8).reshape(len(all_), -1), order, axis=0).view(ENTRY_DTYPE).reshape(-1)
        names = all_["name"]
        uniq, starts = np.unique(names, return_index=True)
        ends = np.append(starts[1:], len(names))
        self._groups = {int(n): (int(s), int(e)) for n, s, e in zip(uniq, starts, ends, strict=True)}
        self._all = all_
        self._dirty = False

    def _entries_of(self, name: str) -> np.ndarray:
        self._consolidate()
        nid = self._name_ids.get(name)
        if nid is None or nid not in self._groups:
            return np.empty(0, dtype=ENTRY_DTYPE)
        s, e = self._groups[nid]
        return self._all[s:e]

    # --- completeness -----------------------------------------------------------------------

    @property
    def loaded_all_steps(self) -> bool:
        """True once the job has ended (every worker closed): nothing more will be written."""
        return self._assumed_ended or self.source.training_ended()

    def assume_ended(self) -> None:
        """Treat the job as ended although not every worker closed (its process died): what was written is
        all there will be, and every written step counts as complete."""
        self.refresh_data()
        self._assumed_ended = True

    @property
    def damage(self) -> list:
        """Corrupt places skipped while reading the index so far, each once: `Damage(path, offset, reason)`
        (docs/format.md §5.1). Corrupt payloads are not listed: reading one raises CorruptData."""
        return list(getattr(self.source, "damage", []))

    @property
    def num_workers(self) -> int | None:
        return self.source.num_workers

    def complete_upto(self) -> float:
        """Every global step <= this is complete; -1 if none, inf once ended. The rule is the format's
        (docs/format.md, "Step completeness")."""
        if self._assumed_ended:
            return float("inf")
        return self.source.complete_upto()

    def is_step_complete(self, global_step: int) -> bool:
        """Every worker has finished `global_step`: its data is all there."""
        return global_step <= self.complete_upto()

    @property
    def last_complete_step(self) -> int:
        """The newest saved global step that is complete, -1 if none."""
        upto = self.complete_upto()
        i = bisect.bisect_right(self._sorted_steps, upto)
        return self._sorted_steps[i - 1] if i else -1

    # --- steps and modes --------------------------------------------------------------------

    def _to_global(self, step: int, mode: ModeKeys) -> int | None:
        if mode == _modes.GLOBAL:
            return step if step in self._global_to_mode else None
        return self._mode_to_global.get(mode, {}).get(step)

    def steps(self, mode: ModeKeys | str = _modes.GLOBAL, show_incomplete_steps: bool = False) -> list[int]:
        """Saved steps of `mode` (mode steps; global steps for GLOBAL), complete ones unless asked."""
        mode = _modes.parse_mode(mode)
        self.maybe_refresh()
        return self._steps(mode, show_incomplete_steps)

    def _steps(self, mode: ModeKeys, show_incomplete_steps: bool) -> list[int]:
        gs = self._sorted_steps
        upto = float("inf") if show_incomplete_steps else self.complete_upto()
        if mode == _modes.GLOBAL:
            return gs[: bisect.bisect_right(gs, upto)]
        m2g = self._mode_to_global.get(mode, {})
        return sorted(s for s, g in m2g.items() if g <= upto)

    def modes(self) -> list[ModeKeys]:
        """Modes with saved data (never GLOBAL unless data was saved in GLOBAL mode)."""
        self.maybe_refresh()
        return sorted(self._mode_to_global, key=lambda m: m.value)

    def mode(self, global_step: int) -> ModeKeys | None:
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step: int) -> int | None:
        return self.mode_modestep(global_step)[1]

    def mode_modestep(self, global_step: int) -> tuple[ModeKeys | None, int | None]:
        global_step = _args.step(global_step, "global_step")
        if global_step not in self._global_to_mode:
            self.maybe_refresh()
        return self._global_to_mode.get(global_step, (None, None))

    def global_step(self, mode: ModeKeys | str, mode_step: int) -> int | None:
        mode = _modes.parse_mode(mode)
        mode_step = _args.step(mode_step, "mode_step")
        g = self._to_global(mode_step, mode)
        if g is None:
            self.maybe_refresh()
            g = self._to_global(mode_step, mode)
        return g

    def workers(self) -> list[str]:
        self.maybe_refresh()
        return sorted(self.source.listed_workers(), key=natural_key)

    def workers_for_step(self, global_step: int) -> list[str]:
        """Workers that saved anything at `global_step`."""
        global_step = _args.step(global_step, "global_step")
        self._consolidate()
        ids = np.unique(self._all["worker"][self._all["step"] == global_step])
        return sorted((self.source.workers[int(i)] for i in ids), key=natural_key)

    # --- tensors ----------------------------------------------------------------------------

    def _all_names(self) -> list[str]:
        self._consolidate()
        return [self.source.names[n] for n in self._groups]

    def tensor_names(
        self,
        show_prefixed_tensors: bool = False,
        *,
        step: int | None = None,
        mode: ModeKeys | str = _modes.GLOBAL,
        regex: str | Iterable[str] | None = None,
        collection: str | CollectionInfo | None = None,
    ) -> list[str]:
        """Sorted names of saved tensors, optionally those saved at `step` of `mode`, matching `regex`
        (one or a list, re.search) or in `collection`."""
        if regex is not None and collection is not None:
            raise InvalidConfiguration("give either regex or collection, not both")
        mode = _modes.parse_mode(mode)
        if step is not None:
            step = _args.step(step)
        pats = _args.regexes(regex) if regex is not None else None
        if collection is not None and not isinstance(collection, str | CollectionInfo):
            raise InvalidConfiguration(f"collection={collection!r} must be a collection name or a CollectionInfo")
        self.maybe_refresh()
        names = self._all_names()
        if step is not None:
            g = self._to_global(step, mode)
            if g is None:
                return []
            self._consolidate()
            sel = self._all["name"][self._all["step"] == g]
            names = [self.source.names[i] for i in np.unique(sel)]
        if pats is not None:
            names = [n for n in names if any(p.search(n) for p in pats)]
        if collection is not None:
            coll = self.collection(collection) if isinstance(collection, str) else collection
            pats = [re.compile(r) for r in coll.include_regex]
            names = [n for n in names if n in coll.tensor_names or any(p.search(n) for p in pats)]
        return sorted(names)

    def has_tensor(self, name: str) -> bool:
        _args.name(name)
        if name not in self._name_ids or self._name_ids[name] not in self._groups:
            self.maybe_refresh()
            self._consolidate()
        nid = self._name_ids.get(name)
        return nid is not None and nid in self._groups

    def tensor(self, name: str) -> Tensor:
        if not self.has_tensor(name):
            # e.g. save_scalar("loss") is stored as "scalar/loss": name the saved tensor in the error
            similar = [n for n in self._all_names() if n.endswith("/" + name)][:5]
            raise TensorUnavailable(name, similar)
        t = self._tensors.get(name)
        if t is None:
            t = self._tensors[name] = Tensor(name, self)
        return t

    def total_norm(self, step_num: int, mode: ModeKeys | str = _modes.GLOBAL, collection: str = "gradients") -> float:
        """The L2 norm of all the tensors of `collection` saved at this step taken together (for the gradients,
        what `torch.nn.utils.get_total_norm` gives over the full gradients, sharded or not): from each tensor's
        L2 norm, saved or computed from its (assembled) value."""
        mode = _modes.parse_mode(mode)
        step_num = _args.step(step_num, "step_num")
        names = self.tensor_names(collection=collection, step=step_num, mode=mode)
        if not names:
            raise TensorUnavailableForStep(f"collection {collection!r}", step_num, mode)
        total = 0.0
        for n in names:
            v = float(self.tensor(n).reduction_value(step_num, "l2", mode))
            total += v * v
        return total ** 0.5

    def incidents(self, kind: str | None = None) -> list[dict[str, Any]]:
        """What the job's flight recorder saw go wrong (docs/format.md §11): every incident of every worker, of
        `kind` only when given ("non_finite", "loss_spike", "grad_norm_spike", "exception", "rule", "stop"), sorted
        by step, then worker. Read afresh at each call."""
        from tensortap.trials.incidents import read_incidents

        storage = getattr(self.source, "storage", None)
        if storage is None:
            from tensortap.storage import open_storage

            storage = open_storage(self.path)
        return read_incidents(storage, kind)

    def first_nonfinite(self) -> dict[str, Any] | None:
        """The earliest `non_finite` incident over all workers (where a NaN or infinity first appeared: the
        module, or the parameter whose gradient, that produced it; at one step a forward's before a backward's,
        docs/format.md §11), or None."""
        from tensortap.trials.incidents import first_nonfinite

        return first_nonfinite(self.incidents("non_finite"))

    def collections(self) -> dict[str, CollectionInfo]:
        self.maybe_refresh()
        return dict(self.source.collections)

    def collection(self, name: str) -> CollectionInfo:
        """The collection `name`; a new empty one (kept by the trial) if the job saved none of that name, as
        smdebug does: fill it with `.include(regex)` / `.add_tensor_name(name)` and query it."""
        _args.name(name)
        colls = self.collections()
        if name not in colls:
            colls[name] = self.source.collections[name] = CollectionInfo(name=name)
        return colls[name]

    # --- waiting ----------------------------------------------------------------------------

    def has_passed_step(self, step: int, mode: ModeKeys | str = _modes.GLOBAL) -> StepState:
        """Whether `step` of `mode` is AVAILABLE, will never be (UNAVAILABLE), or may come (NOT_YET_AVAILABLE)."""
        mode = _modes.parse_mode(mode)
        step = _args.step(step)
        self.maybe_refresh()
        g = self._to_global(step, mode)
        if g is not None:
            return StepState.AVAILABLE if self.is_step_complete(g) else StepState.NOT_YET_AVAILABLE
        if self.loaded_all_steps:
            return StepState.UNAVAILABLE
        # A later saved step of this mode is complete: this one will never come.
        later = self._next_saved(step, mode)
        if later is not None and self.is_step_complete(later):
            return StepState.UNAVAILABLE
        if self.source.all_workers_passed(step, None if mode == _modes.GLOBAL else mode.name):
            return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE

    def _lost_words(self, step: int, mode: ModeKeys) -> str | None:
        """What damage cost `step` of `mode`, in words, None if no damage the reader met can have held it. A mode
        step is placed between the global steps of the saved mode steps around it."""
        lost_steps = list(getattr(self.source, "lost_steps", []))
        if not lost_steps:
            return None
        if mode == _modes.GLOBAL:
            lo, hi = step, step
        else:
            m2g = self._mode_to_global.get(mode, {})
            lo = max((g for s, g in m2g.items() if s < step), default=-1) + 1
            nxt = min((g for s, g in m2g.items() if s > step), default=None)
            hi = None if nxt is None else nxt - 1
        for lost in lost_steps:
            if (hi is None or lost.lo <= hi) and (lost.hi is None or lo <= lost.hi):
                d = lost.damage
                return f"index block damaged in {d.path} at offset {d.offset} ({d.reason}): {d.lost}"
        return None

    def _next_saved(self, step: int, mode: ModeKeys) -> int | None:
        """The global step of the first saved step of `mode` after `step`, None if there is none."""
        if mode == _modes.GLOBAL:
            i = bisect.bisect_right(self._sorted_steps, step)
            return self._sorted_steps[i] if i < len(self._sorted_steps) else None
        later = [g for s, g in self._mode_to_global.get(mode, {}).items() if s > step]
        return min(later) if later else None

    def wait_for_steps(
        self, required_steps: Iterable[int], mode: ModeKeys | str = _modes.GLOBAL, timeout: float | None = None
    ) -> None:
        """Block until every step is available. Raises StepUnavailable for a step that will never come,
        NoMoreData past the end of a finished job, StepNotYetAvailable when `timeout` seconds pass."""
        mode = _modes.parse_mode(mode)
        required = _args.steps(required_steps)
        timeout = _args.timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        next_look = time.monotonic() + _WRITERS_LOOK_S
        for step in sorted(required):
            while True:
                self.refresh_data()
                state = self.has_passed_step(step, mode)
                if state == StepState.AVAILABLE:
                    break
                if state == StepState.UNAVAILABLE:
                    steps = self._steps(mode, True)
                    if self.loaded_all_steps and (not steps or step > steps[-1]):
                        raise NoMoreData(step, mode, steps[-1] if steps else None)
                    raise StepUnavailable(step, mode, self._lost_words(step, mode))
                if not self._assumed_ended and time.monotonic() >= next_look:
                    next_look = time.monotonic() + _WRITERS_LOOK_S
                    if self.source.writers_gone():
                        logger.warning("tensortap: every writer of %s that did not close is gone (its process "
                                       "was killed?): what it flushed is taken as the whole job",
                                       self.source.location)
                        self.assume_ended()
                        continue
                if deadline is not None and time.monotonic() >= deadline:
                    raise StepNotYetAvailable(step, mode)
                time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 1.5, 0.5)

    # --- helpers for Tensor -----------------------------------------------------------------

    def _complete_mask(self, steps: np.ndarray) -> np.ndarray:
        upto = self.complete_upto()
        if upto == float("inf"):
            return np.ones(len(steps), dtype=bool)
        return steps <= upto

    # --- bulk / export ----------------------------------------------------------------------

    def statistics(
        self,
        names: Iterable[str] | None = None,
        stats: Iterable[str] = ("l2", "min", "max", "nonfinite"),
        *,
        mode: ModeKeys | str = _modes.GLOBAL,
        worker: str | None = None,
        steps: tuple[int | None, int | None] | Iterable[int] | None = None,
    ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """{tensor: {statistic: (steps, float64 values)}} of many tensors at once (default: every tensor), in one
        pass over the index and one read of the raw values needed: at each complete step, the reduction saved
        at that step, else the statistic computed from the raw value; the same values as
        `tensor(name).reduction_value(step, stat)` for each step, bit for bit (`abs_<name>` for abs=True). A
        statistic with no value is absent. `steps`: (first, last) inclusive, or a list, of steps of `mode`
        (global steps for GLOBAL); `worker`: that worker's values, else each step's first worker's."""
        from tensortap.trials import bulk

        return bulk.statistics(self, names, stats, mode=mode, worker=worker, steps=steps)

    def wall_time(self, global_steps: Iterable[int]) -> np.ndarray:
        """UNIX seconds at which each global step's data became readable: the time of the index flush (the block
        header's `time`, docs/format.md §3.1) that first held or passed the step, the earliest over the workers;
        at most one flush interval (0.5 s by default) after the step was saved. NaN where unknown (smdebug
        out_dirs record no time; a step no flush has reached yet)."""
        steps = np.asarray(list(global_steps) if not isinstance(global_steps, np.ndarray) else global_steps,
                           dtype=np.int64)
        out = np.full(len(steps), np.inf)
        bt = getattr(self.source, "block_times", None)
        if not bt or not len(steps):
            return np.full(len(steps), np.nan)
        arr = np.asarray(bt, dtype=np.float64)
        for wid in np.unique(arr[:, 0]).tolist():
            rows = arr[arr[:, 0] == wid]
            upto = np.maximum.accumulate(rows[:, 1])  # blocks in the order read: a worker's steps only grow
            times = rows[:, 2]
            i = np.searchsorted(upto, steps, side="left")
            ok = i < len(times)
            out[ok] = np.minimum(out[ok], times[i[ok]])
        out[~np.isfinite(out)] = np.nan
        return out

    def values_of(
        self,
        names: Iterable[str] | None = None,
        *,
        mode: ModeKeys | str = _modes.GLOBAL,
        worker: str | None = None,
        steps: tuple[int | None, int | None] | Iterable[int] | None = None,
    ) -> dict[str, tuple[np.ndarray, np.ndarray | list[np.ndarray]]]:
        """{tensor: (steps, values)} of many tensors' raw values at once, as `tensor(name).stacked()` gives each
        (values stacked when they share a shape and dtype, else a list), for the complete steps asked (as in
        `statistics`). A tensor with no raw value there is absent."""
        from tensortap.trials import bulk

        return bulk.values(self, names, mode=mode, worker=worker, steps=steps)

    def _extract(self, names: Iterable[str] | None, regex: str | None, collection: str | None,
                 mode: ModeKeys | str) -> Any:
        from tensortap.trials.columns import Extract

        mode = _modes.parse_mode(mode)
        if names is None and regex is None and collection is None:
            self.maybe_refresh()  # every tensor: no name list needed
        elif names is None:
            names = self.tensor_names(regex=regex, collection=collection)
        elif isinstance(names, str) or not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
            raise InvalidConfiguration(f"names={names!r} must be a list of tensor names")
        else:
            self.maybe_refresh()
        return Extract(self, None if names is None else list(names), None if mode == _modes.GLOBAL else mode.value,
                       complete_only=True)

    def to_dataframe(
        self,
        names: Iterable[str] | None = None,
        *,
        regex: str | None = None,
        collection: str | None = None,
        mode: ModeKeys | str = _modes.GLOBAL,
        reductions: bool = True,
    ) -> Any:
        """A long-form pandas DataFrame (tensor, worker, step, mode, mode_step, reduction, value) of every
        scalar tensor (reduction None) and saved reduction of the complete steps; for a tensor saved raw with
        no reduction at a step, its statistics (l2, min, max, mean, nonfinite) computed from the raw value, so
        weights and gradients have curves without any configuration at capture time. Needs pandas
        (tensortap[pandas]). `to_arrow()` gives the same rows in the export's schema (docs/export.md)."""
        import pandas as pd

        from tensortap.trials.columns import MODE_NAMES, STATISTICS

        s = self._extract(names, regex, collection, mode).scalars(reductions=reductions)
        # strings as categoricals: one small table each, codes per row (reduction NaN for a scalar's own value)
        return pd.DataFrame({
            "tensor": pd.Categorical.from_codes(s.tensor, categories=s.tensors),
            "worker": pd.Categorical.from_codes(s.worker, categories=s.workers),
            "step": s.step, "mode": pd.Categorical.from_codes(s.mode.astype(np.int8) - 1,
                                                              categories=[MODE_NAMES[i] for i in (1, 2, 3, 4)]),
            "mode_step": s.mode_step,
            "reduction": pd.Categorical.from_codes(s.statistic - 1, categories=list(STATISTICS[1:])),
            "value": s.value,
        })

    def to_arrow(
        self,
        names: Iterable[str] | None = None,
        *,
        regex: str | None = None,
        collection: str | None = None,
        mode: ModeKeys | str = _modes.GLOBAL,
        table: str = "scalars",
        max_elements: int = 4096,
        job: str | None = None,
    ) -> Any:
        """The complete steps as a pyarrow Table in the export's schema (docs/export.md): `table="scalars"`
        (scalars, saved reductions and statistics computed from raw values, one row per value) or
        `"tensors"` (raw values that are not scalars: elements as a list up to `max_elements`, beyond that a
        pointer into the native store). `job` names the job column (default: the trial's name). Needs pyarrow
        (tensortap[export])."""
        if table not in ("scalars", "tensors"):
            raise InvalidConfiguration(f"table={table!r} must be 'scalars' or 'tensors'")
        if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 0:
            raise InvalidConfiguration(f"max_elements={max_elements!r} must be a non-negative int")
        from tensortap.trials import arrow
        from tensortap.trials.columns import collections_of

        ex = self._extract(names, regex, collection, mode)
        per_tensor = collections_of(self, ex.tensors)
        job = self.name if job is None else job
        if table == "scalars":
            return arrow.scalars_table(ex.scalars(), job, per_tensor)
        return arrow.tensors_table(ex.tensors_table(max_elements), job, per_tensor)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: a short HTML summary (tensortap.trials.summary)."""
        from tensortap.trials.summary import trial_html

        return trial_html(self)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} path={self.path!r} steps={len(self._sorted_steps)} "
            f"workers={self.workers()}>"
        )


class LocalTrial(Trial):
    """A trial over a local directory (smdebug's `LocalTrial`, same constructor)."""

    def __init__(
        self,
        name: str,
        dirname: str,
        range_steps: tuple[int | None, int | None] | None = None,
        parallel: bool = True,
        check: bool = False,
        index_mode: bool = True,
        cache: bool = False,
        *,
        refresh_interval: float = 0.05,
    ):
        from tensortap.storage import LocalStorage
        from tensortap.trials.pending import open_source

        storage = LocalStorage(os.path.expanduser(str(dirname)))
        super().__init__(open_source(storage, range_steps), name, range_steps, refresh_interval)


class S3Trial(Trial):
    """A trial over s3://bucket/prefix (smdebug's `S3Trial`, same constructor)."""

    def __init__(
        self,
        name: str,
        bucket_name: str,
        prefix_name: str,
        range_steps: tuple[int | None, int | None] | None = None,
        check: bool = False,
        index_mode: bool = True,
        cache: bool = False,
        *,
        refresh_interval: float = 0.05,
    ):
        from tensortap.storage import open_storage
        from tensortap.trials.pending import open_source

        storage = open_storage(f"s3://{bucket_name}/{str(prefix_name).strip('/')}")
        Trial.__init__(self, open_source(storage, range_steps), name, range_steps, refresh_interval)
