"""The dashboard and the report in real headless Chromium: a PyTorch job whose rule fired, a live job, a
hostile tensor name, and the report opened from disk. Screenshots of each view are kept as artefacts
(tests/_artifacts/ui/, or $TENSORTAP_TEST_ARTIFACTS)."""

from __future__ import annotations

import html
import os

import pytest

import tensortap as tt
from tensortap import modes

pytest.importorskip("flask")
pytest.importorskip("plotly")

from tensortap.ui.server import Server  # noqa: E402
from tensortap.ui.views import NONFINITE_COLOUR, PALETTE  # noqa: E402

VIEWS = ("layers", "heatmap", "distribution", "rules")


@pytest.fixture
def hostile_job(tmp_path, ui) -> str:
    out = str(tmp_path / "hostile")
    ui.write_scalar_job(out, steps=40)
    return out


def _figures(page, ui) -> dict[str, dict]:
    return {f["fig"]: f for f in page.js(ui.FIGURES_JS)}


def _trace0(page, fig: str) -> dict:
    """The first trace of figure `fig`, as plotly holds it."""
    return page.page.evaluate("f => document.querySelector('div.figure[data-fig=\"' + f + '\"]').data[0]", fig)


def _open(page, url: str) -> None:
    outside: list[str] = []
    origin = url.split("/", 3)[:3]

    def check(route):
        u = route.request.url
        if not (u.startswith("/".join(origin)) or u.startswith("data:") or u.startswith("file:")):
            outside.append(u)
            return route.abort()
        return route.continue_()

    page.ctx.route("**/*", check)
    page.outside = outside
    page.page.goto(url)
    page.wait("window.ttPaintedAt")


def _show(page, view: str) -> None:
    n = page.js("window.ttRenders")
    page.page.click(f"nav button[data-view={view}]")
    page.wait(f"document.getElementById('view').dataset.view === '{view}' && window.ttRenders > {n}")


