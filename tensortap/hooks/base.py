"""The framework-agnostic hook: steps, modes, collections, and hand-off to the background writer.

Framework hooks (tensortap.pytorch, ...) subclass it and only adapt their framework's callbacks and
tensors. Every callback they run goes through `guard()`, so an error inside tensortap is logged once,
counted, and turns the hook off while training goes on. `TENSORTAP_DISABLE=1` turns every hook off.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import math
import os
import platform
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.capture.batch import BatchSpec, array_sources
from tensortap.capture.clock import StepClock
from tensortap.capture.schedule import SaveSchedule
from tensortap.capture.writer import Writer, open_writer
from tensortap.collection import (
    NON_REDUCTION_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from tensortap.config import ReductionConfig, SaveConfig
from tensortap.exceptions import InvalidConfiguration, TensorTapError
from tensortap.format import codec, layout
from tensortap.format.records import Record, RecordBatch
from tensortap.modes import ModeKeys
from tensortap.storage import check_access, is_remote, open_storage

logger = logging.getLogger("tensortap")

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
    if sys.platform.startswith("linux") and not is_remote(out_dir) and _ring_is_ordered():
        return "process"
    return "thread"


def _ring_is_ordered() -> bool:
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


def _tensorboard_dir(out_dir: str, export: bool, tensorboard_dir: Any) -> str | None:
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


def _flush_interval_from_env() -> float:
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


_RANK_VARS = (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))


def _rank_from_env() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment (torchrun, MPI, SLURM), else (0, 1)."""
    found = rank_in_env()
    return found if found is not None else (0, 1)


def rank_in_env() -> tuple[int, int] | None:
    """(rank, world size) if the launcher's environment (torchrun, MPI, SLURM) gives them, else None."""
    for r, w in _RANK_VARS:
        if r in os.environ and w in os.environ:
            try:
                return int(os.environ[r]), int(os.environ[w])
            except ValueError:
                pass
    return None


