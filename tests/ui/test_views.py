"""The dashboard's data, without a browser: the min/max envelope, rule statuses, views of native, smdebug
and S3 jobs, escaping, and what importing costs."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tensortap as tt
from tensortap.ui.jobs import JobSet, rule_summary
from tensortap.ui.series import envelope, series_json

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")

pytest.importorskip("flask")


def _figures(blocks):
    return {b["id"]: b["figure"] for b in blocks if b["type"] == "figure"}


def test_envelope_keeps_every_spike_and_non_finite_value():
    rng = np.random.default_rng(0)
    steps = np.arange(100_000)
    vals = rng.standard_normal(100_000)
    vals[31_337] = 1e6
    vals[77_777] = -1e6
    vals[50_001] = np.nan
    xs, ys = envelope(steps, vals, max_points=1000)
    assert len(xs) <= 1002 and np.all(np.diff(xs) > 0)
    assert 31_337 in xs and 77_777 in xs and 50_001 in xs
    assert np.nanmax(ys) == 1e6 and np.nanmin(ys) == -1e6
    # every run keeps its own extremes: the envelope's upper line never falls below a run's max
    edges = np.linspace(0, len(vals), 501).astype(int)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        seg = vals[a:b]
        inside = ys[(xs >= a) & (xs < b)]
        assert np.nanmax(inside) == np.nanmax(seg) and np.nanmin(inside) == np.nanmin(seg)
    s = series_json(steps, vals, max_points=1000)
    assert s["downsampled"] and s["n"] == 100_000 and s["nonfinite_steps"] == [50_001]
    assert None in s["y"]  # NaN drawn as a gap
    short = series_json(np.arange(5), np.arange(5.0))
    assert short["x"] == [0, 1, 2, 3, 4] and not short["downsampled"]


def test_rule_statuses():
    fired = rule_summary("vg", {"status": "IssuesFound", "rule": "vanishing_gradient", "first_step": 7},
                         {"fired_steps": [7, 9], "datapoints": 3, "first_violations": [
                             {"step": 7, "tensor": "gradient/<b>", "condition": "mean < 1e-7"}]})
    assert fired["status"] == "IssuesFound" and fired["fired_steps"] == [7, 9]
    assert fired["explanations"] == {"7": ["gradient/<b>: mean < 1e-7"]}
    # a rule that ended without seeing data never says NoIssuesFound
    assert rule_summary("r", {"status": "NoIssuesFound"}, {"datapoints": 0, "steps_evaluated": 0})["status"] \
        == "NoData"
    assert rule_summary("r", {"status": "NoIssuesFound"}, {"datapoints": 5, "steps_evaluated": 2})["status"] \
        == "NoIssuesFound"
    err = rule_summary("r", {"status": "Error", "message": "boom", "traceback": "Traceback ..."}, {})
    assert err["status"] == "Error" and err["error"] == "Traceback ..."
    assert rule_summary("r", {}, {})["status"] == "InProgress"
    assert rule_summary("r", {"status": "<img>"}, {})["status"] == "Error"  # unknown: not shown as given


def test_jobs_are_named_only_by_index(tmp_path):
    hook = tt.Hook(str(tmp_path / "a"), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_scalar("loss", 1.0)
    hook.close()
    jobs = JobSet([str(tmp_path / "a")])
    assert jobs.get("0").path == str(tmp_path / "a")
    for bad in ("1", "-1", "../a", str(tmp_path / "a"), "0x0", " 0", ""):
        with pytest.raises(KeyError, match="allowed are 0..0"):
            jobs.get(bad)
    with pytest.raises(ValueError, match="at least one OUT_DIR"):
        JobSet([])


def test_views_of_an_smdebug_pytorch_job():
    from tensortap.ui.views import render_view

    jobs = JobSet([os.path.join(FIXTURES, "pytorch_job")])
    trial = jobs.jobs[0].trial
    figs = _figures(render_view(jobs, "overview", {}))
    assert figs, "no curves"
    loss_names = trial.tensor_names(collection="losses")
    drawn = {t["meta"]["tensor"] for f in figs.values() for t in f["data"] if t.get("meta", {}).get("tensor")}
    assert set(loss_names) <= drawn
    layers = _figures(render_view(jobs, "layers", {}))
    norms = layers["layers-norms"]["data"]
    grads = trial.tensor_names(collection="gradients")
    assert {t["meta"]["tensor"] for t in norms} >= set(grads)
    # a norm computed from the saved raw values, bit for bit what numpy says
    g = grads[0]
    tr = next(t for t in norms if t["meta"]["tensor"] == g)
    step = tr["x"][0]
    assert tr["y"][0] == pytest.approx(float(np.linalg.norm(trial.tensor(g).value(step).astype(np.float64))),
                                       rel=1e-6)
    heat = _figures(render_view(jobs, "heatmap", {}))["heatmap"]["data"][0]
    assert len(heat["z"]) == len(grads) and sorted(heat["meta"]["tensors"]) == sorted(grads)


def test_workers_side_by_side_for_an_smdebug_distributed_job():
    from tensortap.ui.views import available_views, render_view

    jobs = JobSet([os.path.join(FIXTURES, "two_workers")])
    assert "workers" in [v["name"] for v in available_views(jobs)]
    blocks = render_view(jobs, "workers", {})
    figs = _figures(blocks)
    assert [t["name"] for t in figs["workers-0"]["data"]] == jobs.jobs[0].trial.workers()


def test_views_of_a_job_on_s3(s3_url):
    from tensortap.ui.report import build_report
    from tensortap.ui.views import render_view

    hook = tt.Hook(s3_url, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(norms=["l2"], reductions=["min", "max"]))
    for step in range(6):
        hook.next_step()
        hook.save_tensor("gradients/w", np.full((3, 3), 2.0 ** -step, np.float32), "gradients")
        hook.save_scalar("loss", 1.0 / (step + 1))
    hook.close()
    jobs = JobSet([s3_url])
    figs = _figures(render_view(jobs, "overview", {}))
    assert figs["scalars-GLOBAL"]["data"][0]["y"] == pytest.approx([1 / (s + 1) for s in range(6)])
    # norms from the saved reductions: no raw value was saved
    heat = _figures(render_view(jobs, "heatmap", {}))["heatmap"]["data"][0]
    assert heat["z"][0] == pytest.approx([np.log10(3 * 2.0 ** -s) for s in range(6)], rel=1e-5)
    html = build_report([s3_url])
    packed = re.search(r'id="tt-report-data">([^<]*)</script>', html).group(1)
    doc = json.loads(gzip.decompress(base64.b64decode(packed)))
    assert [s["name"] for s in doc["sections"]][:3] == ["diagnosis", "rules", "overview"]
    assert _figures(doc["sections"][2]["blocks"]) == figs


def test_names_from_the_job_reach_figures_escaped(tmp_path):
    from tensortap.ui.server import to_json
    from tensortap.ui.views import render_view

    out = str(tmp_path / "job")
    hostile = "<script>alert(1)</script>"
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for step in range(3):
        hook.next_step()
        hook.save_scalar(hostile, float(step))
        hook.save_tensor(f"gradients/{hostile}", np.ones(4, np.float32), "gradients")
    hook.close()
    jobs = JobSet([out])
    for view in ("overview", "layers", "heatmap", "distribution"):
        blocks = render_view(jobs, view, {})
        figures = [b["figure"] for b in blocks if b["type"] == "figure"]
        # what plotly draws: every field but `meta` (data for scripts, which plotly never renders here)
        text = to_json([{**f, "data": [{k: v for k, v in t.items() if k != "meta"} for t in f["data"]]}
                        for f in figures])
        assert figures and "<script" not in text and "&lt;script&gt;" in text, view


def test_importing_the_ui_imports_no_web_stack():
    code = ("import sys, tensortap, tensortap.ui, tensortap.plot, tensortap.cli.main;"
            "tensortap.cli.main.build_parser();"
            "print([m for m in ('flask', 'plotly', 'werkzeug') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_trial_html_summary_escapes_names(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for _ in range(3):
        hook.next_step()
        hook.save_scalar("<b>loss</b>", 1.0)
    hook.close()
    os.makedirs(os.path.join(out, "rules", "r1"))
    with open(os.path.join(out, "rules", "r1", "status.json"), "w") as f:
        json.dump({"status": "IssuesFound", "first_step": 1}, f)
    from tensortap.runner import status as st
    from tensortap.storage import open_storage

    st.write_status(open_storage(out), "r2", True, status=st.NO_DATA)  # as `tensortap rules run` writes it
    with open(os.path.join(out, "rules", "r1", "status.json.partial"), "w") as f:
        f.write("{")  # not a rule's file: no rule named after it
    html = tt.create_trial(out)._repr_html_()
    assert "&lt;b&gt;loss&lt;/b&gt;" in html and "<b>loss" not in html
    assert "r1: <b>IssuesFound</b> at step 1<br>r2 (offline): <b>no data</b>" in html
    assert "steps</th><td style=\"text-align:left\">3" in html


def test_layers_count_non_finite_values_and_keep_a_spike(tmp_path):
    from tensortap.ui.views import render_view

    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for step in range(3000):
        hook.next_step()
        g = np.full(4, 1e-3, np.float32)
        if step == 1234:
            g[0] = 1e3  # one exploding step
        if step == 2000:
            g[:2] = [np.nan, np.inf]
        hook.save_tensor("gradients/fc", g, "gradients")
        hook.save_tensor("weights/fc", np.ones(4, np.float32), "weights")
    hook.close()
    jobs = JobSet([out])
    figs = _figures(render_view(jobs, "layers", {}))
    nf = next(t for t in figs["layers-nonfinite"]["data"] if t["meta"]["tensor"] == "gradients/fc")
    assert dict(zip(nf["x"], nf["y"], strict=True))[2000] == 2
    assert sum(y for y in nf["y"] if y) == 2
    norm = next(t for t in figs["layers-norms"]["data"] if t["meta"]["tensor"] == "gradients/fc")
    assert len(norm["x"]) <= 402 and 1234 in norm["x"]  # enveloped, the spike kept
    assert max(y for y in norm["y"] if y is not None) == pytest.approx(1e3, rel=1e-6)
    # the NaN/inf step on the L2 norm's log axis: a marker on the row labelled NaN/inf, never left out
    (row,) = [t for t in figs["layers-norms"]["data"] if t["meta"].get("row") == "nonfinite"]
    assert row["x"] == [2000] and row["meta"]["tensor"] == "gradients/fc"
    axis = figs["layers-norms"]["layout"]["yaxis" if row["yaxis"] == "y" else "yaxis" + row["yaxis"][1:]]
    assert axis["ticktext"][-1] == "NaN/inf" and row["y"] == [pytest.approx(axis["tickvals"][-1])]
    heat = _figures(render_view(jobs, "heatmap", {}))["heatmap"]["data"]
    assert max(z for z in heat[0]["z"][0] if z is not None) == pytest.approx(3.0, abs=1e-6)  # log10(1e3)
    bad = next(t for t in heat if (t.get("meta") or {}).get("cells") == "NaN or inf")
    col = max(i for i, x in enumerate(heat[0]["x"]) if x <= 2000)
    assert bad["z"][0][col] == 1 and heat[0]["z"][0][col] is None  # drawn apart from the colour scale


def test_rule_marker_sits_on_the_loss_curve_at_the_firing_step(tmp_path):
    from tensortap.runner.status import write_status
    from tensortap.storage import open_storage
    from tensortap.ui.views import render_view

    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for step in range(10):
        hook.next_step()
        hook.save_scalar("acc", float("nan") if step == 3 else step / 10)
        hook.save_scalar("loss", 1.0 / (step + 1))
    hook.close()
    storage = open_storage(out)
    report = {"rule": "LossNotDecreasing", "fired_steps": [5], "datapoints": 6, "steps_evaluated": 6,
              "first_violations": [{"step": 5, "tensor": "scalar/loss", "condition": "loss <did not> decrease"}]}
    storage.write("rules/loss_not_decreasing/report.json", json.dumps(report).encode())
    write_status(storage, "loss_not_decreasing", status="IssuesFound", first_step=5, message="fired at step 5")
    figs = _figures(render_view(JobSet([out]), "overview", {}))
    traces = figs["scalars-GLOBAL"]["data"]
    marker = next(t for t in traces if t.get("meta", {}).get("rule") == "loss_not_decreasing")
    assert marker["x"] == [5] and marker["y"] == [pytest.approx(1 / 6)]
    assert marker["text"] == ["loss_not_decreasing fired at step 5<br>scalar/loss: loss &lt;did not&gt; decrease"]
    acc = next(t for t in traces if t.get("meta", {}).get("tensor") == "scalar/acc")
    assert acc["y"][3] is None  # NaN: a gap, and a marker of its step
    nonfinite = next(t for t in traces if t["name"].startswith("non-finite"))
    assert nonfinite["x"] == [3]


@pytest.mark.parametrize("raw", [True, False])
def test_a_live_jobs_statistics_grow_step_by_step_as_if_read_at_once(tmp_path, raw):
    from tensortap.ui.jobs import Job
    from tensortap.ui.series import stat_series

    out = str(tmp_path / "live")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), reduction_config=tt.ReductionConfig(
        save_raw_tensor=raw, norms=[] if raw else ["l2"], reductions=[] if raw else ["min", "max"]))
    rng = np.random.default_rng(0)

    def steps(n: int) -> None:
        for _ in range(n):
            hook.next_step()
            g = rng.standard_normal(6).astype(np.float32)
            if rng.random() < 0.2:
                g[1] = np.nan
            hook.save_tensor("gradients/fc", g, "gradients")
        hook.next_step()  # the steps so far are complete
        hook.flush()

    steps(30)
    job = Job(0, out)
    first = job.stats("gradients/fc")
    assert len(first["l2"][0]) == 30
    steps(7)
    job.refresh()
    grown = job.stats("gradients/fc")  # the 30 old steps kept, 7 read
    fresh = stat_series(tt.create_trial(out).tensor("gradients/fc"), ("l2", "min", "max", "nonfinite"))
    hook.close()
    assert sorted(grown) == sorted(fresh)
    for k in fresh:
        assert grown[k][0].tolist() == fresh[k][0].tolist() and len(fresh[k][0]) == 37, k
        np.testing.assert_array_equal(grown[k][1], fresh[k][1], err_msg=k)


def test_the_vendored_plotly_bundle_is_the_pinned_one_and_draws_every_trace_type_the_views_use(tmp_path, ui):
    """The page's plotly.js is npm's plotly.js-cartesian-dist-min, vendored: the file is the one its sha256
    pins, its header names the version in its file name, its licence ships next to it, and it registers
    every trace type that a view (or the report) of a job with every kind of data emits."""
    import hashlib
    from importlib import resources

    from tensortap.ui.report import _sections
    from tensortap.ui.server import PLOTLY_BUNDLE, PLOTLY_BUNDLE_SHA256, plotly_js

    static = resources.files("tensortap.ui").joinpath("static")
    data = static.joinpath(PLOTLY_BUNDLE).read_bytes()
    assert hashlib.sha256(data).hexdigest() == PLOTLY_BUNDLE_SHA256
    version = re.fullmatch(r"plotly-cartesian-(\d+\.\d+\.\d+)\.min\.js", PLOTLY_BUNDLE).group(1)
    assert data[:200].decode().splitlines()[1].strip() == f"* plotly.js (cartesian - minified) v{version}"
    assert "MIT License" in static.joinpath("plotly-LICENSE.txt").read_text()
    registered = set(re.findall(r'moduleType:"trace",name:"(\w+)"', plotly_js()))
    ui.write_xgboost_job(str(tmp_path / "xgb"))
    ui.write_scalar_job(str(tmp_path / "dist"), steps=5, workers=2)
    sections = _sections(JobSet([str(tmp_path / "xgb"), str(tmp_path / "dist")]))
    used = {t["type"] for s in sections for b in s["blocks"] if b["type"] == "figure" for t in b["figure"]["data"]}
    assert {"scatter", "heatmap", "bar"} <= used  # the views drew what a test job has
    assert used | {"histogram"} <= registered  # ... and a label histogram (> 50 distinct labels)


def test_nothing_in_trials_imports_the_ui():
    """The layers run storage → format → ... → trials, and the ui sits above trials: no module of
    tensortap/trials imports tensortap.ui (the notebook summary lives in tensortap.trials.summary)."""
    import ast

    root = os.path.join(os.path.dirname(__file__), "..", "..", "tensortap", "trials")
    found = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{name}: {m}" for m in mods if m == "tensortap.ui" or m.startswith("tensortap.ui.")]
    assert found == []
    code = ("import sys, tensortap as tt; t = tt.create_trial(sys.argv[1]); t._repr_html_(); "
            "print(sorted(m for m in sys.modules if m.startswith('tensortap.ui')))")
    out = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug", "pytorch_job")
    got = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, check=True).stdout
    assert got.strip() == "[]"  # a notebook's summary loads no ui module


def test_the_pages_palette_is_the_views_palette():
    """A run's colour is the same in every view: the page's script (job picker, report chips) and the views
    use one palette, Okabe and Ito's colour-blind-safe one."""
    from importlib import resources

    from tensortap.ui.views import PALETTE

    js = resources.files("tensortap.ui").joinpath("static", "app.js").read_text(encoding="utf-8")
    got = re.search(r"var PALETTE = \[([^\]]*)\]", js).group(1)
    assert [s.strip().strip('"') for s in got.split(",")] == list(PALETTE)
    okabe_ito = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442"}
    assert set(PALETTE) <= okabe_ito