def test_dashboard_of_a_pytorch_job_whose_rule_fired(page, pytorch_job, hostile_job, ui):
    trial = tt.create_trial(pytorch_job)
    fired = ui.fired_steps(pytorch_job)
    # the rule fired where the sigmoids saturated: train step ui.SATURATE_AT (or the next saved one)
    saved_train = [s for s in trial.steps(modes.TRAIN) if s >= ui.SATURATE_AT]
    assert fired == [trial.global_step(modes.TRAIN, saved_train[0])] and fired[0] > 0

    server = Server([pytorch_job, hostile_job], port=0).start()
    try:
        _open(page, server.url)
        page.screenshot("dashboard-overview.png")
        figs = _figures(page, ui)
        assert set(figs) == {"scalars-TRAIN", "scalars-EVAL"}
        train = figs["scalars-TRAIN"]["traces"]
        by_name = {html.unescape(t["name"]): t for t in train}  # figure text is sent escaped
        loss = by_name["CrossEntropyLoss_output_0 · pytorch_job"]
        t = trial.tensor("CrossEntropyLoss_output_0")
        assert loss["x"] == [trial.global_step(modes.TRAIN, s) for s in t.steps(modes.TRAIN)]
        assert loss["y"] == pytest.approx([float(v) for v in t.values(modes.TRAIN).values()], rel=1e-6)
        # one curve per (job, scalar), plus the rule's marker
        assert sorted(by_name) == sorted(["CrossEntropyLoss_output_0 · pytorch_job", "loss · hostile",
                                          f"{ui.HOSTILE[:47]}… · hostile",  # a long name is cut in the legend
                                          "rule: vanishing_gradient (pytorch_job)"])
        assert by_name[f"{ui.HOSTILE[:47]}… · hostile"]["meta"]["tensor"] == ui.HOSTILE
        marker = by_name["rule: vanishing_gradient (pytorch_job)"]
        assert marker["x"] == fired and marker["meta"]["rule"] == "vanishing_gradient"
        assert marker["meta"]["run"] == "live"
        assert len(figs["scalars-EVAL"]["traces"]) == 1  # the eval loss of the PyTorch job
        # the hostile name is shown as text, and ran nothing
        assert any(ui.HOSTILE[:47] in s for s in figs["scalars-TRAIN"]["svgText"])
        assert page.js("window.__pwned") is None
        # the rule table: status and the rule's own explanation
        rows = page.js("Array.from(document.querySelectorAll('table.tt[data-table=rules] tr')).map(r => "
                       "Array.from(r.children).map(c => c.textContent))")
        assert rows[0][:3] == ["job", "rule", "status"]
        assert rows[1][:4] == ["pytorch_job", "vanishing_gradient", "IssuesFound", str(fired[0])]
        assert "mean(|gradient|)" in rows[1][4] and "< threshold 1e-07" in rows[1][4]

        grads = trial.tensor_names(collection="gradients")
        weights = trial.tensor_names(collection="weights")

        def jobs_of(fig: dict) -> dict:
            """{job index: number of curves} of a figure (markers of zeros and NaN rows left out)."""
            out: dict = {}
            for t in fig["traces"]:
                m = t["meta"] or {}
                if "job" in m and "row" not in m:
                    out[m["job"]] = out.get(m["job"], 0) + 1
            return out

        # every view overlays both jobs in one figure
        expected_traces = {
            # per layer: L2 norm of weight and gradient, min and max of each; the hostile job's two layers too
            "layers": lambda f: jobs_of(f["layers-norms"]) == {0: len(grads) + len(weights), 1: 4}
            and jobs_of(f["layers-minmax"]) == {0: 2 * (len(grads) + len(weights)), 1: 8},
            "heatmap": lambda f: [t["meta"]["job"] for t in f["heatmap"]["traces"] if t["type"] == "heatmap"]
            == [0, 1],
            "distribution": lambda f: len(f["distribution"]["traces"]) == 7,
            "rules": lambda f: f == {},
        }
        for view in VIEWS:
            _show(page, view)
            page.screenshot(f"dashboard-{view}.png")
            figs = _figures(page, ui)
            assert expected_traces[view]({k: v for k, v in figs.items()}), (view, list(figs))
        # the heatmap's rows are the PyTorch job's gradients; the first layer's norm collapses at the firing step
        _show(page, "heatmap")
        hm = _trace0(page, "heatmap")
        assert hm["meta"]["tensors"][0] == "gradient/Sequential_0.bias"
        assert {t for t in hm["meta"]["tensors"] if t} == set(grads)
        assert len(hm["y"]) == len(grads) + 2  # the rows of both jobs' layers, lined up
        col = hm["x"].index(fired[0])
        assert hm["z"][0][col] < -7 < hm["z"][0][0]
        # a choice redraws the view with another tensor, and a reload keeps view and choice (URL fragment)
        _show(page, "distribution")
        n = page.js("window.ttRenders")
        page.page.select_option("select[data-param=tensor] >> nth=0", "Sequential_2.weight")
        page.wait(f"window.ttRenders > {n}")
        title = "document.querySelector('div.figure').layout.title.text"
        assert page.js(title) == "Distribution of Sequential_2.weight over steps"
        page.page.reload()
        page.wait("window.ttPaintedAt")
        assert page.js("document.getElementById('view').dataset.view") == "distribution"
        assert page.js(title) == "Distribution of Sequential_2.weight over steps"
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_a_live_jobs_new_steps_appear_without_reload(page, tmp_path):
    out = str(tmp_path / "live")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))

    def steps(a: int, b: int) -> None:
        for s in range(a, b):
            hook.set_mode(modes.TRAIN)
            hook.next_step()
            hook.save_scalar("loss", 1.0 / (s + 1))
        hook.next_step()  # step b - 1 is complete once the job has moved past it
        hook.flush()

    steps(0, 5)
    trial = tt.create_trial(out)
    assert trial.steps(modes.TRAIN)[-1] == 4
    server = Server([out], port=0).start()
    try:
        _open(page, server.url)
        last = "Math.max(...document.querySelector('div.figure[data-fig=scalars-TRAIN]').data[0].x)"
        assert page.js(last) == 4
        page.page.evaluate("window.__reloaded = 'no'")
        steps(6, 9)
        page.wait(f"{last} >= 8", timeout=30)
        page.screenshot("dashboard-live.png")
        assert page.js("window.__reloaded") == "no"  # the same page, redrawn in place
        assert page.errors == []
    finally:
        server.stop()
        hook.close()


