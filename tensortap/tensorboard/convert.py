"""Convert a saved job (tensortap's store or an smdebug out_dir, local or s3://) into TensorBoard event files.

The job is read through a trial (`tensortap.trials.create_trial`); every complete step not converted
before goes through the same EventExporter a hook's writer uses, so a converted job and a live export look
the same. What was converted is kept in `<logdir>/tensortap-tensorboard.json`
(`{"format": 1, "source": OUT_DIR, "converted_upto": STEP, "ended": BOOL}`): a later conversion, or
`follow=True`, converts only the steps after it and appends new event files; nothing is rewritten.

Damage is skipped as a trial skips it: a value whose payload fails its check is left out with one warning naming
its file and offset (the rest of its step and of the job is converted), and the result counts what was skipped.
A job whose data files have no index file cannot be read at all: that is an error naming the missing file.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensortap.exceptions import CorruptData, InvalidConfiguration
from tensortap.format import layout
from tensortap.format.entries import RAW, REDUCTION, reduction_name
from tensortap.modes import ModeKeys
from tensortap.tensorboard.export import EventExporter

logger = logging.getLogger("tensortap")

STATE_FILE = "tensortap-tensorboard.json"
STATE_FORMAT = 1
#: payload bytes read from the job per batch
BATCH_BYTES = 64 << 20


@dataclass
class ConvertResult:
    """What one `convert` call did."""

    steps: int = 0  # global steps converted
    records: int = 0  # tensors exported (a raw value and its reductions count once)
    converted_upto: int = -1  # every step <= this is converted
    ended: bool = False  # the job has ended and everything is converted
    waiting: int = 0  # saved steps not converted because not every worker has finished them yet
    seconds: float = 0.0
    skipped_values: int = 0  # values left out because their stored bytes are damaged (each logged once)
    damaged_index: int = 0  # damaged places in the job's index files, skipped by the reader (each logged once)


def _state_path(logdir: str) -> str:
    return os.path.join(logdir, STATE_FILE)


def read_state(logdir: str) -> dict[str, Any] | None:
    """The conversion state kept in `logdir`, None if it has none."""
    try:
        with open(_state_path(logdir)) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidConfiguration(f"{_state_path(logdir)}: unreadable conversion state ({e})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InvalidConfiguration(f"{_state_path(logdir)}: not a tensortap conversion state (format {STATE_FORMAT})")
    return state


def _write_state(logdir: str, state: dict[str, Any]) -> None:
    tmp = _state_path(logdir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, _state_path(logdir))


def _has_event_files(logdir: str) -> bool:
    for _root, _dirs, files in os.walk(logdir):
        if any("tfevents" in f for f in files):
            return True
    return False


def _collections_json(trial: Any) -> dict[str, Any]:
    out = {}
    for name, info in trial.collections().items():
        d = dict(info.config)
        d["name"] = name
        d["tensor_names"] = sorted(info.tensor_names)
        d["include_regex"] = list(info.include_regex)
        out[name] = d
    return {"collections": out}


class Converter:
    """Converts one job into one logdir, step range by step range; keeps one exporter per worker open."""

    def __init__(self, out_dir: str, logdir: str, assume_ended: bool = False):
        from tensortap.trials import create_trial

        if not isinstance(logdir, str) or not logdir.strip():
            raise InvalidConfiguration(f"logdir={logdir!r} must be a local directory")
        if "://" not in out_dir:
            out_dir = os.path.abspath(out_dir)
        self.out_dir = out_dir
        self.logdir = os.path.expanduser(logdir)
        if "://" not in out_dir and not os.path.isdir(out_dir):
            raise FileNotFoundError(f"{out_dir}: no such directory")
        os.makedirs(self.logdir, exist_ok=True)
        state = read_state(self.logdir)
        if state is not None and state.get("source") != out_dir:
            raise InvalidConfiguration(
                f"{self.logdir} holds the conversion of {state.get('source')!r}, not of {out_dir!r}: "
                "give another --logdir"
            )
        if state is None and _has_event_files(self.logdir):
            raise InvalidConfiguration(
                f"{self.logdir} already holds TensorBoard event files that no conversion wrote (a live export?): "
                "give another --logdir"
            )
        self.converted_upto = int(state["converted_upto"]) if state else -1
        self.trial = create_trial(out_dir)
        _check_indexed(self.trial)
        self.assume_ended = assume_ended
        self._exporters: dict[int, EventExporter] = {}
        self._skipped = 0
        self._index_damage = len(self.trial.damage)  # found while the trial was opened: reported by the first step

    def _exporter(self, worker_id: int) -> EventExporter:
        ex = self._exporters.get(worker_id)
        if ex is None:
            # offline, nobody waits for it: every histogram
            ex = self._exporters[worker_id] = EventExporter(self.logdir, self.trial.source.workers[worker_id],
                                                            histogram_budget=None)
            ex.set_collections(self._colls)
        return ex

    def step(self) -> ConvertResult:
        """Convert every complete step after the last converted one; flush; save the state."""
        t0 = time.perf_counter()
        trial = self.trial
        damage_before = len(trial.damage)
        if self.assume_ended:
            trial.assume_ended()  # an interrupted job: what is saved is all there will be
        else:
            trial.refresh_data()
        ended = trial.loaded_all_steps
        upto = trial.complete_upto()
        # the bulk path, as Tensor.stacked takes it: the trial's consolidated entries, the source's batched reads
        trial._consolidate()
        entries = trial._all
        if upto == float("inf"):
            upto = int(entries["step"].max()) if len(entries) else self.converted_upto
        upto = max(int(upto), self.converted_upto)
        sel = entries[
            (entries["step"] > self.converted_upto) & (entries["step"] <= upto)
            & ((entries["kind"] == RAW) | (entries["kind"] == REDUCTION))
        ]
        self._colls = _collections_json(trial)
        for ex in self._exporters.values():
            ex.set_collections(self._colls)
        self._skipped = 0
        records = self._export(sel)
        for ex in self._exporters.values():
            ex.set_collections(self._colls)  # decides histograms of names the collections list by regex only
            ex.flush()
            if ex.errors:
                raise RuntimeError(f"TensorBoard export to {self.logdir} failed; see the log")
        res = ConvertResult(
            steps=len(np.unique(sel["step"])), records=records, converted_upto=upto, ended=ended,
            seconds=time.perf_counter() - t0, waiting=int(np.count_nonzero(np.unique(entries["step"]) > upto)),
            skipped_values=self._skipped, damaged_index=len(self.trial.damage) - damage_before + self._index_damage,
        )
        self._index_damage = 0
        self.converted_upto = upto
        _write_state(self.logdir, {"format": STATE_FORMAT, "source": self.out_dir, "converted_upto": upto,
                                   "ended": ended})
        return res

    def _export(self, sel: np.ndarray) -> int:
        if not len(sel):
            return 0
        # in step order per worker, a tensor's raw value and reductions next to each other
        sel = sel[np.lexsort((sel["reduction"], sel["kind"], sel["name"], sel["step"], sel["worker"]))]
        src = self.trial.source
        sizes = np.cumsum(sel["length"].astype(np.int64))
        # batch boundaries only between (worker, step, name) groups, every BATCH_BYTES of payload
        key_change = np.ones(len(sel), dtype=bool)
        key_change[1:] = (
            (sel["worker"][1:] != sel["worker"][:-1]) | (sel["step"][1:] != sel["step"][:-1])
            | (sel["name"][1:] != sel["name"][:-1])
        )
        starts = np.flatnonzero(key_change)
        records = 0
        b0 = 0
        while b0 < len(sel):
            limit = (sizes[b0 - 1] if b0 else 0) + BATCH_BYTES
            cut = int(np.searchsorted(sizes, limit, side="right"))
            nxt = starts[starts > max(cut, b0)]
            b1 = int(nxt[0]) if cut < len(sel) and len(nxt) else len(sel)
            batch = sel[b0:b1]
            try:
                values = src.read_values(batch)
            except CorruptData:
                values = self._read_each(batch)
            records += self._export_batch(batch, values)
            b0 = b1
        return records

    def _read_each(self, batch: np.ndarray) -> list[np.ndarray | None]:
        """The values of `batch` one by one, None for each damaged one (logged with its file and offset)."""
        names = self.trial.source.names
        out: list[np.ndarray | None] = []
        for i in range(len(batch)):
            try:
                out.append(self.trial.source.read_values(batch[i : i + 1])[0])
            except CorruptData as e:
                e0 = batch[i]
                what = "value" if int(e0["kind"]) == RAW else "reduction"
                logger.warning("tensortap tensorboard: skipped the damaged %s of %s at step %d: %s", what,
                               names[int(e0["name"])], int(e0["step"]), e)
                self._skipped += 1
                out.append(None)
        return out

    def _export_batch(self, batch: np.ndarray, values: list[np.ndarray | None]) -> int:
        names = self.trial.source.names
        workers, steps, nids = batch["worker"].tolist(), batch["step"].tolist(), batch["name"].tolist()
        kinds, codes = batch["kind"].tolist(), batch["reduction"].tolist()
        modes, mode_steps = batch["mode"].tolist(), batch["mode_step"].tolist()
        n = 0
        i = 0
        count = len(batch)
        while i < count:
            key = (workers[i], steps[i], nids[i])
            raw = None
            reds: dict[str, float] = {}
            j = i
            while j < count and (workers[j], steps[j], nids[j]) == key:
                if values[j] is None:  # damaged: skipped (and logged) by _read_each
                    pass
                elif kinds[j] == RAW:
                    if raw is None:
                        raw = values[j]
                else:
                    rname, is_abs = reduction_name(codes[j])
                    reds[("abs_" if is_abs else "") + rname] = float(np.asarray(values[j]).reshape(-1)[0])
                j += 1
            if raw is not None or reds:
                self._exporter(key[0]).add(names[key[2]], key[1], ModeKeys(modes[i]).name, mode_steps[i], raw, reds)
                n += 1
            i = j
        return n

    def close(self) -> None:
        for ex in self._exporters.values():
            ex.close()


def _check_indexed(trial: Any) -> None:
    """A native job's data files each have their index file: the data of a chunk without one cannot be found.
    None of the job's data files indexed is an error naming the missing index; some is damage, logged once."""
    storage = getattr(trial.source, "storage", None)
    if storage is None:
        return
    chunks: dict[tuple[str, int], set[str]] = {}
    for key in storage.list(layout.ROOT + "/"):
        p = layout.parse_chunk_key(key)
        if p is not None:
            chunks.setdefault((p[0], p[1]), set()).add(p[2])
    unindexed = [(w, seq) for (w, seq), kinds in sorted(chunks.items()) if kinds == {"dat"}]
    if not unindexed:
        return
    missing = [storage.describe(layout.chunk_key(w, seq, layout.INDEX_SUFFIX)) for w, seq in unindexed]
    if len(unindexed) == len(chunks):
        raise InvalidConfiguration(
            f"{trial.source.location}: the job's data has no index: {', '.join(missing)} is missing, and without "
            "it nothing in the data file beside it can be found (nothing converted)")
    for m in missing:
        logger.warning("tensortap tensorboard: %s is missing: the data file beside it cannot be read and is "
                       "skipped", m)


