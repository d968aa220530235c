"""`tensortap report`: the dashboard's views as one self-contained HTML file that opens offline.

Everything is inside the file: the page's style and script, the views' data as JSON, and the dashboard's
plotly.js bundle; the data and plotly.js are gzip-compressed and base64-encoded (plotly.js: 0.66 MB instead
of 1.5 MB) and unpacked by the browser's own DecompressionStream. The diagnosis comes first, then the rule
summary.
"""

from __future__ import annotations

import base64
import gzip
import math
import os
import re
import time
from typing import Any

import numpy as np

from tensortap.ui.jobs import JobSet
from tensortap.ui.server import plotly_js, static_text, to_json
from tensortap.ui.views import (
    distribution_choices,
    distribution_view,
    has_gradients,
    has_layers,
    heatmap_view,
    job_colour,
    layers_view,
    rules_view,
    scalars_view,
    workers_view,
    xgboost_blocks,
)

#: tensors whose distribution the report shows, per job (unless --distribution names them)
REPORT_DISTRIBUTIONS = 3
#: layers pages drawn in a report, per job
REPORT_LAYER_PAGES = 4

_LOADER = """
(function () {
  function unpack(id) {
    var b64 = document.getElementById(id).textContent.trim();
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text();
  }
  function run(code) {
    var s = document.createElement("script");
    s.textContent = code;
    document.head.appendChild(s);
  }
  Promise.all([unpack("tt-plotly"), unpack("tt-report-data")]).then(function (parts) {
    window.ttReportData = parts[1];
    run(parts[0]);
    run(document.getElementById("tt-appjs").textContent);
  }, function (e) {
    var el = document.getElementById("error");
    el.textContent = "this browser cannot unpack the report's plotly.js: " + e;
    el.hidden = false;
  });
})();
"""


