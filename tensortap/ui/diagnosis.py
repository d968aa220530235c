"""The diagnosis on top of the dashboard's overview and of the report (tensortap.analysis.diagnose): per job, what
went wrong in one line, a table of the findings (kind, step, what), and what to try. The dashboard has it made
in a process of its own and shows it when it is ready (a large job's takes minutes); the report waits for it."""

from __future__ import annotations

import atexit
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

from tensortap.analysis.diagnose import Diagnosis

__all__ = ["diagnosis_view", "job_diagnosis", "findings_rows", "RECOMPUTE_S", "WAIT_S"]

#: a running job's diagnosis is made again at most this often (seconds); a finished job's when its data changes
RECOMPUTE_S = 30.0
#: how long a dashboard view waits for the diagnoses being made before it answers without them (seconds, for all
#: its jobs together); the diagnosis is then one block `{"type": "group", "pending": "diagnosis", "blocks"}`: the page
#: asks for that view (the diagnosis alone) until nothing in it is pending, drawing each answer in the group's place
#: and leaving the rest of the view as it is
WAIT_S = 0.5
#: diagnoses made at once (each a process of its own, about a CPU second per 10,000 steps): the others wait their
#: turn, started as the page asks again (50 jobs at once would take every core from the server and the browser)
MAX_MAKING = 2

#: the diagnosis is made in a process of its own, so that a large job's (rules over every step: minutes) neither
#: holds the job's lock nor competes with the server for the GIL
_CHILD = ("import os, sys\n"
          "os.nice(19)  # (the lowest priority: below the server, the browser and a training beside it)\n"
          "from tensortap.analysis.diagnose import diagnose\n"
          "sys.stdout.write(diagnose(sys.argv[1]).to_json())\n")


