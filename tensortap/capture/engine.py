"""The step engine: the step policy every framework hook shares, written once.

A framework hook (`tensortap.pytorch`, `tensortap.mxnet`, `tensortap.xgboost`, `tensortap.tensorflow`) is an
adapter: it says when its framework begins and ends a step, and reads the tensors the engine's plan asks for.
The engine owns, for every framework:

* the **saving flag** of the current step (`saving`) and what saves (`now`, the schedule's answer);
* the **quiet window**: after a step that saves nothing, the steps before the next saving step (and before the
  next look for a stop request, `deadline`) save nothing either, so an adapter may only count them
  (`count_quiet()`), or let a counter it runs elsewhere count them (`arm(tally)`, e.g. Keras's batch callbacks);
* **late identity**: a rank and world size the framework learns after the hook was made (a process group,
  Horovod, XGBoost's collective), adopted once before the first step, then the claim of the worker's folder
  (`settle_identity()`, `tensortap.capture.identity`);
* the **plan cache**: what an adapter derived from the schedule's answer (which tensors, their collections),
  keyed by that answer (`plans`, a `PlanCache`);
* the **hand-off** of a step's tensors (`handoff`, `tensortap.capture.handoff`) and **held step marks**
  (`hold_marks()` / `release_marks()`, for an adapter that reads a step's tensors after it ended);
* a small named **lifecycle** that other components listen to (`add_listener`): `step_begin`, `forward_end`,
  `backward_end`, `optimizer_step`, `step_end`. The engine fires `step_begin` and `step_end`; an adapter fires
  the others where its framework lets it see them, for as long as someone listens (`listening(event)`).

The engine imports no ML framework; an adapter never writes the engine's fields (it calls its methods).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

from tensortap.capture.clock import StepClock
from tensortap.capture.identity import IdentitySource, WorkerIdentity, claim_worker_dir
from tensortap.capture.schedule import NOTHING, SaveSchedule
from tensortap.exceptions import InvalidConfiguration
from tensortap.modes import ModeKeys

logger = logging.getLogger("tensortap")

STEP_BEGIN = "step_begin"
FORWARD_END = "forward_end"
BACKWARD_END = "backward_end"
OPTIMIZER_STEP = "optimizer_step"
STEP_END = "step_end"
#: the lifecycle's events, in the order a training step fires them
EVENTS = (STEP_BEGIN, FORWARD_END, BACKWARD_END, OPTIMIZER_STEP, STEP_END)

_MAX_LEFT = 1 << 62  # (a tally's `left` is a C long long)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as an adapter describes it to the engine: its saved name, dtype (numpy's name), shape, and
    where the framework keeps it (`source`: "weight", "gradient", "input", "output", "loss", "optimizer",
    "metric", ...)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class StepEvent:
    """What a listener gets: the event's name, the step (global, its mode and the mode's step), whether it saves,
    and what the adapter passes along (e.g. PyTorch's forward: `{"module": m, "output": out}`)."""

    name: str
    step: int
    mode: ModeKeys
    mode_step: int
    saving: bool
    data: Any = None


Listener = Callable[[StepEvent], None]


class Tally:
    """Steps counted outside the engine's own code: `skipped` counted so far (the clock adds them before anything
    reads it), and while `left` > 0 and the clock is before `deadline` the counter may count that many more
    quiet steps."""

    __slots__ = ("skipped", "left", "deadline")

    def __init__(self) -> None:
        self.skipped = 0
        self.left = 0
        self.deadline = 0.0

    def take(self) -> bool:
        """Count one quiet step if the window allows it (True), else leave it to the engine (False)."""
        left = self.left
        if left > 0 and monotonic() < self.deadline:
            self.left = left - 1
            self.skipped += 1
            return True
        return False


class PlanCache:
    """An adapter's plans (what it captures at a step) keyed by the schedule's answer: the list of collections
    saving now (the same object while the set stays the same) and an adapter's key (e.g. TRAIN or not). A plan
    is made once per key by `make(now, key)`; the cache forgets everything when collections change."""

    LIMIT = 64

    def __init__(self) -> None:
        self._plans: dict[tuple, Any] = {}
        self._last_now: Any = None
        self._last_key: Any = None
        self._last: Any = None

    def get(self, now: list, key: Any, make: Callable[[list, Any], Any]) -> Any:
        if self._last_now is now and self._last_key == key:
            return self._last
        full = (key, *map(id, now))
        plan = self._plans.get(full)
        if plan is None:
            if len(self._plans) >= self.LIMIT:
                self._plans.clear()
            plan = self._plans[full] = make(now, key)
        self._last_now, self._last_key, self._last = now, key, plan
        return plan

    def clear(self) -> None:
        self._plans.clear()
        self._last_now = self._last_key = self._last = None

    def __len__(self) -> int:
        return len(self._plans)


class EngineHost(Protocol):
    """What the engine asks of the hook it runs in (tensortap.hooks.base.Hook)."""

    out_dir: str
    dry_run: bool
    disabled: bool

    @property
    def active(self) -> bool: ...

    def counting_deadline(self) -> float: ...

    def on_step_begin(self) -> None: ...

    def on_step_end(self) -> None: ...

    def _send_step_mark(self, step: int | None = None, passed: dict[str, int] | None = None) -> None:
        """Tell the writer that step `step` (and these mode steps) passed; by default the clock's."""

    def _identity_changed(self) -> None: ...

    def _warn_once(self, key: str, message: str) -> None: ...

    def _fail(self, where: str, e: BaseException) -> None: ...


class StepEngine:
    """The step policy of one hook (see the module's docstring)."""

    def __init__(self, host: EngineHost, clock: StepClock, schedule: SaveSchedule, identity: WorkerIdentity,
                 handoff: Any = None) -> None:
        self.host = host
        self.clock = clock
        self.schedule = schedule
        self.identity = identity
        self.handoff = handoff
        #: the current step saves something; `now`: the collections saving (NOTHING when none)
        self.saving = False
        self.now: list = NOTHING
        # the quiet window: after a step that saves nothing, the next step of its mode that saves (-1: unknown),
        # and until when (time.monotonic()) the steps before it may only be counted
        self.next_save: float = -1
        self.deadline = 0.0
        # the light window (see open_light_window): the next step that saves a collection the adapter cannot keep
        # on a counted step, and the collections it can keep (a predicate; None: no light window)
        self.next_full: float = -1
        self.light: Callable[[Any], bool] | None = None
        self._heavy: dict[int, bool] = {}  # id(collection): not light (until the collections change)
        self.plans = PlanCache()
        self._armed: Any = None  # the tally counting quiet steps (see arm)
        #: collections or their membership changed since the writer last got them
        self.collections_dirty = True
        # step marks held back until an adapter has handed over the tensors of their steps: (step, mode steps)
        self._held: list[tuple[int, dict[str, int]]] | None = None
        # late identity: the framework's source, asked once more at the first step; the claim still to make
        self.identity_source: IdentitySource | None = None
        self.claim_pending = False
        self.storage: Any = None
        self.first_seq: int | None = None
        self._listeners: dict[str, list[Listener]] = {e: [] for e in EVENTS}
        self._listened: frozenset[str] = frozenset()
        self._every_step = False  # step_begin or step_end is listened to: no step is only counted
        self._listen_watchers: list[Callable[[frozenset[str]], None]] = []

    # --- the step --------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """The clock has begun a step: decide what saves and the quiet window, let the adapter begin
        (`on_step_begin`), then tell the listeners."""
        clock = self.clock
        mode = clock.mode
        mode_step = clock.mode_steps[mode]
        if self.host.active:
            now = self.schedule.at(mode, mode_step)
            self.now = now
            if now:
                self.saving = True
            else:
                self.saving = False
                self.next_save = self.schedule.next_saving_step(mode, mode_step + 1)
                self.deadline = self.host.counting_deadline()
        else:
            self.now = NOTHING
            self.saving = False
            self.next_save = math.inf
            self.deadline = self.host.counting_deadline()
        self.host.on_step_begin()
        if self._listeners[STEP_BEGIN]:
            self.fire(STEP_BEGIN)

    def end_step(self) -> None:
        """End the open step: the adapter hands over what it holds (`on_step_end`), listeners hear it, then
        readers learn that nothing more comes for the step (its mark, or held with the marks held)."""
        clock = self.clock
        if not clock.in_step:
            return
        clock.in_step = False
        host = self.host
        host.on_step_end()
        if self._listeners[STEP_END]:
            self.fire(STEP_END)
        self.saving = False
        if self._held is not None:  # (sent by release_marks, after this step's tensors)
            passed = clock.passed()  # (adds steps counted elsewhere: before the global step is read)
            self._held.append((clock.step, passed))
        else:
            host._send_step_mark()

    def step_id(self) -> tuple[int, int, int]:
        """(global step, mode value, mode step) of the current step."""
        clock = self.clock
        clock.sync()
        mode = clock.mode
        return clock.step, mode._value_, clock.mode_steps[mode]

    def invalidate(self) -> None:
        """Collections, their configs or the included set changed: plans and the quiet window are recomputed."""
        self.disarm()
        self.plans.clear()
        self._heavy.clear()
        self.schedule.invalidate()
        self.next_save = self.next_full = -1

    # --- the quiet window -----------------------------------------------------------------------------

    def count_quiet(self, mode: ModeKeys | None = None, target: int | None = None) -> bool:
        """Count the step about to begin without beginning it when it is known to save nothing (the open step
        saved nothing, the step is before the next saving one and the next look for a stop request, and no one
        listens to step_begin or step_end): True when counted (readers learn it passed when a later step ends),
        False when the caller begins it. `mode`: the
        step's mode (the open step's by default); `target`: its mode step (by default the next)."""
        if self.saving or self._every_step:
            return False
        clock = self.clock
        if not clock.in_step or (mode is not None and mode is not clock.mode):
            return False
        clock.sync()
        steps = clock.mode_steps
        current = steps[clock.mode]
        if target is None:
            target = current + 1
        if current < target < self.next_save and monotonic() < self.deadline:
            if target != current + 1:
                steps[clock.mode] = target - 1
            clock.advance()
            armed = self._armed
            if armed is not None:  # (the window an armed tally may still count shrinks by the steps counted here)
                armed.left = max(0, armed.left - (target - current))
            return True
        return False

    def open_light_window(self, deadline: float) -> None:
        """For an adapter whose steps hand everything over before they end (XGBoost's rounds), after such a step:
        the steps after it, until the next one that saves a collection it cannot keep (`light(collection)` false)
        and until `deadline`, may be counted with `count_light` whether the step saved or not."""
        clock = self.clock
        mode = clock.mode
        nxt = clock.mode_steps[mode] + 1
        if not self.host.active or self.light is None:
            self.next_save = self.next_full = math.inf if not self.host.active else -1
        else:
            schedule = self.schedule
            light = self.light
            heavy = self._heavy

            def needs_full(c: Any) -> bool:
                hit = heavy.get(id(c))
                if hit is None:
                    hit = heavy[id(c)] = not light(c)
                return hit

            self.next_save = schedule.next_saving_step(mode, nxt)
            self.next_full = schedule.next_saving_step(mode, nxt, where=needs_full)
        self.deadline = deadline

    def close_light_window(self) -> None:
        self.next_full = -1

    def count_light(self, target: int) -> int:
        """Count step `target` (the next of the open step's mode) inside the light window: 0 when the adapter must
        begin it (`next_step()`), 1 when it was counted and saves nothing, 2 when it was counted and saves only
        collections the adapter keeps (it hands their values over with a later step's)."""
        clock = self.clock
        if not clock.in_step or self._every_step:
            return 0
        if not (clock.mode_steps[clock.mode] + 1 == target < self.next_full and monotonic() < self.deadline):
            return 0
        clock.advance()
        if target >= self.next_save:
            self.next_save = self.schedule.next_saving_step(clock.mode, target + 1)
            return 2
        return 1

    def quiet_left(self) -> int:
        """How many steps after the open one may only be counted (0 when none)."""
        clock = self.clock
        if self.saving or self._every_step or not clock.in_step:
            return 0
        left = self.next_save - clock.mode_steps[clock.mode] - 1
        return int(min(left, _MAX_LEFT)) if left > 0 else 0

    def arm(self, tally: Any) -> None:
        """Let `tally` (a `Tally`, or a counter with its fields) count the quiet steps after the open one,
        until the window's deadline; the clock adds what it counted before anything reads the steps."""
        left = self.quiet_left()
        if left > 0:
            tally.left = left
            tally.deadline = self.deadline
            self._armed = tally

    def arm_after(self, tally: Any) -> None:
        """`arm` once the step has ended (an adapter that ends a saving step as soon as it handed everything over):
        `tally` counts the steps after it, up to the next saving step of its mode and the window's deadline, none
        of them begun; the next step that begins then ends no open one."""
        clock = self.clock
        if clock.in_step or self._every_step or not self.host.active:
            return
        clock.sync()
        mode = clock.mode
        current = clock.mode_steps[mode]
        left = self.schedule.next_saving_step(mode, current + 1) - current - 1
        if left > 0:
            self.deadline = self.host.counting_deadline()
            tally.left = int(min(left, _MAX_LEFT))
            tally.deadline = self.deadline
            self._armed = tally

    def disarm(self) -> None:
        """Every later step goes through the adapter again (the step, mode or plan changes)."""
        armed = self._armed
        if armed is not None:
            armed.left = 0
            self._armed = None
        if self.clock.tally is not None:
            self.clock.sync()

    # --- late identity --------------------------------------------------------------------------------

    def adopt_identity(self, rank: int, world_size: int) -> bool:
        """Take a rank and world size the framework learned after the hook was made: once, before the first
        step and before anything was handed to the writer, unless the caller gave the rank. True if taken."""
        ident = self.identity
        if ident.given or self.clock.step >= 0 or getattr(self.host, "_writer", None) is not None:
            return False
        if (rank, world_size) == (ident.rank, ident.world_size):
            return False
        why = ident.adopt(rank, world_size)
        if why is not None:
            self.host._warn_once("late-rank", f"tensortap: the framework's {why}; ignored")
            return False
        self.host._identity_changed()
        return True

    def settle_identity(self) -> None:
        """At the first step (or where the framework says training starts): ask the framework's source once more,
        adopt what it says, then claim the worker's folder if that waited for it."""
        source = self.identity_source
        if source is not None and not self.identity.given and self.clock.step < 0:
            found = source()
            if found is not None:
                self.adopt_identity(*found)
        self.claim()

    def claim(self) -> None:
        """Claim the worker's folder in out_dir if the claim waited for the identity; another job's data there
        turns the hook off (training goes on)."""
        if not self.claim_pending:
            return
        self.claim_pending = False
        host = self.host
        if self.identity.writes and not host.disabled and not host.dry_run:
            try:
                self.claim_now()
            except InvalidConfiguration as e:
                host._fail("first step", e)

    def claim_now(self) -> None:
        """Claim the worker's folder now (InvalidConfiguration if another job holds it)."""
        self.storage, self.first_seq = claim_worker_dir(self.host.out_dir, self.identity.worker)

    # --- held step marks ------------------------------------------------------------------------------

    def hold_marks(self) -> None:
        """The current step's tensors are handed over after it ends: its step mark, and those of the steps after
        it, wait until `release_marks()`."""
        if self._held is None:
            self._held = []

    def release_marks(self) -> None:
        """Send the step marks held since `hold_marks()` (their steps' tensors are handed over)."""
        held, self._held = self._held, None
        if held:
            step, passed = held[-1]  # (a mark covers every step up to it, in every mode)
            self.host._send_step_mark(step, passed)

    @property
    def holding(self) -> bool:
        return self._held is not None

    # --- the lifecycle --------------------------------------------------------------------------------

    def add_listener(self, event: str, listener: Listener) -> Callable[[], None]:
        """Call `listener(StepEvent)` at every `event` (one of `EVENTS`) from now on; returns what removes it.
        A listener that raises is logged once and removed; training and capture go on."""
        if event not in self._listeners:
            raise InvalidConfiguration(f"add_listener({event!r}, ...): allowed events are {', '.join(EVENTS)}")
        if not callable(listener):
            raise InvalidConfiguration(f"add_listener({event!r}, {listener!r}): the listener must be callable")
        self._listeners[event].append(listener)
        self._listeners_changed()

        def remove() -> None:
            self.remove_listener(event, listener)

        return remove

    def remove_listener(self, event: str, listener: Listener) -> None:
        listeners = self._listeners.get(event, [])
        if listener in listeners:
            listeners.remove(listener)
            self._listeners_changed()

    def listening(self, event: str) -> bool:
        """Whether anyone listens to `event` (an adapter fires the events it must go out of its way to see only
        then)."""
        return event in self._listened

    def watch_listeners(self, watcher: Callable[[frozenset[str]], None]) -> None:
        """`watcher(events listened to)` whenever that set changes (an adapter installs what it needs to see an
        event while it is listened to)."""
        self._listen_watchers.append(watcher)
        watcher(self._listened)

    def _listeners_changed(self) -> None:
        listened = frozenset(e for e, fns in self._listeners.items() if fns)
        if listened != self._listened:
            self._listened = listened
            self._every_step = STEP_BEGIN in listened or STEP_END in listened
            if self._every_step:
                self.disarm()
            for w in self._listen_watchers:
                w(listened)

    def fire(self, event: str, data: Any = None) -> None:
        """Tell `event`'s listeners (at the clock's current step)."""
        listeners = self._listeners[event]
        if not listeners:
            return
        clock = self.clock
        clock.sync()
        mode = clock.mode
        ev = StepEvent(event, clock.step, mode, clock.mode_steps[mode], self.saving, data)
        for fn in tuple(listeners):
            try:
                fn(ev)
            except Exception as e:  # noqa: BLE001 - a listener never breaks training or the capture
                logger.error("tensortap: a %s listener failed and is removed; training continues", event,
                             exc_info=e)
                self.remove_listener(event, fn)