def test_keras_layers_pair_weight_and_gradient():
    from tensortap.ui.jobs import layer_of

    assert layer_of("d1/weights/sequential/d1/kernel") == layer_of("gradients/sequential/d1/kernelGrad") == \
        "sequential/d1/kernel"
    assert layer_of("gradient/Net_fc1.weight") == layer_of("Net_fc1.weight") == "Net_fc1.weight"
    assert layer_of("weights/fc") == layer_of("gradients/fc") == "fc"


def test_zero_safe_log_axis_labels_its_rows():
    from tensortap.ui.views import log_ticks, zero_safe_log_axis

    axis, zero_y, nf_y = zero_safe_log_axis([[1e-3, 0.5, None], [2.0]], zeros=True, nonfinite=True)
    assert axis["ticktext"][0] == "0" and axis["ticktext"][-1] == "NaN/inf"
    assert axis["tickvals"][0] == zero_y < 1e-3 and axis["tickvals"][-1] == nf_y > 2.0
    lo, hi = axis["range"]
    assert lo < np.log10(zero_y) < np.log10(1e-3) and np.log10(2.0) < np.log10(nf_y) < hi
    assert len(axis["tickvals"]) <= 6  # at most four decades, and the two rows
    # a panel whose values are all exactly 0: still an axis, with its 0 row
    axis, zero_y, _ = zero_safe_log_axis([[None, None]], zeros=True, nonfinite=False)
    assert axis["ticktext"] == ["0"] and axis["range"][0] < np.log10(zero_y) < axis["range"][1]
    assert log_ticks(1e-6, 1e3)[1] == ["10<sup>-6</sup>", "10<sup>-3</sup>", "1", "10<sup>3</sup>"]
    assert log_ticks(1.02, 1.14) == ([1.02, 1.14], ["1", "1.1"])


