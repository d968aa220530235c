"""Trials: query the saved data of a training job (`create_trial`)."""

from __future__ import annotations

import os

from tensortap.trials.state import StepState
from tensortap.trials.tensor import Tensor
from tensortap.trials.trial import LocalTrial, S3Trial, Trial

__all__ = ["create_trial", "Trial", "LocalTrial", "S3Trial", "Tensor", "StepState"]


def create_trial(
    path: str,
    name: str | None = None,
    range_steps: tuple[int | None, int | None] | None = None,
    *,
    refresh_interval: float = 0.05,
    **kwargs: object,
) -> Trial:
    """A Trial over the job saved at `path` (local dir or s3://...): tensortap's own store or an
    smdebug out_dir, detected from the first data written (until then the trial keeps looking).
    `range_steps=(begin, end)` keeps global steps in [begin, end). Returns an S3Trial for s3:// URLs,
    else a LocalTrial (both are Trials)."""
    from tensortap.exceptions import InvalidConfiguration
    from tensortap.storage import open_storage

    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise InvalidConfiguration(f"path={path!r} must be a directory or s3:// URL")
    path = str(path).strip()
    for k in kwargs:
        if k not in ("parallel", "check", "index_mode", "cache", "profiler", "output_dir"):
            raise InvalidConfiguration(f"create_trial() got an unknown argument {k!r}")
    if range_steps is not None:
        if (
            not isinstance(range_steps, tuple | list)
            or len(range_steps) != 2
            or any(x is not None and (not isinstance(x, int) or x < 0) for x in range_steps)
            or (range_steps[0] is not None and range_steps[1] is not None and range_steps[0] >= range_steps[1])
        ):
            raise InvalidConfiguration(
                f"range_steps={range_steps!r} must be (begin, end) of non-negative ints or None with begin < end"
            )
        range_steps = tuple(range_steps)
    storage = open_storage(path)
    if name is None:
        name = os.path.basename(path.rstrip("/")) or path
    cls = S3Trial if path.startswith("s3://") else LocalTrial
    return cls.from_storage(storage, name, range_steps, refresh_interval=refresh_interval)
