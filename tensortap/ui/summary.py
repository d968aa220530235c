"""A short HTML summary of a Trial for notebooks: steps, modes, workers, collections, tensors, rules.
Plain HTML (no script); every name is escaped."""

from __future__ import annotations

import html
from typing import Any

#: tensors listed by name before the summary says "and N more"
MAX_TENSORS = 12


def trial_html(trial: Any) -> str:
    e = html.escape
    steps = trial.steps(show_incomplete_steps=True)
    modes = []
    for m in trial.modes():
        ms = trial.steps(m, show_incomplete_steps=True)
        modes.append(f"{e(m.name)} {len(ms)}" + (f" ({ms[0]}–{ms[-1]})" if ms else ""))
    names = trial.tensor_names()
    colls = trial.collections()
    shown = ", ".join(f"<code>{e(n)}</code>" for n in names[:MAX_TENSORS])
    if len(names) > MAX_TENSORS:
        shown += f", … and {len(names) - MAX_TENSORS} more"
    rows = [
        ("path", f"<code>{e(str(trial.path))}</code>"),
        ("state", "ended" if trial.loaded_all_steps else "running or interrupted"),
        ("steps", f"{len(steps)}" + (f", global {steps[0]}–{steps[-1]}" if steps else "")),
        ("modes", e(", ".join(modes)) if modes else "-"),
        ("workers", e(", ".join(trial.workers())) or "-"),
        ("collections", e(", ".join(sorted(colls))) or "-"),
        (f"tensors ({len(names)})", shown or "-"),
    ]
    rules = _rules(trial)
    if rules:
        rows.append(("rules", "<br>".join(
            f"{e(r['name'])}{' (offline)' if r['run'] == 'offline' else ''}: "
            f"<b>{e(r['status'] if r['status'] != 'NoData' else 'no data')}</b>"
            + (f" at step {r['fired_steps'][0]}" if r["fired_steps"] else "") for r in rules)))
    body = "".join(f"<tr><th style=\"text-align:left\">{k}</th><td style=\"text-align:left\">{v}</td></tr>"
                   for k, v in rows)
    return (f"<div class=\"tensortap-trial\"><b>Trial {e(str(trial.name))}</b>"
            f"<table>{body}</table>"
            "<small>tensortap.plot.curves(trial), .layers(trial), .heatmap(trial), .distribution(trial, name) "
            "draw it</small></div>")


def _rules(trial: Any) -> list[dict[str, Any]]:
    from tensortap.ui.jobs import Job

    storage = getattr(trial.source, "storage", None)
    if storage is None:
        return []
    try:
        return Job.rules_of(storage)
    except Exception:  # noqa: BLE001 - a summary never fails for want of rule files
        return []
