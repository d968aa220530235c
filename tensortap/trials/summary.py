"""What a Trial shows of itself: the short HTML summary of Jupyter's rich display (steps, modes, workers,
collections, tensors, rules; plain HTML, no script, every name escaped), and the statuses of the rules that
watch the job, read from the files `tensortap run` and `tensortap rules run` write under rules/ (the dashboard
reads them through this module too)."""

from __future__ import annotations

import html
import json
from typing import Any

#: statuses a rule can show; "NoData" is a rule that finished without seeing any data
RULE_STATUSES = ("InProgress", "IssuesFound", "NoIssuesFound", "NoData", "Error", "Stopped")
#: the files a rule run writes (tensortap.runner.status)
_RULE_FILES = ("status.json", "report.json")


def rule_runs(storage: Any) -> list[dict[str, Any]]:
    """Every rule run of a job: {name, run, status, message, fired_steps, explanations, parameters, ...}
    from the status.json and report.json that `tensortap run` writes under rules/<rule>/ ("live") and
    `tensortap rules run` under rules/<rule>/offline/ ("offline"); a rule run both ways gives two."""
    runs: set[tuple[str, str]] = set()
    for key in storage.list("rules/"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2] in _RULE_FILES:
            runs.add((parts[1], "live"))
        elif len(parts) == 4 and parts[2] == "offline" and parts[3] in _RULE_FILES:
            runs.add((parts[1], "offline"))
    out = []
    for label, run in sorted(runs):
        base = f"rules/{label}/" + ("offline/" if run == "offline" else "")
        status = _read_json(storage, base + "status.json") or {}
        report = _read_json(storage, base + "report.json") or status.get("report") or {}
        out.append({**rule_summary(label, status, report), "run": run})
    return out


def _read_json(storage: Any, key: str) -> dict[str, Any] | None:
    try:
        d = json.loads(storage.read(key))
    except (FileNotFoundError, ValueError, OSError):
        return None
    return d if isinstance(d, dict) else None


def rule_summary(label: str, status: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """One rule's status with its firing steps and explanations. A rule that ended without data says
    NoData, never NoIssuesFound."""
    s = status.get("status") or ("IssuesFound" if report.get("triggered") else
                                 "NoIssuesFound" if report.get("finished") else "InProgress")
    if s == "NoIssuesFound" and report and not report.get("datapoints") and not report.get("steps_evaluated"):
        s = "NoData"
    if s not in RULE_STATUSES:
        s = "Error"
    fired = [int(x) for x in report.get("fired_steps") or []]
    if not fired and status.get("first_step") is not None and s == "IssuesFound":
        fired = [int(status["first_step"])]
    explanations: dict[int, list[str]] = {}
    tensors: list[str] = []
    for v in (report.get("first_violations") or []) + (report.get("last_violations") or []):
        if not isinstance(v, dict) or v.get("step") is None:
            continue
        text = str(v.get("condition", ""))
        if v.get("tensor"):
            text = f"{v['tensor']}: {text}"
            if str(v["tensor"]) not in tensors:
                tensors.append(str(v["tensor"]))
        lst = explanations.setdefault(int(v["step"]), [])
        if text not in lst:
            lst.append(text)
    return {
        "name": label,
        "rule": status.get("rule") or report.get("rule") or label,
        "status": s,
        "message": str(status.get("message") or ""),
        "fired_steps": fired,
        "explanations": {str(k): v[:5] for k, v in explanations.items()},
        "tensors": tensors,
        "parameters": status.get("params") or report.get("parameters") or {},
        "steps_evaluated": report.get("steps_evaluated"),
        "last_step": status.get("last_step", report.get("last_step_evaluated")),
        "warnings": report.get("warnings") or [],
        "error": str(status.get("traceback") or "")[-2000:] if s == "Error" else "",
        "updated_at": status.get("updated_at") or report.get("updated_at"),
    }



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
    storage = getattr(trial.source, "storage", None)
    if storage is None:
        return []
    try:
        return rule_runs(storage)
    except Exception:  # noqa: BLE001 - a summary never fails for want of rule files
        return []
