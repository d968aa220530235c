"""The views of the dashboard and the report, as plain JSON: each view is a list of blocks (a plotly
figure as {data, layout}, a table, a choice, a note) that the page's script draws as they are.

Names that come from the job (tensors, rules, workers, jobs) go into figures HTML-escaped (plotly shows
entities as the characters they stand for, and runs no markup) and into tables as text.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.trials.trial import natural_key
from tensortap.ui.jobs import Job, JobSet, layer_of
from tensortap.ui.series import (
    envelope,
    quantile_bands,
    scalar_series,
    series_json,
    to_json_values,
)

#: layers per page of small multiples
LAYERS_PER_PAGE = 24
#: points of one small multiple's series (a min/max envelope beyond)
SMALL_POINTS = 400
#: columns of the heatmap (step buckets); each shows the largest norm of its steps
HEATMAP_COLUMNS = 400

_STATUS_COLOURS = {"IssuesFound": "#d62728", "Error": "#9467bd", "InProgress": "#1f77b4",
                   "NoIssuesFound": "#2ca02c", "NoData": "#7f7f7f", "Stopped": "#8c564b"}


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


#: characters of a name in a legend (the hover shows it whole): a long one would squeeze the plot
LEGEND_CHARS = 48


def short(name: str, limit: int = LEGEND_CHARS) -> str:
    """`name` cut to `limit` characters, an ellipsis at the cut."""
    return name if len(name) <= limit else name[: limit - 1] + "…"


def fig(data: list[dict], title: str = "", **layout: Any) -> dict[str, Any]:
    lay = {"title": {"text": title}, "margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "hovermode": "closest",
           **layout}
    return {"data": data, "layout": lay}


def step_axis(traces: list[dict], title: str = "global step") -> dict[str, Any]:
    """An x axis of steps (or rounds): no zero line (step 0 is not a value to compare with), and whole-step
    ticks when only a few steps show (plotly would tick 9, 9.5, 10 around a single point)."""
    xs = [x for t in traces for x in (t.get("x") or []) if isinstance(x, int | float)]
    axis: dict[str, Any] = {"title": {"text": title}, "zeroline": False}
    if xs and max(xs) - min(xs) < 8:
        axis["dtick"] = 1
    return axis


def figure_block(fid: str, figure: dict[str, Any], height: int = 360) -> dict[str, Any]:
    return {"type": "figure", "id": fid, "figure": figure, "height": height}


def note(text: str) -> dict[str, Any]:
    return {"type": "note", "text": text}


# --- scalars and rules ---------------------------------------------------------------------------


def _mode_series(job: Job, name: str, mode: Any, worker: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(global steps, values) of a scalar tensor's `mode` steps."""
    trial = job.trial
    t = trial.tensor(name)
    steps, vals = scalar_series(t, mode, worker)
    if mode != _modes.GLOBAL and len(steps):
        g = [trial.global_step(mode, int(s)) for s in steps.tolist()]
        steps = np.array([-1 if x is None else x for x in g], dtype=np.int64)
    return steps, vals


def rule_markers(rules: list[dict[str, Any]], xs: list[int], ys: list[float | None], job_name: str | None,
                 axis: str = "") -> list[dict[str, Any]]:
    """One marker trace per rule that fired, at each firing step on the curve (`xs`, `ys`), its hover
    text the rule's explanation."""
    out = []
    lookup = dict(zip(xs, ys, strict=False))
    finite = [y for y in ys if y is not None]
    top = max(finite) if finite else 0.0
    for r in rules:
        if not r["fired_steps"]:
            continue
        mx, my, text = [], [], []
        for s in r["fired_steps"]:
            mx.append(s)
            y = lookup.get(s)
            if y is None and xs:
                i = int(np.searchsorted(np.asarray(xs), s))
                near = [ys[j] for j in (i - 1, i) if 0 <= j < len(ys) and ys[j] is not None]
                y = near[0] if near else top
            my.append(top if y is None else y)
            expl = r["explanations"].get(str(s)) or ([r["message"]] if r["message"] else [])
            what = f"{r['name']} ({r['run']} run)" if r.get("run") == "offline" else r["name"]
            text.append("<br>".join(esc(e) for e in [f"{what} fired at step {s}", *expl]))
        offline = r.get("run") == "offline"
        tr = {"type": "scatter", "mode": "markers", "x": mx, "y": my, "name": esc(f"rule: {r['name']}")
              + (" [offline]" if offline else "") + (f" ({esc(job_name)})" if job_name else ""),
              "text": text, "hoverinfo": "text",
              # a live and an offline run firing at the same step both show: an x inside an open diamond
              "marker": {"symbol": "diamond-open" if offline else "x", "size": 14 if offline else 12,
                         "color": _STATUS_COLOURS["IssuesFound"], "line": {"width": 2}},
              "meta": {"rule": r["name"], "run": r.get("run", "live")}}
        if axis:
            tr["xaxis"], tr["yaxis"] = "x" + axis, "y" + axis
        out.append(tr)
    return out


