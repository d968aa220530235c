"""The framework-agnostic hook: the public API every framework hook shares, on the step engine.

Framework hooks (tensortap.pytorch, ...) subclass it and only adapt their framework's callbacks and tensors; the
step policy (what saves, the quiet window, late identity, plans, hand-offs, held marks, the lifecycle) is the
step engine's (`tensortap.capture.engine`, `hook.engine`). Every callback they run goes through `guard()`, so an
error inside tensortap is logged once, counted, and turns the hook off while training goes on.
`TENSORTAP_DISABLE=1` turns every hook off.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.capture.batch import BatchSpec
from tensortap.capture.clock import StepClock
from tensortap.capture.engine import Listener, StepEngine, TensorSpec
from tensortap.capture.handoff import HandOff
from tensortap.capture.identity import IdentitySource, rank_in_env, resolve_identity
from tensortap.capture.schedule import SaveSchedule
from tensortap.capture.writer import Writer, open_writer
from tensortap.collection import Collection, CollectionKeys, CollectionManager
from tensortap.config import ReductionConfig, SaveConfig
from tensortap.exceptions import InvalidConfiguration, TensorTapError
from tensortap.hooks.options import (
    DISABLE_ENV,
    FROM_JSON,
    STOP_CHECK_INTERVAL,
    check_arguments,
    check_out_dir,
    default_writer,
    disabled_by_env,
    included_collections,
    runner_config,
    tensorboard_dir_of,
    with_runner_config,
)
from tensortap.hooks.stop import StopWatch
from tensortap.hooks.values import ValueSaving
from tensortap.modes import ModeKeys
from tensortap.storage import check_access, open_storage

__all__ = ["DISABLE_ENV", "STOP_CHECK_INTERVAL", "Hook", "check_out_dir", "default_writer", "disabled_by_env",
           "rank_in_env"]

logger = logging.getLogger("tensortap")


class _IdentityField:
    """A hook's attribute that is a field of its engine's `WorkerIdentity`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, hook: Any, owner: Any = None) -> Any:
        return self if hook is None else getattr(hook.engine.identity, self.name)

    def __set__(self, hook: Any, value: Any) -> None:
        setattr(hook.engine.identity, self.name, value)