def _packed(text: str) -> str:
    """`text` gzip-compressed and base64-encoded: it can sit inside a <script> element as it is."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), 9, mtime=0)).decode("ascii")


def report_distributions(job: Any, patterns: list[str] | None = None, limit: int = REPORT_DISTRIBUTIONS) -> list[str]:
    """The tensors whose distributions the report draws for `job`: those matching any of `patterns` (regular
    expressions, searched in the name) when given; else the tensors its rules named where they fired, then
    the gradients with the largest L2 norm, up to `limit`."""
    choices = distribution_choices(job)
    if patterns:
        rx = [re.compile(p) for p in patterns]
        return [c for c in choices if any(r.search(c) for r in rx)]
    chosen: list[str] = []
    for r in job.rules():
        for t in r.get("tensors") or []:
            if t in choices and t not in chosen:
                chosen.append(t)
    largest = []
    norms = job.stats_many(job.kinds.gradients) if job.kinds.gradients else {}
    for g in job.kinds.gradients:
        st = norms[g].get("l2")
        if st is not None and len(st[1]):
            v = st[1][np.isfinite(st[1])]
            largest.append((float(v.max()) if len(v) else float("inf"), g))
    for _, g in sorted(largest, key=lambda p: -p[0]):
        if g not in chosen:
            chosen.append(g)
    for c in choices:  # no gradients: the other tensors in name order
        if c not in chosen:
            chosen.append(c)
    return chosen[:limit]


def _sections(jobs: JobSet, distributions: list[str] | None = None) -> list[dict[str, Any]]:
    """The report's sections: only those with something of these jobs to show. XGBoost jobs' metrics are drawn
    once, in the XGBoost section."""
    sel = jobs.jobs
    xgb = [j for j in sel if j.kinds.xgboost]
    from tensortap.ui.diagnosis import diagnosis_view

    sections = [{"name": "diagnosis", "title": "Diagnosis", "blocks": diagnosis_view(sel, wait=math.inf)},
                {"name": "rules", "title": "Rule summary", "blocks": rules_view(sel)}]
    curves = scalars_view(sel, xgboost=False if xgb else None)
    if any(b["type"] == "figure" for b in curves) or not xgb:
        sections.append({"name": "overview", "title": "Losses and metrics", "blocks": curves})
    nn = [j for j in sel if not j.kinds.xgboost or j.kinds.weights or j.kinds.gradients]
    if has_gradients(nn):
        sections.append({"name": "heatmap", "title": "Gradient heatmap", "blocks": heatmap_view(nn)})
    if has_layers(nn):
        blocks = []
        for page in range(REPORT_LAYER_PAGES):
            got = layers_view(nn, page)
            pick = next((b for b in got if b["type"] == "choice"), None)
            blocks.extend({**b, "id": f"{b['id']}-p{page}"} if page and "id" in b else b
                          for b in got if b["type"] not in ("choice", "search"))
            if pick is None or page + 1 >= len(pick["options"]):
                break
        sections.append({"name": "layers", "title": "Layers", "blocks": blocks})
    if distribution_choices(nn):
        names: list[str] = []
        for j in nn:
            names += [n for n in report_distributions(j, distributions) if n not in names]
        blocks = []
        for i, name in enumerate(names):
            blocks += [{**b, "id": f"{b['id']}-{i}"} if "id" in b else b for b in distribution_view(nn, name)
                       if b["type"] != "choice"]
        if distributions and not names:
            blocks = [{"type": "note", "text": "No tensor matches --distribution " + " ".join(distributions)}]
        sections.append({"name": "distribution", "title": "Distributions", "blocks": blocks})
    if any(len(j.trial.workers()) > 1 for j in sel):
        sections.append({"name": "workers", "title": "Workers", "blocks": workers_view(sel)})
    if xgb:
        sections.append({"name": "xgboost", "title": "XGBoost training report", "blocks": xgboost_blocks(xgb)})
    return sections


def check_distributions(patterns: list[str] | None) -> None:
    """ValueError naming a --distribution pattern that is not a regular expression."""
    for p in patterns or []:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"--distribution {p!r}: not a regular expression ({e})") from None


def build_report(paths: list[str], distributions: list[str] | None = None) -> str:
    """The report's HTML for the jobs at `paths` (local directories or s3:// URLs); `distributions`: regular
    expressions of the tensors whose distributions it draws (default: report_distributions' choice)."""
    check_distributions(distributions)
    jobs = JobSet(paths)
    doc = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "jobs": [{"index": j.index, "name": j.name, "path": j.path, "colour": job_colour(j.index)}
                 for j in jobs.jobs],
        "sections": _sections(jobs, distributions),
    }
    plotly_b64 = _packed(plotly_js())
    app_js = static_text("app.js")
    if "</script" in app_js.lower():
        raise AssertionError("app.js must not contain '</script'")
    title = "tensortap report: " + ", ".join(j.name for j in jobs.jobs)
    import html

    return "".join([
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<link rel=\"icon\" href=\"data:,\">\n",
        f"<title>{html.escape(title)}</title>\n",
        f"<style>\n{static_text('app.css')}\n</style>\n",
        "</head>\n<body>\n",
        '<header><span class="brand">tensortap report</span> <span id="jobs"></span> '
        '<span id="live" class="live"></span></header>\n<main id="view"></main>\n',
        '<div id="error" class="error" hidden></div>\n',
        f'<script type="application/gzip-base64" id="tt-report-data">{_packed(to_json(doc))}</script>\n',
        f'<script type="text/plain" id="tt-appjs">{app_js}</script>\n',
        f'<script type="application/gzip-base64" id="tt-plotly">{plotly_b64}</script>\n',
        f"<script>{_LOADER}</script>\n",
        "</body>\n</html>\n",
    ])


def write_report(paths: list[str], output: str, distributions: list[str] | None = None) -> int:
    """Write the report to `output`; returns its size in bytes."""
    text = build_report(paths, distributions)
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{output}.{os.getpid()}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, output)
    return os.path.getsize(output)


__all__ = ["build_report", "write_report"]
