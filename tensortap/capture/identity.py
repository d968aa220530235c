"""A worker's identity: its rank, the world size, its name, and its claim on its folder in out_dir.

A hook learns its rank from the caller, the launcher's environment (torchrun, MPI, SLURM) or its framework's
own source (a torch process group, Horovod, XGBoost's collective). That source may start after the hook was
made: then the identity is adopted once, before the first step and before anything was handed to the writer,
and the worker's folder is claimed after that (docs/format.md §1). `StepEngine.settle_identity` does both.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.format import layout
from tensortap.storage import open_storage

_RANK_VARS = (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))

#: a framework's own source of (rank, world size), None while it does not know them
IdentitySource = Callable[[], "tuple[int, int] | None"]


def rank_in_env() -> tuple[int, int] | None:
    """(rank, world size) if the launcher's environment (torchrun, MPI, SLURM) gives them, else None."""
    for r, w in _RANK_VARS:
        if r in os.environ and w in os.environ:
            try:
                return int(os.environ[r]), int(os.environ[w])
            except ValueError:
                pass
    return None


@dataclass
class WorkerIdentity:
    """Who this process writes as. `given`: the caller named the rank (never adopted from elsewhere);
    `named`: the caller named the worker (its name does not follow the rank)."""

    rank: int
    world_size: int
    worker: str
    include_workers: str  # "one": rank 0 writes; "all": every rank writes
    given: bool = False
    named: bool = False
    writes: bool = True  # whether this process writes anything
    num_workers: int = field(init=False, default=1)  # the workers whose data the job's readers wait for

    def __post_init__(self) -> None:
        self.writes = self.include_workers == "all" or self.rank == 0
        self.num_workers = self.world_size if self.include_workers == "all" else 1

    def adopt(self, rank: int, world_size: int) -> str | None:
        """Take (rank, world size) found late; a reason when they cannot be taken (None when taken)."""
        if not 0 <= rank < max(world_size, 1):
            return f"rank {rank} is not in [0, {world_size})"
        self.rank, self.world_size = rank, world_size
        if not self.named:
            self.worker = f"worker_{rank}"
        self.writes = self.include_workers == "all" or rank == 0
        self.num_workers = world_size if self.include_workers == "all" else 1
        return None


def claim_worker_dir(out_dir: str, worker: str) -> tuple[Any, int]:
    """Claim `worker`'s folder in `out_dir` for this job, atomically (docs/format.md §1): a second job given the
    same out_dir and worker gets a clear InvalidConfiguration here instead of interleaving its data. Returns the
    storage and the writer's first chunk number (the claim keeps every other writer out of the folder)."""
    storage = open_storage(out_dir)
    keys = storage.list(layout.worker_dir(worker) + "/")
    for key in keys:
        if key.endswith(layout.INDEX_SUFFIX):
            raise InvalidConfiguration(f"out_dir {out_dir!r} already holds data of {worker}: "
                                       "use a new out_dir for every training job")
    claim = json.dumps({"pid": os.getpid(), "host": platform.node(), "time": time.time()}).encode()
    try:
        claimed = storage.create_exclusive(layout.claim_key(worker), claim)
    except OSError as e:
        raise InvalidConfiguration(f"out_dir {out_dir!r} cannot be written: {e}") from None
    if not claimed:
        raise InvalidConfiguration(
            f"out_dir {out_dir!r} is already used by another job writing {worker} "
            f"({storage.describe(layout.claim_key(worker))}): use a new out_dir for every training job"
        )
    return storage, max((p[1] for k in keys if (p := layout.parse_chunk_key(k))), default=-1) + 1


def resolve_identity(rank: int | None, world_size: int | None, worker: str | None, include_workers: str,
                     source: IdentitySource | None) -> tuple[WorkerIdentity, bool]:
    """Who a new hook writes as: the caller's rank, else the framework's `source`, else the launcher's environment,
    else rank 0 of 1; and whether the source may still tell it later (then it is asked again at the first step)."""
    given = rank is not None or world_size is not None
    found = source() if not given and source is not None else None
    if found is not None:
        rank, world_size = found
    env = rank_in_env()
    env_rank, env_world = env if env is not None else (0, 1)
    rank = env_rank if rank is None else int(rank)
    world_size = env_world if world_size is None else int(world_size)
    if not 0 <= rank < max(world_size, 1):
        raise InvalidConfiguration(f"rank={rank} is not in [0, world_size={world_size})")
    identity = WorkerIdentity(rank, world_size, worker or f"worker_{rank}", include_workers, given=given,
                              named=worker is not None)
    return identity, not given and found is None and source is not None and env is None
