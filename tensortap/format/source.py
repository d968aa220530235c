"""What a trial reads from: a Source turns some stored job (native store, smdebug out_dir) into entries."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tensortap.format.entries import ENTRY_DTYPE


class Damage(NamedTuple):
    """Corrupt stored bytes a reader skipped: the file, the byte offset, why, and what was lost with them in
    words (docs/format.md §5.1; "" until the reader knows, e.g. "steps 4–6 of worker worker_0 lost")."""

    path: str
    offset: int
    reason: str
    lost: str = ""


class LostSteps(NamedTuple):
    """Global steps lo..hi (hi None: every step after lo - 1) of `worker` whose records were in damaged index
    bytes: `damage` says where."""

    worker: str
    lo: int
    hi: int | None
    damage: Damage


@dataclass
class CollectionInfo:
    """A collection as a reader sees it: the names it holds, its regexes and its saved configuration."""

    name: str
    tensor_names: set[str] = field(default_factory=set)
    include_regex: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the writer's Collection.to_json_dict()

    def include(self, regex: str | list[str]) -> None:
        """Add a regex (or a list of them) to the collection, as smdebug's Collection.include does."""
        if isinstance(regex, list | tuple):
            for r in regex:
                self.include(r)
        elif isinstance(regex, str):
            self.include_regex.append(regex)
        else:
            raise TypeError(f"include() takes a str or a list of str, got {type(regex).__name__}")

    def add_tensor_name(self, name: str) -> None:
        self.tensor_names.add(name)

    def remove_tensor_name(self, name: str) -> None:
        self.tensor_names.discard(name)

    def has_tensor_name(self, name: str) -> bool:
        return name in self.tensor_names


class Source(ABC):
    """Append-only view of a stored job. Tables only grow; ids into them stay valid forever.

    `names`, `workers`, `dtypes` (numpy dtypes) and `shapes` (tuples) are the tables the entries' ids
    point into. `refresh()` returns only entries not returned before, and updates the metadata:
    `collections`, `num_workers` (None if unknown yet), `ended_workers` (workers that closed
    cleanly), and `passed_step[worker]`: the last global step the worker has finished (it will
    write nothing more for any step <= it). `damage` lists the corrupt places skipped so far (each once), and
    `lost_steps` the steps whose records were in them, where the reader knows.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.workers: list[str] = []
        self.dtypes: list[np.dtype] = []
        self.shapes: list[tuple[int, ...]] = []
        self.collections: dict[str, CollectionInfo] = {}
        self.num_workers: int | None = None
        self.ended_workers: set[str] = set()
        self.passed_step: dict[str, int] = {}
        self.damage: list[Damage] = []
        self.lost_steps: list[LostSteps] = []

    @property
    @abstractmethod
    def location(self) -> str:
        """The path or URL this source reads."""

    @abstractmethod
    def refresh(self) -> np.ndarray:
        """New entries (ENTRY_DTYPE) since the last call; reads only what it has not read before."""

    @abstractmethod
    def read_values(self, entries: np.ndarray) -> list[np.ndarray]:
        """The decoded payloads of `entries`, in order; reads each file range at most once per call.

        Raises CorruptData naming the file and offset for a payload that fails its check.
        """

    def lost_at(self, step: int) -> LostSteps | None:
        """The damage that cost global `step` its records, None if none did (as far as the reader knows)."""
        for lost in self.lost_steps:
            if lost.lo <= step and (lost.hi is None or step <= lost.hi):
                return lost
        return None

    def training_ended(self) -> bool:
        """True once every expected worker has closed."""
        if self.num_workers is None:
            return False
        return len(self.ended_workers) >= self.num_workers

    def writers_gone(self) -> bool:
        """True when every worker that has not closed is known to be gone without closing (its process was
        killed): nothing more will come. False when that cannot be known (the default)."""
        return False

    def resolved(self) -> Source:
        """The source to read from now: itself, or (for a job whose format is not known yet) the source of
        the format its first data turned out to be."""
        return self

    def listed_workers(self) -> list[str]:
        """The workers a trial lists (`Trial.workers()`)."""
        return list(self.workers)

    # Step completeness (docs/format.md, "Step completeness"): tensortap's own rule. A source whose format
    # has another rule (smdebug out_dirs) overrides both methods.
    def complete_upto(self) -> float:
        """Every global step <= this is complete (every worker finished it); -1 if none, inf once ended."""
        if self.training_ended():
            return float("inf")
        nw = self.num_workers
        if nw is None or len(self.workers) < nw:
            return -1
        return min(float("inf") if w in self.ended_workers else self.passed_step.get(w, -1) for w in self.workers)

    def all_workers_passed(self, step: int, mode_name: str | None) -> bool:
        """Every worker has finished global `step` (mode_name None), or mode step `step` of `mode_name`."""
        nw = self.num_workers
        if nw is None or len(self.workers) < nw:
            return False
        for w in self.workers:
            if w in self.ended_workers:
                continue
            if mode_name is None:
                if self.passed_step.get(w, -1) < step:
                    return False
            elif getattr(self, "passed_mode_step", {}).get(w, {}).get(mode_name, -1) < step:
                return False
        return True

    @staticmethod
    def empty() -> np.ndarray:
        return np.empty(0, dtype=ENTRY_DTYPE)