def scalars_view(jobs: list[Job], names: list[str] | None = None) -> list[dict[str, Any]]:
    """Losses and metrics per mode over global steps: one figure per mode, every job overlaid, with a
    marker where a rule fired."""
    per_mode: dict[str, list[dict]] = {}
    rules_by_job = {j.index: j.rules() for j in jobs}
    multi = len(jobs) > 1
    for job in jobs:
        with job.lock:
            kinds = job.kinds
            chosen = [n for n in kinds.scalars if names is None or n in names]
            modes = job.trial.modes() or [_modes.GLOBAL]
            for mode in modes:
                for name in chosen:
                    steps, vals = _mode_series(job, name, mode)
                    if not len(steps):
                        continue
                    s = series_json(steps, vals)
                    label = esc(name) + (f" · {esc(job.name)}" if multi else "")
                    tr = {"type": "scatter", "mode": "lines",
                          "x": s["x"], "y": s["y"],
                          "name": esc(short(name)) + (f" · {esc(short(job.name, 24))}" if multi else ""),
                          "meta": {"job": job.index, "tensor": name, "n": s["n"], "downsampled": s["downsampled"]},
                          "hovertemplate": "step %{x}: %{y}<extra>" + label + "</extra>"}
                    if len(s["x"]) < 60:
                        tr["mode"] = "lines+markers"
                    per_mode.setdefault(mode.name, []).append(tr)
                    if s["nonfinite_steps"]:
                        per_mode[mode.name].append({
                            "type": "scatter", "mode": "markers", "x": s["nonfinite_steps"],
                            "y": [0] * len(s["nonfinite_steps"]), "name": "non-finite " + tr["name"],
                            "marker": {"symbol": "triangle-up", "color": "black"}})
    blocks = []
    if not per_mode:
        return [note("No losses or metrics saved yet.")]
    for mode_name, traces in per_mode.items():
        # rule markers go on the TRAIN curves (rules run over global steps; training steps are where they fire)
        if mode_name in ("TRAIN", "GLOBAL") or len(per_mode) == 1:
            for job in jobs:
                # the marker sits on the job's loss curve (else its first curve)
                own = [t for t in traces if t.get("meta", {}).get("job") == job.index]
                own.sort(key=lambda t: "loss" not in t["meta"]["tensor"].lower())
                xs, ys = (own[0]["x"], own[0]["y"]) if own else ([], [])
                traces = traces + rule_markers(rules_by_job[job.index], xs, ys, job.name if multi else None)
        blocks.append(figure_block(f"scalars-{mode_name}", fig(traces, f"Losses and metrics ({mode_name})",
                                                               xaxis=step_axis(traces), showlegend=True)))
    return blocks


