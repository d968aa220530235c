"""Saved jobs as Parquet/Arrow tables that DuckDB, Polars, Spark and pandas read directly (docs/export.md).

`export(out_dirs, dest)` writes them (what `tensortap export` runs); `Trial.to_arrow()` gives one job's tables in
memory. Needs pyarrow (`pip install tensortap[export]`); importing this package does not import it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["export"]


def export(out_dirs: Any, dest: str, **kwargs: Any) -> dict[str, Any]:
    """Export jobs (out_dirs, local or s3://) into `dest` (local or s3://), appending only what is new since the
    last export into the same `dest`. See `tensortap.export.writer.export`."""
    from tensortap.export.writer import export as _export

    return _export(out_dirs, dest, **kwargs)
