"""DTensors (FSDP2's `fully_shard`, `distribute_module`, tensor parallelism): each worker saves its local shard
under the tensor's name, and its placement (docs/format.md §10) so that a trial assembles the full tensor.

A DTensor is a wrapper with no storage of its own (`data_ptr()` is 0): every capture path takes `to_local()`
first.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

# The DTensor class, once `torch.distributed.tensor` has been imported. It is looked up there rather than imported:
# that import costs ~0.5 s and ~40 MB (it brings sympy), and a job that never imported it has no DTensor (FSDP2,
# `distribute_module` and tensor parallelism import it before they make one).
_DTensor: type | None = None


def _dtensor_class() -> type | None:
    global _DTensor
    module = sys.modules.get("torch.distributed.tensor")
    _DTensor = getattr(module, "DTensor", None)  # (None while the package is still being imported)
    return _DTensor


def is_dtensor(t: Any) -> bool:
    cls = _DTensor or _dtensor_class()
    return cls is not None and isinstance(t, cls)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor's own data on this worker (`t` itself when it is not a DTensor), detached."""
    if is_dtensor(t):
        return t.to_local().detach()
    return t.detach()


def shard_meta(t: Any) -> dict[str, Any] | None:
    """Where this worker's local shard of DTensor `t` lies in the full tensor (docs/format.md §10); None for a
    tensor that is not a DTensor. `partial`: the full tensor is the sum of the workers' local values."""
    if not is_dtensor(t):
        return None
    placements = tuple(t.placements)
    global_shape = [int(s) for s in t.shape]
    offset: list[int] | None = None
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _shape, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh, placements)
        offset = [int(o) for o in off]
    except Exception:  # noqa: BLE001 - the private helper moved: the public chunk list of checkpointing
        chunks = t.__create_chunk_list__()
        offset = [int(o) for o in chunks[0].offsets]
    return {
        "global_shape": global_shape,
        "offset": offset,
        "local_shape": [int(s) for s in t.to_local().shape],
        "placements": [str(p) for p in placements],
        "partial": any(p.is_partial() for p in placements),
        "mesh_shape": [int(s) for s in t.device_mesh.shape],
    }