def rules_view(jobs: list[Job]) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        for r in job.rules():
            fired = r["fired_steps"]
            expl = r["explanations"].get(str(fired[0]), []) if fired else []
            rows.append({
                "job": job.name, "rule": r["name"], "run": r.get("run", "live"), "status": r["status"],
                "fired at": ", ".join(map(str, fired[:10])) + (" …" if len(fired) > 10 else "") or "-",
                "explanation": "; ".join(expl) or r["message"] or "-",
                "last step": "-" if r["last_step"] is None else str(r["last_step"]),
                "parameters": ", ".join(f"{k}={v}" for k, v in sorted(r["parameters"].items())) or "-",
            })
    if not rows:
        return [note("No rules watch these jobs (tensortap run --rule ..., or tensortap rules run).")]
    columns = ["job", "rule", "run", "status", "fired at", "explanation", "last step", "parameters"]
    if all(r["run"] == "live" for r in rows):
        columns.remove("run")  # said only when a rule was run offline (tensortap rules run)
    if len(jobs) == 1:
        columns.remove("job")  # the header names it
    return [{"type": "table", "id": "rules", "columns": columns, "rows": rows, "status_column": "status"}]


# --- layers ------------------------------------------------------------------------------------


def _layers(job: Job) -> list[tuple[str, str | None, str | None]]:
    """(layer, weight tensor, gradient tensor) of every layer, in saving order of names."""
    k = job.kinds
    by: dict[str, list[str | None]] = {}
    for w in k.weights:
        by.setdefault(layer_of(w), [None, None])[0] = w
    for g in k.gradients:
        by.setdefault(layer_of(g), [None, None])[1] = g
    return [(layer, by[layer][0], by[layer][1]) for layer in sorted(by, key=natural_key)]


def _grid(n: int, cols: int = 4) -> dict[str, Any]:
    rows = max(1, math.ceil(n / cols))
    return {"rows": rows, "columns": min(cols, max(n, 1)), "pattern": "independent", "ygap": 0.45, "xgap": 0.15}


def _legend_once(traces: list[dict[str, Any]]) -> None:
    """One legend entry per legend group: its first trace's (a layer may lack a weight or a gradient)."""
    seen: set[str] = set()
    for t in traces:
        t["showlegend"] = t["legendgroup"] not in seen
        seen.add(t["legendgroup"])


def layers_view(job: Job, page: int = 0, per_page: int = LAYERS_PER_PAGE) -> list[dict[str, Any]]:
    """Per-layer weight and gradient statistics as small multiples: norms (log scale), min/max, and
    non-finite counts, `per_page` layers at a time."""
    with job.lock:
        layers = _layers(job)
        if not layers:
            return [note("No weights or gradients saved.")]
        pages = max(1, math.ceil(len(layers) / per_page))
        page = min(max(page, 0), pages - 1)
        shown = layers[page * per_page:(page + 1) * per_page]
        norm_tr, mm_tr, nf_tr = [], [], []
        annotations = []
        nonfinite_total: dict[str, int] = {}
        for i, (layer, w, g) in enumerate(shown, start=1):
            ax = "" if i == 1 else str(i)
            annotations.append({"text": esc(layer), "xref": f"x{ax} domain", "yref": f"y{ax} domain", "x": 0.5,
                                "y": 1.0, "yanchor": "bottom", "showarrow": False, "font": {"size": 11}})
            for tname, kind, colour in ((w, "weight", "#1f77b4"), (g, "gradient", "#ff7f0e")):
                if tname is None:
                    continue
                st = job.stats(tname)
                common = {"xaxis": "x" + ax, "yaxis": "y" + ax, "legendgroup": kind,
                          "line": {"color": colour, "width": 1}}
                if "l2" in st:
                    s = series_json(*st["l2"], max_points=SMALL_POINTS)
                    norm_tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                                    "name": f"{kind} L2 norm", "meta": {"tensor": tname}, **common,
                                    "hovertemplate": f"{esc(tname)}<br>step %{{x}}: %{{y:.3g}}<extra></extra>"})
                for stat, dash in (("min", "dot"), ("max", "solid")):
                    if stat in st:
                        s = series_json(*st[stat], max_points=SMALL_POINTS)
                        mm_tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                                      "name": f"{kind} {stat}", "meta": {"tensor": tname},
                                      **{**common, "line": {"color": colour, "width": 1, "dash": dash},
                                         "legendgroup": f"{kind}{stat}"},
                                      "hovertemplate": f"{esc(tname)} {stat}<br>step %{{x}}: %{{y:.3g}}"
                                                       "<extra></extra>"})
                if "nonfinite" in st:
                    steps, counts = st["nonfinite"]
                    nonfinite_total[tname] = int(np.nansum(counts))
                    s = series_json(steps, counts, max_points=SMALL_POINTS)
                    nf_tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                                  "name": f"{kind} non-finite", "meta": {"tensor": tname}, **common})
        n = len(shown)
        height = 180 * _grid(n)["rows"] + 80
        for traces in (norm_tr, mm_tr, nf_tr):
            _legend_once(traces)
        x_axes = {("xaxis" if i == 1 else f"xaxis{i}"): {"zeroline": False} for i in range(1, n + 1)}
        log_axes = {("yaxis" if i == 1 else f"yaxis{i}"): {"type": "log", "exponentformat": "power"}
                    for i in range(1, n + 1)}
        blocks: list[dict[str, Any]] = []
        if pages > 1:
            blocks.append({"type": "choice", "param": "page", "label": "layers page",
                           "options": [{"value": str(p), "label": f"{p * per_page + 1}–"
                                        f"{min((p + 1) * per_page, len(layers))} of {len(layers)}"}
                                       for p in range(pages)], "value": str(page)})
        blocks.append(figure_block("layers-norms", fig(norm_tr, "Weight and gradient L2 norms per layer (log scale)",
                                                       grid=_grid(n), annotations=annotations, **x_axes, **log_axes),
                                   height))
        blocks.append(figure_block("layers-minmax", fig(mm_tr, "Min and max per layer", grid=_grid(n),
                                                        annotations=annotations, **x_axes), height))
        bad = {k: v for k, v in nonfinite_total.items() if v}
        if bad:
            blocks.append(figure_block("layers-nonfinite", fig(nf_tr, "Non-finite (NaN/inf) elements per layer",
                                                               grid=_grid(n), annotations=annotations, **x_axes),
                                       height))
        else:
            blocks.append(note(f"No NaN or inf in the weights and gradients of these {n} layers."))
        return blocks