class _Making:
    """One job's diagnosis: the last one made (and the job's state it was made at), the process making the next."""

    def __init__(self) -> None:
        self.key: Any = None
        self.made_at = 0.0
        self.result: Diagnosis | Exception | None = None
        self.proc: subprocess.Popen | None = None
        self.proc_key: Any = None
        self.out: Any = None
        self.err: Any = None
        self.started_at = 0.0  # time.monotonic() when the process making the next one started

    def poll(self) -> bool:
        """Collect the process's answer if it has ended; whether one is still being made."""
        proc = self.proc
        if proc is None:
            return False
        if proc.poll() is None:
            return True
        self.out.seek(0)
        text = self.out.read()
        self.err.seek(0)
        lines = [ln for ln in self.err.read().splitlines() if ln.strip()]
        self.out.close()
        self.err.close()
        self.proc, self.out, self.err = None, None, None
        try:
            if proc.returncode != 0:
                raise RuntimeError(f"the diagnosis process exited with {proc.returncode}"
                                   + (f": {lines[-1][:300]}" if lines else ""))
            self.result = Diagnosis.from_dict(json.loads(text))
        except Exception as e:  # noqa: BLE001 - shown in place of the diagnosis
            self.result = e
        self.key, self.made_at = self.proc_key, time.monotonic()
        return False

    def start(self, path: str, key: Any) -> None:
        import tensortap

        root = os.path.dirname(os.path.dirname(os.path.abspath(tensortap.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=self.out,
                                     stderr=self.err, stdin=subprocess.DEVNULL, env=env)
        self.proc_key = key
        self.started_at = time.monotonic()
        _RUNNING.add(self)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_MAKING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RUNNING: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    for m in list(_RUNNING):
        m.stop()


def _job_key(job: Any) -> tuple:
    with job.lock:
        trial = job.trial
        rules = tuple((r["name"], r.get("run"), r["status"], r.get("updated_at")) for r in job.rules())
        return trial.generation, rules, bool(trial.loaded_all_steps)


def _making_now() -> int:
    return sum(1 for m in list(_RUNNING) if m.proc is not None)


def _ask(job: Any) -> _Making:
    """The job's _Making, its finished process collected, a new one started when the job changed and a turn is free
    (at most MAX_MAKING at once)."""
    key = _job_key(job)
    with _LOCK:
        m = _MAKING.get(job)
        if m is None:
            m = _MAKING[job] = _Making()
        busy = m.poll()
        stale = m.result is None or (m.key != key and (key[2] or time.monotonic() - m.made_at >= RECOMPUTE_S))
        if stale and not busy:
            for other in list(_RUNNING):  # free the turns of those that ended
                if other is not m:
                    other.poll()
            if _making_now() < MAX_MAKING:
                m.start(job.path, key)
    return m


def _result(m: _Making, deadline: float) -> Diagnosis | Exception | None:
    while True:
        with _LOCK:
            busy = m.poll()
            result = m.result
        if not busy or time.monotonic() >= deadline:
            return result
        time.sleep(0.05)


def job_diagnosis(job: Any, wait: float | None = None) -> Diagnosis | None:
    """The diagnosis of a dashboard Job: the last one made, made again (in a process of its own) when the job
    has changed (a running job's at most every RECOMPUTE_S); waits `wait` seconds (WAIT_S) for one being made.
    None while the first is being made (or waits its turn). Raises what making it raised."""
    got = _diagnoses([job], WAIT_S if wait is None else wait)[0]
    if isinstance(got, Exception):
        raise got
    return got


def _diagnoses(jobs: list[Any], wait: float) -> list[Diagnosis | Exception | None]:
    """Each job's diagnosis (job_diagnosis), waiting `wait` seconds for all of them together, and for each at most
    until `wait` seconds after its process started (a large job's, minutes long, delays only the request that
    started it); not at all when a job waits its turn (processes of other views take the turns), unless `wait` is
    infinite: then it waits for its turn too. A job whose turn comes while others are waited for is started then."""
    making = {id(j): _ask(j) for j in jobs}
    if wait != math.inf and any(m.proc is None and m.result is None for m in making.values()):
        wait = 0.0  # some wait their turn: not all can be ready soon, the page shows them as they come
    deadline = time.monotonic() + wait
    out: list[Diagnosis | Exception | None] = []
    for j in jobs:
        m = making[id(j)]
        while m.proc is None and m.result is None:  # waits for a turn: the jobs before it may have ended
            m = _ask(j)
            if m.proc is not None or m.result is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        out.append(_result(m, deadline if wait == math.inf else min(deadline, m.started_at + wait)))
    return out


def findings_rows(d: Diagnosis) -> list[dict[str, str]]:
    """One row per finding (and per plateau that levels off, said as information): finding, step, what."""
    rows: list[dict[str, str]] = []

    def add(kind: str, step: Any, text: str) -> None:
        rows.append({"finding": kind, "step": "-" if step is None else str(step), "what": text})

    if d.nonfinite is not None:
        add("non-finite value", d.nonfinite.get("step"), d.nonfinite["text"])
    for r in d.rules:
        if r["status"] == "IssuesFound":
            steps = r.get("fired_steps") or []
            add(f"rule {r['name']}" + (" (offline)" if r.get("run") == "offline" else ""),
                steps[0] if steps else None, r.get("message") or "IssuesFound")
    for s in d.spikes:
        add(f"{s['kind']} spike", s["step"], s["text"] + "".join(
            f"; moved first: {m['tensor']} at step {m['step']}" for m in s["movers"][:3]))
    for r in d.ranks:
        add("diverging worker", r["step"], r["text"])
    if d.amp and d.amp.get("collapsed"):
        add("GradScaler collapse", (d.amp.get("run_steps") or [None])[0], d.amp["text"])
    for p in d.plateaus:
        add("loss never fell" if p["kind"] == "never fell" else "plateau (information)", p["from_step"], p["text"])
    return rows


BEING_MADE = "being made (the built-in rules are run over the job's steps); it appears here when it is ready"


def diagnosis_view(jobs: list[Any], wait: float | None = None) -> list[dict[str, Any]]:
    """One job: its headline as a note, the findings as a table, then what to try (one note each). Several: a
    note counting them, a table `diagnosis-jobs` of the headlines of those with findings (or whose diagnosis could
    not be made), the names of those still being made and of those with nothing wrong, each in one note (fifty jobs
    stay a few lines above their curves), then the findings and what to try of each job with findings. `wait`: how
    long to wait for the diagnoses being made, all together (WAIT_S; the report waits for them: `math.inf`). While
    one is being made, the blocks are one group marked `pending: "diagnosis"` (the page asks again until it is
    not)."""
    got = _diagnoses(list(jobs), WAIT_S if wait is None else wait)
    if len(jobs) == 1:
        blocks = [{"type": "note", "text": f"Diagnosis: {_headline(got[0])}"}]
        if isinstance(got[0], Diagnosis):
            blocks += _details(got[0], None)
    else:
        pending = [j.name for j, d in zip(jobs, got, strict=True) if d is None]
        healthy = [j.name for j, d in zip(jobs, got, strict=True) if isinstance(d, Diagnosis) and not findings_rows(d)]
        rows = [{"job": j.name, "diagnosis": _headline(d)} for j, d in zip(jobs, got, strict=True)
                if isinstance(d, Exception) or (isinstance(d, Diagnosis) and findings_rows(d))]
        counts = [f"{len(rows)} with findings" + (" or not made" if any(isinstance(d, Exception) for d in got) else ""),
                  f"{len(healthy)} with nothing wrong found"] + ([f"{len(pending)} being made"] if pending else [])
        blocks = [{"type": "note", "text": f"Diagnosis of {len(jobs)} jobs: {', '.join(counts)}."}]
        if rows:
            blocks.append({"type": "table", "id": "diagnosis-jobs", "columns": ["job", "diagnosis"], "rows": rows})
        if pending:
            blocks.append({"type": "note", "text": f"Being made (the built-in rules are run over each job's steps, "
                                                   f"{MAX_MAKING} jobs at a time): {_names(pending)}; each appears "
                                                   "here when it is ready."})
        if healthy:
            blocks.append({"type": "note", "text": f"Nothing wrong found: {_names(healthy)}."})
        for job, d in zip(jobs, got, strict=True):
            if isinstance(d, Diagnosis) and findings_rows(d):
                blocks.append({"type": "heading", "text": f"Diagnosis of {job.name}: {d.headline()}."})
                blocks += _details(d, job)
    if any(d is None for d in got):
        return [{"type": "group", "id": "diagnosis", "pending": "diagnosis", "blocks": blocks}]
    return blocks


def _details(d: Diagnosis, job: Any) -> list[dict[str, Any]]:
    """The findings table and what to try of one diagnosis (`job`: of several jobs', None: of the only one)."""
    out: list[dict[str, Any]] = []
    rows = findings_rows(d)
    if rows:
        out.append({"type": "table", "id": "diagnosis" if job is None else f"diagnosis-{job.index}",
                    "columns": ["finding", "step", "what"], "rows": rows})
    who = "" if job is None else f" ({job.name})"
    out += [{"type": "note", "text": f"To try{who}: {s}."} for s in d.suggestions]
    return out


#: job names a note lists before "and N more"
NAMES_SHOWN = 12


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


def _headline(d: Diagnosis | Exception | None) -> str:
    if d is None:
        return BEING_MADE + "."
    if isinstance(d, Exception):
        return f"could not be made ({type(d).__name__}: {d})"
    return f"{d.headline()}."


def nonfinite_blocks(job: Any, tensor: str, steps: list[int], multi: bool = False) -> list[dict[str, Any]]:
    """Beside a distribution (its quantile bands hold the finite values): how many NaN, +inf and -inf values
    the tensor held at each of `steps`, as a stacked bar figure, when it held any (else nothing)."""
    import numpy as np

    t = job.trial.tensor(tensor)
    xs: list[int] = []
    counts: dict[str, list[int]] = {"NaN": [], "+inf": [], "−inf": []}
    for s in steps:
        try:
            v = np.asarray(t.value(s))
        except Exception:  # noqa: BLE001 - a step without a raw value has nothing to count
            continue
        if v.dtype.kind not in "fc" and not (v.dtype.kind == "V" and v.dtype.itemsize <= 2):
            continue
        v = v.astype(np.float64, copy=False) if v.dtype.kind == "V" else v
        xs.append(int(s))
        counts["NaN"].append(int(np.count_nonzero(np.isnan(v))))
        counts["+inf"].append(int(np.count_nonzero(np.isposinf(v))))
        counts["−inf"].append(int(np.count_nonzero(np.isneginf(v))))
    total = sum(sum(c) for c in counts.values())
    if not total:
        return []
    from tensortap.ui.views import NONFINITE_COLOUR, PALETTE, esc, fig, figure_block

    colours = {"NaN": NONFINITE_COLOUR, "+inf": PALETTE[1], "−inf": PALETTE[2]}
    patterns = {"NaN": "", "+inf": "/", "−inf": "\\"}
    traces = [{"type": "bar", "x": xs, "y": c, "name": k, "marker": {"color": colours[k],
                                                                      "pattern": {"shape": patterns[k]}}}
              for k, c in counts.items() if any(c)]
    bad = sum(1 for i in range(len(xs)) if any(c[i] for c in counts.values()))
    who = f" · {esc(job.name)}" if multi else ""
    fid = f"distribution-nonfinite-{job.index}" if multi else "distribution-nonfinite"
    return [{"type": "note", "text": f"{tensor}{' in ' + job.name if multi else ''}: {bad} of the {len(xs)} steps "
                                     f"drawn held NaN or infinite values, left out of the bands above and counted "
                                     f"here."},
            figure_block(fid, fig(traces, f"Non-finite values of {esc(tensor)} per step{who}", barmode="stack",
                                  xaxis={"title": {"text": "global step"}}, yaxis={"title": {"text": "values"}}),
                         260)]
