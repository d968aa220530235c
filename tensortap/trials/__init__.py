"""Trials: query the saved data of a training job (`create_trial`)."""

from __future__ import annotations

import os

from tensortap.trials.state import StepState
from tensortap.trials.tensor import Tensor
from tensortap.trials.trial import LocalTrial, S3Trial, Trial

__all__ = ["create_trial", "read_statistics", "Trial", "LocalTrial", "S3Trial", "Tensor", "StepState"]


def read_statistics(path: str, stats=None, *, names=None, steps=None, mode="GLOBAL", worker=None,  # type: ignore[no-untyped-def]
                    dtype=None):
    """Every saved statistic of the job at `path` (or a selection), read whole without a trial, each in the dtype
    it was saved as unless `dtype` says otherwise (see `tensortap.trials.saved_statistics.read_statistics`)."""
    from tensortap.trials.saved_statistics import read_statistics as _read

    return _read(path, stats, names=names, steps=steps, mode=mode, worker=worker, dtype=dtype)

#: top-level entries a job's out_dir may hold before its hook has written anything: what tensortap's
#: runner writes beside the job (rule statuses) and its control files
_NOT_STARTED_OK = ("rules", "tensortap", "incidents")
#: top-level entries of the stores a trial reads (tensortap's own, smdebug's)
_STORE_ENTRIES = ("tensortap", "index", "events", "collections")


def _check_out_dir(storage: object, path: str) -> None:
    """Refuse a local path that cannot be a job's out_dir: missing, a file, or a folder of other things."""
    from tensortap.exceptions import InvalidConfiguration
    from tensortap.storage import LocalStorage

    if not isinstance(storage, LocalStorage):
        return  # an object-store prefix with no objects is a job that has not written yet
    root = storage.root
    if not os.path.exists(root):
        raise InvalidConfiguration(
            f"create_trial: {path!r} does not exist; expected the out_dir of a training job (a directory, "
            "or s3://bucket/prefix). For a job that has not started yet, create the directory first."
        )
    if not os.path.isdir(root):
        raise InvalidConfiguration(
            f"create_trial: {path!r} is a file; expected the out_dir of a training job (a directory)"
        )
    try:
        entries = os.listdir(root)
    except OSError as e:
        raise InvalidConfiguration(f"create_trial: {path!r} cannot be read: {e}") from None
    if any(e in _STORE_ENTRIES for e in entries) or all(e in _NOT_STARTED_OK for e in entries):
        return
    shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
    raise InvalidConfiguration(
        f"create_trial: {path!r} holds no training job data (it has {shown}); expected a tensortap "
        "out_dir (a tensortap/ folder) or an smdebug out_dir (index/, events/, collections/), or an empty "
        "directory for a job that has not started yet"
    )


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
    else a LocalTrial (both are Trials).

    `path` must be an existing directory (or an s3:// prefix). An empty one (or one holding only what
    tensortap's runner writes beside a job: `rules/`) is a job that has not started yet: the trial shows
    no steps and `wait_for_steps` waits for them (docs/format.md §5.2). A missing path, a plain file or a
    directory of other things raises InvalidConfiguration naming the path."""
    from tensortap.exceptions import InvalidConfiguration
    from tensortap.storage import open_storage

    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise InvalidConfiguration(f"path={path!r} must be a directory or s3:// URL")
    path = str(path).strip()
    if name is not None and not isinstance(name, str):
        raise InvalidConfiguration(f"create_trial: name={name!r} must be a str or None")
    if isinstance(refresh_interval, bool) or not isinstance(refresh_interval, int | float) or not (
            0 <= refresh_interval < float("inf")):
        raise InvalidConfiguration(
            f"create_trial: refresh_interval={refresh_interval!r} must be a non-negative number of seconds")
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
    from tensortap.format.live import settle

    settle(path)  # (a hook of this process writing `path`: what it was handed is readable first)
    try:
        storage = open_storage(path)
    except ValueError as e:
        raise InvalidConfiguration(f"create_trial: path={path!r}: {e}") from None
    _check_out_dir(storage, path)
    if name is None:
        name = os.path.basename(path.rstrip("/")) or path
    cls = S3Trial if path.startswith("s3://") else LocalTrial
    return cls.from_storage(storage, name, range_steps, refresh_interval=refresh_interval)
