"""Watching and comparing runs in real headless Chromium: smoothing, the log toggle, zeros and NaN on log
scales, two jobs overlaid in every view, the job picker, the XGBoost page, zoom at full resolution, searching
a long tensor list, and screenshots of every view of a PyTorch, a Keras and an XGBoost job
(tests/_artifacts/ui/, or $TENSORTAP_TEST_ARTIFACTS)."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes

pytest.importorskip("flask")

from tensortap.ui.server import Server  # noqa: E402
from tensortap.ui.views import PALETTE  # noqa: E402


def _ema(ys: list, w: float) -> list:
    """TensorBoard's debiased exponential moving average (a gap stays a gap)."""
    out, last, n = [], 0.0, 0
    for v in ys:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        last = last * w + (1 - w) * v
        n += 1
        out.append(last / (1 - w ** n))
    return out


def _curve_traces(data: list[dict]) -> list[dict]:
    return [t for t in data if (t.get("meta") or {}).get("curve")]


def _write_loss_job(out: str, losses: list[float], eval_losses: dict[int, float] | None = None) -> None:
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for step, v in enumerate(losses):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        hook.save_scalar("loss", v)
        if eval_losses and step in eval_losses:
            hook.set_mode(modes.EVAL)
            hook.next_step()
            hook.save_scalar("loss", eval_losses[step])
    hook.close()


def test_smoothing_and_the_log_toggle_by_keyboard(page, tmp_path, ui):
    """The toolbar's controls are reached and worked with the keyboard; the smoothed curve is TensorBoard's
    EMA of the saved values with the raw curve faint behind it; on a log scale an exact zero sits on a row
    labelled 0 and a NaN on a row labelled NaN/inf; a reload keeps the settings."""
    out = str(tmp_path / "job")
    rng = np.random.default_rng(0)
    losses = [float(2.0 / (1 + s) + 0.3 * rng.random()) for s in range(80)]
    losses[40], losses[55] = 0.0, float("nan")
    _write_loss_job(out, losses)
    server = Server([out], port=0).start()
    try:
        ui.open_page(page, server.url)
        fig = ui.figure_data(page, "scalars-TRAIN")
        (raw,) = _curve_traces(fig["data"])
        assert raw["y"][:40] == pytest.approx(losses[:40], rel=1e-6) and raw["y"][55] is None
        # smoothing 0.6 by keyboard: Home, then 60 steps of 0.01
        n = page.js("window.ttCurveRenders || 0")
        page.page.focus("input[data-control=smooth]")
        page.page.keyboard.press("Home")
        for _ in range(60):
            page.page.keyboard.press("ArrowRight")
        page.wait(f"(window.ttCurveRenders || 0) > {n} && "
                  "document.querySelector('input[data-control=smooth]').value === '0.6'")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').data.some(t => t.meta && "
                  "t.meta.smoothing === 0.6)")
        fig = ui.figure_data(page, "scalars-TRAIN")
        faint = [t for t in _curve_traces(fig["data"]) if t["meta"].get("raw")]
        smooth = [t for t in _curve_traces(fig["data"]) if t["meta"].get("smoothing")]
        assert len(faint) == 1 and len(smooth) == 1
        assert faint[0]["opacity"] == 0.25 and faint[0]["y"] == raw["y"]  # the raw curve, faint, behind
        assert fig["data"].index(faint[0]) < fig["data"].index(smooth[0])
        want = _ema(raw["y"], 0.6)
        assert [y is None for y in smooth[0]["y"]] == [y is None for y in want]
        assert [y for y in smooth[0]["y"] if y is not None] == pytest.approx([y for y in want if y is not None],
                                                                            rel=1e-9)
        page.screenshot("curves-smoothed.png")
        # the log toggle by keyboard
        n = page.js("window.ttCurveRenders")
        page.page.focus("input[data-control=ylog]")
        page.page.keyboard.press("Space")
        page.wait(f"window.ttCurveRenders > {n}")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').layout.yaxis.type === 'log'")
        fig = ui.figure_data(page, "scalars-TRAIN")
        y = fig["layout"]["yaxis"]
        ticks = dict(zip(y["ticktext"], y["tickvals"], strict=True))
        assert "0" in ticks and "NaN/inf" in ticks
        zero = [t for t in fig["data"] if (t.get("meta") or {}).get("row") == "zero"]
        assert [t["x"] for t in zero] == [[40]]  # the smoothed curve is never 0 here: the raw value is
        assert zero[0]["y"] == [pytest.approx(ticks["0"])]
        nan = [t for t in fig["data"] if (t.get("meta") or {}).get("row") == "nonfinite"]
        assert nan[0]["x"] == [55] and nan[0]["y"] == [pytest.approx(ticks["NaN/inf"])]
        low, high = y["range"]
        assert low < math.log10(ticks["0"]) < math.log10(min(v for v in losses if v > 0)) < high
        svg = page.js("[...document.querySelectorAll('div.figure[data-fig=scalars-TRAIN] .ytick text')]"
                      ".map(e => e.textContent)")
        assert svg[0] == "0" and svg[-1] == "NaN/inf"  # labelled on the axis, not only by colour
        page.screenshot("curves-log-zero-nan.png")
        # the x axis by step within the mode
        page.page.select_option("select[data-control=x]", "mode")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').layout.xaxis.title.text"
                  " === 'step within its mode'")
        # settings live in the URL: a reload keeps them
        page.page.reload()
        page.wait("window.ttPaintedAt")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').layout.yaxis.type === 'log'")
        assert page.js("document.querySelector('input[data-control=smooth]').value") == "0.6"
        assert page.js("document.querySelector('input[data-control=ylog]').checked") is True
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_a_sparse_mode_says_why_it_is_sparse(tmp_path):
    from tensortap.ui.jobs import JobSet
    from tensortap.ui.views import render_view

    out = str(tmp_path / "job")
    _write_loss_job(out, [1.0 / (s + 1) for s in range(50)], eval_losses={49: 0.3})
    blocks = render_view(JobSet([out]), "overview", {})
    notes = [b["text"] for b in blocks if b["type"] == "note"]
    hint = [n for n in notes if n.startswith("EVAL:")]
    assert hint == ["EVAL: 1 point per curve (step 50): too few for a trend. Save EVAL steps more often: "
                    "SaveConfig(mode_save_configs={modes.EVAL: SaveConfigMode(save_interval=1)}), or a smaller "
                    "--save-interval."]
    # one job: each mode's curves and title in the mode's colour
    from tensortap.ui.views import MODE_COLOURS

    for mode in ("TRAIN", "EVAL"):
        (f,) = [b["figure"] for b in blocks if b.get("id") == f"scalars-{mode}"]
        assert {t["line"]["color"] for t in _curve_traces(f["data"])} == {MODE_COLOURS[mode]}
        assert f["layout"]["title"]["font"]["color"] == MODE_COLOURS[mode]
    assert MODE_COLOURS["TRAIN"] != MODE_COLOURS["EVAL"]