def heatmap_view(job: Job, columns: int = HEATMAP_COLUMNS) -> list[dict[str, Any]]:
    """Layers × steps heatmap of gradient L2 norms on a log scale; each column is the largest norm over
    its steps, so one exploding step is never averaged away."""
    with job.lock:
        grads = sorted(job.kinds.gradients, key=lambda g: natural_key(layer_of(g)))
        if not grads:
            return [note("No gradients saved: the heatmap needs the gradients collection.")]
        rows = []
        all_steps: set[int] = set()
        for g in grads:
            st = job.stats(g).get("l2")
            if st is None:
                continue
            rows.append((g, st))
            all_steps.update(st[0].tolist())
        if not rows:
            return [note("No gradient norms could be read yet.")]
        steps = np.array(sorted(all_steps), dtype=np.int64)
        ncol = min(columns, len(steps))
        edges = np.linspace(0, len(steps), ncol + 1).astype(np.int64)
        xcol = steps[edges[:-1]]
        z = []
        for _, (s, v) in rows:
            col = np.searchsorted(edges, np.searchsorted(steps, s), side="right") - 1
            out = np.full(ncol, np.nan)
            with np.errstate(all="ignore"):
                lv = np.where(v > 0, np.log10(np.abs(v)), -30.0)
                lv[~np.isfinite(v)] = np.nan
            np.fmax.at(out, col, lv)
            z.append(to_json_values(out))
        names = [esc(layer_of(g)) for g, _ in rows]
        tr = {"type": "heatmap", "z": z, "x": [int(x) for x in xcol.tolist()], "y": names,
              "colorscale": "Viridis", "colorbar": {"title": {"text": "log10 ‖g‖"}},
              "hovertemplate": "%{y}<br>step %{x}<br>log10 norm %{z:.2f}<extra></extra>",
              "meta": {"tensors": [g for g, _ in rows], "columns": int(ncol)}}
        height = max(260, 22 * len(rows) + 120)
        return [figure_block("heatmap", fig([tr], "Gradient L2 norm per layer over steps (log10)",
                                            xaxis=step_axis([tr]),
                                            yaxis={"automargin": True, "autorange": "reversed"}), height)]


# --- distributions -----------------------------------------------------------------------------


