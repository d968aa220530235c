"""`tensortap report`: the dashboard's views as one self-contained HTML file that opens offline.

Everything is inside the file: the page's style and script, the views' data as JSON, and the dashboard's
plotly.js bundle; the data and plotly.js are gzip-compressed and base64-encoded (plotly.js: 0.66 MB instead
of 1.5 MB) and unpacked by the browser's own DecompressionStream. The rule summary comes first.
"""

from __future__ import annotations

import base64
import gzip
import os
import time
from typing import Any

from tensortap.ui.jobs import JobSet
from tensortap.ui.server import plotly_js, static_text, to_json
from tensortap.ui.views import (
    distribution_choices,
    distribution_view,
    heatmap_view,
    layers_view,
    per_job,
    rules_view,
    scalars_view,
    workers_view,
    xgboost_view,
)

#: tensors whose distribution the report shows, per job
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


def _sections(jobs: JobSet) -> list[dict[str, Any]]:
    sel = jobs.jobs
    sections = [{"name": "rules", "title": "Rule summary", "blocks": rules_view(sel)},
                {"name": "overview", "title": "Losses and metrics", "blocks": scalars_view(sel)}]

    def section(name: str, title: str, make: Any) -> None:
        sections.append({"name": name, "title": title, "blocks": per_job(make, sel)})

    section("heatmap", "Gradient heatmap", heatmap_view)

    def layers(j: Any) -> list[dict[str, Any]]:
        out = []
        for page in range(REPORT_LAYER_PAGES):
            blocks = layers_view(j, page)
            choice = next((b for b in blocks if b["type"] == "choice"), None)
            out.extend({**b, "id": f"{b['id']}-p{page}"} if page and "id" in b else b
                       for b in blocks if b["type"] != "choice")
            if choice is None or page + 1 >= len(choice["options"]):
                break
        return out

    section("layers", "Layers", layers)

    def distributions(j: Any) -> list[dict[str, Any]]:
        out = []
        for name in distribution_choices(j)[:REPORT_DISTRIBUTIONS]:
            out.extend(distribution_view(j, name))
        return out or distribution_view(j)

    section("distribution", "Distributions", distributions)
    if any(len(j.trial.workers()) > 1 for j in sel):
        sections.append({"name": "workers", "title": "Workers", "blocks": workers_view(sel)})
    xgb = [j for j in sel if j.kinds.xgboost]
    if xgb:
        sections.append({"name": "xgboost", "title": "XGBoost training report", "blocks": per_job(xgboost_view, xgb)})
    return sections


def build_report(paths: list[str]) -> str:
    """The report's HTML for the jobs at `paths` (local directories or s3:// URLs)."""
    jobs = JobSet(paths)
    doc = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "jobs": [{"index": j.index, "name": j.name, "path": j.path} for j in jobs.jobs],
        "sections": _sections(jobs),
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


def write_report(paths: list[str], output: str) -> int:
    """Write the report to `output`; returns its size in bytes."""
    text = build_report(paths)
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{output}.{os.getpid()}.partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, output)
    return os.path.getsize(output)


__all__ = ["build_report", "write_report"]
