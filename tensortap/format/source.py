"""What a trial reads from: a Source turns some stored job (native store, smdebug out_dir) into entries."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tensortap.format.entries import ENTRY_DTYPE


class Damage(NamedTuple):
    """Corrupt stored bytes a reader skipped: the file, the byte offset, and why (docs/format.md §5.1)."""

    path: str
    offset: int
    reason: str


@dataclass
class CollectionInfo:
    """A collection as a reader sees it: the names it holds, its regexes and its saved configuration."""

    name: str
    tensor_names: set[str] = field(default_factory=set)
    include_regex: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the writer's Collection.to_json_dict()


class Source(ABC):
    """Append-only view of a stored job. Tables only grow; ids into them stay valid forever.

    `names`, `workers`, `dtypes` (numpy dtypes) and `shapes` (tuples) are the tables the entries' ids
    point into. `refresh()` returns only entries not returned before, and updates the metadata:
    `collections`, `num_workers` (None if unknown yet), `ended_workers` (workers that closed
    cleanly), and `passed_step[worker]`: the last global step the worker has finished (it will
    write nothing more for any step <= it). `damage` lists the corrupt places skipped so far (each once).
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

    def training_ended(self) -> bool:
        """True once every expected worker has closed."""
        if self.num_workers is None:
            return False
        return len(self.ended_workers) >= self.num_workers

    @staticmethod
    def empty() -> np.ndarray:
        return np.empty(0, dtype=ENTRY_DTYPE)