def distribution_choices(job: Job) -> list[str]:
    k = job.kinds
    return [*k.gradients, *k.weights, *k.others]


def distribution_view(job: Job, tensor: str | None = None) -> list[dict[str, Any]]:
    """Quantile bands (min–max, 5–95 %, 25–75 %, median) of one tensor's values over steps."""
    with job.lock:
        choices = distribution_choices(job)
        if not choices:
            return [note("No non-scalar tensors saved.")]
        if tensor not in choices:
            tensor = choices[0]
        blocks: list[dict[str, Any]] = [{"type": "choice", "param": "tensor", "label": "tensor",
                                         "options": [{"value": c, "label": c} for c in choices], "value": tensor}]
        q = quantile_bands(job.trial.tensor(tensor))
        if not q["steps"]:
            return [*blocks, note(f"{tensor}: only reductions saved, no raw values to show a distribution of.")]
        x = q["steps"]
        qs = q["quantiles"]
        traces = []
        for lo, hi, colour, label in (("0.0", "1.0", "rgba(31,119,180,0.15)", "min–max"),
                                      ("0.05", "0.95", "rgba(31,119,180,0.3)", "5–95 %"),
                                      ("0.25", "0.75", "rgba(31,119,180,0.5)", "25–75 %")):
            traces.append({"type": "scatter", "mode": "lines", "x": x, "y": qs[lo], "line": {"width": 0},
                           "showlegend": False, "hoverinfo": "skip", "name": label + " low"})
            traces.append({"type": "scatter", "mode": "lines", "x": x, "y": qs[hi], "line": {"width": 0},
                           "fill": "tonexty", "fillcolor": colour, "name": label})
        traces.append({"type": "scatter", "mode": "lines", "x": x, "y": qs["0.5"], "name": "median",
                       "line": {"color": "#1f77b4"}})
        blocks.append(figure_block("distribution", fig(traces, f"Distribution of {esc(tensor)} over steps",
                                                       xaxis=step_axis(traces))))
        return blocks


# --- workers -----------------------------------------------------------------------------------


def workers_view(jobs: list[Job], tensor: str | None = None) -> list[dict[str, Any]]:
    """Each worker of a distributed job side by side: one curve per worker of a chosen scalar (or a
    tensor's L2 norm), and each worker's relative distance from the workers' median."""
    blocks: list[dict[str, Any]] = []
    for job in jobs:
        with job.lock:
            workers = job.trial.workers()
            if len(workers) < 2:
                continue
            k = job.kinds
            choices = [*k.scalars, *k.gradients, *k.weights]
            if not choices:
                continue
            name = tensor if tensor in choices else choices[0]
            blocks.append({"type": "choice", "param": "tensor", "label": f"{job.name}: tensor",
                           "options": [{"value": c, "label": c} for c in choices], "value": name})
            t = job.trial.tensor(name)
            traces, per_worker = [], {}
            for w in workers:
                if name in k.scalars:
                    steps, vals = scalar_series(t, _modes.GLOBAL, w)
                else:
                    got = job.stats(name, w).get("l2")
                    steps, vals = got if got is not None else (np.empty(0), np.empty(0))
                if not len(steps):
                    continue
                per_worker[w] = dict(zip(steps.tolist(), vals.tolist(), strict=True))
                s = series_json(steps, vals)
                traces.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"], "name": esc(w),
                               "meta": {"worker": w}})
            common = sorted(set.intersection(*(set(d) for d in per_worker.values()))) if per_worker else []
            dev = []
            if common:
                m = np.array([[per_worker[w][s] for s in common] for w in per_worker], dtype=np.float64)
                med = np.median(m, axis=0)
                with np.errstate(all="ignore"):
                    rel = np.abs(m - med) / np.maximum(np.abs(med), 1e-12)
                dev = [float(np.nanmean(r)) if np.isfinite(r).any() else None for r in rel]
            what = "" if name in k.scalars else " (L2 norm)"
            blocks.append(figure_block(f"workers-{job.index}", fig(traces, f"{esc(name)}{what} per worker · "
                                                                   f"{esc(job.name)}",
                                                                   xaxis=step_axis(traces))))
            if dev:
                colours = ["#d62728" if d is not None and d > 3 * (np.nanmedian([x for x in dev if x is not None])
                                                                    + 1e-3) else "#1f77b4" for d in dev]
                blocks.append(figure_block(f"workers-dev-{job.index}", fig(
                    [{"type": "bar", "x": [esc(w) for w in per_worker], "y": dev, "marker": {"color": colours},
                      "name": "mean relative distance from the median"}],
                    "Mean relative distance of each worker from the workers' median",
                    yaxis={"title": {"text": "mean |value − median| / |median|"}}), 280))
    return blocks or [note("No distributed job here (every job has a single worker).")]