class Hook(ValueSaving):
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
    #: the framework's own source of (rank, world size) (a torch process group, Horovod, XGBoost's collective),
    #: asked when the caller gives no rank; when neither it nor the launcher's environment knows them yet, it is
    #: asked once more at the first step and the worker's folder is claimed then (`StepEngine.settle_identity`)
    identity_source: IdentitySource | None = None

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
        runner_cfg = runner_config()
        if runner_cfg is not None:
            out_dir, include_workers, include_collections, save_config, tensorboard_dir, export_tensorboard = \
                with_runner_config(runner_cfg, out_dir, include_workers, include_collections,
                                   self.default_include_collections, save_config, tensorboard_dir,
                                   export_tensorboard)
        self.out_dir = check_out_dir(out_dir)
        flush_interval = check_arguments(
            dry_run=dry_run, save_all=save_all, export_tensorboard=export_tensorboard,
            include_workers=include_workers, reduction_config=reduction_config, include_regex=include_regex,
            include_collections=include_collections, worker=worker, rank=rank, world_size=world_size,
            tensorboard_dir=tensorboard_dir, flush_interval=flush_interval, chunk_bytes=chunk_bytes,
            max_pending_bytes=max_pending_bytes, backpressure=backpressure, writer=writer)
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
        self._tb_dir = tensorboard_dir_of(self.out_dir, export_tensorboard, tensorboard_dir)
        if self._tb_dir:  # (the export starts with the writer, at the first hand-off: a bad budget is refused now)
            from tensortap.tensorboard.export import histogram_budget_from_env

            histogram_budget_from_env()

        self.collection_manager = CollectionManager()
        for name in self.builtin_collections:
            self.collection_manager.get(name)
        self._init_builtin_collections()
        included = included_collections(self.collection_manager, include_collections,
                                        self.default_include_collections, self.always_include_collections,
                                        include_regex, save_all)

        # Who this process writes as. The framework may start its collective after this hook
        # (torch.multiprocessing.spawn calling init_process_group itself, hvd.init(), xgboost.dask): its rank is
        # then taken at the first step and the worker's folder claimed then, before anything is written.
        source = type(self).identity_source
        identity, later = resolve_identity(rank, world_size, worker, include_workers, source)

        #: the step clock, what saves at each step (tensortap.capture) and the step engine on them
        self.clock = StepClock()
        self.schedule = SaveSchedule(self.collection_manager, included, self._save_config, save_all)
        self.engine = StepEngine(self, self.clock, self.schedule, identity)
        self.handoff = self.engine.handoff = HandOff(self, self.engine)
        self.engine.claim_pending = later
        if later:
            self.engine.identity_source = source
        self.collection_manager.set_num_workers(self.num_workers)

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
        self._prepared = False
        self._closed = False
        # Stop requests (tensortap.format.control): every rank watches, writing or not.
        self._stop = StopWatch(self.out_dir, not disabled_by_env())
        self._dropped_here = 0  # values refused before they reached the writer (too large)
        if not self.disabled and self.writes and not self.dry_run and self._stop.remote:
            # an object store that cannot be written is a bad out_dir: said now, in one line, not at the first step
            check_access(self.out_dir)
        #: save_scalar calls kept for the next step: (name, value, sm_metric, timestamp)
        self._outside_scalars: list[tuple[str, np.ndarray, bool, float | None]] = []
        if not self.disabled and self.writes and not self.dry_run and not later:
            self.engine.claim_now()
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
    #: a thread writer starts its thread only at the first hand-off a flush interval after it was made; a job
    #: closed sooner is written by close() (ChunkWriter's `start_after`)
    _late_writer_thread = False
    #: a writer process starts a flush interval after the writer was made (ProcessChunkWriter's `start_after`): a
    #: job that ends sooner starts none, and the start of one that runs longer is not beside its first steps
    _late_writer_process = False

    # --- identity (the engine's WorkerIdentity) ---------------------------------------------

    rank = _IdentityField("rank")
    world_size = _IdentityField("world_size")
    worker = _IdentityField("worker")
    num_workers = _IdentityField("num_workers")
    #: whether this process writes anything (include_workers="one": rank 0 only)
    writes = _IdentityField("writes")

    def _identity_changed(self) -> None:
        self.collection_manager.set_num_workers(self.num_workers)
        self.engine.collections_dirty = True

    def _check_out_dir(self) -> None:
        """Claim this worker's folder in out_dir for this job, atomically (docs/format.md §1)."""
        self.engine.claim_now()

    @property
    def _collections_dirty(self) -> bool:
        return self.engine.collections_dirty

    @_collections_dirty.setter
    def _collections_dirty(self, value: bool) -> None:
        self.engine.collections_dirty = value

    @property
    def _storage(self) -> Any:
        """The job's storage, once the claim or the writer opened it."""
        return self.engine.storage

    @property
    def _stop_request(self) -> dict | None:
        """The stop request found (docs/format.md §8), if any."""
        return self._stop.request

    @property
    def _stop_watch(self) -> bool:
        return self._stop.watching

    @_stop_watch.setter
    def _stop_watch(self, value: bool) -> None:
        self._stop.watching = value

    def tensor_specs(self) -> list[TensorSpec]:
        """The tensors this hook can read now, as `TensorSpec`s (name, dtype, shape, source); framework hooks
        override."""
        return []

    def add_listener(self, event: str, listener: Listener) -> Callable[[], None]:
        """Call `listener(StepEvent)` at every `event` of the step lifecycle (`tensortap.capture.engine.EVENTS`:
        step_begin, forward_end, backward_end, optimizer_step, step_end); returns what removes it."""
        return self.engine.add_listener(event, listener)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None, **overrides: Any) -> Hook:
        """A hook configured by smdebug-style JSON: `json_file_path`, else $TENSORTAP_CONFIG,
        else $SMDEBUG_CONFIG_FILE_PATH."""
        from tensortap.hook_config import load_hook_config

        cfg = load_hook_config(json_file_path)
        kwargs = cfg.hook_kwargs()
        kwargs.update(overrides)
        token = FROM_JSON.set(True)
        try:
            hook = cls(**kwargs)
        finally:
            FROM_JSON.reset(token)
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
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.disarm()  # (no step is counted any more, not even by an adapter's tally)

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
        """The caller may change collections or their configs: the engine's plans and quiet window are recomputed
        (framework hooks extend this to drop plans of another kind)."""
        self.engine.invalidate()

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
        stop = self._stop
        if stop.watching and stop.due():
            stop.check(self)
        self.end_step()
        if not self._prepared:
            self.engine.settle_identity()  # (before the first step: a rank the framework learned late)
        step = self.clock.advance()
        if not self._prepared:
            self._prepare()
        self.engine.begin_step()  # (the adapter's on_step_begin, then the listeners)
        if self._outside_scalars:
            self._save_outside_scalars()
        return step

    def counting_deadline(self) -> float:
        """Until when (`time.monotonic()`) a framework hook may only count steps that save nothing instead of
        calling `next_step()`: the next stop-request check, or infinity when none is watched."""
        return self._stop.deadline()

    def end_step(self) -> None:
        """Finish the current step: readers learn that no more data comes for it."""
        engine = self.engine
        engine.disarm()
        engine.end_step()

    def _send_step_mark(self, step: int | None = None, passed: dict[str, int] | None = None) -> None:
        """Tell the writer that `step` passed (by default the clock's current one)."""
        w = self._writer
        if w is None or self.disabled or not self.writes or self._closed:  # (not active)
            return
        try:  # (what guard() does, without a generator per step)
            engine = self.engine
            if engine.collections_dirty:
                w.set_collections(self.collection_manager.to_json_dict())
                engine.collections_dirty = False
            if step is None:  # (the clock's: its mode steps as numbers, no dict per step)
                w.mark_steps(*self.clock.mark_fields())
            else:
                w.mark_step_passed(step, passed)
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
        return self.engine.step_id()

    def hold_step_marks(self) -> None:
        """The current step's tensors are handed over after it ends (`write_tensors(..., at=step_id())`): its
        step mark, and those of the steps after it, wait until `release_step_marks()` (close() releases them)."""
        self.engine.hold_marks()

    def release_step_marks(self) -> None:
        """Send the step marks held since `hold_step_marks()` (their steps' tensors are handed over)."""
        self.engine.release_marks()

    def on_step_begin(self) -> None:
        """Called when a step begins, once the engine knows what it saves (framework hooks override)."""

    def on_step_end(self) -> None:
        """Called when a step ends, before readers are told (framework hooks override)."""

    # --- saving -----------------------------------------------------------------------------

    def _get_writer(self) -> Writer:
        if self._writer is None:
            engine = self.engine
            if engine.storage is None:
                engine.storage = open_storage(self.out_dir)
            late = self._late_writer_thread if self.writer_kind == "thread" else self._late_writer_process
            start_after = self._writer_opts["flush_interval"] if late else 0.0
            self._writer = open_writer(self.writer_kind, engine.storage, self.worker, tensorboard_dir=self._tb_dir,
                                       first_seq=engine.first_seq, start_after=start_after,
                                       num_workers=self.num_workers, metadata=self._writer_metadata(),
                                       **self._writer_opts)
            self.writer_kind = self._writer.kind
        return self._writer

    def _writer_metadata(self) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "hook": type(self).__name__}

    def _end_writer(self) -> Writer:
        """The writer of a hook that handed nothing over: the end of the job written on the closing thread (a
        writer thread that is never started), not a writer process started only to be stopped."""
        engine = self.engine
        if engine.storage is None:
            engine.storage = open_storage(self.out_dir)
        self._writer = open_writer("thread", engine.storage, self.worker, first_seq=engine.first_seq,
                                   start_after=self._writer_opts["flush_interval"], num_workers=self.num_workers,
                                   metadata=self._writer_metadata(), **self._writer_opts)
        return self._writer

    # (the hand-off, tensortap.capture.handoff)

    def _plan(self, name: str, colls: list[Collection]) -> tuple[bool, tuple[tuple[str, bool], ...], bool]:
        """(save_raw, reductions, save_shape) for a tensor saved in `colls` now."""
        return self.handoff.plan(name, colls)

    def _note_membership(self, name: str, colls: Iterable[Collection]) -> None:
        self.handoff.note_membership(name, colls)

    def write_tensor(self, name: str, value: Any, colls: list[Collection],
                     reduction_values: dict[tuple[str, bool], Any] | None = None,
                     shape: tuple[int, ...] | None = None, copy: bool = True) -> None:
        """Hand one host-side tensor to the writer with the plan of `colls` (framework hooks call this).

        With `copy=False` the caller hands `value` over: it must not change it afterwards.
        """
        self.handoff.write_tensor(name, value, colls, reduction_values, shape, copy)

    def write_tensors(self, items: Iterable[tuple[str, Any, list[Collection]]], copy: bool = True,
                      at: tuple[int, int, int] | None = None) -> None:
        """`write_tensor(name, value, colls, copy=copy)` for each item, in one hand-off: the values saved raw,
        of one dtype, go as one batch copied straight into the writer's room (tensortap.capture.batch); the
        others as records. `at`: the `step_id()` of an earlier step to save them at (its mark held until
        then, see `hold_step_marks`); by default the current step."""
        self.handoff.write_tensors(items, copy, at)

    def batch_spec(self, items: list[tuple[str, list[Collection]]]) -> BatchSpec:
        """The plan of tensors saved together at every saving step with these collections (membership in them
        noted here, once per plan). Shapes and dtype are the caller's to set."""
        return self.handoff.batch_spec(items)

    def write_planned(self, spec: BatchSpec, sources: Sequence[tuple[int, int]],
                      at: tuple[int, int, int] | None = None) -> bool:
        """Hand off a planned batch at the current step (`spec` raw only, with its shapes and numpy dtype;
        `sources` the (address, byte count) of its tensors' bytes, in order, readable now): False if it cannot go
        that way (then hand its tensors to `write_tensors`). `at`: as for `write_tensors`."""
        return self.handoff.write_planned(spec, sources, at)

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
            self._stop.close()
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


def _close_at_exit(ref: weakref.ref) -> None:
    hook = ref()
    if hook is not None and not hook._closed:
        hook.close()