def test_heatmap_draws_zero_and_nonfinite_cells_apart_from_the_colour_scale(tmp_path):
    from tensortap.ui.views import render_view

    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for step in range(6):
        hook.next_step()
        g = np.full(4, 0.0 if step < 3 else 0.1, np.float32)
        if step == 4:
            g[1] = np.nan
        hook.save_tensor("gradients/fc", g, "gradients")
    hook.close()
    data = _figures(render_view(JobSet([out]), "heatmap", {}))["heatmap"]["data"]
    main = data[0]
    assert main["z"][0] == [None, None, None, pytest.approx(np.log10(0.2)), None, pytest.approx(np.log10(0.2))]
    zero = next(t for t in data if t.get("meta", {}).get("cells") == "exactly 0")
    bad = next(t for t in data if t.get("meta", {}).get("cells") == "NaN or inf")
    assert zero["z"][0] == [1, 1, 1, None, None, None] and bad["z"][0] == [None, None, None, None, 1, None]
    assert zero["text"][0][:3] == ["0", "0", "0"] and bad["text"][0][4] == "✕"  # not by colour alone
    assert {t["name"] for t in data if t["type"] == "scatter"} == {"exactly 0", "NaN or inf"}  # the legend


def test_statistics_asked_later_are_read_then(tmp_path):
    """The heatmap asks for norms only; the layers view asks for every statistic of the same tensor after:
    it gets them all, equal to reading them at once."""
    from tensortap.ui.jobs import Job
    from tensortap.ui.series import stat_series

    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    rng = np.random.default_rng(3)
    for _ in range(8):
        hook.next_step()
        hook.save_tensor("gradients/fc", rng.standard_normal(5).astype(np.float32), "gradients")
    hook.close()
    job = Job(0, out)
    assert sorted(job.stats("gradients/fc", which=("l2",))) == ["l2"]
    both = job.stats("gradients/fc")
    fresh = stat_series(tt.create_trial(out).tensor("gradients/fc"), ("l2", "min", "max", "nonfinite"))
    assert sorted(both) == sorted(fresh)
    for k in fresh:
        np.testing.assert_array_equal(both[k][1], fresh[k][1], err_msg=k)