# --- XGBoost -----------------------------------------------------------------------------------


def _last_value(job: Job, name: str) -> tuple[int | None, np.ndarray | None]:
    t = job.trial.tensor(name)
    steps = t.steps()
    if not steps:
        return None, None
    return steps[-1], np.asarray(t.value(steps[-1]))


def xgboost_view(job: Job) -> list[dict[str, Any]]:
    """SageMaker's XGBoost training report: metrics per round, feature importance over rounds, label
    distribution, confusion matrix, SHAP summary: each shown when its data was saved."""
    with job.lock:
        k = job.kinds
        x = k.xgboost
        if not x:
            return [note("No XGBoost data (feature_importance, average_shap, labels, predictions) in this job.")]
        blocks: list[dict[str, Any]] = []
        metrics = [n for n in k.scalars if _XGB_METRIC.match(n)]
        if metrics:
            tr = []
            for n in metrics:
                steps, vals = scalar_series(job.trial.tensor(n))
                s = series_json(steps, vals)
                tr.append({"type": "scatter", "mode": "lines+markers", "x": s["x"], "y": s["y"], "name": esc(n)})
            blocks.append(figure_block("xgb-metrics", fig(tr, "Metrics per round", xaxis=step_axis(tr, "round"))))
        for itype, names in x["feature_importance"].items():
            tr = []
            for n in names:
                steps, vals = scalar_series(job.trial.tensor(n))
                s = series_json(steps, vals)
                tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                           "name": esc(n.split("/", 2)[2]), "stackgroup": "fi"})
            blocks.append(figure_block(f"xgb-fi-{itype}", fig(tr, f"Feature importance ({esc(itype)}) over rounds",
                                                              xaxis=step_axis(tr, "round"))))
        labels_step, labels = _last_value(job, "labels") if x["labels"] else (None, None)
        if labels is not None:
            vals, counts = np.unique(labels.reshape(-1), return_counts=True)
            if len(vals) <= 50:
                bar = {"type": "bar", "x": [esc(_fmt(v)) for v in vals.tolist()], "y": counts.tolist(),
                       "name": "labels"}
            else:
                bar = {"type": "histogram", "x": labels.reshape(-1)[:100000].tolist(), "name": "labels"}
            blocks.append(figure_block("xgb-labels", fig([bar], f"Label distribution (round {labels_step})",
                                                         xaxis={"type": "category", "title": {"text": "label"}}),
                                       300))
        if labels is not None and x["predictions"]:
            _, preds = _last_value(job, "predictions")
            cm = _confusion(labels, preds)
            if cm is not None:
                classes, matrix = cm
                blocks.append(figure_block("xgb-confusion", fig(
                    [{"type": "heatmap", "z": matrix, "x": classes, "y": classes, "colorscale": "Blues",
                      "reversescale": True,
                      "texttemplate": "%{z}", "hovertemplate": "label %{y}, predicted %{x}: %{z}<extra></extra>"}],
                    f"Confusion matrix (round {labels_step})",
                    xaxis={"title": {"text": "predicted"}, "type": "category"},
                    yaxis={"title": {"text": "label"}, "type": "category", "autorange": "reversed"}), 360))
        if x["average_shap"]:
            feats, vals = [], []
            for n in x["average_shap"]:
                _, v = _last_value(job, n)
                if v is not None:
                    feats.append(n.split("/", 1)[1])
                    vals.append(float(np.abs(v).mean()))
            order = np.argsort(vals)
            blocks.append(figure_block("xgb-shap", fig(
                [{"type": "bar", "orientation": "h", "x": [vals[i] for i in order], "y": [esc(feats[i]) for i in order],
                  "name": "mean |SHAP|"}], "SHAP summary: mean |SHAP value| per feature",
                yaxis={"automargin": True}), max(260, 22 * len(feats) + 100)))
        return blocks or [note("No XGBoost report data yet.")]


