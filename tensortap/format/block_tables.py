"""A block's tables (names, dtypes, shapes, packed statistics layouts) and the entry templates of batch layouts.

The encoder (`tensortap.format.writer.ChunkEncoder`) fills an index block's entries against these tables
(docs/format.md §3); `BlockTables.to_header()` is the block header's part that names them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.format.entries import INLINE_BYTES, is_packed

__all__ = ["BatchTemplate", "BlockTables", "byte_view", "record_keys"]


def byte_view(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a 1-d uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


class BatchTemplate:
    """Entries of a batch layout (names, shapes, dtypes): what does not change from block to block, and the ids
    of its names, dtypes and shapes in one block's tables (`bind`)."""

    __slots__ = ("rows", "lengths", "total", "spans", "rel", "outline", "inline", "runs", "names", "dtypes",
                 "shapes", "tables")

    def __init__(self, rows: np.ndarray, lengths: list[int], runs: list[tuple[int, int]], names: tuple[str, ...],
                 dtypes: list[str], shapes: list[tuple[int, ...]]):
        self.rows = rows  # kind, reduction, flags and length filled in; name, dtype and shape by `bind`
        self.names = names
        self.dtypes = dtypes
        self.shapes = shapes
        self.tables: BlockTables | None = None  # the tables that `rows`' ids point into
        self.lengths = lengths
        self.total = sum(lengths)
        self.spans: list[tuple[int, int]] = []  # of each payload in the batch's flat bytes
        pos = 0
        for n in lengths:
            self.spans.append((pos, pos + n))
            pos += n
        # positions of the payloads written to the data file, and of those stored inline
        self.outline = [i for i, n in enumerate(lengths) if n > INLINE_BYTES]
        self.inline = [i for i, n in enumerate(lengths) if n <= INLINE_BYTES]
        # offsets of those payloads relative to the batch's first written byte
        rel = np.zeros(len(self.outline), dtype=np.uint64)
        pos = 0
        for j, i in enumerate(self.outline):
            rel[j] = pos
            pos += lengths[i]
        self.rel = rel
        self.runs = runs  # (first, end) positions of runs of consecutive written payloads

    def bind(self, tables: BlockTables) -> None:
        """Point the entries' name, dtype and shape ids into `tables` (those of the block being built)."""
        rows = self.rows
        table_id = tables._id
        rows["name"] = [table_id(tables.names, n) for n in self.names]
        rows["dtype"] = [table_id(tables.dtypes, d) for d in self.dtypes]
        rows["shape"] = [table_id(tables.shapes, s) for s in self.shapes]
        self.tables = tables


_KEY_DTYPE = np.dtype([("packed", "u1"), ("name", "<u4"), ("mode", "u1"), ("step", "<i8")])


def record_keys(rows: np.ndarray) -> np.ndarray:
    """Per entry, the record it belongs to: (name, mode, step), a packed entry's (its layout, mode, step) apart."""
    k = np.empty(len(rows), dtype=_KEY_DTYPE)
    k["packed"] = is_packed(rows["kind"])
    for f in ("name", "mode", "step"):
        k[f] = rows[f]
    return k


class BlockTables:
    """Block-local tables of names, dtypes and shapes."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.dtypes: dict[str, int] = {}
        self.shapes: dict[tuple[int, ...], int] = {}
        #: packed statistics layouts the block refers to (docs/format.md §3.3), by their payload's offset in the
        #: data file: (their id in the block, [offset, length, crc], tensors per packed entry)
        self.statistics: dict[int, tuple[int, list[int], int]] = {}

    @staticmethod
    def _id(table: dict, key: Any) -> int:
        i = table.get(key)
        if i is None:
            i = table[key] = len(table)
        return i

    def to_header(self) -> dict[str, Any]:
        header = {"names": list(self.names), "dtypes": list(self.dtypes), "shapes": [list(s) for s in self.shapes]}
        if self.statistics:
            header["statistics"] = [ref for _, ref, _ in sorted(self.statistics.values(), key=lambda v: v[0])]
        return header

    def records_of(self, rows: np.ndarray) -> int:
        """How many records entries hold: one per (name, mode, step), a packed entry one per tensor it packs."""
        if not len(rows):
            return 0
        packed = is_packed(rows["kind"])
        if not packed.any():
            return len(np.unique(record_keys(rows)))
        per_layout = np.zeros(len(self.statistics), dtype=np.int64)
        for i, _, n in self.statistics.values():
            per_layout[i] = n
        rest = rows[~packed]
        return (len(np.unique(record_keys(rest))) if len(rest) else 0) + int(
            per_layout[rows["name"][packed]].sum())