def test_offline_rule_statuses_show_like_live_ones(page, pytorch_job, tmp_path, ui):
    """`tensortap rules run` writes under rules/<rule>/offline/: the dashboard shows each offline run's status
    beside the live run's, a marker where it fired, and a status that changes without a reload."""
    import shutil
    import subprocess
    import sys

    from tensortap.runner import status as st
    from tensortap.storage import open_storage

    out = str(tmp_path / "job")
    shutil.copytree(pytorch_job, out)
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    proc = subprocess.run([exe, "rules", "run", out, "--rule", "vanishing_gradient", "--rule", "exploding_tensor",
                           "--rule", "dead_relu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1: a rule found an issue
    fired = ui.fired_steps(out)
    assert ui.fired_steps(out, "vanishing_gradient/offline") == fired
    # a run still going and one that failed: written by the rule worker's own status writer (a real offline run
    # on a saved job ends within a second, and no built-in rule fails on demand)
    storage = open_storage(out)
    st.write_status(storage, "weight_update_ratio", True, rule="weight_update_ratio", status=st.IN_PROGRESS,
                    last_step=10, message="")
    st.write_status(storage, "unchanged_tensor", True, rule="unchanged_tensor", status=st.ERROR,
                    message="ValueError: <b>bad</b>", traceback="Traceback ...")
    rows_js = ("Array.from(document.querySelectorAll('table.tt[data-table=rules] tr')).slice(1).map(r => "
               "[...r.children].map(c => c.textContent))")
    server = Server([out], port=0).start()
    try:
        _open(page, server.url)
        page.screenshot("dashboard-offline-rules.png")
        head = page.js("[...document.querySelectorAll('table.tt[data-table=rules] th')].map(c => c.textContent)")
        assert head[:3] == ["rule", "run", "status"]  # one job: no job column
        rows = {(r[0], r[1]): r for r in page.js(rows_js)}
        assert {k: r[2] for k, r in rows.items()} == {
            ("vanishing_gradient", "live"): "IssuesFound", ("vanishing_gradient", "offline"): "IssuesFound",
            ("exploding_tensor", "offline"): "NoIssuesFound", ("dead_relu", "offline"): "no data",
            ("weight_update_ratio", "offline"): "InProgress", ("unchanged_tensor", "offline"): "Error"}
        assert rows[("vanishing_gradient", "offline")][3] == str(fired[0])
        assert "matched no tensor" in rows[("dead_relu", "offline")][4]  # the rule's own explanation
        assert rows[("unchanged_tensor", "offline")][4] == "ValueError: <b>bad</b>"  # shown as text
        classes = page.js("[...document.querySelectorAll('td.status')].map(c => c.className)")
        assert {"status status-NoData", "status status-Error", "status status-InProgress"} <= set(classes)
        markers = {t["name"]: t for t in _figures(page, ui)["scalars-TRAIN"]["traces"] if t["name"].startswith("rule:")}
        assert set(markers) == {"rule: vanishing_gradient", "rule: vanishing_gradient [offline]"}
        assert markers["rule: vanishing_gradient [offline]"]["x"] == fired
        assert markers["rule: vanishing_gradient [offline]"]["meta"]["rule"] == "vanishing_gradient"
        assert markers["rule: vanishing_gradient [offline]"]["meta"]["run"] == "offline"
        # the run in progress finds an issue: its row and a marker appear without a reload
        page.page.evaluate("window.__reloaded = 'no'")
        st.write_status(storage, "weight_update_ratio", True, rule="weight_update_ratio", status=st.ISSUES_FOUND,
                        first_step=fired[0], last_step=fired[0], message="weight_update_ratio fired")
        page.wait("[...document.querySelector('div.figure[data-fig=scalars-TRAIN]').data]"
                  ".some(t => t.name === 'rule: weight_update_ratio [offline]')", timeout=60)
        assert {(r[0], r[1]): r[2] for r in page.js(rows_js)}[("weight_update_ratio", "offline")] == "IssuesFound"
        assert page.js("window.__reloaded") == "no"
        assert page.errors == [] and page.outside == []
    finally:
        server.stop()


def test_report_opened_from_disk_renders_the_same(page, pytorch_job, hostile_job, tmp_path, ui):
    from tensortap.ui.report import write_report

    report = str(tmp_path / "report.html")
    size = write_report([pytorch_job, hostile_job], report)
    assert size < 1_500_000  # plotly.js is 0.66 MB of it, compressed
    with open(report, encoding="utf-8") as f:
        text = f.read()
    assert "<script src" not in text and "<link rel=\"stylesheet\"" not in text
    _open(page, "file://" + report)
    page.screenshot("report.png")
    for view in ("diagnosis", "rules", "overview", "heatmap", "layers", "distribution"):
        page.page.locator(f"section[data-view={view}]").screenshot(
            path=os.path.join(ui.artifacts_dir(), f"report-section-{view}.png"))
    sections = page.js("Array.from(document.querySelectorAll('section')).map(s => s.dataset.view)")
    assert sections[:3] == ["diagnosis", "rules", "overview"]  # the diagnosis on top, then the rule summary
    figs = page.js(ui.FIGURES_JS)
    train = next(f for f in figs if f["fig"] == "scalars-TRAIN")
    by_name = {html.unescape(t["name"]): t for t in train["traces"]}
    assert by_name["rule: vanishing_gradient (pytorch_job)"]["x"] == ui.fired_steps(pytorch_job)
    assert any(ui.HOSTILE[:47] in s for s in train["svgText"]) and page.js("window.__pwned") is None

    # the same curves as the dashboard draws
    server = Server([pytorch_job, hostile_job], port=0).start()
    try:
        live = type(page)(page.page.context.browser)
        try:
            _open(live, server.url)
            live_train = next(f for f in live.js(ui.FIGURES_JS) if f["fig"] == "scalars-TRAIN")
            assert [(t["name"], t["x"], t["y"]) for t in live_train["traces"]] == \
                   [(t["name"], t["x"], t["y"]) for t in train["traces"]]
        finally:
            live.close()
    finally:
        server.stop()
    kinds = {f["fig"] for f in figs}
    assert {"heatmap", "layers-norms", "layers-minmax", "distribution-0"} <= kinds
    assert page.errors == [] and page.outside == []


def test_report_shows_xgboost_and_workers_views(page, tmp_path, ui):
    from tensortap.ui.report import write_report

    xgb = str(tmp_path / "xgb")
    ui.write_xgboost_job(xgb)
    dist = str(tmp_path / "two_workers")
    ui.write_scalar_job(dist, steps=20, hostile=False, workers=3)  # worker_2 diverges
    report = str(tmp_path / "report.html")
    write_report([xgb, dist], report)
    _open(page, "file://" + report)
    page.screenshot("report-xgboost-workers.png")
    for view in ("workers", "xgboost"):
        page.page.locator(f"section[data-view={view}]").screenshot(
            path=os.path.join(ui.artifacts_dir(), f"report-section-{view}.png"))
    figs = {f["fig"]: f for f in page.js(ui.FIGURES_JS)}
    assert {"xgb-metrics", "xgb-fi", "xgb-labels", "xgb-confusion", "xgb-shap", "workers-1",
            "workers-dev-1"} <= set(figs)
    assert len(figs["xgb-metrics"]["traces"]) == 2 and len(figs["xgb-fi"]["traces"][0]["y"]) == 3
    conf = _trace0(page, "xgb-confusion")["z"]
    assert sum(map(sum, conf)) == 90
    dev = _trace0(page, "workers-dev-1")
    assert dev["x"] == ["worker_0", "worker_1", "worker_2"]
    assert dev["y"] == pytest.approx([0, 0, 4])  # |5/(s+1) - 1/(s+1)| / (1/(s+1))
    # the diverging rank stands out: another colour, a hatch and a label
    assert dev["marker"]["color"] == [PALETTE[0], PALETTE[0], NONFINITE_COLOUR]
    assert dev["marker"]["pattern"]["shape"] == ["", "", "/"] and dev["text"] == ["", "", "diverges"]
    assert len(figs["workers-1"]["traces"]) == 3
    assert page.errors == []


def test_dashboard_serves_only_the_jobs_it_was_given(tmp_path, ui):
    import urllib.error
    import urllib.request

    out = str(tmp_path / "job")
    ui.write_scalar_job(out, steps=5, hostile=False)
    server = Server([out], port=0).start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        for bad in ("job=1", "job=..%2F..%2Fetc", "job=%2Ftmp", "job=-1"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(server.url + "api/view/overview?" + bad)
            assert e.value.code == 400 and b"allowed are 0..0" in e.value.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + "static/..%2F..%2Fserver.py")
        assert e.value.code == 404
        ok = urllib.request.urlopen(server.url + "api/view/overview?job=0")
        assert ok.headers["Content-Security-Policy"].startswith("default-src 'self'")
    finally:
        server.stop()


def test_the_report_command_writes_one_file(tmp_path, capsys, ui):
    from tensortap.cli.main import main

    out = str(tmp_path / "job")
    ui.write_scalar_job(out, steps=5, hostile=False)
    assert main(["report", out, "-o", str(tmp_path / "r.html")]) == 0
    import base64
    import gzip
    import re

    from tensortap.ui.server import plotly_js

    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    packed = re.search(r'<script type="application/gzip-base64" id="tt-plotly">([^<]*)</script>', text)
    assert gzip.decompress(base64.b64decode(packed.group(1))).decode("utf-8") == plotly_js()  # inlined, whole
    assert "<script src=" not in text and "https://" not in text  # nothing fetched
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2
    assert "missing: no such directory" in capsys.readouterr().err
    # the report needs neither flask nor the plotly package (an import of either fails in this process)
    import subprocess
    import sys

    code = ("import sys; sys.modules['flask'] = sys.modules['plotly'] = None; from tensortap.cli.main import main; "
            f"sys.exit(main(['report', {out!r}, '-o', {str(tmp_path / 'bare.html')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert packed.group(0) in (tmp_path / "bare.html").read_text(encoding="utf-8")  # the same plotly.js


def test_ui_command_prints_its_url_and_serves(tmp_path, ui):
    import subprocess
    import sys
    import urllib.request

    out = str(tmp_path / "job")
    ui.write_scalar_job(out, steps=5, hostile=False)
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    proc = subprocess.Popen([exe, "ui", out, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        body = urllib.request.urlopen(url + "api/jobs", timeout=30).read()
        assert b'"name":"job"' in body
        port = int(url.rsplit(":", 1)[1].strip("/"))
        busy = subprocess.run([exe, "ui", out, "--port", str(port)], capture_output=True, text=True, timeout=60)
        assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # another address only on request, with a warning (127.0.0.2: still loopback, but not the default)
    proc = subprocess.Popen([exe, "ui", out, "--port", "0", "--host", "127.0.0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "http://127.0.0.2:" in proc.stdout.readline()
        assert "warning: listening on 127.0.0.2" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
