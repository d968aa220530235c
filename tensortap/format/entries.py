"""The in-memory index entry every source (native store, smdebug out_dir) produces for the trial.

One entry = one saved thing: a raw tensor, one reduction of a tensor, or a shape alone, for one
(name, global step, mode, mode step, worker). Entries are numpy structured arrays so that a trial of
millions of entries is indexed and queried with vectorised numpy, not Python objects.
"""

from __future__ import annotations

import numpy as np

# kind
RAW = 0
REDUCTION = 1
SHAPE = 2
#: (index files only, docs/format.md §3.3) the statistics of several tensors at one step, packed in one payload;
#: readers expand it into one REDUCTION entry per value
PACKED = 3
#: (index files only, docs/format.md §3.3) packed statistics whose all-zero dtype runs are left out of the payload:
#: the entry's `shape` field is the mask of the layout's runs present
PACKED_SPARSE = 4


def is_packed(kind: np.ndarray) -> np.ndarray:
    """Per index-file entry kind: a packed statistics entry (kind 3 or 4)?"""
    return (kind == PACKED) | (kind == PACKED_SPARSE)

# Reduction codes; ABS_FLAG is or-ed in for abs_ reductions (abs_mean = MEAN | ABS_FLAG).
# (append only: a reduction's code is its position; docs/format.md §3.2)
REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod", "median", "l1", "l2", "nonfinite", "zeros", "l4")
NORMS = ("l1", "l2", "l4")
REDUCTION_CODE = {name: i for i, name in enumerate(REDUCTIONS)}
ABS_FLAG = 0x80
NO_REDUCTION = 0xFF

INLINE_BYTES = 16  # payloads up to this size live in the index entry itself
INLINE_CHUNK = 0xFFFFFFFF  # `chunk` value of an entry whose payload is inline

ENTRY_DTYPE = np.dtype(
    [
        ("name", "<u4"),  # id into Source.names
        ("worker", "<u2"),  # id into Source.workers
        ("mode", "u1"),  # ModeKeys value
        ("kind", "u1"),  # RAW / REDUCTION / SHAPE
        ("reduction", "u1"),  # REDUCTION_CODE | ABS_FLAG, NO_REDUCTION otherwise
        ("dtype", "<u2"),  # id into Source.dtypes (payload dtype)
        ("shape", "<u4"),  # id into Source.shapes (the tensor's shape; a reduction's own value is a scalar)
        ("step", "<i8"),  # global step
        ("mode_step", "<i8"),
        ("chunk", "<u4"),  # id of the file holding the payload (source-specific), INLINE_CHUNK if inline
        ("offset", "<u8"),
        ("length", "<u8"),  # payload bytes
        ("crc", "<u4"),  # CRC32C of the payload (0 where the source has none)
        ("inline", f"V{INLINE_BYTES}"),  # the payload itself when chunk == INLINE_CHUNK
    ]
)


def reduction_code(name: str, abs: bool = False) -> int:
    """Code of reduction `name` (`l1`/`l2` also as `l1_norm`), with the abs flag."""
    base = name[: -len("_norm")] if name.endswith("_norm") else name
    if base not in REDUCTION_CODE:
        raise ValueError(f"unknown reduction {name!r}: allowed are {', '.join(REDUCTIONS)}")
    return REDUCTION_CODE[base] | (ABS_FLAG if abs else 0)


def reduction_name(code: int) -> tuple[str, bool]:
    """(name, abs) of a reduction code."""
    code = int(code)
    return REDUCTIONS[code & 0x7F], bool(code & ABS_FLAG)


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """Entry arrays joined into one, moved as bytes (numpy's concatenate copies a packed structured dtype field
    by field: tens of times slower for millions of entries)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.empty(0, dtype=ENTRY_DTYPE)
    if len(parts) == 1:
        return parts[0]
    rows = [np.ascontiguousarray(p).view(np.uint8).reshape(len(p), -1) for p in parts]
    return np.concatenate(rows).view(ENTRY_DTYPE).reshape(-1)