def test_many_jobs_curves_share_a_budget_and_the_header_swatches_are_their_legend(tmp_path):
    """Twenty jobs overlaid: each curve a min/max envelope within the figure's budget (a spike kept), no plotly
    legend (the title says the swatches are it), and each job in its colour and dash, as its header swatch draws
    them (jobs 0 and 7 share a colour, never a dash)."""
    from importlib import resources

    from tensortap import modes
    from tensortap.ui import views
    from tensortap.ui.views import render_view

    paths = []
    for j in range(20):
        paths.append(str(tmp_path / f"run{j:02d}"))
        hook = tt.Hook(paths[-1], save_config=tt.SaveConfig(save_interval=1))
        for step in range(1000):
            hook.set_mode(modes.TRAIN)
            hook.next_step()
            hook.save_scalar("loss", 50.0 if step == 500 + j else 1.0 / (step + 1))
            g = np.full(4, 0.0 if step == 300 else (1e3 if step == 700 else 1.0), np.float32)
            hook.save_tensor("gradients/fc", g, "gradients")
        hook.close()
    blocks = render_view(JobSet(paths), "overview", {})
    (f,) = [b["figure"] for b in blocks if b["type"] == "figure"]
    curves = [t for t in f["data"] if (t.get("meta") or {}).get("curve")]
    assert len(curves) == 20 and sum(len(t["x"]) for t in curves) <= views.CURVE_BUDGET
    assert all(len(t["x"]) < 1000 and t["meta"]["downsampled"] for t in curves)
    assert all(dict(zip(t["x"], t["y"], strict=True))[500 + t["meta"]["job"]] == 50.0 for t in curves)
    assert f["layout"]["showlegend"] is False and "20 curves: each job in the colour and dash of its swatch" in \
        f["layout"]["title"]["text"]
    style = {t["meta"]["job"]: (t["line"]["color"], t["line"]["dash"]) for t in curves}
    assert style == {j: (views.job_colour(j), views.job_dash(j)) for j in range(20)}
    assert style[0][0] == style[7][0] and style[0][1] != style[7][1]
    # the layers' panel of 20 series shares a budget of points too; every zero listed, the spike kept, no legend
    (f,) = [b["figure"] for b in render_view(JobSet(paths), "layers", {}) if b["type"] == "figure"
            and b["id"] == "layers-norms"]
    norms = [t for t in f["data"] if "row" not in t["meta"]]
    assert len(norms) == 20 and all(len(t["x"]) <= views.PANEL_POINTS // 20 for t in norms)
    assert all(dict(zip(t["x"], t["y"], strict=True))[700] == pytest.approx(2e3) for t in norms)
    zeros = [t for t in f["data"] if t["meta"].get("row") == "zero"]
    assert len(zeros) == 20 and all(t["x"] == [300] for t in zeros)
    assert f["layout"]["showlegend"] is False and "each job in its swatch's colour" in f["layout"]["title"]["text"]
    # the heatmaps side by side, four a row: each readable, the layers named at the start of each row
    (f,) = [b["figure"] for b in render_view(JobSet(paths), "heatmap", {}) if b["type"] == "figure"]
    grid = f["layout"]["grid"]
    assert (grid["rows"], grid["columns"]) == (5, 4)
    named = [i for i in range(1, 21) if f["layout"]["yaxis" if i == 1 else f"yaxis{i}"]["showticklabels"]]
    assert named == [1, 5, 9, 13, 17]
    js = resources.files("tensortap.ui").joinpath("static", "app.js").read_text(encoding="utf-8")
    got = re.search(r"var DASHES = \[([^\]]*)\]", js).group(1)
    plotly = {"solid": "null", "dash": '"9,9"', "dot": '"3,3"', "dashdot": '"9,3,3,3"', "longdash": '"15,15"',
              "longdashdot": '"15,6,3,6"'}  # plotly's dash patterns at a line width of 3
    assert re.findall(r'null|"[0-9,]+"', got) == [plotly[d] for d in views.DASHES]


def test_every_median_is_drawn_over_every_band(tmp_path):
    """Two jobs' distributions: the bands first, then each job's median line, so that no job's bands hide
    another's median."""
    from tensortap.ui.views import render_view

    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    for p in paths:
        hook = tt.Hook(p, save_config=tt.SaveConfig(save_interval=1),
                       reduction_config=tt.ReductionConfig(save_raw_tensor=True))
        for step in range(5):
            hook.next_step()
            hook.save_tensor("gradients/fc", np.arange(8, dtype=np.float32) * step, "gradients")
        hook.close()
    (f,) = [b["figure"] for b in render_view(JobSet(paths), "distribution", {}) if b["type"] == "figure"]
    kinds = ["median" if t["name"].startswith("median") else "band" for t in f["data"]]
    assert kinds == ["band"] * 12 + ["median"] * 2
    assert [t["meta"]["job"] for t in f["data"][-2:]] == [0, 1]
    values = [np.arange(8, dtype=np.float32) * step for step in range(5)]  # what each job saved
    assert f["data"][-1]["y"] == pytest.approx([float(np.median(v)) for v in values], rel=1e-6)
    low = next(t for t in f["data"] if t["name"] == "5–95 % low · b")
    assert low["y"] == pytest.approx([float(np.quantile(v, 0.05)) for v in values], rel=1e-6)