def convert(
    out_dir: str,
    logdir: str,
    *,
    follow: bool = False,
    assume_ended: bool = False,
    poll_interval: float = 1.0,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[ConvertResult], None] | None = None,
) -> ConvertResult:
    """Convert the job at `out_dir` into TensorBoard event files under `logdir` (see the module docstring).

    With `follow`, keep converting new complete steps every `poll_interval` seconds until the job ends
    (every worker closed) or `should_stop()` returns True. Steps some worker has not finished wait for it;
    `assume_ended` converts them too (a job that was interrupted). Returns the totals.
    """
    if not (isinstance(poll_interval, int | float) and poll_interval > 0):
        raise InvalidConfiguration(f"poll_interval={poll_interval!r} must be a positive number of seconds")
    conv = Converter(out_dir, logdir, assume_ended)
    total = ConvertResult(converted_upto=conv.converted_upto)
    try:
        while True:
            r = conv.step()
            total.steps += r.steps
            total.records += r.records
            total.seconds += r.seconds
            total.converted_upto = r.converted_upto
            total.ended = r.ended
            total.waiting = r.waiting
            total.skipped_values += r.skipped_values
            total.damaged_index += r.damaged_index
            if on_progress is not None and (r.steps or r.ended):
                on_progress(r)
            if not follow or r.ended or (should_stop is not None and should_stop()):
                break
            time.sleep(poll_interval)
    finally:
        conv.close()
    return total