class Hook:
    """Captures tensors of a training job into `out_dir` (a local path or, with tensortap[s3], s3://...).

    Steps: `next_step()` starts the next step (the first is 0); `set_mode(mode)` switches between
    TRAIN/EVAL/PREDICT/GLOBAL, each mode counting its own steps; saving outside a step starts one.
    """

    #: collections every hook of this kind creates; framework hooks extend it
    builtin_collections: tuple[str, ...] = (CollectionKeys.ALL, CollectionKeys.DEFAULT, CollectionKeys.SCALARS)
    #: saved when include_collections is None
    default_include_collections: tuple[str, ...] = (CollectionKeys.DEFAULT, CollectionKeys.SCALARS)
    #: saved in addition to whatever include_collections names (smdebug's "default collections saved": PyTorch and
    #: MXNet losses, XGBoost metrics, Keras losses, metrics and sm_metrics); one is turned off by giving it a save
    #: config that saves no step, e.g. `hook.get_collection("losses").save_config = SaveConfig(end_step=0)`
    always_include_collections: tuple[str, ...] = ()

    def __init__(
        self,
        out_dir: str,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str | Collection] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        *,
        rank: int | None = None,
        world_size: int | None = None,
        worker: str | None = None,
        flush_interval: float | None = None,
        chunk_bytes: int = 256 << 20,
        max_pending_bytes: int = 512 << 20,
        backpressure: str = "block",
        writer: str = "auto",
    ):
        runner_cfg = _runner_config()
        if runner_cfg is not None:
            # Under `tensortap run` a script's own hook writes where the runner says, with the runner's
            # collections added to its own, instead of writing a second copy somewhere else.
            if out_dir != runner_cfg.out_dir:
                logger.warning("tensortap run: this script's hook writes to %s (the runner's out_dir), not %s",
                               runner_cfg.out_dir, out_dir)
            out_dir = runner_cfg.out_dir
            include_workers = runner_cfg.include_workers
            base = list(include_collections) if include_collections is not None else list(
                self.default_include_collections)
            include_collections = list(dict.fromkeys([*base, *(runner_cfg.include_collections or [])]))
            if save_config is None:
                save_config = runner_cfg.save_config
            runner_kw = runner_cfg.hook_kwargs()
            if runner_kw.get("tensorboard_dir") and not tensorboard_dir:
                tensorboard_dir = runner_kw["tensorboard_dir"]
            export_tensorboard = bool(export_tensorboard or runner_kw.get("export_tensorboard", False))
        self.out_dir = check_out_dir(out_dir)
        for flag_name, flag in (("dry_run", dry_run), ("save_all", save_all),
                                ("export_tensorboard", export_tensorboard)):
            if not isinstance(flag, bool):
                raise InvalidConfiguration(f"{flag_name}={flag!r} must be True or False")
        if include_workers not in INCLUDE_WORKERS:
            raise InvalidConfiguration(f"include_workers={include_workers!r}: allowed are 'one' and 'all'")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise InvalidConfiguration(
                f"reduction_config={reduction_config!r} must be a tensortap.ReductionConfig or None"
            )
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
            flush_interval = _flush_interval_from_env()
        if not (isinstance(flush_interval, int | float) and not isinstance(flush_interval, bool)
                and flush_interval > 0):
            raise InvalidConfiguration(f"flush_interval={flush_interval!r} must be a positive number of seconds")
        for size_name, size in (("chunk_bytes", chunk_bytes), ("max_pending_bytes", max_pending_bytes)):
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise InvalidConfiguration(f"{size_name}={size!r} must be a positive whole number of bytes")
        if backpressure not in ("block", "drop"):
            raise InvalidConfiguration(f"backpressure={backpressure!r}: allowed are 'block' and 'drop'")
        if writer not in WRITERS:
            raise InvalidConfiguration(f"writer={writer!r}: allowed are 'auto' (the default), 'thread' and 'process'")
        #: "thread": a writer thread in this process; "process": a writer process fed through shared memory
        self.writer_kind = default_writer(self.out_dir) if writer == "auto" else writer
        self._save_config = SaveConfig.coerce(save_config)
        self.reduction_config = reduction_config or ReductionConfig(save_raw_tensor=True)
        self.dry_run = dry_run
        self.save_all = save_all
        self.include_workers = include_workers
        self.export_tensorboard = export_tensorboard
        self.tensorboard_dir = tensorboard_dir
        #: where the writer exports TensorBoard event files (docs/tensorboard.md); None: no export
        self._tb_dir = _tensorboard_dir(self.out_dir, export_tensorboard, tensorboard_dir)
        if self._tb_dir:  # (the export starts with the writer, at the first hand-off: a bad budget is refused now)
            from tensortap.tensorboard.export import histogram_budget_from_env

            histogram_budget_from_env()

        self.collection_manager = CollectionManager()
        for name in self.builtin_collections:
            self.collection_manager.get(name)
        self._init_builtin_collections()
        if include_regex:
            regexes = [include_regex] if isinstance(include_regex, str) else list(include_regex)
            self.collection_manager.get(CollectionKeys.DEFAULT).include(regexes)
        included: list[str] = []
        for c in include_collections if include_collections is not None else self.default_include_collections:
            if isinstance(c, Collection):
                self.collection_manager.add(c)
                c = c.name
            elif not isinstance(c, str):
                raise InvalidConfiguration(f"include_collections entry {c!r} must be a collection name or Collection")
            included.append(c)
        included.extend(self.always_include_collections)
        if include_regex and CollectionKeys.DEFAULT not in included:
            included.append(CollectionKeys.DEFAULT)
        if save_all:
            self.collection_manager.get(CollectionKeys.ALL).include(".*")
            included.append(CollectionKeys.ALL)
        #: the step clock and what saves at each step (tensortap.capture)
        self.clock = StepClock()
        self.schedule = SaveSchedule(self.collection_manager, list(dict.fromkeys(included)), self._save_config,
                                     save_all)

        # Workers.
        env_rank, env_world = _rank_from_env()
        self.rank = env_rank if rank is None else int(rank)
        self.world_size = env_world if world_size is None else int(world_size)
        if not 0 <= self.rank < max(self.world_size, 1):
            raise InvalidConfiguration(f"rank={self.rank} is not in [0, world_size={self.world_size})")
        self.worker = worker or f"worker_{self.rank}"
        self.num_workers = self.world_size if include_workers == "all" else 1
        self.collection_manager.set_num_workers(self.num_workers)
        #: whether this process writes anything (include_workers="one": rank 0 only)
        self.writes = include_workers == "all" or self.rank == 0


        # Error isolation.
        self.disabled = disabled_by_env()
        self.error_count = 0
        self.first_error: BaseException | None = None
        self._warned: set[str] = set()

        self._writer_opts = dict(
            flush_interval=flush_interval, chunk_bytes=chunk_bytes,
            max_pending_bytes=max_pending_bytes, backpressure=backpressure,
        )
        self._writer: Writer | None = None
        self._storage = None
        self._first_seq: int | None = None  # the writer's first chunk number, when the claim found it
        self._prepared = False
        self._closed = False
        self._collections_dirty = True
        # step marks held back until a framework hook has handed over the tensors of their steps
        # (hold_step_marks / release_step_marks): (global step, mode steps) in order; None: not holding
        self._held_marks: list[tuple[int, dict[str, int]]] | None = None
        # Stop requests (tensortap.format.control): every rank watches, writing or not.
        self._stop_watch = not disabled_by_env()
        self._stop_request: dict | None = None
        # (the first look one interval in: a rule asks only after it has read data the job wrote)
        self._next_stop_check = time.monotonic() + STOP_CHECK_INTERVAL
        self._remote = is_remote(self.out_dir)
        self._stop_thread: threading.Thread | None = None
        self._dropped_here = 0  # values refused before they reached the writer (too large)
        if not self.disabled and self.writes and not self.dry_run and self._remote:
            # an object store that cannot be written is a bad out_dir: said now, in one line, not at the first step
            check_access(self.out_dir)
        #: save_scalar calls kept for the next step: (name, value, sm_metric, timestamp)
        self._outside_scalars: list[tuple[str, np.ndarray, bool, float | None]] = []
        if not self.disabled and self.writes and not self.dry_run and not self._claim_later:
            self._check_out_dir()
        # applied at the first step, once a framework subclass has finished its own set-up
        self._pending_collection_configs = runner_cfg.collection_configs if runner_cfg is not None else None
        # Nothing lost: a job that forgets close() still gets its data flushed and its end marked.
        atexit.register(_close_at_exit, weakref.ref(self))
        # The writer (a thread or a process) starts at the first hand-off: a hook that never saves starts neither,
        # and its close() writes the end of the job itself.
        if self.active and not self.dry_run:
            from tensortap.format import live

            live.register(self.out_dir, self._settle)  # (a trial made in this process reads what was handed over)

    # --- construction helpers ---------------------------------------------------------------

    def _init_builtin_collections(self) -> None:
        """Set the regexes of the built-in collections (framework hooks override)."""

    #: the framework begins and ends the steps (Keras batches, boosting rounds): a scalar saved between two of them
    #: is kept and saved at the next one (at close(): at a GLOBAL step of its own)
    _scalars_wait_for_step = False
    #: a framework hook that learns its worker's name only at the first step claims the out_dir then
    _claim_later = False
    #: a thread writer starts its thread only at the first hand-off a flush interval after it was made; a job
    #: closed sooner is written by close() (ChunkWriter's `start_after`)
    _late_writer_thread = False

    def _claim_late(self) -> None:
        """Claim the out_dir once the worker is known (a hook with `_claim_later`, at its first step); another job's
        data there turns this hook off (training goes on)."""
        if self.writes and not self.disabled and not self.dry_run:
            try:
                self._check_out_dir()
            except InvalidConfiguration as e:
                self._fail("first step", e)

    def _check_out_dir(self) -> None:
        """Claim this worker's folder in out_dir for this job, atomically (docs/format.md §1): a second job
        given the same out_dir and worker gets a clear error here instead of interleaving its data."""
        storage = open_storage(self.out_dir)
        keys = storage.list(layout.worker_dir(self.worker) + "/")
        for key in keys:
            if key.endswith(layout.INDEX_SUFFIX):
                raise InvalidConfiguration(
                    f"out_dir {self.out_dir!r} already holds data of {self.worker}: "
                    "use a new out_dir for every training job"
                )
        claim = json.dumps({"pid": os.getpid(), "host": platform.node(), "time": time.time()}).encode()
        try:
            claimed = storage.create_exclusive(layout.claim_key(self.worker), claim)
        except OSError as e:
            raise InvalidConfiguration(f"out_dir {self.out_dir!r} cannot be written: {e}") from None
        if not claimed:
            raise InvalidConfiguration(
                f"out_dir {self.out_dir!r} is already used by another job writing {self.worker} "
                f"({storage.describe(layout.claim_key(self.worker))}): use a new out_dir for every training job"
            )
        self._storage = storage
        # the writer's first chunk number, from this listing (the claim keeps every other writer out of the folder)
        self._first_seq = max((p[1] for k in keys if (p := layout.parse_chunk_key(k))), default=-1) + 1

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None, **overrides: Any) -> Hook:
        """A hook configured by smdebug-style JSON: `json_file_path`, else $TENSORTAP_CONFIG,
        else $SMDEBUG_CONFIG_FILE_PATH."""
        from tensortap.hook_config import load_hook_config

        cfg = load_hook_config(json_file_path)
        kwargs = cfg.hook_kwargs()
        kwargs.update(overrides)
        token = _FROM_JSON.set(True)
        try:
            hook = cls(**kwargs)
        finally:
            _FROM_JSON.reset(token)
        hook.apply_collection_configs(cfg.collection_configs)
        return hook

    def apply_collection_configs(self, configs: dict[str, Collection]) -> None:
        """Merge per-collection settings (regexes, save and reduction configs) into this hook's collections."""
        for name, coll in configs.items():
            existing = self.get_collection(name)
            if coll.include_regex:
                existing.include(coll.include_regex)
            if coll.save_config is not None:
                existing.save_config = coll.save_config
            if coll.reduction_config is not None:
                existing.reduction_config = coll.reduction_config
            existing.save_histogram = coll.save_histogram

    # --- error isolation --------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run hook work so that an internal error disables the hook instead of breaking training."""
        try:
            yield
        except TensorTapError as e:
            if isinstance(e, InvalidConfiguration):
                raise
            self._fail(where, e)
        except Exception as e:  # noqa: BLE001 - by design: never break the training job
            self._fail(where, e)

    def _fail(self, where: str, e: BaseException) -> None:
        self.error_count += 1
        if self.first_error is None:
            self.first_error = e
            logger.error(
                "tensortap: error in %s; the hook turns itself off and training continues", where, exc_info=e
            )
        self.disabled = True

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    @property
    def active(self) -> bool:
        """Whether this hook captures anything (not disabled, not a silent rank, not closed)."""
        return not self.disabled and self.writes and not self._closed

    # --- collections ------------------------------------------------------------------------

    def _invalidate_caches(self) -> None:
        """Collections or their configs may have changed: recompute what saves what."""
        self.schedule.invalidate()

    def _collections_changed(self) -> None:
        """The caller may change collections or their configs (framework hooks extend this to drop their own
        plans)."""
        self._invalidate_caches()

    def get_collection(self, name: str, create: bool = True) -> Collection:
        self._collections_changed()
        self._collections_dirty = True
        return self.collection_manager.get(name, create=create)

    def get_collections(self) -> dict[str, Collection]:
        self._collections_changed()
        return self.collection_manager.get_collections()

    def add_collection(self, collection: Collection) -> None:
        if not isinstance(collection, Collection):
            raise InvalidConfiguration(f"add_collection takes a tensortap.Collection, not {type(collection).__name__}")
        self.collection_manager.add(collection)
        self._collections_changed()
        self._collections_dirty = True

    def _prepare(self) -> None:
        """Validate collections once, at the first step."""
        if self._pending_collection_configs:
            self.apply_collection_configs(self._pending_collection_configs)
            self._pending_collection_configs = None
        for name in self.include_collections:
            c = self.collection_manager.get(name)
            if (
                name not in self.builtin_collections
                and not c.include_regex
                and not c.tensor_names
                and name not in self._programmatic_collections()
            ):
                logger.info("tensortap: collection %r matches nothing yet (no regex, no names)", name)
        self._prepared = True

    def _programmatic_collections(self) -> set[str]:
        return set()

    def _included(self) -> list[Collection]:
        return self.schedule.included()

    def _coll_save_config(self, c: Collection) -> SaveConfig:
        return self.schedule.config_of(c)

    def _collection_saves_now(self, c: Collection) -> bool:
        clock = self.clock
        clock.sync()
        return self.schedule.saves_at(c, clock.mode, clock.mode_steps[clock.mode])

    def collections_to_save(self) -> list[Collection]:
        """Included collections that save at the current step (the same list object while the set stays the
        same)."""
        clock = self.clock
        if clock.tally is not None and clock.tally.skipped:
            clock.sync()
        return self.schedule.at(clock.mode, clock.mode_steps[clock.mode])

    def next_saving_step(self) -> float:
        """The next step of the current mode, after the current one, at which anything saves (inf if none): the
        steps before it save nothing, so a framework hook may only count them."""
        clock = self.clock
        clock.sync()
        return self.schedule.next_saving_step(clock.mode, clock.mode_steps[clock.mode] + 1)

    def is_saving_step(self) -> bool:
        """True if anything may be saved at the current step."""
        return self.active and bool(self.collections_to_save())

    def collections_for(self, name: str) -> list[Collection]:
        """Collections saving now that contain tensor `name`."""
        return self.schedule.for_tensor(name, self.collections_to_save())

    def should_save_tensor(self, name: str) -> bool:
        return self.active and bool(self.collections_for(name))

    # --- steps and modes (the step clock, tensortap.capture.clock) --------------------------

    @property
    def save_config(self) -> SaveConfig:
        """The save config of every collection that has none of its own."""
        return self._save_config

    @save_config.setter
    def save_config(self, value: SaveConfig) -> None:
        self._save_config = SaveConfig.coerce(value)
        if "schedule" in self.__dict__:
            self.schedule.default = self._save_config

    @property
    def collection_manager(self) -> CollectionManager:
        return self._collection_manager

    @collection_manager.setter
    def collection_manager(self, value: CollectionManager) -> None:
        self._collection_manager = value
        if "schedule" in self.__dict__:
            self.schedule.collections = value
            self._collections_changed()

    @property
    def include_collections(self) -> list[str]:
        """The names of the collections this hook saves."""
        return self.schedule.include

    @include_collections.setter
    def include_collections(self, value: Iterable[str]) -> None:
        self.schedule.include = list(value)
        self._collections_changed()

    @property
    def mode(self) -> ModeKeys:
        return self.clock.mode

    @mode.setter
    def mode(self, value: ModeKeys) -> None:
        self.clock.mode = value

    @property
    def step(self) -> int:
        """The global step (-1 before the first)."""
        clock = self.clock
        clock.sync()
        return clock.step

    @step.setter
    def step(self, value: int) -> None:
        self.clock.step = value

    @property
    def mode_steps(self) -> dict[ModeKeys, int]:
        """The step within each mode (GLOBAL: the global step); -1 before a mode's first step."""
        clock = self.clock
        clock.sync()
        return clock.mode_steps

    @mode_steps.setter
    def mode_steps(self, value: dict[ModeKeys, int]) -> None:
        self.clock.mode_steps = value

    @property
    def mode_step(self) -> int:
        clock = self.clock
        clock.sync()
        return clock.mode_steps[clock.mode]

    @property
    def _in_step(self) -> bool:
        return self.clock.in_step

    def set_mode(self, mode: ModeKeys | str) -> None:
        """Switch mode; the next step is counted in it."""
        mode = _modes.parse_mode(mode)
        if mode != self.clock.mode:
            self.end_step()
            self.clock.mode = mode

    def next_step(self) -> int:
        """End the current step (if any) and begin the next; returns the new global step.

        At this boundary a stop request (a rule's StopTraining action) ends training: the hook closes
        (everything flushed, the job marked ended) and TrainingStopped (a SystemExit) is raised.
        """
        if self._stop_watch and (self._stop_request is not None or time.monotonic() >= self._next_stop_check):
            self._check_stop_request()
        self.end_step()
        step = self.clock.advance()
        if not self._prepared:
            self._prepare()
        self.on_step_begin()
        if self._outside_scalars:
            self._save_outside_scalars()
        return step

    def counting_deadline(self) -> float:
        """Until when (`time.monotonic()`) a framework hook may only count steps that save nothing instead of
        calling `next_step()`: the next stop-request check, or infinity when none is watched."""
        return self._next_stop_check if self._stop_watch else math.inf

    def _check_stop_request(self) -> None:
        """One stat per STOP_CHECK_INTERVAL at most (local); object stores are polled by a background thread."""
        now = time.monotonic()
        if self._stop_request is None and now < self._next_stop_check:
            return
        self._next_stop_check = now + STOP_CHECK_INTERVAL
        from tensortap.format.control import StopSignal, stop_requested

        if self._stop_request is None and not self._remote:
            try:
                self._stop_request = stop_requested(self.out_dir, min_interval=0)
            except Exception as e:  # noqa: BLE001 - an unreadable control file must not break training
                self._warn_once("stop-check", f"tensortap: cannot check for stop requests: {e}")
                self._stop_watch = False
        elif self._remote and self._stop_thread is None:
            self._stop_thread = threading.Thread(target=self._poll_stop, name="tensortap-stop-watch", daemon=True)
            self._stop_thread.start()
        req = self._stop_request
        if req is not None and not self._closed:
            self._stop_watch = False
            StopSignal(self.out_dir).stop(self, req)  # closes the hook, raises TrainingStopped

    def _poll_stop(self) -> None:
        from tensortap.format.control import stop_requested

        while not self._closed and self._stop_request is None:
            try:
                self._stop_request = stop_requested(self.out_dir, min_interval=0)
            except Exception:  # noqa: BLE001 - the store may be unreachable for a while
                pass
            time.sleep(STOP_POLL_INTERVAL)

    def end_step(self) -> None:
        """Finish the current step: readers learn that no more data comes for it."""
        clock = self.clock
        if not clock.in_step:
            return
        clock.in_step = False
        self.on_step_end()
        if self._held_marks is not None:  # (sent by release_step_marks, after this step's tensors)
            passed = clock.passed()  # (adds steps counted elsewhere: before the global step is read)
            self._held_marks.append((clock.step, passed))
        elif self._writer is not None and not self.disabled and self.writes and not self._closed:  # (active)
            try:  # (what guard() does, without a generator per step)
                if self._collections_dirty:
                    self._writer.set_collections(self.collection_manager.to_json_dict())
                    self._collections_dirty = False
                passed = clock.passed()  # (adds steps counted elsewhere: before the global step is read)
                self._writer.mark_step_passed(clock.step, passed)
            except InvalidConfiguration:
                raise
            except Exception as e:  # noqa: BLE001 - never break the training job
                self._fail("end_step", e)

    def _ensure_step(self) -> None:
        if not self.clock.in_step:
            self.next_step()

    def step_id(self) -> tuple[int, int, int]:
        """(global step, mode value, mode step) of the current step: where `write_tensors(..., at=)` saves
        later."""
        clock = self.clock
        clock.sync()
        mode = clock.mode
        return clock.step, mode.value, clock.mode_steps[mode]

    def hold_step_marks(self) -> None:
        """The current step's tensors are handed over after it ends (`write_tensors(..., at=step_id())`): its
        step mark, and those of the steps after it, wait until `release_step_marks()` (close() releases them)."""
        if self._held_marks is None:
            self._held_marks = []

    def release_step_marks(self) -> None:
        """Send the step marks held since `hold_step_marks()` (their steps' tensors are handed over)."""
        held, self._held_marks = self._held_marks, None
        if held and self._writer is not None and self.active:
            if self._collections_dirty:
                self._writer.set_collections(self.collection_manager.to_json_dict())
                self._collections_dirty = False
            step, passed = held[-1]  # (a mark covers every step up to it, in every mode)
            self._writer.mark_step_passed(step, passed)

    def on_step_begin(self) -> None:
        """Called when a step begins (framework hooks override)."""

    def on_step_end(self) -> None:
        """Called when a step ends, before readers are told (framework hooks override)."""

    # --- saving -----------------------------------------------------------------------------

    def _get_writer(self) -> Writer:
        if self._writer is None:
            if self._storage is None:
                self._storage = open_storage(self.out_dir)
            start_after = self._writer_opts["flush_interval"] if self._late_writer_thread else 0.0
            self._writer = open_writer(self.writer_kind, self._storage, self.worker, tensorboard_dir=self._tb_dir,
                                       first_seq=self._first_seq, start_after=start_after,
                                       num_workers=self.num_workers, metadata=self._writer_metadata(),
                                       **self._writer_opts)
            self.writer_kind = self._writer.kind
        return self._writer

    def _writer_metadata(self) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "hook": type(self).__name__}

    def _end_writer(self) -> Writer:
        """The writer of a hook that handed nothing over: the end of the job written on the closing thread (a
        writer thread that is never started), not a writer process started only to be stopped."""
        if self._storage is None:
            self._storage = open_storage(self.out_dir)
        self._writer = open_writer("thread", self._storage, self.worker, first_seq=self._first_seq,
                                   start_after=self._writer_opts["flush_interval"], num_workers=self.num_workers,
                                   metadata=self._writer_metadata(), **self._writer_opts)
        return self._writer

    def _plan(self, name: str, colls: list[Collection]) -> tuple[bool, tuple[tuple[str, bool], ...], bool]:
        """(save_raw, reductions, save_shape) for a tensor saved in `colls` now."""
        save_raw = False
        save_shape = False
        reds: list[tuple[str, bool]] = []
        for c in colls:
            rc = c.reduction_config or self.reduction_config
            if c.name in NON_REDUCTION_COLLECTIONS:
                save_raw = True
                continue
            save_raw = save_raw or rc.save_raw_tensor
            save_shape = save_shape or rc.save_shape
            for r in rc.requested():
                if r not in reds:
                    reds.append(r)
        return save_raw, tuple(reds), save_shape

    def _note_membership(self, name: str, colls: Iterable[Collection]) -> None:
        for c in colls:
            if not c.has_tensor_name(name):
                c.add_tensor_name(name)
                self._collections_dirty = True

    def write_tensor(
        self,
        name: str,
        value: Any,
        colls: list[Collection],
        reduction_values: dict[tuple[str, bool], Any] | None = None,
        shape: tuple[int, ...] | None = None,
        copy: bool = True,
    ) -> None:
        """Hand one host-side tensor to the writer with the plan of `colls` (framework hooks call this).

        With `copy=False` the caller hands `value` over: it must not change it afterwards.
        """
        save_raw, reds, save_shape = self._plan(name, colls)
        if reduction_values is not None:
            reds = tuple(r for r in reds if r not in reduction_values)
        arr = None
        if value is not None:
            arr = codec.as_storable(value)
            if copy and (arr is value or (isinstance(value, np.ndarray) and np.shares_memory(arr, value))):
                arr = arr.copy()  # the caller may mutate its array after we return
        self._note_membership(name, colls)
        if self.dry_run:
            return
        self._get_writer().submit(
            Record(
                name=name, step=self.step, mode=self.mode.value, mode_step=self.mode_steps[self.mode],
                value=arr, save_raw=save_raw and arr is not None, reductions=reds if arr is not None else (),
                reduction_values=dict(reduction_values or {}), save_shape=save_shape,
                shape=tuple(shape) if shape is not None else None,
            )
        )

    def write_tensors(self, items: Iterable[tuple[str, Any, list[Collection]]], copy: bool = True,
                      at: tuple[int, int, int] | None = None) -> None:
        """`write_tensor(name, value, colls, copy=copy)` for each item, in one hand-off: the values saved raw,
        of one dtype, go as one batch copied straight into the writer's room (tensortap.capture.batch); the
        others as records. `at`: the `step_id()` of an earlier step to save them at (its mark held until
        then, see `hold_step_marks`); by default the current step."""
        plans: dict[tuple[int, ...], tuple[bool, tuple[tuple[str, bool], ...], bool]] = {}
        step, mode, mode_step = at if at is not None else self.step_id()
        records = []
        batch: list[tuple[str, np.ndarray, tuple]] = []
        for name, value, colls in items:
            key = tuple(map(id, colls))
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = self._plan(name, colls)
            save_raw, reds, save_shape = plan
            arr = codec.as_storable(value)
            self._note_membership(name, colls)
            if save_raw and not save_shape and (not batch or arr.dtype == batch[0][1].dtype):
                batch.append((name, arr, reds))
                continue
            if copy and (arr is value or (isinstance(value, np.ndarray) and np.shares_memory(arr, value))):
                arr = arr.copy()
            records.append(Record(name=name, step=step, mode=mode, mode_step=mode_step, value=arr,
                                  save_raw=save_raw, reductions=reds, save_shape=save_shape))
        if self.dry_run:
            return
        writer = self._get_writer()
        if batch and sum(a.nbytes for _n, a, _r in batch) < writer.reserve_min_bytes:
            # (a thread writer takes small host values as they are, in one hand-off: no reservation to copy into)
            reds = tuple(r for _n, _a, r in batch)
            writer.submit_batch(RecordBatch(tuple(n for n, _a, _r in batch),
                                            [a.copy() if copy else a for _n, a, _r in batch], None,
                                            step, mode, mode_step, reds if any(reds) else None))
        elif batch and not self._send_batch(writer, batch, step, mode, mode_step):
            for name, arr, reds in batch:
                records.append(Record(name=name, step=step, mode=mode, mode_step=mode_step,
                                      value=arr.copy() if copy else arr, save_raw=True, reductions=reds))
        if records:
            writer.submit_many(records)

    def _send_batch(self, writer: Any, batch: list[tuple[str, np.ndarray, tuple]], step: int, mode: int,
                    mode_step: int) -> bool:
        """Copy raw values of one dtype into one reservation of `writer` at that step; False if they cannot go
        that way (then they go as records)."""
        found = array_sources([arr for _n, arr, _r in batch])
        if found is None:
            return False
        sources, shapes = found
        reds = tuple(r for _n, _a, r in batch)
        spec = BatchSpec(tuple(n for n, _a, _r in batch), True, reds if any(reds) else None, shapes,
                         np_dtype=batch[0][1].dtype)
        return self._reserve_and_copy(writer, spec, sources, (step, mode, mode_step))

    def _batch_spec(self, items: list[tuple[str, list[Collection]]]) -> BatchSpec:
        """The plan of tensors saved together at every saving step with these collections (membership in them
        noted here, once per plan). Shapes and dtype are the caller's to set."""
        raw_only = True
        reductions = []
        for name, colls in items:
            save_raw, reds, save_shape = self._plan(name, colls)
            raw_only = raw_only and save_raw and not save_shape
            reductions.append(reds)
            self._note_membership(name, colls)
        return BatchSpec(tuple(name for name, _c in items), raw_only,
                         tuple(reductions) if any(reductions) else None)

    def _write_planned(self, spec: BatchSpec, sources: Sequence[tuple[int, int]],
                       at: tuple[int, int, int] | None = None) -> bool:
        """Hand off a planned batch at the current step (`spec` raw only, with its shapes and numpy dtype;
        `sources` the (address, byte count) of its tensors' bytes, in order, readable now): False if it cannot go
        that way (then hand its tensors to `write_tensors`). `at`: as for `write_tensors`."""
        if self.dry_run or not spec.raw_only:
            return False
        writer = self._writer if self._writer is not None else self._get_writer()
        if sum(n for _a, n in sources) < writer.reserve_min_bytes:
            return False
        self.clock.sync()
        return self._reserve_and_copy(writer, spec, sources, at)

    def _reserve_and_copy(self, writer: Any, spec: BatchSpec, sources: Sequence[tuple[int, int]],
                          at: tuple[int, int, int] | None = None) -> bool:
        if at is None:
            res = spec.reserve(writer, self.clock)
        else:
            step, mode, mode_step = at
            res = writer.reserve_batch(spec.names, spec.np_dtype, spec.shapes, step, mode, mode_step,
                                       reductions=spec.reductions)
        if res is None:
            return False
        if res:  # (False: dropped under backpressure, counted by the writer)
            res.copy_in(sources)
            res.commit()
        return True

    def save_tensor(
        self, tensor_name: str, tensor_value: Any, collections_to_write: str | Iterable[str] = CollectionKeys.DEFAULT
    ) -> None:
        """Save `tensor_value` at the current step in the named collections (created if missing),
        when their save config saves this step. A name, collection or value that cannot be saved is skipped,
        counted (dropped_records) and logged once; it never raises into the training loop."""
        if not self.active:
            return
        if not isinstance(tensor_name, str) or not tensor_name:
            self._skip_value(tensor_name, tensor_value, "the tensor name must be a non-empty string")
            return
        names = [collections_to_write] if isinstance(collections_to_write, str) else collections_to_write
        try:
            names = list(names)
        except TypeError:
            names = [names]
        if not names or not all(isinstance(n, str) and n for n in names):
            self._skip_value(tensor_name, tensor_value, f"collections_to_write={collections_to_write!r} must be a "
                                                        "collection name or a list of them")
            return
        if self._too_large(tensor_name, tensor_value):
            return
        with self.guard("save_tensor"):
            self._ensure_step()
            colls = []
            for n in names:
                c = self.collection_manager.get(n)
                if c.name not in self.include_collections and n != CollectionKeys.DEFAULT:
                    self.include_collections.append(c.name)  # naming a collection asks for it
                    self._invalidate_caches()
                colls.append(c)
            now = self.collections_to_save()
            colls = [c for c in colls if c in now or self._collection_saves_now(c)]
            if colls:
                try:
                    value = codec.as_storable(tensor_value)
                except Exception as e:  # noqa: BLE001 - any object may be handed over: none breaks training
                    self._skip_value(tensor_name, tensor_value, str(e) or type(e).__name__)
                    return
                self.write_tensor(tensor_name, value, colls)

    def _skip_value(self, name: Any, value: Any, why: str) -> None:
        """A value handed over during training that cannot be saved: skipped, counted in dropped_records, and
        logged once per tensor (naming it and the value's type); the hook and training go on."""
        self._dropped_here += 1
        self._warn_once(f"bad-value:{name!r}", f"tensortap: {name!r} not saved: {why} (got a "
                                               f"{type(value).__module__}.{type(value).__qualname__}); such values "
                                               "are skipped and counted (dropped_records), training goes on")

    def _too_large(self, name: str, value: Any) -> bool:
        """A value larger than the writer may hold (max_pending_bytes) is dropped before anything copies it
        (a broadcast view's copy could take all the memory): counted in dropped_records, warned once."""
        nbytes = getattr(value, "nbytes", None)
        limit = self._writer_opts["max_pending_bytes"]
        if isinstance(nbytes, int) and nbytes > limit:
            self._dropped_here += 1
            self._warn_once("too-large", f"tensortap: {name!r} not saved: {nbytes} bytes is more than "
                                         f"max_pending_bytes={limit}; such values are dropped and counted "
                                         "(dropped_records)")
            return True
        return False

    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar as `scalar/<name>` at the current step, whatever the save config (smdebug's signature).

        `sm_metric=True` also puts it in the `sm_metrics` collection (smdebug sends such scalars to SageMaker
        Metrics; here they are the job's metrics, shown with its losses). `timestamp` (UNIX seconds) is accepted
        for smdebug's scripts; tensortap's store keeps no wall time per value (docs/migration.md). A name or value
        that cannot be saved (None, text, several numbers) is skipped, counted in dropped_records and logged once;
        it never raises into the training loop."""
        if not isinstance(sm_metric, bool):
            raise InvalidConfiguration(f"save_scalar({name!r}, ..., sm_metric={sm_metric!r}): sm_metric must be True "
                                       "or False (the third parameter is sm_metric, as in smdebug; pass timestamp=)")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int | float)):
            raise InvalidConfiguration(f"save_scalar({name!r}, ..., timestamp={timestamp!r}): timestamp must be None "
                                       "or a number of seconds")
        if not self.active:
            return
        if not isinstance(name, str) or not name:
            self._skip_value(name, value, "the scalar name must be a non-empty string")
            return
        try:
            size = np.size(value)
            kind = np.asarray(value).dtype.kind if size == 1 and value is not None else ""
        except Exception:  # noqa: BLE001 - any object may be handed over: none breaks training
            size, kind = -1, ""
        if size != 1 or kind not in tuple("biufc"):
            self._skip_value(f"scalar/{name}", value, "save_scalar needs a single number")
            return
        if self._scalars_wait_for_step and not self.clock.in_step:
            # Between the framework's own steps (before training, between fit and evaluate, after it): saved at
            # the next step, as smdebug saves them at its next write; steps stay the framework's.
            self._outside_scalars.append((name, np.asarray(value).reshape(()).copy(), sm_metric, timestamp))
            return
        with self.guard("save_scalar"):
            self._ensure_step()
            colls = [self.collection_manager.get(CollectionKeys.SCALARS)]
            if sm_metric:
                colls.append(self.collection_manager.get(CollectionKeys.SM_METRICS))
            full = f"scalar/{name}"
            self._note_membership(full, colls)
            if not self.dry_run:
                arr = np.asarray(value).reshape(())
                self._get_writer().submit(
                    Record(name=full, step=self.step, mode=self.mode.value,
                           mode_step=self.mode_steps[self.mode], value=codec.as_storable(arr))
                )

    def _save_outside_scalars(self) -> None:
        """Save the scalars kept since the last step (see save_scalar) at the current one."""
        kept, self._outside_scalars = self._outside_scalars, []
        wait, self._scalars_wait_for_step = self._scalars_wait_for_step, False
        try:
            for name, value, sm_metric, timestamp in kept:
                self.save_scalar(name, value, sm_metric, timestamp)
        finally:
            self._scalars_wait_for_step = wait

    # --- lifecycle --------------------------------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> None:
        """Make everything handed off so far visible to readers."""
        if self._writer is not None and self.active:
            with self.guard("flush"):
                if self._collections_dirty:
                    self._writer.set_collections(self.collection_manager.to_json_dict())
                    self._collections_dirty = False
                self._writer.flush(timeout)

    def _step_is_over(self) -> bool:
        """Whether a reader in the training thread may end the current step (`create_trial` after a training
        loop): a hook whose steps end implicitly (at the next forward pass: PyTorch, MXNet) says so once the step's
        work is done; one driven by next_step() and end_step() leaves its steps to the caller."""
        return False

    def _settle(self) -> None:
        """A reader in this process (on the training thread) is about to read out_dir: everything handed over so
        far is written (the current step ended first where steps end implicitly), as at the end of training."""
        if self._writer is None or self._closed or not self.active:
            return
        with self.guard("end of training"):
            if self._step_is_over():
                self.end_step()
            self.flush()

    def close(self) -> None:
        """End the step, flush, and mark this worker's job as ended."""
        if self._closed:
            return
        with self.guard("close"):
            if self._writer is not None:
                self._writer.prompt_marks = False  # (the close writes the last step with the end of the job)
            self.end_step()
            self.on_close()
            if self._outside_scalars:  # (saved after the last step: a GLOBAL step of their own, after it)
                self._stop_watch = False
                self.set_mode(_modes.GLOBAL)
                self._save_outside_scalars()
                self.end_step()
            self.release_step_marks()
            if self.writes and not self.disabled and not self.dry_run:
                w = self._writer if self._writer is not None else self._end_writer()
                w.set_collections(self.collection_manager.to_json_dict())
                w.close()
                if w.error is not None:
                    raise w.error
                if self.dropped_records:
                    logger.warning("tensortap: %d records of %s were not saved (counted in dropped_records; the "
                                   "cause was logged when it began)", self.dropped_records, self.worker)
            elif self._writer is not None:
                self._writer.close()
        self._closed = True

    def on_close(self) -> None:
        """Called at close, before the writer ends (framework hooks override)."""

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def dropped_records(self) -> int:
        """Records handed to tensortap and not saved (storage full or too slow, writer process gone, too large)."""
        return self._dropped_here + (self._writer.dropped_records if self._writer is not None else 0)

    def has_default_hook_configuration(self) -> bool:
        return set(self.include_collections) == set(self.default_include_collections)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} out_dir={self.out_dir!r} worker={self.worker} step={self.step} "
            f"mode={self.mode.name} collections={self.include_collections}>"
        )


_FROM_JSON: contextvars.ContextVar[bool] = contextvars.ContextVar("tensortap_from_json", default=False)


def _runner_config() -> Any:
    """The hook config of `tensortap run` (TENSORTAP_AUTO=1) for a hook the script builds itself, else None."""
    if os.environ.get("TENSORTAP_AUTO") != "1" or _FROM_JSON.get() or not os.environ.get("TENSORTAP_CONFIG"):
        return None
    from tensortap.hook_config import load_hook_config

    return load_hook_config(os.environ["TENSORTAP_CONFIG"])


def _close_at_exit(ref: weakref.ref) -> None:
    hook = ref()
    if hook is not None and not hook._closed:
        hook.close()
