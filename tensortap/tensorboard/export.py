"""EventExporter: the TensorBoard event files of one worker, fed record by record by a writer.

The layout and tags are specified in docs/tensorboard.md.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import quote

import numpy as np

from tensortap.collection import NON_HISTOGRAM_COLLECTIONS, CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.tensorboard.events import EventFile, encode_histogram, event_record, histogram_value, scalar_value
from tensortap.tensorboard.histogram import Histogram, histogrammable, make_histogram

logger = logging.getLogger("tensortap")

MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
_TAG_RE = re.compile(r"[^-/\w\.]")
#: histograms of tensors whose collections are not known yet wait at most this many bytes for them
MAX_PENDING_BYTES = 64 << 20
#: scalars added before the first collections dict wait for it, at most this many (then they take plain tags)
MAX_PENDING_SCALARS = 100_000
#: ... and at most this many seconds (a caller that never sends one)
PENDING_SCALARS_WAIT_S = 5.0
#: collections that name every tensor (save_all) or the leftovers: a histogram tag prefers any other
_CATCH_ALL = (CollectionKeys.ALL, CollectionKeys.DEFAULT)
#: the share of the writer's time that histograms may take, unless TENSORTAP_TENSORBOARD_BUDGET says otherwise
HISTOGRAM_BUDGET = 0.25
BUDGET_ENV = "TENSORTAP_TENSORBOARD_BUDGET"
#: the budget of this many seconds can be saved up (and is there at the start): budget x window seconds of
#: histograms in a row before the budget applies
_BUDGET_WINDOW_S = 1.0
#: the scalar that counts the histograms skipped so far (written at each step that skipped some)
SKIPPED_TAG = "tensortap/skipped_histograms"


def histogram_budget_from_env() -> float | None:
    """The histogram budget TENSORTAP_TENSORBOARD_BUDGET sets: a number in (0, 1], or "none" for no limit;
    HISTOGRAM_BUDGET when unset. Raises InvalidConfiguration naming a bad value."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return HISTOGRAM_BUDGET
    if raw.lower() == "none":
        return None
    try:
        return _check_budget(float(raw))
    except (ValueError, InvalidConfiguration):
        raise InvalidConfiguration(f"{BUDGET_ENV}={raw!r}: allowed are a number in (0, 1] (the share of the "
                                   "writer's time histograms may take) or 'none' (no limit)") from None


def _check_budget(budget: float | None) -> float | None:
    if budget is not None and not (isinstance(budget, int | float) and not isinstance(budget, bool)
                                   and 0.0 < budget <= 1.0):
        raise InvalidConfiguration(f"histogram_budget={budget!r}: allowed are a number in (0, 1] (the share of "
                                   "the writer's time histograms may take) or None (no limit)")
    return None if budget is None else float(budget)


#: scalar collections whose tensors lead TensorBoard's page: tag groups sort by TensorBoard's tag order, in
#: which a digit sorts before any letter (and "1" before "2")
LEADING_GROUPS = {CollectionKeys.LOSSES: "1_losses", CollectionKeys.METRICS: "2_metrics"}


def _strip_group(group: str, name: str) -> str:
    """`name` without a first component that repeats `group` (`gradient/x` in `gradients`: `x`)."""
    head, sep, rest = name.partition("/")
    return rest if sep and rest and head in (group, group.rstrip("s")) else name


def scalar_tag(name: str, collection: str | None = None) -> str:
    """The tag of tensor `name`'s one-number value: `1_losses/<name>` in `losses`, `2_metrics/<name>` in
    `metrics`, else `<name>`; cleaned."""
    group = LEADING_GROUPS.get(collection or "")
    return clean_tag(name if group is None else f"{group}/{_strip_group(collection or '', name)}")


def histogram_tag(collection: str, name: str) -> str:
    """`<collection>/<name>`, without repeating a prefix the name has (`gradient/x` in `gradients` stays
    `gradient/x`, not `gradients/gradient/x`); cleaned."""
    stripped = _strip_group(collection, name)
    return clean_tag(name if stripped != name else f"{collection}/{name}")


@lru_cache(maxsize=1 << 16)
def clean_tag(tag: str) -> str:
    """smdebug's tag cleaning: characters other than word, '-', '/', '.' become '_'; no leading '/'."""
    return _TAG_RE.sub("_", tag).lstrip("/")


