"""The views of the dashboard and the report, as plain JSON: each view is a list of blocks (a plotly
figure as {data, layout}, a table, a choice, a search box, a note) that the page's script draws as they are.

Every view overlays the jobs it is given on shared axes (a run keeps its colour in every view); XGBoost rounds
and neural-net steps never share an axis. Log axes are zero-safe: an exact zero is drawn on a row labelled "0"
and a NaN or inf on a row labelled "NaN/inf", never left out.

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
    MAX_POINTS,
    envelope,
    envelope_index,
    quantile_bands,
    scalar_series,
    series_json,
    to_json_values,
    window_index,
)

#: layers per page of small multiples
LAYERS_PER_PAGE = 24
#: points of one small multiple's series (a min/max envelope beyond)
SMALL_POINTS = 400
#: points of all the series of one small multiple together: with many jobs (50 jobs: 100 series a panel), each is
#: a min/max envelope of PANEL_POINTS / series points (at least MIN_SMALL_POINTS)
PANEL_POINTS = 4_000
MIN_SMALL_POINTS = 40
#: columns of the heatmap (step buckets); each shows the largest norm of its steps. With many layers, fewer
#: columns: at most HEATMAP_CELLS cells per job (500 layers: 120 columns; a zoom of the Layers view shows more)
HEATMAP_COLUMNS = 400
HEATMAP_CELLS = 60_000
#: the heatmap's rows: 22 px each up to HEATMAP_ROWS_PX in all, then smaller (at least HEATMAP_MIN_ROW_PX)
HEATMAP_ROWS_PX = 2200
HEATMAP_MIN_ROW_PX = 4
#: jobs side by side in one row of the heatmap (more: the next row)
HEATMAP_JOBS_PER_ROW = 4
#: jobs beyond which the layers view leaves out the min/max small multiples (a note says how to see them)
MINMAX_JOBS = 8
#: points of all the curves of one figure together: with many curves (50 jobs), each is a min/max envelope of
#: CURVE_BUDGET / curves points (at least MIN_CURVE_POINTS); a zoom re-reads the shown steps at full resolution
CURVE_BUDGET = 12_000
MIN_CURVE_POINTS = 200
#: curves beyond which a figure has no legend (its plotly legend of 50 entries costs as much to draw as the
#: curves): the header's job swatches, in each job's colour and dash, are the legend, and the hover names a curve
LEGEND_CURVES = 16
#: a mode with at most this many points per curve gets a hint to save it more often
SPARSE_POINTS = 2
#: options from which a choice gets a search box
SEARCH_FROM = 12

#: Okabe and Ito's colour-blind-safe palette (its yellow left out: too faint on white); a run's colour is
#: PALETTE[index] in every view, its dash DASHES[index // len(PALETTE)] beyond seven runs
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
#: one job's curves take the colour of their mode (several jobs: of their job)
MODE_COLOURS = {"TRAIN": "#0072B2", "EVAL": "#E69F00", "PREDICT": "#009E73", "GLOBAL": "#444444"}
#: one job's weights and gradients (several jobs: the job's colour; weight solid, gradient dashed)
KIND_COLOURS = {"weight": "#0072B2", "gradient": "#D55E00"}
KIND_DASH = {"weight": "solid", "gradient": "dash"}
#: cells of the heatmap that hold an exact zero or a NaN/inf (drawn over the colour scale, and named in the
#: legend and hover)
ZERO_COLOUR = "#BDBDBD"
NONFINITE_COLOUR = "#D55E00"

_STATUS_COLOURS = {"IssuesFound": "#D55E00", "Error": "#CC79A7", "InProgress": "#0072B2",
                   "NoIssuesFound": "#009E73", "NoData": "#7f7f7f", "Stopped": "#7f7f7f"}


def job_colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def job_dash(index: int) -> str:
    return DASHES[(index // len(PALETTE)) % len(DASHES)]


def rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


#: characters of a name in a legend (the hover shows it whole): a long one would squeeze the plot
LEGEND_CHARS = 48


def short(name: str, limit: int = LEGEND_CHARS) -> str:
    """`name` cut to `limit` characters, an ellipsis at the cut."""
    return name if len(name) <= limit else name[: limit - 1] + "…"


def fig(data: list[dict], title: str = "", **layout: Any) -> dict[str, Any]:
    lay = {"title": {"text": title, "font": {"size": 15}}, "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
           "hovermode": "closest", **layout}
    return {"data": data, "layout": lay}


def step_axis(traces: list[dict], title: str = "global step") -> dict[str, Any]:
    """An x axis of steps (or rounds): no zero line (step 0 is not a value to compare with), and whole-step
    ticks when only a few steps show (plotly would tick 9, 9.5, 10 around a single point)."""
    ends = []
    for t in traces:
        x = t.get("x") or []
        try:
            ends += [min(x), max(x)] if x else []
        except TypeError:  # a None (a gap) among them
            xs = [v for v in x if isinstance(v, int | float)]
            ends += [min(xs), max(xs)] if xs else []
    axis: dict[str, Any] = {"title": {"text": title}, "zeroline": False}
    if ends and max(ends) - min(ends) < 8:
        axis["dtick"] = 1
    return axis


def figure_block(fid: str, figure: dict[str, Any], height: int = 360, **extra: Any) -> dict[str, Any]:
    return {"type": "figure", "id": fid, "figure": figure, "height": height, **extra}


def note(text: str) -> dict[str, Any]:
    return {"type": "note", "text": text}


def choice(param: str, label: str, options: list[str], value: str) -> dict[str, Any]:
    """A select that refetches the view with `param=value`; a long list gets a search box."""
    return {"type": "choice", "param": param, "label": label, "options": [{"value": o, "label": o} for o in options],
            "value": value, "search": len(options) > SEARCH_FROM}


def _sup(k: int) -> str:
    return f"10<sup>{k}</sup>" if k not in (0, 1) else ("1" if k == 0 else "10")


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """At most four tick values and labels for a log axis showing lo..hi (> 0): whole decades when two or
    more fall inside, else lo and hi themselves (two significant digits): never plotly's minor labels, which
    run together in a small panel."""
    lo_l, hi_l = math.log10(lo), math.log10(hi)
    ks = list(range(math.ceil(lo_l - 1e-9), math.floor(hi_l + 1e-9) + 1))
    if len(ks) >= 2:
        step = max(1, math.ceil((len(ks) - 1) / 3))
        ks = ks[::step]
        return [10.0 ** k for k in ks], [_sup(k) for k in ks]
    vals = [lo, hi] if hi > lo * 1.0001 else [lo]
    return vals, [f"{v:.2g}" for v in vals]


def zero_safe_log_axis(values: list[list[float | None]], zeros: bool, nonfinite: bool) -> tuple[dict, float, float]:
    """A log y axis for series `values` (positive values only; their zeros and NaN/inf are drawn by the caller
    on the rows this returns): at most four tick labels (log_ticks), a row labelled "0" below the values when
    there are zeros, a row labelled "NaN/inf" above them when there are non-finite values. Returns (axis, y of
    the "0" row, y of the "NaN/inf" row). app.js's logAxis does the same for the curves' log toggle."""
    pos = [v for vs in values for v in vs if v is not None and v > 0 and math.isfinite(v)]
    lo, hi = (min(pos), max(pos)) if pos else (1.0, 1.0)
    lo_l, hi_l = math.log10(lo), math.log10(hi)
    pad = max(0.1, 0.05 * (hi_l - lo_l))
    gap = max(0.3, 0.15 * (hi_l - lo_l + 2 * pad))
    vals, text = log_ticks(lo, hi) if pos else ([], [])
    zero_l, nf_l = lo_l - pad - gap, hi_l + pad + gap
    rng = [lo_l - pad, hi_l + pad]
    if zeros:
        vals.insert(0, 10.0 ** zero_l)
        text.insert(0, "0")
        rng[0] = zero_l - gap / 2
    if nonfinite:
        vals.append(10.0 ** nf_l)
        text.append("NaN/inf")
        rng[1] = nf_l + gap / 2
    axis = {"type": "log", "tickvals": vals, "ticktext": text, "range": rng, "tickfont": {"size": 10},
            "zeroline": False}
    return axis, 10.0 ** zero_l, 10.0 ** nf_l


# --- scalars and rules ---------------------------------------------------------------------------


def _to_mode_steps(gsteps: np.ndarray, msteps: np.ndarray, xs: list[int]) -> list[int | None]:
    """The mode steps of global steps `xs` (None where the curve has no such step)."""
    if not len(gsteps):
        return [None] * len(xs)
    i = np.clip(np.searchsorted(gsteps, xs), 0, len(gsteps) - 1)
    return [int(msteps[j]) if int(gsteps[j]) == x else None for j, x in zip(i.tolist(), xs, strict=True)]


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


def _curve(job: Job, name: str, mode: Any, k: int, multi: bool, max_points: int = MAX_POINTS,
           by_scalar: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One scalar's curve in `mode` (its points a min/max envelope beyond `max_points`; `meta.x_mode` the mode
    steps of its points, for an x axis of mode steps), and a marker trace of its NaN/inf steps (or None). Its
    colour is its job's (`multi`), else its mode's, or (`by_scalar`: XGBoost's metrics, all TRAIN) its own."""
    g, v, m = job.scalar(name, mode)
    idx = envelope_index(v, max_points)
    colour = job_colour(job.index) if multi else (PALETTE[k % len(PALETTE)] if by_scalar
                                                  else MODE_COLOURS.get(mode.name, PALETTE[0]))
    label = esc(name) + (f" · {esc(job.name)}" if multi else "")
    x = [int(s) for s in g[idx].tolist()]
    tr = {"type": "scatter", "mode": "lines" if len(x) >= 60 else "lines+markers", "x": x,
          "y": to_json_values(v[idx]),
          "name": esc(short(name)) + (f" · {esc(short(job.name, 24))}" if multi else ""),
          # a job's scalars by dash; several jobs: the first scalar in the job's own dash (job_dash, as in the
          # header's swatch), the next ones in the dashes after it
          "line": {"color": colour, "width": 1.5,
                   "dash": DASHES[((job.index // len(PALETTE) if multi else 0) + k) % len(DASHES)]},
          "marker": {"color": colour, "size": 5},
          "meta": {"job": job.index, "tensor": name, "mode": mode.name, "n": int(len(v)),
                   "downsampled": bool(len(idx) < len(v)), "curve": True,
                   "x_mode": [int(s) for s in m[idx].tolist()]},
          "hovertemplate": "step %{x}: %{y}<extra>" + label + "</extra>"}
    bad = ~np.isfinite(v)
    nf = None
    if bad.any():
        steps = g[bad][:100]
        nf = {"type": "scatter", "mode": "markers", "x": [int(s) for s in steps.tolist()], "y": [0] * len(steps),
              "name": "non-finite " + tr["name"], "marker": {"symbol": "x", "color": "#000000", "size": 9},
              "hovertemplate": "NaN or inf at step %{x}<extra>" + label + "</extra>",
              "meta": {"job": job.index, "row": "nonfinite", "x_mode": [int(s) for s in m[bad][:100].tolist()]}}
    return tr, nf


def scalars_view(jobs: list[Job], names: list[str] | None = None, xgboost: bool | None = None) -> list[dict[str, Any]]:
    """Losses and metrics per mode, every job overlaid, with a marker where a rule fired: neural nets' over
    global steps (`scalars-<MODE>`), XGBoost jobs' per boosting round in figures of their own (`rounds-<MODE>`).
    `xgboost`: only XGBoost jobs (True), only the others (False), both (None)."""
    multi = len(jobs) > 1
    blocks: list[dict[str, Any]] = []
    if xgboost is not True:
        blocks += _curve_figures([j for j in jobs if not j.is_xgboost], names, multi, "scalars",
                                 "Losses and metrics", "global step")
    if xgboost is not False:
        blocks += _curve_figures([j for j in jobs if j.is_xgboost], names, multi, "rounds",
                                 "XGBoost metrics per round", "round")
    return blocks or [note("No losses or metrics saved yet.")]


def _curve_figures(jobs: list[Job], names: list[str] | None, multi: bool, prefix: str, title: str,
                   xtitle: str) -> list[dict[str, Any]]:
    per_mode: dict[str, list[dict]] = {}
    rules_by_job = {j.index: j.rules() for j in jobs}
    chosen = {j.index: [n for n in j.kinds.scalars if names is None or n in names] for j in jobs}
    curves = max([sum(len(chosen[j.index]) for j in jobs if m in (j.trial.modes() or [_modes.GLOBAL]))
                  for m in _modes.ModeKeys] or [1])
    max_points = min(MAX_POINTS, max(MIN_CURVE_POINTS, CURVE_BUDGET // max(curves, 1)))
    for job in jobs:
        with job.lock:
            for mode in job.trial.modes() or [_modes.GLOBAL]:
                for k, name in enumerate(chosen[job.index]):
                    tr, nf = _curve(job, name, mode, k, multi, max_points, by_scalar=prefix == "rounds")
                    if not tr["x"]:
                        continue
                    per_mode.setdefault(mode.name, []).append(tr)
                    if nf is not None:
                        per_mode[mode.name].append(nf)
    blocks: list[dict[str, Any]] = []
    for mode_name, traces in per_mode.items():
        # rule markers go on the TRAIN curves (rules run over global steps; training steps are where they fire)
        if mode_name in ("TRAIN", "GLOBAL") or len(per_mode) == 1:
            for job in jobs:
                # the marker sits on the job's loss curve (else its first curve)
                own = [t for t in traces if t["meta"].get("curve") and t["meta"]["job"] == job.index]
                own.sort(key=lambda t: "loss" not in t["meta"]["tensor"].lower())
                xs, ys = (own[0]["x"], own[0]["y"]) if own else ([], [])
                markers = rule_markers(rules_by_job[job.index], xs, ys, job.name if multi else None)
                if own:
                    g, _, m = job.scalar(own[0]["meta"]["tensor"], _modes.parse_mode(mode_name))
                    for mk in markers:
                        mk["meta"]["x_mode"] = _to_mode_steps(g, m, mk["x"])
                        mk["meta"]["job"] = job.index
                traces = traces + markers
        curves = [t for t in traces if t["meta"].get("curve")]
        counts = [len(t["x"]) for t in curves]
        if mode_name not in ("TRAIN", "GLOBAL") and counts and max(counts) <= SPARSE_POINTS:
            steps = sorted({x for t in curves for x in t["x"]})
            n = max(counts)
            blocks.append(note(
                f"{mode_name}: {n} point{'s' if n > 1 else ''} per curve (step {', '.join(map(str, steps[:5]))}): "
                f"too few for a trend. Save {mode_name} steps more often: SaveConfig(mode_save_configs="
                f"{{modes.{mode_name}: SaveConfigMode(save_interval=1)}}), or a smaller --save-interval."))
        mode_colour = MODE_COLOURS.get(mode_name, "#444444")
        legend = len(curves) <= LEGEND_CURVES
        f = fig(traces, f"{title} ({mode_name})" + ("" if legend else f" · {len(curves)} curves: each job in the "
                                                    "colour and dash of its swatch above"),
                xaxis=step_axis(traces, xtitle), showlegend=legend,
                yaxis={"title": {"text": "value"}, "zeroline": False})
        f["layout"]["title"]["font"]["color"] = mode_colour
        # when each job's steps were written (an x axis of wall time), once per job: {job index: table}
        walls = {str(j.index): w for j in jobs if (w := j.wall_table()) is not None}
        # the epoch of each job's steps, where it saved one (an x axis of epochs)
        epochs = {str(j.index): e for j in jobs if (e := j.epoch_table()) is not None}
        if walls or epochs:
            f["layout"]["meta"] = {"wall": walls, **({"epoch": epochs} if epochs else {})}
        blocks.append(figure_block(f"{prefix}-{mode_name}", f, curves=True, mode=mode_name))
    return blocks


def series_window(job: Job, tensor: str, mode: str, lo: float, hi: float) -> dict[str, Any]:
    """A curve's points when steps lo..hi show (a zoom): every saved point inside (a min/max envelope beyond
    MAX_POINTS), a min/max envelope outside; {x, y, x_mode, n, inside}."""
    if tensor not in job.kinds.scalars:
        raise KeyError(f"tensor {tensor!r}: not a scalar of job {job.index}")
    m = _modes.parse_mode(mode)
    with job.lock:
        g, v, ms = job.scalar(tensor, m)
    idx = window_index(g, v, lo, hi, MAX_POINTS)
    inside = int(np.count_nonzero((g >= lo) & (g <= hi)))
    return {"x": [int(s) for s in g[idx].tolist()], "y": to_json_values(v[idx]),
            "x_mode": [int(s) for s in ms[idx].tolist()], "n": int(len(v)), "inside": inside}


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
    return {"rows": rows, "columns": min(cols, max(n, 1)), "pattern": "independent", "ygap": 0.4, "xgap": 0.15}


def _legend_once(traces: list[dict[str, Any]]) -> None:
    """One legend entry per legend group: its first trace's (a layer may lack a weight or a gradient)."""
    seen: set[str] = set()
    for t in traces:
        t["showlegend"] = t["legendgroup"] not in seen
        seen.add(t["legendgroup"])


def _jobs(jobs: Job | list[Job]) -> list[Job]:
    return [jobs] if isinstance(jobs, Job) else list(jobs)


def _what(kinds: set[str]) -> str:
    """"Weight and gradient", "Gradient" or "Weight": what the panels hold."""
    return " and ".join(k for k in ("weight", "gradient") if k in kinds).capitalize()


def layers_view(jobs: Job | list[Job], page: int = 0, per_page: int = LAYERS_PER_PAGE,
                find: str | None = None) -> list[dict[str, Any]]:
    """Per-layer weight and gradient statistics as small multiples, every job's in the same panel (layers
    matched by name): L2 norms on a zero-safe log scale, min/max, non-finite counts; `per_page` layers at a
    time, those whose name contains `find` when given."""
    jobs = _jobs(jobs)
    multi = len(jobs) > 1
    per = {j.index: {layer: (w, g) for layer, w, g in _layers(j)} for j in jobs}
    names = sorted(set().union(*per.values()), key=natural_key)
    if not names:
        return [note("No weights or gradients saved.")]
    blocks: list[dict[str, Any]] = [{"type": "search", "param": "find", "label": "find layer",
                                     "value": find or ""}] if len(names) > per_page or find else []
    if find:
        names = [n for n in names if find.lower() in n.lower()]
        if not names:
            return [*blocks, note(f"No layer's name contains {find!r}.")]
    pages = max(1, math.ceil(len(names) / per_page))
    page = min(max(page, 0), pages - 1)
    shown = names[page * per_page:(page + 1) * per_page]
    n = len(shown)
    grid = _grid(n)
    norm_tr: list[dict] = []
    mm_tr: list[dict] = []
    nf_tr: list[dict] = []
    annotations, shapes = [], []
    log_axes: dict[str, Any] = {}
    nonfinite_total: dict[str, int] = {}
    kinds: set[str] = set()
    stats = {}
    for job in jobs:  # every shown tensor of a job read at once
        names = [t for layer in shown for t in per[job.index].get(layer, (None, None)) if t is not None]
        stats[job.index] = job.stats_many(names) if names else {}
    for i, layer in enumerate(shown, start=1):
        ax = "" if i == 1 else str(i)
        annotations.append({"text": esc(short(layer, 40)), "xref": f"x{ax} domain", "yref": f"y{ax} domain",
                            "x": 0.5, "y": 1.0, "yanchor": "bottom", "showarrow": False, "font": {"size": 11}})
        panel: list[dict] = []
        zero_pts: list[tuple[dict, list[int]]] = []
        nf_pts: list[tuple[dict, list[int]]] = []
        series = sum(t is not None for job in jobs for t in per[job.index].get(layer, (None, None)))
        points = min(SMALL_POINTS, max(MIN_SMALL_POINTS, PANEL_POINTS // max(series, 1)))
        for job in jobs:
            w, g = per[job.index].get(layer, (None, None))
            for tname, kind in ((w, "weight"), (g, "gradient")):
                if tname is None:
                    continue
                kinds.add(kind)
                colour = job_colour(job.index) if multi else KIND_COLOURS[kind]
                who = f"{kind} · {esc(short(job.name, 24))}" if multi else kind
                st = stats[job.index][tname]
                common = {"xaxis": "x" + ax, "yaxis": "y" + ax, "legendgroup": who,
                          "line": {"color": colour, "width": 1.2, "dash": KIND_DASH[kind]}}
                meta = {"tensor": tname, "job": job.index}
                if "l2" in st:
                    steps, vals = st["l2"]
                    s = series_json(steps, vals, max_points=points)
                    y = [None if v is not None and v <= 0 else v for v in s["y"]]
                    tr = {"type": "scatter", "mode": "lines" if len(s["x"]) > 1 else "markers", "x": s["x"], "y": y,
                          "name": f"{who} L2 norm", "meta": meta, **common,
                          "marker": {"color": colour, "size": 4},
                          "hovertemplate": f"{esc(tname)}<br>step %{{x}}: %{{y:.3g}}<extra></extra>"}
                    norm_tr.append(tr)
                    panel.append(tr)
                    zx = [int(x) for x in steps[vals == 0][:SMALL_POINTS].tolist()]  # every zero, not the envelope's
                    if zx:
                        zero_pts.append((tr, zx))
                    bad = [int(x) for x in steps[~np.isfinite(vals)][:200].tolist()]
                    if "nonfinite" in st:
                        nsteps, counts = st["nonfinite"]
                        bad = sorted(set(bad) | {int(x) for x in nsteps[counts > 0][:200].tolist()})
                    if bad:
                        nf_pts.append((tr, bad))
                for stat, dash in (("min", "dot"), ("max", KIND_DASH[kind])):
                    if stat in st:
                        s = series_json(*st[stat], max_points=points)
                        mm_tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                                      "name": f"{who} {stat}", "meta": meta,
                                      **{**common, "line": {"color": colour, "width": 1.2, "dash": dash},
                                         "legendgroup": f"{who}{stat}"},
                                      "hovertemplate": f"{esc(tname)} {stat}<br>step %{{x}}: %{{y:.3g}}"
                                                       "<extra></extra>"})
                if "nonfinite" in st:
                    steps, counts = st["nonfinite"]
                    nonfinite_total[tname] = int(np.nansum(counts))
                    s = series_json(steps, counts, max_points=points)
                    nf_tr.append({"type": "scatter", "mode": "lines", "x": s["x"], "y": s["y"],
                                  "name": f"{who} non-finite", "meta": meta, **common})
        axis, zero_y, nf_y = zero_safe_log_axis([t["y"] for t in panel], bool(zero_pts), bool(nf_pts))
        band = 0.06 * (axis["range"][1] - axis["range"][0])  # half the height of a row's grey band, in decades
        col = (i - 1) % grid["columns"]
        if col == 0:
            axis["title"] = {"text": "L2 norm", "font": {"size": 10}, "standoff": 2}
        log_axes["yaxis" if i == 1 else f"yaxis{i}"] = axis
        for row_y, pts, label, symbol in ((zero_y, zero_pts, "exactly 0", "triangle-down"),
                                          (nf_y, nf_pts, "NaN or inf", "x")):
            if not pts:
                continue
            shapes.append({"type": "rect", "xref": f"x{ax} domain", "yref": f"y{ax}", "x0": 0, "x1": 1,
                           "y0": row_y / 10 ** band, "y1": row_y * 10 ** band, "line": {"width": 0},
                           "fillcolor": "rgba(0,0,0,0.06)", "layer": "below"})
            for tr, xs in pts:
                norm_tr.append({"type": "scatter", "mode": "markers", "x": xs, "y": [row_y] * len(xs),
                                "name": label, "xaxis": tr["xaxis"], "yaxis": tr["yaxis"], "legendgroup": label,
                                "marker": {"symbol": symbol, "size": 7, "color": tr["line"]["color"]},
                                "meta": {**tr["meta"], "row": "zero" if row_y == zero_y else "nonfinite"},
                                "hovertemplate": f"{esc(tr['meta']['tensor'])}: {label} at step %{{x}}"
                                                 "<extra></extra>"})
    height = 190 * grid["rows"] + 90
    for traces in (norm_tr, mm_tr, nf_tr):
        _legend_once(traces)
    x_axes = {}
    for i in range(1, n + 1):
        a: dict[str, Any] = {"zeroline": False, "tickfont": {"size": 10}, "nticks": 5}
        if i + grid["columns"] > n:  # the bottom panel of its column: the axis says what it counts
            a["title"] = {"text": "step", "font": {"size": 10}, "standoff": 2}
        x_axes["xaxis" if i == 1 else f"xaxis{i}"] = a
    lin_axes = {("yaxis" if i == 1 else f"yaxis{i}"): {"tickfont": {"size": 10}, "nticks": 4}
                for i in range(1, n + 1)}
    what = _what(kinds)
    legend = {"orientation": "h", "y": -0.08 if grid["rows"] < 3 else -0.03, "yanchor": "top"}
    if pages > 1:
        blocks.append({"type": "choice", "param": "page", "label": "layers page",
                       "options": [{"value": str(p), "label": f"{p * per_page + 1}–"
                                    f"{min((p + 1) * per_page, len(names))} of {len(names)}"}
                                   for p in range(pages)], "value": str(page)})
    # many jobs: no legend (one entry per job and kind), the header's swatches are it
    entries = len({t["legendgroup"] for t in norm_tr})
    shown = {"showlegend": entries <= LEGEND_CURVES}
    if not shown["showlegend"]:
        shown["margin"] = {"l": 60, "r": 20, "t": 64, "b": 40}
    many = "" if shown["showlegend"] else ("<br><sup>each job in its swatch's colour, weight solid, gradient "
                                           "dashed</sup>")
    blocks.append(figure_block("layers-norms", fig(
        norm_tr, f"{what} L2 norm per layer (log scale; exact zeros on the row marked 0){many}",
        grid=grid, annotations=annotations, shapes=shapes, legend=legend, **shown, **x_axes, **log_axes), height))
    if len(jobs) <= MINMAX_JOBS:
        blocks.append(figure_block("layers-minmax", fig(mm_tr, f"{what} min and max per layer", grid=grid,
                                                        annotations=annotations, legend=legend, **x_axes,
                                                        **lin_axes), height))
    else:
        blocks.append(note(f"Min and max per layer: shown for at most {MINMAX_JOBS} jobs at a time (pick them in "
                           "the header)."))
    bad = {k: v for k, v in nonfinite_total.items() if v}
    if bad:
        blocks.append(figure_block("layers-nonfinite", fig(nf_tr, "Non-finite (NaN/inf) elements per layer",
                                                           grid=grid, annotations=annotations, legend=legend,
                                                           **x_axes, **lin_axes), height))
    else:
        blocks.append(note(f"No NaN or inf in the {what.lower().replace('t and', 'ts and')}s of these {n} layers."))
    return blocks


def _heat_rows(job: Job, columns: int) -> tuple[list[tuple[str, str]], list[int], np.ndarray, np.ndarray,
                                                  np.ndarray] | None:
    """(layer, tensor) rows of a job's gradient heatmap, the first step of each column, and per cell: the
    log10 of the largest positive norm (NaN where none), whether every value was exactly 0, whether a value
    was NaN or inf."""
    grads = sorted(job.kinds.gradients, key=lambda g: natural_key(layer_of(g)))
    columns = min(columns, max(50, HEATMAP_CELLS // max(len(grads), 1)))
    rows = []
    stats = job.stats_many(grads, which=("l2", "nonfinite")) if grads else {}
    for g in grads:
        st = stats[g].get("l2")
        if st is None:
            continue
        rows.append((g, st))
    if not rows:
        return None
    steps = np.unique(np.concatenate([st[0] for _, st in rows]))
    ncol = min(columns, len(steps))
    edges = np.linspace(0, len(steps), ncol + 1).astype(np.int64)
    z = np.full((len(rows), ncol), np.nan)
    zero = np.zeros((len(rows), ncol), dtype=bool)
    bad = np.zeros((len(rows), ncol), dtype=bool)
    for r, (_, (s, v)) in enumerate(rows):
        col = np.searchsorted(edges, np.searchsorted(steps, s), side="right") - 1
        fin = np.isfinite(v)
        pos = fin & (v > 0)
        with np.errstate(all="ignore"):
            lv = np.where(pos, np.log10(np.where(pos, v, 1.0)), np.nan)
        np.fmax.at(z[r], col, lv)
        npos = np.bincount(col, weights=pos, minlength=ncol)
        nzero = np.bincount(col, weights=fin & (v == 0), minlength=ncol)
        nbad = np.bincount(col, weights=~fin, minlength=ncol)
        bad[r] = nbad > 0
        zero[r] = (nzero > 0) & (npos == 0) & ~bad[r]
    z[bad] = np.nan
    return ([(layer_of(g), g) for g, _ in rows], [int(x) for x in steps[edges[:-1]].tolist()], z, zero, bad)


def heatmap_view(jobs: Job | list[Job], columns: int = HEATMAP_COLUMNS) -> list[dict[str, Any]]:
    """Layers × steps heatmap of gradient L2 norms on a log scale, several jobs side by side on one colour
    scale; each column is the largest norm over its steps, so one exploding step is never averaged away. A
    cell whose norms were all exactly 0, or that held a NaN/inf, is drawn in a colour of its own, named in
    the legend and the hover."""
    jobs = _jobs(jobs)
    got = []
    for job in jobs:
        with job.lock:
            if not job.kinds.gradients:
                continue
            h = _heat_rows(job, columns)
        if h is not None:
            got.append((job, h))
    if not got:
        return [note("No gradients saved: the heatmap needs the gradients collection.")]
    finite = [h[2][np.isfinite(h[2])] for _, h in got]
    allz = np.concatenate(finite) if finite else np.empty(0)
    cmin, cmax = (float(allz.min()), float(allz.max())) if len(allz) else (0.0, 1.0)
    if cmax <= cmin:
        cmax = cmin + 1.0
    layers = sorted({layer for _, h in got for layer, _ in h[0]}, key=natural_key)
    multi = len(got) > 1
    data: list[dict] = []
    layout: dict[str, Any] = {"coloraxis": {"colorscale": "Viridis", "cmin": cmin, "cmax": cmax,
                                            "colorbar": {"title": {"text": "log10 ‖g‖"}}},
                              "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0,
                                         "yanchor": "bottom"}}
    any_zero = any_bad = False
    for i, (job, (rows, xcol, z, zero, bad)) in enumerate(got, start=1):
        ax = "" if i == 1 else str(i)
        if multi:  # every job's rows are the union of layers, in one order: a layer lines up across jobs
            at = {layer: r for r, (layer, _) in enumerate(rows)}
            pick = [at.get(layer, -1) for layer in layers]

            def spread(a: np.ndarray, fill: Any, pick: list[int] = pick) -> np.ndarray:
                out = np.full((len(pick), a.shape[1]), fill, dtype=a.dtype)
                for r, p in enumerate(pick):
                    if p >= 0:
                        out[r] = a[p]
                return out

            z, zero, bad = spread(z, np.nan), spread(zero, False), spread(bad, False)
            tensors = [rows[p][1] if p >= 0 else None for p in pick]
            names = [esc(layer) for layer in layers]
        else:
            tensors = [g for _, g in rows]
            names = [esc(layer) for layer, _ in rows]
        extra = f"<extra>{esc(short(job.name, 24))}</extra>" if multi else "<extra></extra>"
        base = {"x": xcol, "y": names, "xaxis": "x" + ax, "yaxis": "y" + ax}
        data.append({"type": "heatmap", "z": [to_json_values(r) for r in z], **base, "coloraxis": "coloraxis",
                     "hovertemplate": "%{y}<br>step %{x}<br>log10 norm %{z:.2f}" + extra,
                     "meta": {"tensors": tensors, "columns": len(xcol), "job": job.index}})
        small = len(xcol) <= 60
        for mask, colour, label, mark in ((zero, ZERO_COLOUR, "exactly 0", "0"), (bad, NONFINITE_COLOUR,
                                                                                  "NaN or inf", "✕")):
            if not mask.any():
                continue
            any_zero |= label == "exactly 0"
            any_bad |= label != "exactly 0"
            tr = {"type": "heatmap", "z": [[1 if c else None for c in r] for r in mask.tolist()], **base,
                  "colorscale": [[0, colour], [1, colour]], "showscale": False, "zmin": 0, "zmax": 1,
                  "hovertemplate": f"%{{y}}<br>step %{{x}}<br>{label}" + extra,
                  "meta": {"cells": label, "job": job.index}}
            if small:
                tr["texttemplate"], tr["text"] = "%{text}", [[mark if c else "" for c in r] for r in mask.tolist()]
            data.append(tr)
        xa: dict[str, Any] = step_axis([base], "step" + (f" · {esc(short(job.name, 30))}" if multi else ""))
        layout["xaxis" if i == 1 else f"xaxis{i}"] = xa
        layout["yaxis" if i == 1 else f"yaxis{i}"] = {"automargin": True, "autorange": "reversed",
                                                      "showticklabels": (i - 1) % HEATMAP_JOBS_PER_ROW == 0}
    for label, colour, present in (("exactly 0", ZERO_COLOUR, any_zero), ("NaN or inf", NONFINITE_COLOUR, any_bad)):
        if present:  # a legend entry for the cells drawn over the colour scale
            data.append({"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": label,
                         "marker": {"symbol": "square", "size": 12, "color": colour}, "showlegend": True,
                         "hoverinfo": "skip"})
    # 22 px a layer, fewer beyond 100 layers (the figure stays under ~2,500 px; the hover names every row)
    rows_px = round(len(layers) * max(HEATMAP_MIN_ROW_PX, min(22.0, HEATMAP_ROWS_PX / len(layers))))
    grid_rows = math.ceil(len(got) / HEATMAP_JOBS_PER_ROW)
    if multi:  # side by side, at most HEATMAP_JOBS_PER_ROW jobs a row
        panel = rows_px + 70  # a job's heatmap and its x axis title
        layout["grid"] = {"rows": grid_rows, "columns": min(len(got), HEATMAP_JOBS_PER_ROW), "pattern": "independent",
                          "xgap": 0.04, "ygap": 70 / panel, "roworder": "top to bottom"}
    if grid_rows > 1:  # the colour bar beside the first row, not along the whole page
        layout["coloraxis"]["colorbar"].update(lenmode="pixels", len=max(rows_px, 160), y=1, yanchor="top")
    title = "Gradient L2 norm per layer over steps (log10)" + (", side by side on one colour scale" if multi else "")
    height = max(260, grid_rows * (rows_px + 70) + 70)
    return [figure_block("heatmap", fig(data, title, **layout), height)]


# --- distributions -----------------------------------------------------------------------------


def distribution_choices(job: Job | list[Job]) -> list[str]:
    out: dict[str, None] = {}
    for j in _jobs(job):
        k = j.kinds
        out.update(dict.fromkeys([*k.gradients, *k.weights, *k.others]))
    return list(out)


def distribution_view(jobs: Job | list[Job], tensor: str | None = None) -> list[dict[str, Any]]:
    """Quantile bands (min–max, 5–95 %, 25–75 %, median) of one tensor's values over steps, every job that
    saved it overlaid in its colour."""
    jobs = _jobs(jobs)
    choices = distribution_choices(jobs)
    if not choices:
        return [note("No non-scalar weights, gradients or outputs saved: nothing to show a distribution of.")]
    if tensor not in choices:
        tensor = choices[0]
    blocks: list[dict[str, Any]] = [choice("tensor", "tensor", choices, tensor)]
    multi = len(jobs) > 1
    traces: list[dict] = []
    medians: list[dict] = []  # drawn over every job's bands (a band drawn later would hide an earlier median)
    nonfinite: list[dict[str, Any]] = []  # NaN/inf counts per step, beside the bands of the finite values
    for job in jobs:
        with job.lock:
            if tensor not in job.trial.tensor_names():
                continue
            q = quantile_bands(job.trial.tensor(tensor))
        if not q["steps"]:
            blocks.append(note(f"{tensor}{' in ' + job.name if multi else ''}: only reductions saved, no raw values "
                               "to show a distribution of."))
            continue
        colour = job_colour(job.index)
        who = f" · {esc(short(job.name, 24))}" if multi else ""
        x = q["steps"]
        # to 7 significant digits, as every drawn value (None: a step without a finite value)
        qs = {k: to_json_values(np.asarray(v, dtype=np.float64)) for k, v in q["quantiles"].items()}
        for lo, hi, alpha, label in (("0.0", "1.0", 0.12, "min–max"), ("0.05", "0.95", 0.25, "5–95 %"),
                                     ("0.25", "0.75", 0.45, "25–75 %")):
            traces.append({"type": "scatter", "mode": "lines", "x": x, "y": qs[lo], "line": {"width": 0},
                           "showlegend": False, "hoverinfo": "skip", "name": label + " low" + who,
                           "legendgroup": f"{job.index}{label}"})
            traces.append({"type": "scatter", "mode": "lines", "x": x, "y": qs[hi], "line": {"width": 0},
                           "fill": "tonexty", "fillcolor": rgba(colour, alpha), "name": label + who,
                           "legendgroup": f"{job.index}{label}", "meta": {"job": job.index}})
        medians.append({"type": "scatter", "mode": "lines", "x": x, "y": qs["0.5"], "name": "median" + who,
                        "line": {"color": colour, "dash": job_dash(job.index)}, "meta": {"job": job.index}})
        from tensortap.ui.diagnosis import nonfinite_blocks

        with job.lock:
            nonfinite.extend(nonfinite_blocks(job, tensor, x, multi))
    traces += medians
    if traces:
        shown = len(medians) * 4 <= LEGEND_CURVES  # four entries a job
        many = "" if shown else ("<br><sup>bands min–max, 5–95 %, 25–75 % (light to dark) and the median, each job in "
                                 "its swatch's colour</sup>")
        blocks.append(figure_block("distribution", fig(traces, f"Distribution of {esc(tensor)} over steps{many}",
                                                       xaxis=step_axis(traces), showlegend=shown,
                                                       margin={"l": 60, "r": 20, "t": 40 if shown else 64, "b": 40},
                                                       yaxis={"title": {"text": "value"}})))
    return blocks + nonfinite


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
            blocks.append(choice("tensor", f"{job.name}: tensor", choices, name))
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
                               "line": {"color": PALETTE[len(traces) % len(PALETTE)],
                                        "dash": DASHES[(len(traces) // len(PALETTE)) % len(DASHES)]},
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
                med = float(np.nanmedian([x for x in dev if x is not None] or [0.0]))
                off = [d is not None and d > 3 * (med + 1e-3) for d in dev]
                # a diverging worker: another colour, a hatch and a label (never colour alone)
                blocks.append(figure_block(f"workers-dev-{job.index}", fig(
                    [{"type": "bar", "x": [esc(w) for w in per_worker], "y": dev,
                      "marker": {"color": [NONFINITE_COLOUR if o else PALETTE[0] for o in off],
                                 "pattern": {"shape": ["/" if o else "" for o in off]}},
                      "text": ["diverges" if o else "" for o in off], "textposition": "outside",
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


def xgboost_view(job: Job, metrics: bool = True) -> list[dict[str, Any]]:
    """SageMaker's XGBoost training report, each part shown when its data was saved: metrics per round
    (`metrics`: once per page), feature importance at the last saved round (one chart, a selector for the
    importance type), label distribution, confusion matrix, SHAP summary."""
    with job.lock:
        k = job.kinds
        x = k.xgboost
        if not x:
            return [note("No XGBoost data (feature_importance, average_shap, labels, predictions) in this job.")]
        blocks: list[dict[str, Any]] = []
        names = [n for n in k.scalars if _XGB_METRIC.match(n)]
        if metrics and names:
            tr = []
            for i, n in enumerate(names):
                steps, vals = scalar_series(job.trial.tensor(n))
                s = series_json(steps, vals)
                colour = PALETTE[i % len(PALETTE)]
                tr.append({"type": "scatter", "mode": "lines+markers", "x": s["x"], "y": s["y"], "name": esc(n),
                           "line": {"color": colour, "dash": DASHES[i % len(DASHES)]},
                           "marker": {"color": colour, "size": 5}})
            blocks.append(figure_block("xgb-metrics", fig(tr, "Metrics per round", xaxis=step_axis(tr, "round"),
                                                          yaxis={"title": {"text": "value"}})))
        fi = x["feature_importance"]
        if fi:
            data, options, n_feats = [], [], 0
            # gain first: what XGBoost's users read as "importance"
            for itype, fnames in sorted(fi.items(), key=lambda kv: (kv[0] != "gain", kv[0])):
                feats, vals, rnd = [], [], None
                for n in fnames:
                    step, v = _last_value(job, n)
                    if v is None:
                        continue
                    rnd = step if rnd is None else max(rnd, step)
                    feats.append(n.split("/", 2)[2])
                    vals.append(float(np.asarray(v, dtype=np.float64).reshape(-1)[0]))
                order = np.argsort(vals)[-30:]  # the 30 most important
                n_feats = max(n_feats, len(order))
                options.append({"label": itype, "title": f"feature importance: {itype} (round {rnd})"})
                data.append({"type": "bar", "orientation": "h", "x": [vals[i] for i in order],
                             "y": [esc(feats[i]) for i in order], "name": esc(itype), "visible": not data,
                             "marker": {"color": PALETTE[0]},
                             "hovertemplate": "%{y}: %{x:.4g}<extra>" + esc(itype) + "</extra>"})
            first = options[0]["title"]
            blocks.append(figure_block(
                "xgb-fi", fig(data, "Feature importance at the last saved round",
                              xaxis={"title": {"text": esc(first)}}, yaxis={"title": {"text": "feature"},
                                                                            "automargin": True},
                              showlegend=False), max(280, 20 * n_feats + 120),
                switch={"label": "importance type", "options": [
                    {"label": o["label"], "visible": [j == i for j in range(len(data))],
                     "layout": {"xaxis.title.text": esc(o["title"])}} for i, o in enumerate(options)]}))
        labels_step, labels = _last_value(job, "labels") if x["labels"] else (None, None)
        if labels is not None:
            vals, counts = np.unique(labels.reshape(-1), return_counts=True)
            if len(vals) <= 50:
                bar = {"type": "bar", "x": [esc(_fmt(v)) for v in vals.tolist()], "y": counts.tolist(),
                       "name": "labels", "marker": {"color": job_colour(job.index)}, "text": counts.tolist(),
                       "textposition": "outside", "cliponaxis": False}
                xa = {"type": "category", "title": {"text": "label"}}
            else:
                bar = {"type": "histogram", "x": labels.reshape(-1)[:100000].tolist(), "name": "labels",
                       "marker": {"color": job_colour(job.index)}}
                xa = {"title": {"text": "label"}}
            blocks.append(figure_block("xgb-labels", fig([bar], f"Label distribution (round {labels_step})",
                                                         xaxis=xa, yaxis={"title": {"text": "rows"}}), 300))
        if labels is not None and x["predictions"]:
            _, preds = _last_value(job, "predictions")
            cm = _confusion(labels, preds)
            if cm is not None:
                classes, matrix = cm
                blocks.append(figure_block("xgb-confusion", fig(
                    [{"type": "heatmap", "z": matrix, "x": classes, "y": classes, "colorscale": "Blues",
                      "reversescale": True, "texttemplate": "%{z}", "colorbar": {"title": {"text": "rows"}},
                      "hovertemplate": "label %{y}, predicted %{x}: %{z}<extra></extra>"}],
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
            order = np.argsort(vals)[-30:]
            blocks.append(figure_block("xgb-shap", fig(
                [{"type": "bar", "orientation": "h", "x": [vals[i] for i in order], "y": [esc(feats[i]) for i in order],
                  "name": "mean |SHAP|", "marker": {"color": PALETTE[2]}}],
                "SHAP summary: mean |SHAP value| per feature",
                xaxis={"title": {"text": "mean |SHAP value| (average over the training rows)"}},
                yaxis={"automargin": True, "title": {"text": "feature"}}), max(260, 22 * len(order) + 100)))
        return blocks or [note("No XGBoost report data yet.")]


def xgboost_blocks(jobs: list[Job]) -> list[dict[str, Any]]:
    """The XGBoost page of `jobs`: one job's as xgboost_view draws it; several jobs compared (xgboost_compare)."""
    xgb = [j for j in jobs if j.kinds.xgboost]
    if len(xgb) > 1:
        return xgboost_compare(xgb)
    return per_job(xgboost_view, xgb or jobs)


def _fi_at_last(job: Job, names: list[str]) -> tuple[dict[str, float], int | None]:
    """{feature: importance} at the last saved round of the `feature_importance/<type>/<feature>` tensors."""
    out, rnd = {}, None
    for n in names:
        step, v = _last_value(job, n)
        if v is None:
            continue
        rnd = step if rnd is None else max(rnd, step)
        out[n.split("/", 2)[2]] = float(np.asarray(v, dtype=np.float64).reshape(-1)[0])
    return out, rnd


def xgboost_compare(jobs: list[Job]) -> list[dict[str, Any]]:
    """Several XGBoost jobs on shared axes, each in its colour: their metrics per round in one figure, feature
    importance as grouped bars (one chart, a selector for the type), the SHAP summary as grouped bars; labels
    and confusion matrices, which do not overlay, one job after another."""
    blocks: list[dict[str, Any]] = []
    ordered = sorted(jobs, key=lambda j: j.index)
    tr: list[dict[str, Any]] = []
    for job in ordered:
        with job.lock:
            names = [n for n in job.kinds.scalars if _XGB_METRIC.match(n)]
            for i, n in enumerate(names):
                steps, vals = scalar_series(job.trial.tensor(n))
                sj = series_json(steps, vals)
                colour = job_colour(job.index)
                tr.append({"type": "scatter", "mode": "lines+markers", "x": sj["x"], "y": sj["y"],
                           "name": f"{esc(n)} · {esc(short(job.name, 24))}",
                           "line": {"color": colour, "dash": DASHES[i % len(DASHES)]},
                           "marker": {"color": colour, "size": 5, "symbol": _SYMBOLS[i % len(_SYMBOLS)]},
                           "meta": {"job": job.index, "tensor": n}})
    if tr:
        blocks.append(figure_block("xgb-metrics", fig(tr, "Metrics per round", xaxis=step_axis(tr, "round"),
                                                      yaxis={"title": {"text": "value"}})))
    types = sorted({t for j in jobs for t in j.kinds.xgboost["feature_importance"]}, key=lambda t: (t != "gain", t))
    if types:
        data, options, n_feats = [], [], 0
        for itype in types:
            first = len(data)
            rounds = []
            per_job_fi = []
            for job in ordered:
                with job.lock:
                    got, rnd = _fi_at_last(job, job.kinds.xgboost["feature_importance"].get(itype, []))
                per_job_fi.append((job, got))
                if rnd is not None:
                    rounds.append(rnd)
            feats = sorted({f for _, g in per_job_fi for f in g},
                           key=lambda f: max(g.get(f, float("-inf")) for _, g in per_job_fi))[-30:]
            n_feats = max(n_feats, len(feats))
            for job, got in per_job_fi:
                data.append({"type": "bar", "orientation": "h", "x": [got.get(f) for f in feats],
                             "y": [esc(f) for f in feats], "name": f"{esc(itype)} · {esc(short(job.name, 24))}",
                             "visible": itype == types[0], "marker": {"color": job_colour(job.index)},
                             "meta": {"job": job.index, "type": itype},
                             "hovertemplate": "%{y}: %{x:.4g}<extra>" + esc(short(job.name, 24)) + "</extra>"})
            options.append((itype, first, len(data), max(rounds) if rounds else None))
        blocks.append(figure_block(
            "xgb-fi", fig(data, "Feature importance at each job's last saved round",
                          xaxis={"title": {"text": f"feature importance: {esc(options[0][0])}"}},
                          yaxis={"title": {"text": "feature"}, "automargin": True}, barmode="group",
                          legend={"traceorder": "reversed"}),  # horizontal groups: the last job on top
            max(280, 20 * n_feats * min(len(jobs), 4) + 120),
            switch={"label": "importance type", "options": [
                {"label": t, "visible": [a <= k < b for k in range(len(data))],
                 "layout": {"xaxis.title.text": f"feature importance: {esc(t)}"}} for t, a, b, _ in options]}))
    if any(j.kinds.xgboost["average_shap"] for j in jobs):
        per = []
        for job in ordered:
            got = {}
            with job.lock:
                for n in job.kinds.xgboost["average_shap"]:
                    _, v = _last_value(job, n)
                    if v is not None:
                        got[n.split("/", 1)[1]] = float(np.abs(v).mean())
            per.append((job, got))
        feats = sorted({f for _, g in per for f in g}, key=lambda f: max(g.get(f, 0.0) for _, g in per))[-30:]
        blocks.append(figure_block("xgb-shap", fig(
            [{"type": "bar", "orientation": "h", "x": [g.get(f) for f in feats], "y": [esc(f) for f in feats],
              "name": f"mean |SHAP| · {esc(short(job.name, 24))}", "marker": {"color": job_colour(job.index)},
              "meta": {"job": job.index}} for job, g in per],
            "SHAP summary: mean |SHAP value| per feature",
            xaxis={"title": {"text": "mean |SHAP value| (average over the training rows)"}},
            yaxis={"automargin": True, "title": {"text": "feature"}}, barmode="group",
            legend={"traceorder": "reversed"}),
            max(260, 22 * len(feats) * min(len(jobs), 4) + 100)))
    for job in ordered:  # labels and confusion: one job's at a time
        own = [b for b in xgboost_view(job, metrics=False) if b.get("id") in ("xgb-labels", "xgb-confusion")]
        if own:
            blocks.append({"type": "heading", "text": job.name})
            blocks += [{**b, "id": f"{b['id']}@{job.index}"} for b in own]
    return blocks or [note("No XGBoost report data yet.")]


#: marker symbols of a job's metrics when jobs are compared (colour is the job's: the metric is told by dash and
#: symbol, never by colour alone)
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x")


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


def has_layers(jobs: list[Job]) -> bool:
    return any(j.kinds.weights or j.kinds.gradients for j in jobs)


def has_gradients(jobs: list[Job]) -> bool:
    return any(j.kinds.gradients for j in jobs)


def available_views(jobs: JobSet) -> list[dict[str, str]]:
    """The views worth a tab for these jobs: layers, heatmap and distribution only when some job saved what
    they draw; workers and XGBoost only when their data exists."""
    js = jobs.jobs
    views = [{"name": "overview", "title": "Overview"}]
    if has_layers(js):
        views.append({"name": "layers", "title": "Layers"})
    if has_gradients(js):
        views.append({"name": "heatmap", "title": "Gradient heatmap"})
    if distribution_choices(js):
        views.append({"name": "distribution", "title": "Distribution"})
    views.append({"name": "rules", "title": "Rules"})
    if any(len(j.trial.workers()) > 1 for j in js):
        views.append({"name": "workers", "title": "Workers"})
    if any(j.kinds.xgboost for j in js):
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
        from tensortap.ui.diagnosis import diagnosis_view

        return [*diagnosis_view(sel), *rules_view(sel), *scalars_view(sel)]
    if view == "diagnosis":  # (no tab: the overview's diagnosis, asked for again while it is being made)
        from tensortap.ui.diagnosis import diagnosis_view

        return diagnosis_view(sel)
    if view == "scalars":
        return scalars_view(sel)
    if view == "rules":
        return rules_view(sel)
    if view == "layers":
        page = params.get("page") or "0"
        return layers_view(sel, int(page) if str(page).isdigit() else 0, find=params.get("find") or None)
    if view == "heatmap":
        return heatmap_view(sel)
    if view == "distribution":
        return distribution_view(sel, params.get("tensor"))
    if view == "workers":
        return workers_view(sel, params.get("tensor"))
    if view == "xgboost":
        return xgboost_blocks(sel)
    raise KeyError(f"view {view!r}: allowed are overview, diagnosis, scalars, rules, layers, heatmap, "
                   "distribution, workers, xgboost")


__all__ = ["render_view", "available_views", "envelope", "series_window"]
