"""Which reader an out_dir needs, decided by its first data: tensortap's own store or an smdebug out_dir.

An out_dir of a job that has not written its first step yet (empty, or holding only smdebug's `collections/`)
gets a PendingSource: it keeps looking at every refresh and hands over to the format's own source as soon as
data appears, so a trial made before the job's first step sees the steps that come after.
"""

from __future__ import annotations

import numpy as np

from tensortap.format import layout
from tensortap.format.native import NativeSource
from tensortap.format.smdebug import SmdebugSource, has_smdebug_data, is_smdebug_out_dir
from tensortap.format.source import Source
from tensortap.storage.base import Storage

__all__ = ["PendingSource", "open_source"]

RangeSteps = tuple[int | None, int | None] | None


def _has_native_data(storage: Storage) -> bool:
    """A tensortap hook has claimed or written a worker folder (a stop request in `tensortap/control/`, which a
    rule may write into any out_dir, is not data)."""
    control = layout.ROOT + "/control/"
    return any(not k.startswith(control) for k in storage.list(layout.ROOT + "/"))


def _detect(storage: Storage, range_steps: RangeSteps) -> Source | None:
    """The source of the format the out_dir's data is in, None while it holds no step data."""
    if _has_native_data(storage):
        return NativeSource(storage, range_steps)
    if has_smdebug_data(storage):
        return SmdebugSource(storage, range_steps)
    return None


def open_source(storage: Storage, range_steps: RangeSteps = None) -> Source:
    """The source for the out_dir in `storage`: the format's own, or a PendingSource until data appears."""
    return _detect(storage, range_steps) or PendingSource(storage, range_steps)


class PendingSource(Source):
    """An out_dir with no step data yet. It returns no entries; `resolved()` is the format's source once the
    first data is there. smdebug's collection files written before that are read (collections, num_workers,
    workers) and the same SmdebugSource then goes on with the steps."""

    def __init__(self, storage: Storage, range_steps: RangeSteps = None):
        super().__init__()
        self.storage = storage
        self.range_steps = range_steps
        self._smdebug: SmdebugSource | None = None

    @property
    def location(self) -> str:
        return self.storage.url

    def resolved(self) -> Source:
        if _has_native_data(self.storage):
            return NativeSource(self.storage, self.range_steps)
        if has_smdebug_data(self.storage):
            return self._smdebug or SmdebugSource(self.storage, self.range_steps)
        return self

    def refresh(self) -> np.ndarray:
        if self._smdebug is None and is_smdebug_out_dir(self.storage):
            self._smdebug = SmdebugSource(self.storage, self.range_steps)
        if self._smdebug is not None:
            new = self._smdebug.refresh()  # collections only: there is no index file yet
            self.collections = self._smdebug.collections
            self.num_workers = self._smdebug.num_workers
            if len(new):  # index files appeared between resolved() and now: keep them for the handover
                self._smdebug._pending.append(new)
        return self.empty()

    def read_values(self, entries: np.ndarray) -> list[np.ndarray]:
        if len(entries):
            raise ValueError("a pending source has no entries to read")
        return []

    def listed_workers(self) -> list[str]:
        return self._smdebug.listed_workers() if self._smdebug is not None else []

    def training_ended(self) -> bool:
        return self._smdebug is not None and self._smdebug.training_ended()

    def complete_upto(self) -> float:
        return float("inf") if self.training_ended() else -1
