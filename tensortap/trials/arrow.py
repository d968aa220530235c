"""The export's Arrow schemas (docs/export.md, schema version 1) and the columns → Arrow table conversions.
Needs pyarrow (`pip install tensortap[export]`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tensortap.trials.columns import MODE_NAMES, STATISTICS, Scalars, Tensors

#: bumped on any change a reader could notice (a column removed, renamed or retyped); new columns keep it
SCHEMA_VERSION = 1

_STR = pa.dictionary(pa.int32(), pa.string())
#: the partition columns: in Trial.to_arrow() tables, and in the files' paths (never inside the files)
PARTITION_FIELDS = [pa.field("job", pa.string()), pa.field("worker", pa.string())]

SCALARS = pa.schema([
    pa.field("job", _STR), pa.field("worker", _STR),
    pa.field("mode", _STR), pa.field("mode_step", pa.int64()), pa.field("step", pa.int64()),
    pa.field("tensor", _STR), pa.field("collections", pa.list_(pa.string())),
    pa.field("statistic", _STR), pa.field("value", pa.float64()), pa.field("computed", pa.bool_()),
    pa.field("wall_time", pa.float64()),
])

TENSORS = pa.schema([
    pa.field("job", _STR), pa.field("worker", _STR),
    pa.field("mode", _STR), pa.field("mode_step", pa.int64()), pa.field("step", pa.int64()),
    pa.field("tensor", _STR), pa.field("collections", pa.list_(pa.string())),
    pa.field("dtype", pa.string()), pa.field("shape", pa.list_(pa.int64())),
    pa.field("values", pa.list_(pa.float64())),
    pa.field("store_path", pa.string()), pa.field("store_offset", pa.int64()),
    pa.field("store_length", pa.int64()), pa.field("store_crc32c", pa.int64()),
    pa.field("wall_time", pa.float64()),
])

EVENTS = pa.schema([
    pa.field("job", pa.string()),
    pa.field("event", pa.string()), pa.field("rule", pa.string()), pa.field("origin", pa.string()),
    pa.field("status", pa.string()), pa.field("step", pa.int64()), pa.field("tensor", pa.string()),
    pa.field("message", pa.string()), pa.field("time", pa.float64()),
])

TABLES = {"scalars": SCALARS, "tensors": TENSORS, "events": EVENTS}


def _meta(schema: pa.Schema, table: str) -> pa.Schema:
    return schema.with_metadata({"tensortap.export.schema": str(SCHEMA_VERSION), "tensortap.table": table})


def file_schema(table: str) -> pa.Schema:
    """The schema of the table's Parquet files: without the partition columns (they are in the paths)."""
    s = TABLES[table]
    drop = {"job", "worker"} if table != "events" else {"job"}
    return _meta(pa.schema([f for f in s if f.name not in drop]), table)


def _dict(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), pa.array(names, pa.string()))


def _modes(mode: np.ndarray) -> pa.DictionaryArray:
    # ModeKeys values 1..4 -> codes 0..3
    return _dict(mode.astype(np.int32) - 1, [MODE_NAMES[i] for i in (1, 2, 3, 4)])


def _collections(codes: np.ndarray, per_tensor: list[list[str]]) -> pa.Array:
    lists = pa.array(per_tensor, pa.list_(pa.string()))
    if not len(codes):
        return pa.array([], pa.list_(pa.string()))
    return lists.take(pa.array(codes.astype(np.int32, copy=False)))


def _wall(w: np.ndarray) -> pa.Array:
    return pa.array(w, pa.float64(), mask=np.isnan(w))


def scalars_table(s: Scalars, job: str, per_tensor: list[list[str]], with_partitions: bool = True) -> pa.Table:
    n = len(s)
    cols: dict[str, Any] = {}
    if with_partitions:
        cols["job"] = _dict(np.zeros(n, np.int32), [job])
        cols["worker"] = _dict(s.worker, s.workers)
    cols.update(
        mode=_modes(s.mode), mode_step=pa.array(s.mode_step, pa.int64()), step=pa.array(s.step, pa.int64()),
        tensor=_dict(s.tensor, s.tensors), collections=_collections(s.tensor, per_tensor),
        statistic=_dict(s.statistic, list(STATISTICS)), value=pa.array(s.value, pa.float64()),
        computed=pa.array(s.computed, pa.bool_()), wall_time=_wall(s.wall_time),
    )
    schema = SCALARS if with_partitions else file_schema("scalars")
    return pa.Table.from_pydict(cols, schema=_meta(schema, "scalars"))


def tensors_table(t: Tensors, job: str, per_tensor: list[list[str]], with_partitions: bool = True) -> pa.Table:
    n = len(t)
    cols: dict[str, Any] = {}
    if with_partitions:
        cols["job"] = _dict(np.zeros(n, np.int32), [job])
        cols["worker"] = _dict(t.worker, t.workers)
    ptr = t.pointer
    cols.update(
        mode=_modes(t.mode), mode_step=pa.array(t.mode_step, pa.int64()), step=pa.array(t.step, pa.int64()),
        tensor=_dict(t.tensor, t.tensors), collections=_collections(t.tensor, per_tensor),
        dtype=pa.array(t.dtype, pa.string()), shape=pa.array([list(s) for s in t.shape], pa.list_(pa.int64())),
        values=_values(t.values),
        store_path=pa.array([p[0] if p else None for p in ptr], pa.string()),
        store_offset=pa.array([p[1] if p else None for p in ptr], pa.int64()),
        store_length=pa.array([p[2] if p else None for p in ptr], pa.int64()),
        store_crc32c=pa.array([p[3] if p else None for p in ptr], pa.int64()),
        wall_time=_wall(t.wall_time),
    )
    schema = TENSORS if with_partitions else file_schema("tensors")
    return pa.Table.from_pydict(cols, schema=_meta(schema, "tensors"))


def _values(values: list[np.ndarray | None]) -> pa.Array:
    """A list<float64> column from the flat element arrays (None: a null list), without a Python loop per element."""
    lens = np.array([0 if v is None else len(v) for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    flat = np.concatenate([v for v in values if v is not None]) if lens.any() else np.empty(0)
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.float64()), mask=mask)


def events_table(rows: list[dict[str, Any]], with_partitions: bool = True) -> pa.Table:
    schema = EVENTS if with_partitions else file_schema("events")
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=_meta(schema, "events"))