def test_zero_gradients_show_as_zeros(page, dead_layer_job, ui):
    """The dead layer's gradients are exactly 0 at every saved step: its Layers panel draws every one of them
    on the row labelled 0, and the heatmap draws its cells as "exactly 0" (never an empty panel, never a
    silent floor)."""
    trial = tt.create_trial(dead_layer_job)
    g = trial.tensor("gradient/Sequential_0.weight")
    steps = g.steps()
    assert steps and all(not np.any(g.value(s)) for s in steps)  # what the job saved: zeros only
    server = Server([dead_layer_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        ui.show(page, "layers")
        fig = ui.figure_data(page, "layers-norms")
        panel = next(i for i, a in enumerate(fig["layout"]["annotations"], start=1)
                     if a["text"] == "Sequential_0.weight")
        ax = "" if panel == 1 else str(panel)
        zeros = [t for t in fig["data"] if (t.get("meta") or {}).get("row") == "zero"
                 and t["meta"]["tensor"] == "gradient/Sequential_0.weight"]
        assert len(zeros) == 1 and zeros[0]["x"] == steps and zeros[0]["yaxis"] == "y" + ax
        yaxis = fig["layout"]["yaxis" + ax]
        assert yaxis["ticktext"][0] == "0" and zeros[0]["y"] == [pytest.approx(yaxis["tickvals"][0])] * len(steps)
        lo, hi = yaxis["range"]
        assert lo < math.log10(yaxis["tickvals"][0]) < hi  # the 0 row is inside the panel
        weight = next(t for t in fig["data"] if (t.get("meta") or {}).get("tensor") == "Sequential_0.weight")
        assert weight["yaxis"] == "y" + ax and len([y for y in weight["y"] if y]) == len(steps)
        assert "Sequential_0.weight" in page.js("[...document.querySelectorAll('div.figure[data-fig=layers-norms] "
                                                "text')].map(e => e.textContent).join('|')")
        page.screenshot("zero-gradients-layers.png")
        ui.show(page, "heatmap")
        fig = ui.figure_data(page, "heatmap")
        main = fig["data"][0]
        row = main["meta"]["tensors"].index("gradient/Sequential_0.weight")
        assert all(z is None for z in main["z"][row])  # not on the colour scale ...
        cells = next(t for t in fig["data"] if (t.get("meta") or {}).get("cells") == "exactly 0")
        assert cells["z"][row] == [1] * len(main["x"])  # ... but drawn as "exactly 0", every column
        assert "exactly 0" in [t.get("name") for t in fig["data"]]  # and named in the legend
        page.screenshot("zero-gradients-heatmap.png")
        assert page.errors == []
    finally:
        server.stop()


def test_two_jobs_overlay_in_every_view_each_in_its_colour(page, dead_layer_job, healthy_job, ui):
    server = Server([dead_layer_job, healthy_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        colours = {}
        fig = ui.figure_data(page, "scalars-TRAIN")
        for t in _curve_traces(fig["data"]):
            colours.setdefault(t["meta"]["job"], set()).add(t["line"]["color"])
        assert colours == {0: {PALETTE[0]}, 1: {PALETTE[1]}}
        page.screenshot("compare-overview.png")
        ui.show(page, "layers")
        fig = ui.figure_data(page, "layers-norms")
        panel = [t for t in fig["data"] if t.get("xaxis") == "x" and "row" not in (t.get("meta") or {})]
        assert {(t["meta"]["job"], t["line"]["color"], t["line"]["dash"]) for t in panel} == {
            (0, PALETTE[0], "solid"), (0, PALETTE[0], "dash"), (1, PALETTE[1], "solid"), (1, PALETTE[1], "dash")}
        page.screenshot("compare-layers.png")
        ui.show(page, "heatmap")
        fig = ui.figure_data(page, "heatmap")
        maps = [t for t in fig["data"] if t["type"] == "heatmap" and "tensors" in (t.get("meta") or {})]
        assert [t["meta"]["job"] for t in maps] == [0, 1] and {t["coloraxis"] for t in maps} == {"coloraxis"}
        assert [t["xaxis"] for t in maps] == ["x", "x2"]  # side by side
        zs = [z for t in maps for r in t["z"] for z in r if z is not None]
        ca = fig["layout"]["coloraxis"]
        assert ca["cmin"] == pytest.approx(min(zs)) and ca["cmax"] == pytest.approx(max(zs))  # one scale for both
        page.screenshot("compare-heatmap.png")
        ui.show(page, "distribution")
        fig = ui.figure_data(page, "distribution")
        medians = {t["meta"]["job"]: t["line"]["color"] for t in fig["data"] if t["name"].startswith("median")}
        assert medians == {0: PALETTE[0], 1: PALETTE[1]}
        page.screenshot("compare-distribution.png")
        # the job picker, by keyboard: leave the healthy run out, every view follows
        n = page.js("window.ttRenders")
        page.page.focus("input[data-job='1']")
        page.page.keyboard.press("Space")
        page.wait(f"window.ttRenders > {n}")
        assert "job=0" in page.js("location.hash")
        fig = ui.figure_data(page, "distribution")
        assert {(t.get("meta") or {}).get("job") for t in fig["data"]} <= {0, None}
        ui.show(page, "overview")
        fig = ui.figure_data(page, "scalars-TRAIN")
        assert {t["meta"]["job"] for t in _curve_traces(fig["data"])} == {0}
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_the_xgboost_page(page, xgboost_job, dead_layer_job, ui):
    """An XGBoost job gets only its own sections: metrics once, feature importance as one chart with a type
    selector and titled axes, labels, confusion and SHAP; its rounds never share an axis with a neural net's
    steps."""
    import xgboost  # noqa: F401 - the job was trained with it

    trial = tt.create_trial(xgboost_job)
    server = Server([xgboost_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        tabs = page.js("[...document.querySelectorAll('nav button')].map(b => b.dataset.view)")
        assert tabs == ["overview", "rules", "xgboost"]  # no neural-net views for a booster
        # the overview's metrics per round: each metric in a colour of its own (all are TRAIN: a mode's colour
        # would draw them alike), told apart by dash too
        rounds = _curve_traces(ui.figure_data(page, "rounds-TRAIN")["data"])
        assert len(rounds) == 4 and len({t["line"]["color"] for t in rounds}) == 4
        assert len({t["line"]["dash"] for t in rounds}) == 4
        ui.show(page, "xgboost")
        figs = page.js("[...document.querySelectorAll('div.figure')].map(d => d.dataset.fig)")
        assert figs == ["xgb-metrics", "xgb-fi", "xgb-labels", "xgb-confusion", "xgb-shap"]
        fig = ui.figure_data(page, "xgb-metrics")
        by = {t["name"]: t for t in fig["data"]}
        assert set(by) == set(trial.tensor_names(collection="metrics"))
        t = trial.tensor("validation-mlogloss")
        assert by["validation-mlogloss"]["y"] == pytest.approx([float(v) for v in t.values().values()], rel=1e-6)
        assert fig["layout"]["xaxis"]["title"]["text"] == "round"
        fi = ui.figure_data(page, "xgb-fi")
        assert [t["name"] for t in fi["data"] if t["visible"] is True] == ["gain"]
        last = trial.steps()[-1]
        gain = next(t for t in fi["data"] if t["name"] == "gain")
        want = {f: float(trial.tensor(f"feature_importance/gain/{f}").value(last)) for f in gain["y"]}
        assert dict(zip(gain["y"], gain["x"], strict=True)) == pytest.approx(want)
        assert fi["layout"]["xaxis"]["title"]["text"] == f"feature importance: gain (round {last})"
        assert fi["layout"]["yaxis"]["title"]["text"] == "feature"
        page.page.select_option("select[data-switch=xgb-fi]", label="weight")
        page.wait("document.querySelector('div.figure[data-fig=xgb-fi]').layout.xaxis.title.text"
                  f" === 'feature importance: weight (round {last})'")
        fi = ui.figure_data(page, "xgb-fi")
        assert [t["name"] for t in fi["data"] if t["visible"] is True] == ["weight"]
        conf = ui.figure_data(page, "xgb-confusion")["data"][0]["z"]
        assert sum(map(sum, conf)) == len(trial.tensor("labels").value(last))
        page.screenshot("xgboost-page.png")
        assert page.errors == [] and page.outside == []
    finally:
        page.close()  # its page polled the server stopped here
        server.stop()
    page = ui.Page(page.page.context.browser)
    server = Server([xgboost_job, dead_layer_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        figs = {f["fig"]: f for f in page.js(ui.FIGURES_JS)}
        assert {"scalars-TRAIN", "rounds-TRAIN"} <= set(figs)
        nn = ui.figure_data(page, "scalars-TRAIN")
        rounds = ui.figure_data(page, "rounds-TRAIN")
        assert {t["meta"]["job"] for t in _curve_traces(nn["data"])} == {1}
        assert {t["meta"]["job"] for t in _curve_traces(rounds["data"])} == {0}
        assert rounds["layout"]["xaxis"]["title"]["text"] == "round"
        assert nn["layout"]["xaxis"]["title"]["text"] == "global step"
        page.screenshot("xgboost-beside-pytorch-overview.png")
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()
        page.close()


def test_two_xgboost_jobs_share_the_axes_of_the_xgboost_page(page, tmp_path, ui):
    """Two XGBoost jobs compared: metrics per round in one figure, feature importance and SHAP as grouped bars,
    each job in its colour; labels and confusion one job after the other."""
    a, b = str(tmp_path / "xgb_a"), str(tmp_path / "xgb_b")
    ui.write_xgboost_job(a, rounds=12)
    ui.write_xgboost_job(b, rounds=7)
    server = Server([a, b], port=0).start()
    try:
        ui.open_page(page, server.url)
        ui.show(page, "xgboost")
        figs = page.js("[...document.querySelectorAll('div.figure')].map(d => d.dataset.fig)")
        assert figs == ["xgb-metrics", "xgb-fi", "xgb-shap", "xgb-labels@0", "xgb-confusion@0", "xgb-labels@1",
                        "xgb-confusion@1"]
        metrics = ui.figure_data(page, "xgb-metrics")["data"]
        assert {(t["meta"]["job"], t["line"]["color"]) for t in metrics} == {(0, PALETTE[0]), (1, PALETTE[1])}
        assert max(max(t["x"]) for t in metrics if t["meta"]["job"] == 1) == 6  # one axis of rounds for both
        fi = ui.figure_data(page, "xgb-fi")
        shown = [t for t in fi["data"] if t["visible"] is True]
        assert [t["meta"]["job"] for t in shown] == [0, 1] and fi["layout"]["barmode"] == "group"
        for t, path in zip(shown, (a, b), strict=True):
            trial = tt.create_trial(path)
            last = trial.steps()[-1]
            want = {f: float(trial.tensor(f"feature_importance/gain/{f}").value(last)) for f in t["y"]}
            assert dict(zip(t["y"], t["x"], strict=True)) == pytest.approx(want)
        shap = ui.figure_data(page, "xgb-shap")["data"]
        assert [t["marker"]["color"] for t in shap] == [PALETTE[0], PALETTE[1]]
        assert dict(zip(shap[0]["y"], shap[0]["x"], strict=True))["f0"] == pytest.approx(0.5 * 11)
        assert dict(zip(shap[1]["y"], shap[1]["x"], strict=True))["f0"] == pytest.approx(0.5 * 6)
        # each job's own sections keep its colour
        assert [ui.figure_data(page, f"xgb-labels@{i}")["data"][0]["marker"]["color"] for i in (0, 1)] == \
            [PALETTE[0], PALETTE[1]]
        page.screenshot("xgboost-two-jobs.png")
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_zoom_rereads_the_shown_steps_at_full_resolution(page, tmp_path, ui):
    """A 30,000-step curve is drawn as a min/max envelope; zooming to 600 steps re-reads them all, keeps an
    envelope outside, and a one-step spike is drawn at every zoom."""
    out = str(tmp_path / "long")
    rng = np.random.default_rng(1)
    losses = (1.0 + 0.1 * rng.standard_normal(30_000)).tolist()
    losses[12_345] = 50.0
    losses[25_000] = 40.0
    _write_loss_job(out, losses)
    server = Server([out], port=0).start()
    try:
        ui.open_page(page, server.url)
        (c,) = _curve_traces(ui.figure_data(page, "scalars-TRAIN")["data"])
        assert len(c["x"]) <= 2000 and c["meta"]["downsampled"] and c["meta"]["n"] == 30_000
        assert 12_345 in c["x"] and 25_000 in c["x"]  # spikes survive the envelope
        n = page.js("window.ttZooms || 0")
        page.page.evaluate("Plotly.relayout(document.querySelector('div.figure[data-fig=scalars-TRAIN]'), "
                           "{'xaxis.range': [12000, 12599]})")
        page.wait(f"(window.ttZooms || 0) > {n}")
        (z,) = _curve_traces(ui.figure_data(page, "scalars-TRAIN")["data"])
        inside = [(x, y) for x, y in zip(z["x"], z["y"], strict=True) if 12_000 <= x <= 12_599]
        assert [x for x, _ in inside] == list(range(12_000, 12_600))  # every saved step of the window
        assert [y for _, y in inside] == pytest.approx(losses[12_000:12_600], rel=1e-6)
        outside = [x for x in z["x"] if not 12_000 <= x <= 12_599]
        assert 0 < len(outside) <= 800 and 25_000 in outside  # an envelope outside, its spike kept
        assert z["meta"]["window"] == [12000, 12599]
        layout = ui.figure_data(page, "scalars-TRAIN")["layout"]
        assert layout["xaxis"]["range"] == [12000, 12599]
        page.screenshot("zoomed.png")
        assert page.errors == []
    finally:
        server.stop()


def test_a_live_redraw_keeps_the_zoomed_window_at_full_resolution_and_wall_time_is_an_x_axis(page, tmp_path, ui):
    """A zoomed curve of a live job stays zoomed, with every saved step of its window, when the page redraws it
    for the job's new steps; the x axis by wall time puts each point at the flush time of its step."""
    import time

    out = str(tmp_path / "live")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    rng = np.random.default_rng(2)
    saved: list[float] = []

    def steps(n: int) -> None:
        for _ in range(n):
            hook.set_mode(modes.TRAIN)
            hook.next_step()
            saved.append(float(1 + 0.1 * rng.standard_normal()))
            hook.save_scalar("loss", saved[-1])
        hook.next_step()  # the steps so far are complete once the job moved past them
        hook.flush()

    steps(2500)
    server = Server([out], port=0).start()
    try:
        ui.open_page(page, server.url)
        (c,) = _curve_traces(ui.figure_data(page, "scalars-TRAIN")["data"])
        assert c["meta"]["downsampled"]
        n = page.js("window.ttZooms || 0")
        page.page.evaluate("Plotly.relayout(document.querySelector('div.figure[data-fig=scalars-TRAIN]'), "
                           "{'xaxis.range': [1000, 1299]})")
        page.wait(f"(window.ttZooms || 0) > {n}")

        def window() -> list[tuple[int, float]]:
            (z,) = _curve_traces(ui.figure_data(page, "scalars-TRAIN")["data"])
            return [(x, y) for x, y in zip(z["x"], z["y"], strict=True) if 1000 <= x <= 1299], z

        inside, _ = window()
        assert [x for x, _ in inside] == list(range(1000, 1300))
        time.sleep(1.0)  # the next flush is a second later: its steps get a later wall time
        steps(40)
        page.wait("Math.max(...document.querySelector('div.figure[data-fig=scalars-TRAIN]').data"
                  ".find(t => t.meta && t.meta.curve).x) >= 2539")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').data.find(t => t.meta && "
                  "t.meta.curve).meta.window")  # redrawn with the job's new steps, then its window read again
        inside, z = window()
        assert [x for x, _ in inside] == list(range(1000, 1300))  # no zoomed point lost
        assert [y for _, y in inside] == pytest.approx(saved[1000:1300], rel=1e-6)
        assert ui.figure_data(page, "scalars-TRAIN")["layout"]["xaxis"]["range"] == [1000, 1299]
        last = max(z["x"])
        assert last > 2499  # the new steps are there, outside the window (an envelope of them)
        # wall time: the flush time of each step, seconds since the job's first step
        table = ui.figure_data(page, "scalars-TRAIN")["layout"]["meta"]["wall"]["0"]
        assert table["step"][0] == 0 and table["step"][-1] >= 2539 and table["s"][0] == 0
        assert table["s"] == sorted(table["s"])
        at = dict(zip(table["step"], table["s"], strict=True))
        assert at[table["step"][-1]] - max(v for k, v in at.items() if k <= 2499) >= 0.9  # written a second later
        page.page.dblclick("div.figure[data-fig=scalars-TRAIN] .nsewdrag")  # back to the whole curve
        page.page.select_option("select[data-control=x]", "wall")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').layout.xaxis.title.text"
                  " === \"wall time (s since the job's first step)\"")
        drawn = page.js("document.querySelector('div.figure[data-fig=scalars-TRAIN]').data"
                        ".find(t => t.meta && t.meta.curve)")
        xs = [x for x in drawn["x"] if x is not None]
        assert len(xs) == len(drawn["x"]) and xs == sorted(xs)  # every point placed, in step order
        assert xs[0] == 0 and 0.9 <= xs[-1] <= table["s"][-1]  # seconds since the first step, not steps
        page.screenshot("curves-wall-time.png")
        assert page.errors == []
    finally:
        server.stop()
        hook.close()


def test_a_long_tensor_list_is_searchable(page, tmp_path, ui):
    out = str(tmp_path / "many")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for _ in range(3):
        hook.next_step()
        for i in range(40):
            hook.save_tensor(f"gradients/block{i}/conv", np.full(4, i + 1.0, np.float32), "gradients")
    hook.close()
    server = Server([out], port=0).start()
    try:
        ui.open_page(page, server.url)
        ui.show(page, "distribution")
        page.page.focus("input[data-search=tensor]")
        page.page.keyboard.type("block3")
        shown = page.js("[...document.querySelectorAll('select[data-param=tensor] option')].filter(o => !o.hidden)"
                        ".map(o => o.value)")
        assert shown == ["gradients/block3/conv"] + [f"gradients/block{i}/conv" for i in range(30, 40)]
        n = page.js("window.ttRenders")
        page.page.keyboard.press("Enter")
        page.wait(f"window.ttRenders > {n}")
        assert page.js("document.querySelector('div.figure').layout.title.text") == \
            "Distribution of gradients/block3/conv over steps"
        # the layers view pages 40 layers by 24, and finds them by name
        ui.show(page, "layers")
        n = page.js("window.ttRenders")
        page.page.fill("input[data-param=find]", "block1")
        page.page.keyboard.press("Enter")
        page.wait(f"window.ttRenders > {n}")
        names = [a["text"] for a in ui.figure_data(page, "layers-norms")["layout"]["annotations"]]
        assert names == ["block1/conv"] + [f"block{i}/conv" for i in range(10, 20)]
        assert page.errors == []
    finally:
        server.stop()


JOBS = ("pytorch_job", "keras_job", "xgboost_job")


@pytest.mark.parametrize("which", JOBS)
def test_screenshots_of_every_view(page, request, which, ui):
    """Every view of a PyTorch, a Keras and an XGBoost job drawn without an error, each kept as a screenshot
    (`<framework>-<view>.png`) for a person to look at."""
    job = request.getfixturevalue(which)
    server = Server([job], port=0).start()
    try:
        ui.open_page(page, server.url)
        views = page.js("[...document.querySelectorAll('nav button')].map(b => b.dataset.view)")
        if which == "xgboost_job":
            assert views == ["overview", "rules", "xgboost"]
        else:
            assert views[:5] == ["overview", "layers", "heatmap", "distribution", "rules"]
        page.wait("!document.querySelector('#view div.pending')", timeout=300)  # the diagnosis drawn in place
        for view in views:
            if view != "overview":
                ui.show(page, view)
            page.screenshot(f"{which.split('_')[0]}-{view}.png")
            # no empty figure: each drawn figure holds data
            empty = page.js("[...document.querySelectorAll('div.figure')].filter(d => !(d.data || []).some("
                            "t => (t.x && t.x.length) || (t.z && t.z.length))).map(d => d.dataset.fig)")
            assert empty == [], (view, empty)
        if which == "keras_job":  # a layer's weight and its gradient share one panel
            ui.show(page, "layers")
            fig = ui.figure_data(page, "layers-norms")
            names = [a["text"] for a in fig["layout"]["annotations"]]
            assert names == [f"sequential/d{i}/{v}" for i in (1, 2, 3) for v in ("bias", "kernel")]
            for i in range(1, 7):
                ax = "y" if i == 1 else f"y{i}"
                kinds = {t["name"].split()[0] for t in fig["data"] if t.get("yaxis") == ax
                         and "row" not in (t.get("meta") or {})}
                assert kinds == {"weight", "gradient"}, names[i - 1]
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_report_of_three_frameworks_draws_only_what_each_has(page, pytorch_job, keras_job, xgboost_job, tmp_path,
                                                             ui):
    from tensortap.ui.report import write_report

    report = str(tmp_path / "report.html")
    write_report([xgboost_job], report)
    ui.open_page(page, "file://" + report)
    page.screenshot("report-xgboost.png")
    sections = page.js("[...document.querySelectorAll('section')].map(s => s.dataset.view)")
    assert sections == ["diagnosis", "rules", "xgboost"]  # its metrics once, in its own section
    assert page.js("[...document.querySelectorAll('div.figure')].map(d => d.dataset.fig)") == \
        ["xgb-metrics", "xgb-fi", "xgb-labels", "xgb-confusion", "xgb-shap"]
    page.page.select_option("select[data-switch=xgb-fi]", label="cover")  # the selector works offline too
    page.wait("document.querySelector('div.figure[data-fig=xgb-fi]').layout.xaxis.title.text.includes('cover')")
    write_report([pytorch_job, keras_job], report)
    page.page.goto("file://" + report)
    page.wait("window.ttPaintedAt")
    page.screenshot("report-pytorch-keras.png")
    assert page.js("[...document.querySelectorAll('section')].map(s => s.dataset.view)") == \
        ["diagnosis", "rules", "overview", "heatmap", "layers", "distribution"]
    assert page.js("document.querySelectorAll('.toolbar input[data-control=smooth]').length") == 1
    assert page.errors == [] and page.outside == []


def test_report_distributions_default_to_rules_and_largest_gradients_and_the_cli_chooses(pytorch_job, tmp_path):
    import base64
    import gzip
    import json

    from tensortap.cli.main import main
    from tensortap.ui.jobs import Job
    from tensortap.ui.report import report_distributions

    job = Job(0, pytorch_job)
    chosen = report_distributions(job)
    named = [t for r in job.rules() for t in r["tensors"]]
    assert named and chosen[0] == named[0]  # what the rule named where it fired comes first
    norms = {g: float(np.nanmax(job.stats(g)["l2"][1])) for g in job.kinds.gradients}
    rest = [c for c in chosen if c not in named]
    assert rest == sorted(rest, key=lambda g: -norms[g])[: len(rest)]
    assert max(norms, key=norms.get) in chosen or len(named) >= 3

    def drawn(path: str) -> list[str]:
        text = open(path, encoding="utf-8").read()
        packed = re.search(r'id="tt-report-data">([^<]*)</script>', text).group(1)
        doc = json.loads(gzip.decompress(base64.b64decode(packed)))
        sec = next(s for s in doc["sections"] if s["name"] == "distribution")
        return [re.sub(r"^Distribution of (.*) over steps$", r"\1", b["figure"]["layout"]["title"]["text"])
                for b in sec["blocks"] if b["type"] == "figure"]

    out = str(tmp_path / "r.html")
    assert main(["report", pytorch_job, "-o", out]) == 0
    assert drawn(out) == chosen
    assert main(["report", pytorch_job, "-o", out, "--distribution", r"^Sequential_2\.weight$",
                 "--distribution", "^gradient/Sequential_0"]) == 0
    assert drawn(out) == ["gradient/Sequential_0.bias", "gradient/Sequential_0.weight", "Sequential_2.weight"]
    assert main(["report", pytorch_job, "-o", out, "--distribution", "(unclosed"]) == 2
    assert not os.path.exists(str(tmp_path / "x.html"))


def test_the_x_axis_by_epoch_where_a_job_saved_its_epoch(page, tmp_path, ui):
    """A job that saves a scalar `epoch` (as the Hugging Face Trainer logs it) gets an x axis of epochs: each point
    at its step's epoch, by linear interpolation between the saved ones (and beyond them along the nearest two);
    a job beside it that saved none draws no point on that axis (never its steps as epochs)."""
    with_epoch, without = str(tmp_path / "with_epoch"), str(tmp_path / "without")
    hook = tt.Hook(with_epoch, save_config=tt.SaveConfig(save_interval=1))
    for step in range(100):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        hook.save_scalar("loss", 1.0 / (step + 1))
        if step % 10 == 5:
            hook.save_scalar("epoch", step / 25)  # 25 steps an epoch
    hook.close()
    _write_loss_job(without, [1.0 / (s + 1) for s in range(100)])
    server = Server([with_epoch, without], port=0).start()
    try:
        ui.open_page(page, server.url)
        options = page.js("[...document.querySelectorAll('select[data-control=x] option')].map(o => o.value)")
        assert options == ["step", "mode", "wall", "epoch"]
        page.page.select_option("select[data-control=x]", "epoch")
        page.wait("document.querySelector('div.figure[data-fig=scalars-TRAIN]').layout.xaxis.title.text"
                  ".startsWith('epoch')")
        fig = ui.figure_data(page, "scalars-TRAIN")
        loss = next(t for t in _curve_traces(fig["data"])
                    if t["meta"]["job"] == 0 and t["meta"]["tensor"].endswith("loss"))
        assert loss["x"] == pytest.approx([s / 25 for s in range(100)], abs=1e-6)  # steps 0..4, 96..99: extended
        other = next(t for t in _curve_traces(fig["data"]) if t["meta"]["job"] == 1)
        assert other["x"] == [None] * 100 and other["name"].endswith(" (no epoch saved)")
        assert "job=" not in page.js("location.hash") and "x=epoch" in page.js("location.hash")
        page.screenshot("curves-epoch.png")
        assert page.errors == []
    finally:
        server.stop()


#: pairs of tick labels (or panel titles) of one figure whose boxes overlap, per axis: [[figure, axis, a, b]]
OVERLAPS_JS = """
(() => {
  const out = [];
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const check = (fig, what, els) => {
    const boxes = els.filter(e => e.textContent.trim()).map(e => [e.textContent, e.getBoundingClientRect()]);
    for (let i = 0; i < boxes.length; i++)
      for (let j = i + 1; j < boxes.length; j++)
        if (hit(boxes[i][1], boxes[j][1])) out.push([fig, what, boxes[i][0], boxes[j][0]]);
  };
  for (const d of document.querySelectorAll('div.figure')) {
    for (const sp of d.querySelectorAll('g.subplot')) {
      const name = [...sp.classList].find(c => c !== 'subplot');
      check(d.dataset.fig, name + ' x', [...sp.querySelectorAll('.xtick text')]);
      check(d.dataset.fig, name + ' y', [...sp.querySelectorAll('.ytick text')]);
    }
    check(d.dataset.fig, 'titles', [...d.querySelectorAll('g.annotation-text-g text')]);
  }
  return out;
})()
"""


@pytest.mark.parametrize("width", [1280, 640])
def test_ticks_and_titles_never_run_together(browser, dead_layer_job, healthy_job, width, ui):
    """At a wide and a narrow window, in every view of two jobs: no two tick labels of one axis overlap, nor two
    panel titles (the small multiples' log axes show at most four labels; their x axes say what they count)."""
    page = ui.Page(browser, width=width, height=900)
    server = Server([dead_layer_job, healthy_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        for view in ("overview", "layers", "heatmap", "distribution"):
            if view != "overview":
                ui.show(page, view)
            assert page.js(OVERLAPS_JS) == [], (view, width)
            if view == "layers":
                fig = ui.figure_data(page, "layers-norms")
                logs = [a for k, a in fig["layout"].items() if k.startswith("yaxis") and a.get("type") == "log"]
                assert logs and all(len(a["tickvals"]) <= 5 for a in logs)  # four, and the 0 row
                titled = [k for k, a in fig["layout"].items() if k.startswith("xaxis") and a.get("title")]
                assert len(titled) == min(4, len(fig["layout"]["annotations"]))  # each column's bottom panel
                page.screenshot(f"layers-{width}px.png")
        assert page.errors == []
    finally:
        server.stop()
        page.close()


def test_every_control_is_reached_with_the_tab_key(page, dead_layer_job, healthy_job, ui):
    """The tabs, the job picker, the curve toolbar and a view's choices are reached by Tab alone, in page order,
    each with a visible focus outline."""
    server = Server([dead_layer_job, healthy_job], port=0).start()
    try:
        ui.open_page(page, server.url)
        ui.show(page, "distribution")
        ui.show(page, "overview")
        seen = []
        for _ in range(40):
            page.page.keyboard.press("Tab")
            got = page.js("(() => { const e = document.activeElement; if (!e || e === document.body) return null; "
                          "const s = getComputedStyle(e); return [e.tagName.toLowerCase(), e.dataset.view || "
                          "e.dataset.job || e.dataset.control || e.dataset.param || e.type || '', "
                          "s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0]; })()")
            if got is None:  # past the end of the page: the next Tab starts at its top
                continue
            if seen and got[:2] == seen[0][:2]:
                break
            seen.append(got)
        reached = [tuple(s[:2]) for s in seen]
        for want in [("input", "0"), ("input", "1"), ("button", "overview"), ("button", "layers"),
                     ("button", "heatmap"), ("button", "distribution"), ("button", "rules"),
                     ("input", "smooth"), ("input", "ylog"), ("select", "x")]:
            assert want in reached, (want, reached)
        assert all(s[2] for s in seen), seen  # the focus is shown on each
        assert page.errors == []
    finally:
        server.stop()