#: XGBoost's evaluation metrics, `<eval set>-<metric>` (train-rmse, validation-auc, eval-error@0.5)
_XGB_METRIC = re.compile(r"^(scalar/)?[A-Za-z0-9_]+-[A-Za-z0-9@:._]+$")


def _fmt(v: Any) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _confusion(labels: np.ndarray, preds: np.ndarray | None) -> tuple[list[str], list[list[int]]] | None:
    if preds is None:
        return None
    y = labels.reshape(-1)
    p = np.asarray(preds)
    if p.ndim == 2 and p.shape[0] == len(y) and p.shape[1] > 1:
        p = p.argmax(axis=1)
    p = p.reshape(-1)
    if len(p) != len(y):
        return None
    if p.dtype.kind == "f" and not np.all(np.mod(p, 1) == 0):
        p = (p > 0.5).astype(np.int64) if np.all((p >= 0) & (p <= 1)) else np.rint(p)
    classes = np.unique(np.concatenate([y, p]))
    if len(classes) > 50:
        return None
    idx = {c: i for i, c in enumerate(classes.tolist())}
    m = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for a, b in zip(y.tolist(), p.tolist(), strict=True):
        m[idx[a], idx[b]] += 1
    return [esc(_fmt(c)) for c in classes.tolist()], m.tolist()


# --- the catalogue -----------------------------------------------------------------------------


def available_views(jobs: JobSet) -> list[dict[str, str]]:
    """The views worth a tab for these jobs (XGBoost and workers only when their data exists)."""
    views = [{"name": "overview", "title": "Overview"}, {"name": "layers", "title": "Layers"},
             {"name": "heatmap", "title": "Gradient heatmap"}, {"name": "distribution", "title": "Distribution"},
             {"name": "rules", "title": "Rules"}]
    if any(len(j.trial.workers()) > 1 for j in jobs.jobs):
        views.append({"name": "workers", "title": "Workers"})
    if any(j.kinds.xgboost for j in jobs.jobs):
        views.append({"name": "xgboost", "title": "XGBoost"})
    return views


def per_job(fn: Callable[[Job], list[dict[str, Any]]], jobs: list[Job]) -> list[dict[str, Any]]:
    """`fn`'s blocks for each job under a heading; with several jobs a figure's id gets "@<job index>"."""
    if len(jobs) == 1:
        return fn(jobs[0])
    out: list[dict[str, Any]] = []
    for j in jobs:
        out.append({"type": "heading", "text": j.name})
        for b in fn(j):
            if "id" in b:
                b = {**b, "id": f"{b['id']}@{j.index}"}
            out.append(b)
    return out


def render_view(jobs: JobSet, view: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks of `view` for the jobs named in params["job"] (indices; all when absent)."""
    sel = jobs.select(params.get("job") or None)
    if view == "overview":
        return [*rules_view(sel), *scalars_view(sel)]
    if view == "scalars":
        return scalars_view(sel)
    if view == "rules":
        return rules_view(sel)
    if view == "layers":
        page = params.get("page", "0")
        page_n = int(page) if str(page).isdigit() else 0
        return per_job(lambda j: layers_view(j, page_n), sel)
    if view == "heatmap":
        return per_job(heatmap_view, sel)
    if view == "distribution":
        return per_job(lambda j: distribution_view(j, params.get("tensor")), sel)
    if view == "workers":
        return workers_view(sel, params.get("tensor"))
    if view == "xgboost":
        return per_job(xgboost_view, [j for j in sel if j.kinds.xgboost] or sel)
    raise KeyError(f"view {view!r}: allowed are overview, scalars, rules, layers, heatmap, distribution, "
                   "workers, xgboost")


__all__ = ["render_view", "available_views", "envelope"]