def run_dir(logdir: str, worker: str, mode: str) -> str:
    """`<logdir>/<worker>/<mode in lower case>`: one TensorBoard run per worker and mode."""
    return os.path.join(logdir, quote(worker, safe=""), mode.lower())


class _Coll:
    __slots__ = ("name", "tensor_names", "regexes", "save_histogram")

    def __init__(self, name: str, d: Mapping[str, Any]):
        self.name = name
        names = d.get("tensor_names") or []
        self.tensor_names = set(names) if isinstance(names, list | tuple | set) else set()
        regex = d.get("include_regex") or []  # smdebug writes False for "none" (spec 4.1)
        if isinstance(regex, str):
            regex = [regex]
        self.regexes = []
        for r in regex if isinstance(regex, list | tuple) else []:
            try:
                self.regexes.append(re.compile(r))
            except (re.error, TypeError):
                logger.warning("tensortap tensorboard: collection %r has an invalid regex %r; ignored", name, r)
        h = d.get("save_histogram", True)  # smdebug's Collection.from_dict default
        self.save_histogram = h if isinstance(h, bool) else str(h).lower() == "true"
        if name in NON_HISTOGRAM_COLLECTIONS:
            self.save_histogram = False

    def matches(self, tensor: str) -> bool:
        return any(r.search(tensor) for r in self.regexes)


