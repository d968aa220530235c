"""The diagnosis on top of the dashboard's overview and of the report (tensortap.analysis.diagnose): per job, what
went wrong in one line, a table of the findings (kind, step, what), and what to try."""

from __future__ import annotations

import time
import weakref
from typing import Any

from tensortap.analysis.diagnose import Diagnosis, diagnose

__all__ = ["diagnosis_view", "job_diagnosis", "findings_rows", "RECOMPUTE_S"]

#: a running job's diagnosis is recomputed at most this often (seconds); a finished job's when its data changes
RECOMPUTE_S = 30.0

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def job_diagnosis(job: Any) -> Diagnosis:
    """The diagnosis of a dashboard Job (cached: see RECOMPUTE_S)."""
    with job.lock:
        trial = job.trial
        rules = tuple((r["name"], r.get("run"), r["status"], r.get("updated_at")) for r in job.rules())
        key = (trial.generation, rules, bool(trial.loaded_all_steps))
        hit = _CACHE.get(job)
        if hit is not None and (hit[0] == key or (not trial.loaded_all_steps
                                                  and time.monotonic() - hit[1] < RECOMPUTE_S)):
            return hit[2]
        d = diagnose(trial, refresh=False)
        _CACHE[job] = (key, time.monotonic(), d)
        return d


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


def diagnosis_view(jobs: list[Any]) -> list[dict[str, Any]]:
    """Per job: its headline as a note, the findings as a table, then what to try (one note each)."""
    blocks: list[dict[str, Any]] = []
    multi = len(jobs) > 1
    for job in jobs:
        try:
            d = job_diagnosis(job)
        except Exception as e:  # noqa: BLE001 - the views below still show the data
            blocks.append({"type": "note", "text": f"Diagnosis{' of ' + job.name if multi else ''}: could not be "
                                                   f"made ({type(e).__name__}: {e})"})
            continue
        who = f" of {job.name}" if multi else ""
        blocks.append({"type": "note", "text": f"Diagnosis{who}: {d.headline()}."})
        rows = findings_rows(d)
        if rows:
            blocks.append({"type": "table", "id": f"diagnosis-{job.index}" if multi else "diagnosis",
                           "columns": ["finding", "step", "what"], "rows": rows})
        for s in d.suggestions:
            blocks.append({"type": "note", "text": f"To try: {s}."})
    return blocks


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
