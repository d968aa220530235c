"""The flight recorder: cheap statistics of every tensor at every step, kept in a bounded ring, written out when
something goes wrong (framework-neutral; the PyTorch side is `tensortap.pytorch._flight`).

A framework adapter computes, once per step and where the tensors live, a few statistics of each weight,
gradient and module output (`STATISTICS`), and hands them to `FlightRecorder.record`. The recorder keeps the last
N steps in memory, whatever the hook's save interval, and watches the loss and the gradient norm for spikes. On a
trigger (a non-finite value, a spike, an exception escaping the training step, a rule that found an issue, a stop
request) it writes the ring as ordinary reduction entries in the collection `flight`, the failing step's raw
tensors, and an incident (docs/format.md §11).

Invariants: nothing here raises into the training job (an error turns the recorder off, logged once and counted
in the hook's `error_count`); the ring holds at most `steps` steps; each step of the ring is written at most once.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensortap.exceptions import InvalidConfiguration
from tensortap.format.incidents import IncidentLog, make_incident
from tensortap.format.records import Record

logger = logging.getLogger("tensortap")

#: the statistics of each tensor at each step, as (reduction, abs) keys of the format (docs/format.md §3.2)
STATISTICS: dict[str, tuple[tuple[str, bool], ...]] = {
    "norms": (("l2", False), ("nonfinite", False)),
    "full": (("l2", False), ("nonfinite", False), ("l1", False), ("max", True), ("zeros", False), ("l4", False)),
}
#: statistics stored as counts (int64)
_COUNTS = ("nonfinite", "zeros")
#: whose outputs are recorded: every module's, those of modules with parameters of their own (and the models' and
#: losses' own outputs), or none (weights, gradients and losses only)
OUTPUTS = ("all", "parameterized", "none")
FLIGHT_COLLECTION = "flight"
ENV = "TENSORTAP_FLIGHT"
_MODE_NAMES = {1: "TRAIN", 2: "EVAL", 3: "PREDICT", 4: "GLOBAL"}
#: seconds between looks at the rules' statuses (a rule that found an issue is a trigger)
RULE_CHECK_INTERVAL = 1.0
#: non_finite incidents written per worker at most (a job that stays non-finite is one incident, not thousands)
MAX_NONFINITE_INCIDENTS = 16
#: the log-scale floor of the spread (1.4826·MAD) a spike is measured against: a flat series is not all spikes
_MIN_LOG_SPREAD = 0.01
_F32_MAX = float(np.finfo(np.float32).max)
_F64 = np.dtype(np.float64)


@dataclass(frozen=True)
class FlightConfig:
    """How the flight recorder works: `steps` kept in the ring; `statistics` "norms" (l2 and the non-finite
    count) or "full" (also Σ|x| (l1), max|x|, the count of zeros and (Σx⁴)^¼ (l4): mean|x|, RMS and kurtosis);
    spikes of the loss and the gradient norm judged on their log against the median and MAD of the last
    `spike_window` values (once `spike_min_history` are known): z-score above `spike_z`, or above `spike_ratio`
    times the largest value seen before; the raw tensors of at most `max_raw_dumps` failing steps are written;
    `outputs`: whose outputs are recorded ("all" modules', "parameterized": those with parameters of their own plus
    the models' and losses' outputs, "none": the models' and losses' own outputs only)."""

    steps: int = 256
    statistics: str = "norms"
    spike_window: int = 128
    spike_min_history: int = 32
    spike_z: float = 6.0
    spike_ratio: float = 10.0
    max_raw_dumps: int = 3
    outputs: str = "all"

    def __post_init__(self) -> None:
        for name in ("steps", "spike_window", "spike_min_history", "max_raw_dumps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "max_raw_dumps" else 1):
                raise InvalidConfiguration(f"flight recorder {name}={v!r} must be a positive whole number")
        if self.outputs not in OUTPUTS:
            raise InvalidConfiguration(f"flight recorder outputs={self.outputs!r}: allowed are {', '.join(OUTPUTS)}")
        if self.statistics not in STATISTICS:
            raise InvalidConfiguration(f"flight recorder statistics={self.statistics!r}: allowed are "
                                       f"{', '.join(STATISTICS)}")
        for name in ("spike_z", "spike_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise InvalidConfiguration(f"flight recorder {name}={v!r} must be a positive number")

    @classmethod
    def coerce(cls, value: Any, under_runner: bool = False) -> FlightConfig | None:
        """The config a hook's `flight_recorder=` argument asks for (None: off): True, a number of steps, a
        FlightConfig, or False / None (None: on under `tensortap run`). `TENSORTAP_FLIGHT` overrides: 0 (or off)
        turns it off everywhere, a number of steps turns it on with that many."""
        env = os.environ.get(ENV, "").strip().lower()
        if env:
            if env in ("0", "off", "false", "no"):
                return None
            if env in ("1", "on", "true", "yes"):
                steps = None
            else:
                try:
                    steps = int(env)
                except ValueError:
                    raise InvalidConfiguration(f"{ENV}={env!r}: allowed are 0/off, 1/on or a number of steps "
                                               "(at least 2)") from None
                if steps < 2:
                    raise InvalidConfiguration(f"{ENV}={env!r}: allowed are 0/off, 1/on or a number of steps "
                                               "(at least 2)")
            base = value if isinstance(value, FlightConfig) else cls()
            return base if steps is None else cls(**{**base.__dict__, "steps": steps})
        if value is None:
            return cls() if under_runner else None
        if isinstance(value, FlightConfig):
            return value
        if value is True:
            return cls()
        if value is False:
            return None
        if isinstance(value, int) and value > 0:
            return cls(steps=value)
        raise InvalidConfiguration(f"flight_recorder={value!r}: allowed are True, False, a number of steps kept "
                                   "(e.g. 256) or a tensortap.capture.flight.FlightConfig")


class Layout:
    """The tensors of a step's statistics, in order: names, shapes and the dtype their statistics are stored in.
    Steps that capture the same tensors share one Layout."""

    __slots__ = ("names", "shapes", "dtypes", "numels")

    def __init__(self, names: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], dtypes: tuple[np.dtype, ...]):
        self.names, self.shapes, self.dtypes = names, shapes, dtypes
        self.numels = np.array([math.prod(s) for s in shapes], dtype=np.float64)  # elements of each tensor


class SpikeDetector:
    """Spikes of a positive series (a loss, a gradient norm), judged on its log: a robust z-score against the
    median and MAD of the trailing window, and the ratio to the largest value seen before. A spike is reported
    when the series starts spiking (not again while it stays up). The window is kept sorted: the median costs
    nothing, the MAD is computed only for a value that could be a spike."""

    def __init__(self, config: FlightConfig):
        self.config = config
        self.window: deque[float] = deque()
        self.sorted: list[float] = []
        self.running_max = 0.0
        self.spiking = False

    def observe(self, value: float) -> dict[str, Any] | None:
        if not (value > 0 and math.isfinite(value)):
            return None  # (non-finite values are the non_finite trigger's; the log needs a positive value)
        c = self.config
        lv = math.log(value)
        found = None
        s = self.sorted
        n = len(s)
        if n >= c.spike_min_history:  # (so running_max > 0)
            med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
            if lv - med > c.spike_z * _MIN_LOG_SPREAD or value / self.running_max > c.spike_ratio:
                found = self._judge(value, lv, med)
            else:
                self.spiking = False
        if n >= c.spike_window:
            del s[bisect.bisect_left(s, self.window.popleft())]
        self.window.append(lv)
        bisect.insort(s, lv)
        if value > self.running_max:
            self.running_max = value
        return found

    def _judge(self, value: float, lv: float, med: float) -> dict[str, Any] | None:
        """A value that could be a spike (its log `lv`, the window's median `med`): the spike, when it starts."""
        c = self.config
        ratio = value / self.running_max
        mad = float(np.median(np.abs(np.asarray(self.sorted) - med)))
        z = (lv - med) / max(1.4826 * mad, _MIN_LOG_SPREAD)
        why = []
        if z > c.spike_z:
            why.append(f"robust z-score of the log {z:.1f} > {c.spike_z:g}")
        if ratio > c.spike_ratio:
            why.append(f"{ratio:.1f}x the largest value before > {c.spike_ratio:g}x")
        found = None
        if why and not self.spiking:
            found = {"value": value, "median": math.exp(med), "mad": mad, "z": z,
                     "running_max": self.running_max, "ratio": ratio, "why": "; ".join(why)}
        self.spiking = bool(why)
        return found


class FlightRecorder:
    """The ring of the last steps' statistics of one hook, and what happens on a trigger.

    `hook` is tensortap's hook (tensortap.hooks.base.Hook): the recorder writes through it. `raw_tensors()`, given
    by the framework adapter, returns the current step's raw tensors as (name, host array) pairs; `flush()` records
    the step in progress.
    """

    def __init__(self, config: FlightConfig, hook: Any, raw_tensors: Callable[[], list[tuple[str, np.ndarray]]],
                 flush: Callable[[], None] | None = None):
        self.config = config
        self.flush = flush  # records the step in progress (before an exception's incident)
        self.keys = STATISTICS[config.statistics]
        self.hook = hook
        self.raw_tensors = raw_tensors
        # (seq, (step, mode, mode_step), layout, values[n, len(keys)]) of the last `steps` steps, oldest first
        self.ring: deque[tuple[int, tuple[int, int, int], Layout, np.ndarray]] = deque(maxlen=config.steps)
        self._seq = 0
        self._written_seq = 0  # ring entries up to this seq are in the store
        self.loss_spikes = SpikeDetector(config)
        self.grad_spikes = SpikeDetector(config)
        self.incidents: list[dict[str, Any]] = []  # written by this recorder, in order
        self._log: IncidentLog | None = None
        self._raw_dumps = 0
        self._nonfinite_armed = True
        self._nonfinite_count = 0
        self._rules_seen: set[str] = set()
        self._next_rule_check = time.monotonic() + RULE_CHECK_INTERVAL
        self._rules_dir = None if "://" in hook.out_dir else os.path.join(hook.out_dir, "rules")
        self._stop_seen = False
        self._exceptions_seen: set[int] = set()
        self.off = False
        coll = hook.collection_manager.get(FLIGHT_COLLECTION)
        from tensortap.config import ReductionConfig

        coll.reduction_config = ReductionConfig(save_raw_tensor=True)  # (the failing step's tensors: raw)
        self._coll = coll
        _watch_exceptions(self)

    # --- the ring ---------------------------------------------------------------------------

    def record(self, step_id: tuple[int, int, int], layout: Layout, values: np.ndarray) -> None:
        """Keep one step's statistics (`values[i, j]`: statistic `keys[j]` of tensor `layout.names[i]`)."""
        self._seq += 1
        self.ring.append((self._seq, step_id, layout, values))

    def ring_steps(self) -> tuple[int, int] | None:
        if not self.ring:
            return None
        return self.ring[0][1][0], self.ring[-1][1][0]

    # --- triggers ---------------------------------------------------------------------------

    def nonfinite(self, step_id: tuple[int, int, int], detail: dict[str, Any] | None,
                  raw: Callable[[], list[tuple[str, np.ndarray]]] | None = None) -> None:
        """The step had a non-finite value (`detail`: where it first appeared), or (None) it had none: the next
        non-finite step is an incident again."""
        if detail is None:
            self._nonfinite_armed = True
            return
        if not self._nonfinite_armed or self._nonfinite_count >= MAX_NONFINITE_INCIDENTS:
            return
        self._nonfinite_armed = False
        self._nonfinite_count += 1
        self.incident("non_finite", step_id, detail, raw)

    def observe(self, step_id: tuple[int, int, int], loss: float | None, grad_norm: float | None,
                raw: Callable[[], list[tuple[str, np.ndarray]]] | None = None, loss_name: str | None = None) -> None:
        """A TRAIN step's loss and total gradient norm (None: not known): spikes are incidents."""
        if loss is not None:
            found = self.loss_spikes.observe(loss)
            if found is not None:
                self.incident("loss_spike", step_id, {**found, "tensor": loss_name}, raw)
        if grad_norm is not None:
            found = self.grad_spikes.observe(grad_norm)
            if found is not None:
                self.incident("grad_norm_spike", step_id, {**found, "tensor": "gradients (total l2 norm)"}, raw)

    def poll(self, step_id: tuple[int, int, int]) -> None:
        """At most once a second: a rule of `tensortap run` that found an issue (its status.json) is an incident."""
        now = time.monotonic()
        if self._rules_dir is None or now < self._next_rule_check:
            return
        self._next_rule_check = now + RULE_CHECK_INTERVAL
        try:
            labels = os.listdir(self._rules_dir)
        except OSError:
            return
        import json

        for label in labels:
            if label in self._rules_seen:
                continue
            try:
                with open(os.path.join(self._rules_dir, label, "status.json"), "rb") as f:
                    status = json.loads(f.read())
            except (OSError, ValueError):
                continue
            if isinstance(status, dict) and status.get("status") == "IssuesFound":
                self._rules_seen.add(label)
                self.incident("rule", step_id, {"rule": label, "message": status.get("message", ""),
                                                "first_step": status.get("first_step")}, self.raw_tensors)

    def on_exception(self, exc: BaseException) -> None:
        """An exception escaped the training step (it reached sys.excepthook, or the hook's `with` block)."""
        if self.off or id(exc) in self._exceptions_seen or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return
        self._exceptions_seen.add(id(exc))
        hook = self.hook
        if hook._closed:
            return
        if self.flush is not None:
            try:
                self.flush()
            except Exception as e:  # noqa: BLE001
                self.fail("recording the step in progress", e)
                return
        self.incident("exception", hook.step_id(), {"type": type(exc).__name__, "message": str(exc)[:2000]},
                      self.raw_tensors)

    def on_close(self) -> None:
        """The hook closes: after a stop request, that is an incident."""
        req = getattr(self.hook, "_stop_request", None)
        if req is not None and not self._stop_seen:
            self._stop_seen = True
            self.incident("stop", self.hook.step_id(), {"rule": req.get("rule"), "reason": req.get("reason", "")},
                          None)
        _unwatch(self)

    # --- writing ----------------------------------------------------------------------------

    def incident(self, kind: str, step_id: tuple[int, int, int], detail: dict[str, Any],
                 raw: Callable[[], list[tuple[str, np.ndarray]]] | None = None) -> None:
        """Write the ring (the steps not written yet), the failing step's raw tensors and the incident."""
        if self.off:
            return
        hook = self.hook
        try:
            step, mode, mode_step = step_id
            ring = self.ring_steps()
            writing = hook.writes and not hook.dry_run and not hook.disabled
            if writing:
                self._write_ring()
                if raw is not None and self._raw_dumps < self.config.max_raw_dumps:
                    items = raw()
                    if items:
                        self._raw_dumps += 1
                        hook.write_tensors([(n, a, [self._coll]) for n, a in items], copy=False, at=step_id)
            inc = make_incident(kind, step, _MODE_NAMES.get(mode, "GLOBAL"), mode_step, hook.worker, time.time(),
                                ring if writing else None, detail)
            self.incidents.append(inc)
            if not hook.dry_run:
                if self._log is None:
                    from tensortap.storage import open_storage

                    self._log = IncidentLog(hook._storage or open_storage(hook.out_dir), hook.worker)
                self._log.append(inc)
            logger.warning("tensortap flight recorder: %s at step %d (%s)%s", kind, step, _summary(kind, detail),
                           f"; the last {len(self.ring)} steps are saved in the collection 'flight'"
                           if writing and ring else "")
        except Exception as e:  # noqa: BLE001 - never break the training job
            self.fail("writing an incident", e)

    def _write_ring(self) -> None:
        new = [e for e in self.ring if e[0] > self._written_seq]
        if not new:
            return
        self._written_seq = new[-1][0]
        hook = self.hook
        keys = self.keys
        records = []
        named: set[int] = set()
        for _seq, (step, mode, mode_step), layout, values in new:
            if id(layout) not in named:
                named.add(id(layout))
                for n in layout.names:
                    hook._note_membership(n, (self._coll,))
            for i, name in enumerate(layout.names):
                row = values[i]
                dt = layout.dtypes[i]
                rv = {k: (np.asarray(int(row[j]), dtype=np.int64) if k[0] in _COUNTS
                          else np.asarray(row[j], dt if abs(row[j]) < _F32_MAX or not math.isfinite(row[j]) else _F64))
                      for j, k in enumerate(keys)}
                records.append(Record(name=name, step=step, mode=mode, mode_step=mode_step, value=None, save_raw=False,
                                      reduction_values=rv, shape=layout.shapes[i]))
        hook._get_writer().submit_many(records)
        hook._collections_dirty = True

    def fail(self, where: str, e: BaseException) -> None:
        """An error of the recorder turns it off (logged once, counted); the hook and training go on."""
        self.hook.error_count += 1
        if not self.off:
            self.off = True
            logger.error("tensortap: error in the flight recorder (%s); it turns itself off, training continues",
                         where, exc_info=e)
        _unwatch(self)


def _summary(kind: str, detail: dict[str, Any]) -> str:
    if kind == "non_finite":
        where = detail.get("module") or detail.get("parameter") or detail.get("tensor")
        return f"{detail.get('phase')}: {where} ({detail.get('tensor')}: {detail.get('nan')} NaN, " \
               f"{detail.get('posinf')} +inf, {detail.get('neginf')} -inf)"
    if kind in ("loss_spike", "grad_norm_spike"):
        return f"{detail.get('value'):.4g}: {detail.get('why')}"
    if kind == "exception":
        return f"{detail.get('type')}: {detail.get('message')}"
    if kind == "rule":
        return f"{detail.get('rule')}: {detail.get('message')}"
    return str(detail.get("reason") or detail)


# --- exceptions escaping the training step ---------------------------------------------------

_recorders: weakref.WeakSet[FlightRecorder] = weakref.WeakSet()
_chained: Any = None


def _excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
    for rec in list(_recorders):
        try:
            rec.on_exception(exc)
        except Exception:  # noqa: BLE001 - the user's traceback must still be printed
            pass
    (_chained or sys.__excepthook__)(exc_type, exc, tb)


def _watch_exceptions(rec: FlightRecorder) -> None:
    """An uncaught exception (sys.excepthook, before the hook is closed at exit) is an incident of `rec`."""
    global _chained
    _recorders.add(rec)
    if sys.excepthook is not _excepthook:
        _chained = sys.excepthook
        sys.excepthook = _excepthook


def _unwatch(rec: FlightRecorder) -> None:
    _recorders.discard(rec)