class EventExporter:
    """Writes the TensorBoard event files of one worker of a job, from the records its writer persists.

    API (the writer, a thread or a separate writer process, calls these in the order it persists):

    - ``EventExporter(logdir: str, worker: str, *, histogram_budget: float | None = <from the environment>)``:
      strings (and a number), so a writer process can build it from JSON.
      Files go to ``<logdir>/<worker>/<mode>/events.out.tfevents.<seconds>.<host>.<pid>.<n>``, mode in
      lower case (``train``, ``eval``, ``predict``, ``global``): one TensorBoard run per worker and mode, with
      the same tags in every mode, so TRAIN and EVAL curves sit side by side. Each file is created at the
      first record of its mode and appended to until ``close()``; files grow with data, not with steps.
    - ``set_collections(collections_json: dict)``: the smdebug-format collections dict the hook hands its
      writer (``{"collections": {name: {"tensor_names", "include_regex", "save_histogram", ...}}, ...}``);
      call it whenever the hook sends a new one.
    - ``add(name: str, step: int, mode: str, mode_step: int, value: numpy.ndarray | None,
      reductions: dict[str, float], collections: Iterable[str] | None = None)``: one saved tensor. ``step``
      is the global step (the x axis of every chart), ``mode`` one of "TRAIN", "EVAL", "PREDICT", "GLOBAL",
      ``value`` the raw host array (None when only reductions were saved), ``reductions`` the saved
      reductions keyed by name ("mean", "l2", "abs_max", ...), ``collections`` the names of the collections
      the tensor is saved for, when the caller knows them (else they are found in the collections dict).
      The exporter reads ``value`` during the call only and keeps no reference to it.
    - ``flush()``: called with the store's flush; afterwards TensorBoard sees everything added so far
      (except histograms of tensors whose collections are not known yet, see below).
    - ``close()``: flushes and closes the files. Idempotent.

    What one ``add`` writes (one Event at ``step``; tags cleaned as smdebug does):

    - a scalar tagged ``scalar_tag(name, collection)``: when ``value`` holds exactly one number
      (save_scalar's ``scalar/<name>``, losses, metrics, any other one-element tensor); NaN and inf are
      written as they are. Tensors of ``losses`` are tagged ``1_losses/<name>``, of ``metrics``
      ``2_metrics/<name>`` (they lead TensorBoard's page), others ``<name>``. A scalar added before the first
      collections dict waits for it (at most PENDING_SCALARS_WAIT_S), so that its tag never changes.
    - ``<scalar tag>/<reduction>`` scalars: each saved reduction.
    - ``histogram_tag(collection, name)`` histogram (``<collection>/<name>``, without repeating a prefix the
      name has: ``gradient/x`` in ``gradients`` stays ``gradient/x``): when ``value`` has two or more numbers
      and a collection the tensor is saved for has save_histogram (smdebug's rule: not for losses, metrics and
      the other scalar collections; not for bool, complex, string or empty tensors), of the finite values
      only, with TensorFlow's default buckets (see tensortap.tensorboard.histogram). The collection is the
      first by name, ``all`` and ``default`` last.
    - ``nonfinite/<name>`` scalar: the number of NaN/inf values a histogram left out, and beside it
      ``nonfinite/<name>/nan``, ``nonfinite/<name>/posinf``, ``nonfinite/<name>/neginf``: how many of them were
      NaN, +inf and -inf; from the first histogram of the tensor that left any out, then beside each of its
      histograms (a job without any has no such chart).

    The values ``add`` gives for one step and mode are written as one Event, when the step or mode changes,
    at ``flush()`` and at ``close()``.

    Keeping up (docs/tensorboard.md): at the first histogram of a step and mode, the exporter decides whether
    that step gets histograms: no when the writer is ``behind`` (a callable the writer sets: its queue holds a
    backlog); else yes when the time histograms took so far is within ``histogram_budget`` (a share; default:
    TENSORTAP_TENSORBOARD_BUDGET, else HISTOGRAM_BUDGET; None: no limit) of the wall-clock time elapsed, plus
    budget x _BUDGET_WINDOW_S seconds (so a short burst, e.g. a job's first steps, gets every histogram;
    unused budget is saved up to that much). A step that gets none still gets its scalars and reductions,
    without histograms and their ``nonfinite/<name>`` counts; each histogram left out is counted in
    ``skipped_histograms``, written as the ``tensortap/skipped_histograms`` scalar with the next Event, and the
    first one is reported in a warning. ``histograms`` counts those written.

    When ``collections`` is not given and the collections dict does not list the tensor yet (a hook sends
    it at the end of each step in which a tensor was first saved), the histogram is computed at once and
    waits for the next ``set_collections`` (at most MAX_PENDING_BYTES), which decides by ``tensor_names``,
    then by ``include_regex``; a tensor no collection names gets ``default/<name>``.

    Never raises into the writer: an error is logged once and counted in ``errors``; after it the exporter
    turns itself off (``disabled``) and counts in ``skipped`` every record it did not write (those it skips
    from then on, and histograms that were still waiting).
    """

    def __init__(self, logdir: str, worker: str, *, histogram_budget: float | None | str = "env"):
        if not isinstance(logdir, str) or not logdir.strip():
            raise InvalidConfiguration(f"logdir={logdir!r} must be a non-empty directory path")
        if "://" in logdir:
            raise InvalidConfiguration(f"logdir={logdir!r}: TensorBoard export writes to a local directory")
        if not isinstance(worker, str) or not worker:
            raise InvalidConfiguration(f"worker={worker!r} must be a non-empty string")
        self.histogram_budget = histogram_budget_from_env() if histogram_budget == "env" else \
            _check_budget(histogram_budget)  # type: ignore[arg-type]
        self.logdir = os.path.expanduser(logdir)
        self.worker = worker
        # mode -> (step, wall time, values, [number of add() calls in it]): the Event being gathered
        self._batches: dict[str, tuple[int, float, list[bytes], list[int]]] = {}
        # histogram seconds the budget allows now (negative: spent ahead)
        self._credit = (self.histogram_budget or 0.0) * _BUDGET_WINDOW_S
        self._credit_at = time.perf_counter()
        self._hist_steps: dict[str, tuple[int, bool]] = {}  # mode -> (step, whether it gets histograms)
        self.skipped_histograms = 0
        #: set by the writer: whether it is behind (a backlog in its queue); a step that starts then gets no
        #: histograms, whatever the budget
        self.behind: Callable[[], bool] | None = None
        self.histograms = 0  # histograms written
        self._skips_written = 0  # skipped_histograms as last written to the event files
        self._files: dict[str, EventFile] = {}
        self._colls: list[_Coll] = []
        self._hist_coll: dict[str, str | None] = {}  # tensor -> collection of its histogram (None: none)
        self._scalar_tags: dict[str, str] = {}  # tensor -> the tag of its one-number value and reductions
        self._nonfinite_seen: set[str] = set()  # tensors that had a non-finite value: their count is written
        # (name, mode, step, wall_time, [(tag suffix, value)]) of scalars added before any collections dict:
        # their tag waits for it (a loss's curve starts under the tag it keeps)
        self._pending_scalars: list[tuple[str, str, int, float, list[tuple[str, float]]]] = []
        self._have_collections = False
        # (name, mode, step, wall_time, encoded HistogramProto or None if skipped, (NaN, +inf, -inf) counts)
        # waiting for collections
        self._pending: list[tuple[str, str, int, float, bytes | None, tuple[int, int, int]]] = []
        self._pending_bytes = 0
        self._closed = False
        self.errors = 0
        self.skipped = 0
        self.records = 0  # add() calls that wrote or queued their data
        self.disabled = False

    # --- collections ------------------------------------------------------------------------

    def set_collections(self, collections_json: Mapping[str, Any]) -> None:
        """Take a new collections dict; decide the histograms that waited for it."""
        if self.disabled:
            return
        try:
            colls = collections_json.get("collections", collections_json) if collections_json else {}
            self._colls = [_Coll(n, d) for n, d in sorted(colls.items()) if isinstance(d, Mapping)]
            self._have_collections = True
            self._resolve_pending_scalars()
            self._resolve_pending(final=True)
        except Exception as e:  # noqa: BLE001 - never raise into the writer
            self._fail("set_collections", e)

    def _pick(self, names: Iterable[str]) -> str | None:
        """The histogram collection among `names` (collections the tensor is saved for), None if none."""
        by_name = {c.name: c for c in self._colls}
        cands = []
        for n in names:
            c = by_name.get(n)
            if c is not None:
                if c.save_histogram:
                    cands.append(n)
            elif n not in NON_HISTOGRAM_COLLECTIONS:
                cands.append(n)  # a collection the dict does not describe yet: smdebug's default, histogram on
        if not cands:
            return None
        return sorted(cands, key=lambda n: (n in _CATCH_ALL, n))[0]

    def _lookup(self, name: str, final: bool) -> tuple[bool, str | None]:
        """(known, histogram collection) of tensor `name` from the collections dict; with `final`, a
        tensor no `tensor_names` lists is decided by the regexes and then by the default."""
        if name in self._hist_coll:
            return True, self._hist_coll[name]
        members = [c.name for c in self._colls if name in c.tensor_names]
        if not members and final:
            members = [c.name for c in self._colls if c.matches(name)] or [CollectionKeys.DEFAULT]
        if not members:
            return False, None
        coll = self._pick(members)
        self._hist_coll[name] = coll
        return True, coll

    # --- records ----------------------------------------------------------------------------

    def add(
        self,
        name: str,
        step: int,
        mode: str,
        mode_step: int,
        value: np.ndarray | None,
        reductions: Mapping[str, float] | None = None,
        collections: Iterable[str] | None = None,
    ) -> None:
        """Export one saved tensor (see the class docstring)."""
        if self.disabled or self._closed:
            self.skipped += 1
            return
        try:
            self._add(name, int(step), _mode_name(mode), value, reductions or {}, collections)
            self.records += 1
        except Exception as e:  # noqa: BLE001 - never raise into the writer
            self._fail("add", e)
            self.skipped += 1

    def _add(
        self, name: str, step: int, mode: str, value: np.ndarray | None, reductions: Mapping[str, float],
        collections: Iterable[str] | None,
    ) -> None:
        now = time.time()
        values: list[bytes] = []
        arr = None
        numbers: list[tuple[str, float]] = []  # (tag suffix, value)
        if value is not None:
            arr = np.asarray(value)
            if arr.size == 1:
                x = _real(arr)
                if x is not None:
                    numbers.append(("", x))
        for red, v in reductions.items():
            x = _real(v)
            if x is not None:  # (a complex tensor's reductions are complex: no scalar for them)
                numbers.append((f"/{red}", x))
        if numbers:
            tag = self._scalar_tags.get(name) or self._scalar_tag(name, collections)
            if tag is None:
                self._pending_scalars.append((name, mode, step, now, numbers))
                if len(self._pending_scalars) > MAX_PENDING_SCALARS:
                    self._resolve_pending_scalars()
            else:
                values.extend(_scalar_values(tag, numbers))
        if arr is not None and arr.size > 1:
            if collections is not None:
                known = True
                coll = self._hist_coll[name] if name in self._hist_coll else self._pick(collections)
                self._hist_coll.setdefault(name, coll)
            else:
                known, coll = self._lookup(name, final=False)
            if (not known or coll is not None) and histogrammable(arr):
                if self._histograms_at(mode, step):
                    started = time.perf_counter()
                    hist = make_histogram(arr)
                    if hist is not None:
                        if known:
                            values.extend(self._histogram_values(coll, name, hist))
                        else:
                            self._queue(name, mode, step, now, _encode(hist) if hist.num else b"",
                                        hist.nonfinite_counts)
                    self._credit -= time.perf_counter() - started
                elif known:
                    self.skipped_histograms += 1
                else:
                    self._queue(name, mode, step, now, None, 0)
        if values:
            self._write(mode, step, now, values)

    def _scalar_tag(self, name: str, collections: Iterable[str] | None, final: bool = False) -> str | None:
        """The scalar tag of `name` (scalar_tag), decided once, when the tensor's collections are known (given,
        or in the collections dict by name or regex), so that a tensor's curve never changes tag; None before
        any collections dict (unless `final`)."""
        if collections is not None:
            member = set(collections)
        elif self._have_collections:
            member = {c.name for c in self._colls
                      if c.name in LEADING_GROUPS and (name in c.tensor_names or c.matches(name))}
        elif final:
            member = set()
        else:
            return None
        group = next((c for c in LEADING_GROUPS if c in member), None)
        tag = self._scalar_tags[name] = scalar_tag(name, group)
        return tag

    def _resolve_pending_scalars(self) -> None:
        """Write the scalars that waited for the first collections dict (in the order they were added)."""
        pending, self._pending_scalars = self._pending_scalars, []
        for i, (name, mode, step, wall_time, numbers) in enumerate(pending):
            tag = self._scalar_tags.get(name) or self._scalar_tag(name, None, final=True)
            try:
                self._write(mode, step, wall_time, _scalar_values(tag or clean_tag(name), numbers))
            except BaseException:
                self._pending_scalars = pending[i:] + self._pending_scalars  # counted as lost by _fail
                raise

    def _histograms_at(self, mode: str, step: int) -> bool:
        """Whether step `step` of `mode` gets histograms (decided at its first one, see the class docstring)."""
        decided = self._hist_steps.get(mode)
        if decided is not None and decided[0] == step:
            return decided[1]
        budget = self.histogram_budget
        if self.behind is not None and self.behind():
            yes = False
        elif budget is None:
            yes = True
        else:
            now = time.perf_counter()
            self._credit = min(self._credit + budget * (now - self._credit_at), budget * _BUDGET_WINDOW_S)
            self._credit_at = now
            yes = self._credit >= 0.0
        self._hist_steps[mode] = (step, yes)
        return yes

    def _histogram_values(self, coll: str, name: str, hist: Histogram) -> list[bytes]:
        out = []
        if hist.num:
            out.append(histogram_value(histogram_tag(coll, name), _encode(hist)))
            self.histograms += 1
        out.extend(self._nonfinite_values(name, hist.nonfinite_counts))
        return out

    def _nonfinite_values(self, name: str, counts: tuple[int, int, int]) -> list[bytes]:
        """`nonfinite/<name>` and its NaN, +inf and -inf counts, from the first histogram that left out a NaN or
        inf, then beside every one (so its chart also shows the return to 0): a job without them has no such
        chart."""
        total = sum(counts)
        if total == 0 and name not in self._nonfinite_seen:
            return []
        self._nonfinite_seen.add(name)
        tag = clean_tag(f"nonfinite/{name}")
        return [scalar_value(tag, total),
                *(scalar_value(f"{tag}/{kind}", n) for kind, n in zip(("nan", "posinf", "neginf"), counts,
                                                                       strict=True))]

    def _write(self, mode: str, step: int, wall_time: float, values: list[bytes]) -> None:
        """Add `values` to the Event of `step` in `mode`'s file (written when the step changes or at flush)."""
        batch = self._batches.get(mode)
        if batch is not None and batch[0] == step:
            batch[2].extend(values)
            batch[3][0] += 1
            return
        if batch is not None:
            self._write_batch(mode)
        else:
            self._file(mode)  # (a directory that cannot be made fails the first record, not a later one)
        self._batches[mode] = (step, wall_time, values, [1])

    def _write_batch(self, mode: str) -> None:
        step, wall_time, values, _ = self._batches.pop(mode)
        if self.skipped_histograms != self._skips_written:
            self._skips_written = self.skipped_histograms
            values.append(scalar_value(SKIPPED_TAG, self.skipped_histograms))
            if not self._warned_skip:
                self._warned_skip = True
                logger.warning(
                    "tensortap: the TensorBoard export of %s cannot keep up (the writer is behind, or histograms "
                    "would take more than %.0f%% of its time): it leaves out the histograms of some steps, counted "
                    "in the %r scalar; scalars and the saved data are complete (%s sets the share)", self.worker,
                    100 * (self.histogram_budget or 1.0), SKIPPED_TAG, BUDGET_ENV)
        self._file(mode).write(event_record(step, values, wall_time))

    _warned_skip = False

    def _queue(self, name: str, mode: str, step: int, wall_time: float, histo: bytes | None,
               nonfinite: tuple[int, int, int]) -> None:
        self._pending.append((name, mode, step, wall_time, histo, nonfinite))
        self._pending_bytes += len(histo or b"") + 64
        if self._pending_bytes > MAX_PENDING_BYTES:
            self._resolve_pending(final=True)

    def _resolve_pending(self, final: bool) -> None:
        if not self._pending:
            return
        keep = []
        for item in self._pending:
            name, mode, step, wall_time, histo, nonfinite = item
            known, coll = self._lookup(name, final)
            if not known:
                keep.append(item)
                continue
            if coll is None:
                continue
            values = []
            if histo is None:
                self.skipped_histograms += 1
                continue
            if histo:
                values.append(histogram_value(histogram_tag(coll, name), histo))
                self.histograms += 1
            values.extend(self._nonfinite_values(name, nonfinite))
            if values:
                self._write(mode, step, wall_time, values)
        self._pending = keep
        self._pending_bytes = sum(len(p[4] or b"") + 64 for p in keep)

    def _file(self, mode: str) -> EventFile:
        f = self._files.get(mode)
        if f is None:
            f = self._files[mode] = EventFile(run_dir(self.logdir, self.worker, mode))
        return f

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def paths(self) -> list[str]:
        """The event files written so far."""
        return [f.path for f in self._files.values()]

    def flush(self) -> None:
        """Make everything added so far readable (histograms still waiting for their collections aside)."""
        if self.disabled:
            return
        try:
            if self._pending_scalars and time.time() - self._pending_scalars[0][3] > PENDING_SCALARS_WAIT_S:
                self._resolve_pending_scalars()  # a caller that sends no collections dict: plain tags
            for mode in list(self._batches):
                self._write_batch(mode)
            for f in self._files.values():
                f.flush()
        except Exception as e:  # noqa: BLE001
            self._fail("flush", e)

    def close(self) -> None:
        """Write what still waits (decided without more collections), flush and close. Idempotent."""
        if self._closed:
            return
        try:
            if not self.disabled:
                self._resolve_pending_scalars()
                self._resolve_pending(final=True)
                self.flush()
        except Exception as e:  # noqa: BLE001
            self._fail("close", e)
        finally:
            self._closed = True
            for f in self._files.values():
                try:
                    f.close()
                except OSError:
                    pass

    def _fail(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        if not self.disabled:
            self.disabled = True
            self.skipped += len(self._pending) + len(self._pending_scalars)
            self.skipped += sum(b[3][0] for b in self._batches.values())
            self._pending = []
            self._pending_scalars = []
            self._batches.clear()
            logger.error("tensortap: TensorBoard export of %s to %s failed in %s (%s: %s); it is off from now on, "
                         "the saved data is not affected", self.worker, self.logdir, where, type(exc).__name__, exc)

    def __enter__(self) -> EventExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<EventExporter {self.worker!r} -> {self.logdir!r} records={self.records} "
                f"histograms={self.histograms} skipped_histograms={self.skipped_histograms} errors={self.errors}>")


def _mode_name(mode: Any) -> str:
    m = getattr(mode, "name", mode)
    if isinstance(m, str) and m.upper() in MODES:
        return m.upper()
    raise ValueError(f"mode={mode!r}: allowed are {', '.join(MODES)}")


def _scalar_values(tag: str, numbers: list[tuple[str, float]]) -> list[bytes]:
    return [scalar_value(clean_tag(tag + suffix) if suffix else tag, x) for suffix, x in numbers]


def _real(v: Any) -> float | None:
    """The one real number `v` holds (bool, int, float, ml_dtypes floats), else None."""
    a = np.asarray(v)
    if a.size != 1:
        return None
    if a.dtype.kind not in "biuf":
        if a.dtype.kind != "V" or a.dtype.itemsize > 2:  # ml_dtypes floats are kind "V"
            return None
        try:
            a = a.astype(np.float32)
        except (TypeError, ValueError):
            return None
    return float(a.reshape(-1)[0])


def _encode(h: Histogram) -> bytes:
    return encode_histogram(h.min, h.max, h.num, h.sum, h.sum_squares, h.bucket_limit, h.bucket)
