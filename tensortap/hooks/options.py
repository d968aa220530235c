"""What a hook is given, checked: the constructor's arguments, the environment's settings (TENSORTAP_DISABLE,
TENSORTAP_WRITER, TENSORTAP_FLUSH_INTERVAL, TENSORTAP_STOP_CHECK_INTERVAL) and `tensortap run`'s hook config.
Every bad value is one clear InvalidConfiguration naming it and what is allowed, at construction time.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterable
from typing import Any

from tensortap.capture.identity import rank_in_env
from tensortap.collection import Collection
from tensortap.config import ReductionConfig
from tensortap.exceptions import InvalidConfiguration
from tensortap.storage import is_remote

__all__ = ["check_arguments", "check_out_dir", "default_writer", "disabled_by_env", "rank_in_env", "runner_config",
           "tensorboard_dir_of"]

DISABLE_ENV = "TENSORTAP_DISABLE"
INCLUDE_WORKERS = ("one", "all")
WRITERS = ("auto", "thread", "process")
#: seconds between looks for a stop request at step boundaries (a stat of a local file, and a step that takes the
#: hook's full path), and between polls of an object store's (one HEAD, on a background thread); they bound the
#: stop's share of the latency from a rule's verdict to training stopped. `tensortap run` with live rules sets
#: TENSORTAP_STOP_CHECK_INTERVAL=0.05.
def _stop_check_interval() -> float:
    try:
        value = float(os.environ.get("TENSORTAP_STOP_CHECK_INTERVAL", "") or 1.0)
    except ValueError:
        value = 1.0  # (a bad value must not stop tensortap from importing: the default)
    return value if 0 < value <= 60 else 1.0


STOP_CHECK_INTERVAL = _stop_check_interval()
STOP_POLL_INTERVAL = min(0.5, STOP_CHECK_INTERVAL * 10)


def default_writer(out_dir: str) -> str:
    """What writer="auto" means for `out_dir`: TENSORTAP_WRITER if set, else "process" for a local out_dir
    on Linux where the ring's counters are ordered (C release/acquire atomics built, or x86-64; see
    docs/transport.md), else "thread" (other platforms, object stores)."""
    env = os.environ.get("TENSORTAP_WRITER", "").strip().lower()
    if env in ("thread", "process"):
        return env
    if env not in ("", "auto"):
        raise InvalidConfiguration(f"TENSORTAP_WRITER={env!r}: allowed are 'auto', 'thread' and 'process'")
    if sys.platform.startswith("linux") and not is_remote(out_dir) and ring_is_ordered():
        return "process"
    return "thread"


def ring_is_ordered() -> bool:
    from tensortap.transport.copy import ORDERED

    return ORDERED


_SYSTEM_DIRS = ("/proc", "/sys", "/dev")


def check_out_dir(out_dir: Any) -> str:
    """`out_dir` as a string, or InvalidConfiguration naming what is wrong with it: not a path, a NUL in it, a
    system folder, an existing file, or a path under a file. (Whether it can be written is found when the hook
    claims it.)"""
    if isinstance(out_dir, os.PathLike):
        out_dir = os.fspath(out_dir)
    if not isinstance(out_dir, str) or not out_dir.strip():
        raise InvalidConfiguration(f"out_dir={out_dir!r}: give a local directory or an s3://bucket/prefix")
    if "\0" in out_dir:
        raise InvalidConfiguration(f"out_dir={out_dir!r} contains a NUL character")
    if is_remote(out_dir):
        return out_dir
    path = os.path.abspath(os.path.expanduser(out_dir))
    if any(path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS):
        raise InvalidConfiguration(f"out_dir={out_dir!r} is inside a system folder ({path}): give a directory "
                                   "for the job's data")
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(probe) and not os.path.isdir(probe):
        where = "is a file" if probe == path else f"is under a file ({probe})"
        raise InvalidConfiguration(f"out_dir={out_dir!r} {where}: give a directory for the job's data")
    return out_dir


def tensorboard_dir_of(out_dir: str, export: bool, tensorboard_dir: Any) -> str | None:
    """The local folder of a hook's TensorBoard export: `tensorboard_dir`, else `<out_dir>/tensorboard` when
    `export` (event files are written locally; an s3:// job exports to a local folder or is converted later)."""
    if tensorboard_dir is None or tensorboard_dir == "":
        if not export:
            return None
        if is_remote(out_dir):
            raise InvalidConfiguration(f"export_tensorboard=True with out_dir={out_dir!r}: TensorBoard files are "
                                       "written locally; give tensorboard_dir= a local folder, or convert the job "
                                       "later with `tensortap tensorboard`")
        return os.path.abspath(os.path.join(os.path.expanduser(out_dir), "tensorboard"))
    if not isinstance(tensorboard_dir, str | os.PathLike):
        raise InvalidConfiguration(f"tensorboard_dir={tensorboard_dir!r} must be a local folder")
    tensorboard_dir = os.fspath(tensorboard_dir)
    if is_remote(tensorboard_dir):
        raise InvalidConfiguration(f"tensorboard_dir={tensorboard_dir!r}: TensorBoard files are written locally; "
                                   "give a local folder (convert an s3:// job with `tensortap tensorboard`)")
    return os.path.abspath(os.path.expanduser(tensorboard_dir))


def flush_interval_from_env() -> float:
    """Seconds between the writer's index blocks: TENSORTAP_FLUSH_INTERVAL (`tensortap run` sets 0.1 when rules
    watch the job live), else 0.5."""
    raw = os.environ.get("TENSORTAP_FLUSH_INTERVAL", "").strip()
    if not raw:
        return 0.5
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidConfiguration(f"TENSORTAP_FLUSH_INTERVAL={raw!r} must be a positive number of seconds")
    return value


def disabled_by_env() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_arguments(*, dry_run: Any, save_all: Any, export_tensorboard: Any, include_workers: Any,
                    reduction_config: Any, include_regex: Any, include_collections: Any, worker: Any, rank: Any,
                    world_size: Any, tensorboard_dir: Any, flush_interval: Any, chunk_bytes: Any,
                    max_pending_bytes: Any, backpressure: Any, writer: Any) -> float:
    """InvalidConfiguration naming the first bad argument of a hook; the flush interval (the environment's when
    None)."""
    for flag_name, flag in (("dry_run", dry_run), ("save_all", save_all), ("export_tensorboard", export_tensorboard)):
        if not isinstance(flag, bool):
            raise InvalidConfiguration(f"{flag_name}={flag!r} must be True or False")
    if include_workers not in INCLUDE_WORKERS:
        raise InvalidConfiguration(f"include_workers={include_workers!r}: allowed are 'one' and 'all'")
    if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
        raise InvalidConfiguration(f"reduction_config={reduction_config!r} must be a tensortap.ReductionConfig or None")
    if include_regex is not None and not isinstance(include_regex, str) and not (
            isinstance(include_regex, Iterable) and all(isinstance(r, str) for r in include_regex)):
        raise InvalidConfiguration(f"include_regex={include_regex!r} must be a regex or a list of regexes")
    if include_collections is not None and (isinstance(include_collections, str | bytes)
                                            or not isinstance(include_collections, Iterable)):
        raise InvalidConfiguration(f"include_collections={include_collections!r} must be a list of collection "
                                   "names or Collections")
    if worker is not None and (not isinstance(worker, str) or not worker.strip() or "\0" in worker):
        raise InvalidConfiguration(f"worker={worker!r} must be a non-empty name (a string)")
    for int_name, int_value in (("rank", rank), ("world_size", world_size)):
        if int_value is not None and (isinstance(int_value, bool) or not isinstance(int_value, int)):
            raise InvalidConfiguration(f"{int_name}={int_value!r} must be a whole number")
    if world_size is not None and world_size < 1:
        raise InvalidConfiguration(f"world_size={world_size!r} must be at least 1")
    if tensorboard_dir is not None and not isinstance(tensorboard_dir, str | os.PathLike):
        raise InvalidConfiguration(f"tensorboard_dir={tensorboard_dir!r} must be a local folder")
    if flush_interval is None:
        flush_interval = flush_interval_from_env()
    if not (isinstance(flush_interval, int | float) and not isinstance(flush_interval, bool) and flush_interval > 0):
        raise InvalidConfiguration(f"flush_interval={flush_interval!r} must be a positive number of seconds")
    for size_name, size in (("chunk_bytes", chunk_bytes), ("max_pending_bytes", max_pending_bytes)):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidConfiguration(f"{size_name}={size!r} must be a positive whole number of bytes")
    if backpressure not in ("block", "drop"):
        raise InvalidConfiguration(f"backpressure={backpressure!r}: allowed are 'block' and 'drop'")
    if writer not in WRITERS:
        raise InvalidConfiguration(f"writer={writer!r}: allowed are 'auto' (the default), 'thread' and 'process'")
    return flush_interval


def included_collections(collection_manager: Any, include_collections: Iterable[Any] | None,
                         default: Iterable[str], always: Iterable[str], include_regex: Any,
                         save_all: bool) -> list[str]:
    """The names of the collections a hook saves (collections given as objects are added to the manager)."""
    from tensortap.collection import CollectionKeys

    if include_regex:
        regexes = [include_regex] if isinstance(include_regex, str) else list(include_regex)
        collection_manager.get(CollectionKeys.DEFAULT).include(regexes)
    included: list[str] = []
    for c in include_collections if include_collections is not None else default:
        if isinstance(c, Collection):
            collection_manager.add(c)
            c = c.name
        elif not isinstance(c, str):
            raise InvalidConfiguration(f"include_collections entry {c!r} must be a collection name or Collection")
        included.append(c)
    included.extend(always)
    if include_regex and CollectionKeys.DEFAULT not in included:
        included.append(CollectionKeys.DEFAULT)
    if save_all:
        collection_manager.get(CollectionKeys.ALL).include(".*")
        included.append(CollectionKeys.ALL)
    return list(dict.fromkeys(included))


FROM_JSON: contextvars.ContextVar[bool] = contextvars.ContextVar("tensortap_from_json", default=False)


def runner_config() -> Any:
    """The hook config of `tensortap run` (TENSORTAP_AUTO=1) for a hook the script builds itself, else None."""
    if os.environ.get("TENSORTAP_AUTO") != "1" or FROM_JSON.get() or not os.environ.get("TENSORTAP_CONFIG"):
        return None
    from tensortap.hook_config import load_hook_config

    return load_hook_config(os.environ["TENSORTAP_CONFIG"])


def with_runner_config(cfg: Any, out_dir: Any, include_workers: str, include_collections: Any,
                       default_include: Iterable[str], save_config: Any, tensorboard_dir: Any,
                       export_tensorboard: bool) -> tuple[Any, str, Any, Any, Any, bool]:
    """Under `tensortap run` a script's own hook writes where the runner says, with the runner's collections added
    to its own, instead of writing a second copy somewhere else: the arguments with the runner's config applied
    (out_dir, include_workers, include_collections, save_config, tensorboard_dir, export_tensorboard)."""
    import logging

    if out_dir != cfg.out_dir:
        logging.getLogger("tensortap").warning("tensortap run: this script's hook writes to %s (the runner's "
                                               "out_dir), not %s", cfg.out_dir, out_dir)
    base = list(include_collections) if include_collections is not None else list(default_include)
    include_collections = list(dict.fromkeys([*base, *(cfg.include_collections or [])]))
    if save_config is None:
        save_config = cfg.save_config
    runner_kw = cfg.hook_kwargs()
    if runner_kw.get("tensorboard_dir") and not tensorboard_dir:
        tensorboard_dir = runner_kw["tensorboard_dir"]
    export_tensorboard = bool(export_tensorboard or runner_kw.get("export_tensorboard", False))
    return cfg.out_dir, cfg.include_workers, include_collections, save_config, tensorboard_dir, export_tensorboard
