"""Dashboard speed and report size (issues #25, #42).

Writes a job of STEPS steps × 100 tensors with the generic hook (a loss and an accuracy every step,
49 weights and 49 gradients of 16 float32 each, raw, every step: 1,000,000 saved values at 10,000 steps),
starts `tensortap ui` on it in its own process, and opens the page in headless Chromium (Debian's, driven
by Playwright) ROUNDS times: the first complete paint is the page's performance.now() when every figure
of the first view is drawn (0 = navigation start). Also the paint of the layers and heatmap tabs, the
server's resident memory, and the size of `tensortap report` for a 1,000-step job of the same shape.

    .venv/bin/python bench/ui_paint.py [--steps 10000] [--rounds 5]
    .venv/bin/python bench/ui_paint.py --scale [--big-steps 1000000] [--big-tensors 1000] [--jobs 50]

`--scale` (issue #42) instead measures a synthetic job of BIG_STEPS steps (a loss and an accuracy saved at
every step) and BIG_TENSORS tensors (half weights, half gradients; their L2 norm, min and max saved at every
BIG_EVERY-th step: the tensor list is BIG_TENSORS long, the steps span BIG_STEPS), and JOBS jobs side by side
(each 10,000 steps of a loss and 10 layers): cold first paint, each tab, a search of the layers, and a zoom
that re-reads 1 % of the steps at full resolution.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import tensortap as tt
from tensortap import modes

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "_out", "ui")
CHROMIUM = "/usr/bin/chromium"


def write_job(out: str, steps: int, layers: int = 49) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["weights", "gradients", "losses", "metrics"],
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((layers, 16)).astype(np.float32)
    for step in range(steps):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        g = rng.standard_normal((layers, 16)).astype(np.float32) * np.float32(0.999 ** step)
        if step == steps // 2:
            g[3] *= 1e4  # one exploding step: the envelope must keep it
        w -= 0.01 * g
        hook.save_tensor("loss", np.float32(1.0 / (1 + step / 100) + 0.01 * rng.random()), "losses")
        hook.save_tensor("accuracy", np.float32(1 - 1.0 / (1 + step / 100)), "metrics")
        for i in range(layers):
            hook.save_tensor(f"weights/layer{i}", w[i], "weights")
            hook.save_tensor(f"gradients/layer{i}", g[i], "gradients")
    hook.close()
    return time.perf_counter() - t0


def plotly_only_page(full: bool = False) -> tuple[str, object]:
    """A page that loads plotly.js (the dashboard's bundle, served the same way; `full`: the plotly
    package's full bundle instead) and nothing else: the floor of any page drawn with it. Returns (url, stop)."""
    import http.server
    import threading

    if full:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs().encode()
    else:
        from tensortap.ui.server import plotly_js

        js = plotly_js().encode()
    html = (b"<!doctype html><html><head><script src='/plotly.min.js'></script></head><body>"
            b"<script>window.ttLoadedAt = performance.now()</script></body></html>")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body, kind = (js, "application/javascript") if self.path.endswith(".js") else (html, "text/html")
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the page was closed before its favicon or script arrived

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_port}/", lambda: (srv.shutdown(), srv.server_close())


#: where a cold load's time went: when plotly.js arrived and had run, the first view's JSON was parsed,
#: its figures drawn (ms since navigation start), and how many figures and points were drawn
MARKS_JS = """() => {
  const m = {};
  for (const e of performance.getEntriesByType('mark')) m[e.name] = e.startTime;
  for (const e of performance.getEntriesByType('resource')) {
    if (e.name.includes('/static/plotly')) m['plotly-fetched'] = e.responseEnd;
    if (e.name.includes('/api/view/')) { m['view-fetched'] = e.responseEnd; m['view-kb'] = e.encodedBodySize / 1024; }
  }
  const nav = performance.getEntriesByType('navigation')[0];
  m['dom-content-loaded'] = nav.domContentLoadedEventStart;
  const figs = document.querySelectorAll('div.figure');
  m['figures'] = figs.length;
  m['points'] = [...figs].reduce((a, f) => a + (f.data || []).reduce((b, t) => b + (t.x ? t.x.length : 0), 0), 0);
  return m;
}"""


def rss_kb(pid: int) -> tuple[int, int]:
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1])
    return vals["VmRSS"], vals["VmHWM"]


def wait(page, expr: str, timeout: float = 60) -> object:
    end = time.monotonic() + timeout
    while True:
        v = page.evaluate(expr)
        if v:
            return v
        if time.monotonic() > end:
            raise TimeoutError(expr)
        time.sleep(0.01)


def measure(out: str, rounds: int) -> dict:
    from playwright.sync_api import sync_playwright

    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    t0 = time.perf_counter()
    proc = subprocess.Popen([exe, "ui", out, "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    start_s = time.perf_counter() - t0
    url = line.split(" at ", 1)[1].split()[0]
    res = {"server_start_s": start_s, "rss_start_mb": rss_kb(proc.pid)[0] / 1024, "paint_ms": [], "tabs": {},
           "marks": []}
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                  "--disable-background-networking"])
            floor_url, floor_stop = plotly_only_page()
            full_url, full_stop = plotly_only_page(full=True)
            res["floor_ms"], res["full_ms"] = [], []
            for _ in range(rounds):  # cold: a fresh browser profile each time (plotly.js not cached)
                for target, key, flag in ((url, "paint_ms", "window.ttPaintedAt"),
                                          (floor_url, "floor_ms", "window.ttLoadedAt"),
                                          (full_url, "full_ms", "window.ttLoadedAt")):
                    ctx = b.new_context(viewport={"width": 1280, "height": 900})
                    page = ctx.new_page()
                    page.goto(target)
                    res[key].append(wait(page, flag))
                    if key == "paint_ms":
                        res["marks"].append(page.evaluate(MARKS_JS))
                    ctx.close()
            floor_stop()
            full_stop()
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            res["warm_ms"] = []
            for _ in range(rounds):  # warm: the same profile reloads (plotly.js cached and compiled)
                page.goto(url)
                res["warm_ms"].append(wait(page, "window.ttPaintedAt"))
            for tab in ("layers", "heatmap", "distribution"):
                n = page.evaluate("window.ttRenders")
                t = time.perf_counter()
                page.click(f"nav button[data-view={tab}]")
                wait(page, f"window.ttRenders > {n}")
                total = (time.perf_counter() - t) * 1000
                # the view's request: from sent to its last byte (the server reading the job), and its size
                req, kb = page.evaluate(
                    "v => { const e = performance.getEntriesByType('resource').filter(e => "
                    "e.name.includes('/api/view/' + v)).pop(); return [e.responseEnd - e.startTime, "
                    "e.encodedBodySize / 1024]; }", tab)
                res["tabs"][tab] = (total, req, kb)
            res["json_kb"] = page.evaluate(
                "performance.getEntriesByType('resource').filter(e => e.name.includes('/api/view/overview'))"
                ".map(e => e.encodedBodySize / 1024)")
            ctx.close()
            b.close()
        res["rss_end_mb"], res["hwm_mb"] = (x / 1024 for x in rss_kb(proc.pid))
    finally:
        proc.terminate()
        proc.wait()
    return res


def live_latency(rounds: int) -> list[float]:
    """Seconds from a live job's flush of a new step to the open page drawing it (no reload)."""
    from playwright.sync_api import sync_playwright

    from tensortap.ui.server import Server

    out = os.path.join(OUT, "live")
    shutil.rmtree(out, ignore_errors=True)
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    step = [0]

    def one_step() -> None:
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        hook.save_scalar("loss", 1.0 / (step[0] + 1))
        step[0] += 1

    for _ in range(5):
        one_step()
    hook.next_step()  # the last step is complete once the job moved past it
    hook.flush()
    server = Server([out], port=0).start()
    lat = []
    last = "Math.max(...document.querySelector('div.figure').data[0].x)"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = b.new_page()
            page.goto(server.url)
            wait(page, "window.ttPaintedAt")
            for _ in range(rounds):
                want = page.evaluate(last) + 2
                one_step()
                hook.next_step()
                hook.flush()
                t = time.perf_counter()
                wait(page, f"{last} >= {want}")
                lat.append(time.perf_counter() - t)
                time.sleep(0.3)
            b.close()
    finally:
        server.stop()
        hook.close()
    return lat


def write_big_job(out: str, steps: int, tensors: int, every: int) -> float:
    """A loss and an accuracy at every step; `tensors` tensors' L2 norm, min and max at every `every`-th."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
                   reduction_config=tt.ReductionConfig(norms=["l2"], reductions=["min", "max"],
                                                       save_raw_tensor=False))
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(steps).astype(np.float32)
    layers = tensors // 2
    for step in range(steps):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        loss = 2.0 / (1 + step / 10_000) + 0.05 * float(noise[step])
        if step == steps // 3:
            loss = 100.0  # one spike: every zoom level must show it
        hook.save_scalar("loss", loss)
        hook.save_scalar("accuracy", 1 - 1 / (1 + step / 10_000))
        if step % every == 0:
            g = rng.standard_normal((layers, 16)).astype(np.float32)
            for i in range(layers):
                hook.save_tensor(f"weights/block{i}/dense", g[i] + 1, "weights")
                hook.save_tensor(f"gradients/block{i}/dense", g[i] * 1e-3, "gradients")
    hook.close()
    return time.perf_counter() - t0


def write_many_jobs(root: str, n: int, steps: int = 10_000, layers: int = 10) -> float:
    """`n` jobs: a loss at every step, `layers` weights and gradients (16 floats, raw) at every 100th."""
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    for j in range(n):
        hook = tt.Hook(os.path.join(root, f"run{j:02d}"), save_config=tt.SaveConfig(save_interval=1),
                       include_collections=["weights", "gradients"],
                       reduction_config=tt.ReductionConfig(save_raw_tensor=True))
        rng = np.random.default_rng(j)
        for step in range(steps):
            hook.set_mode(modes.TRAIN)
            hook.next_step()
            hook.save_scalar("loss", (1 + j / n) / (1 + step / 1000) + 0.02 * rng.random())
            if step % 100 == 0:
                g = rng.standard_normal((layers, 16)).astype(np.float32)
                for i in range(layers):
                    hook.save_tensor(f"weights/layer{i}", g[i] + 1, "weights")
                    hook.save_tensor(f"gradients/layer{i}", g[i] * 0.1, "gradients")
        hook.close()
    return time.perf_counter() - t0


def measure_scale(paths: list[str], rounds: int, zoom: bool) -> dict:
    """Cold first paints of the overview, then each tab, a search of the layers and (zoom) a zoom to 1 % of
    the steps, for a dashboard of `paths` started in its own process."""
    from playwright.sync_api import sync_playwright

    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    t0 = time.perf_counter()
    proc = subprocess.Popen([exe, "ui", *paths, "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    res: dict = {"server_start_s": time.perf_counter() - t0, "paint_ms": [], "tabs": {}, "marks": []}
    url = line.split(" at ", 1)[1].split()[0]
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                  "--disable-background-networking"])
            floor_url, floor_stop = plotly_only_page()
            res["floor_ms"] = []
            for _ in range(rounds):  # cold loads, alternated with a page that loads plotly.js alone
                for target, key in ((url, "paint_ms"), (floor_url, "floor_ms")):
                    ctx = b.new_context(viewport={"width": 1280, "height": 900})
                    page = ctx.new_page()
                    page.goto(target)
                    res[key].append(wait(page, "window.ttPaintedAt" if key == "paint_ms" else "window.ttLoadedAt",
                                         timeout=300))
                    if key == "paint_ms":
                        res["marks"].append(page.evaluate(MARKS_JS))
                    ctx.close()
            floor_stop()
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            res["warm_ms"] = []
            for _ in range(rounds + 1):  # warm: the same profile reloads (plotly.js cached and compiled)
                page.goto(url)
                res["warm_ms"].append(wait(page, "window.ttPaintedAt", timeout=300))
            res["warm_ms"] = res["warm_ms"][1:]  # the first load of this profile is a cold one
            if zoom:
                res["zoom_ms"] = []
                for k in range(rounds):
                    n = page.evaluate("window.ttZooms || 0")
                    lo = 100_000 + k * 50_000
                    t = time.perf_counter()
                    page.evaluate("r => Plotly.relayout(document.querySelector('div.figure[data-fig=scalars-TRAIN]'), "
                                  "{'xaxis.range': r})", [lo, lo + 9_999])
                    wait(page, f"(window.ttZooms || 0) > {n}", timeout=120)
                    res["zoom_ms"].append((time.perf_counter() - t) * 1000)
                res["zoom_points"] = page.evaluate(
                    "(() => { const t = document.querySelector('div.figure[data-fig=scalars-TRAIN]').data"
                    ".find(t => t.meta && t.meta.curve && t.meta.tensor.includes('loss')); "
                    "return [t.x.length, t.meta.n_inside, "
                    "Math.max(...t.y.filter(v => v !== null))]; })()")
            for tab in ("layers", "heatmap", "distribution"):
                n = page.evaluate("window.ttRenders")
                t = time.perf_counter()
                page.click(f"nav button[data-view={tab}]")
                wait(page, f"window.ttRenders > {n}", timeout=300)
                total = (time.perf_counter() - t) * 1000
                req, kb = page.evaluate(
                    "v => { const e = performance.getEntriesByType('resource').filter(e => "
                    "e.name.includes('/api/view/' + v)).pop(); return [e.responseEnd - e.startTime, "
                    "e.encodedBodySize / 1024]; }", tab)
                res["tabs"][tab] = (total, req, kb)
                if tab == "layers" and zoom:
                    n = page.evaluate("window.ttRenders")
                    t = time.perf_counter()
                    page.fill("input[data-param=find]", "block77" if zoom else "layer7")
                    page.keyboard.press("Enter")
                    wait(page, f"window.ttRenders > {n}", timeout=300)
                    res["search_ms"] = (time.perf_counter() - t) * 1000
                if tab == "distribution":
                    t = time.perf_counter()
                    page.fill("input[data-search=tensor]", "block4")
                    res["filter_ms"] = (time.perf_counter() - t) * 1000
                    res["options"] = page.evaluate("document.querySelectorAll('select[data-param=tensor] option')"
                                                   ".length")
            ctx.close()
            b.close()
        res["rss_end_mb"], res["hwm_mb"] = (x / 1024 for x in rss_kb(proc.pid))
    finally:
        proc.terminate()
        proc.wait()
    return res


TIMELINE = ["plotly-fetched", "tt-plotly-ready", "dom-content-loaded", "view-fetched", "tt-view-data", "tt-painted"]


def timeline(marks: list[dict]) -> str:
    """Median of each performance mark of the cold loads (MARKS_JS)."""
    return ", ".join(f"{k} {statistics.median([m[k] for m in marks if k in m]):.0f}" for k in TIMELINE
                     if any(k in m for m in marks))


def load_text() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def report_scale(name: str, res: dict) -> None:
    pm = res["paint_ms"]
    m = res["marks"][-1]
    wm = res["warm_ms"]
    print(f"{name}: server start {res['server_start_s']:.1f} s; first complete paint, cold, {len(pm)} loads: median "
          f"{statistics.median(pm):.0f} ms (min {min(pm):.0f}, max {max(pm):.0f})  {[round(x) for x in pm]}; "
          f"{m['figures']} figures, {m['points']} points, view JSON {m.get('view-kb', 0):.0f} KB; plotly.js alone "
          f"(alternated) median {statistics.median(res['floor_ms']):.0f} ms (dashboard - plotly.js alone, median of "
          f"pairs {statistics.median([a - b for a, b in zip(pm, res['floor_ms'], strict=True)]):+.0f} ms); "
          "warm reloads median "
          f"{statistics.median(wm):.0f} ms (max {max(wm):.0f})  {[round(x) for x in wm]}")
    print("  cold load timeline, median ms since navigation start: " + timeline(res["marks"]))
    if "zoom_ms" in res:
        z = res["zoom_ms"]
        print(f"  zoom to 10,000 steps: re-read and drawn in median {statistics.median(z):.0f} ms (max {max(z):.0f}); "
              f"points drawn / saved steps in the window / highest value drawn: {res['zoom_points']}")
    print("  tabs, click to drawn (the view's request; JSON): " + ", ".join(
        f"{k} {t:.0f} ms ({r:.0f} ms; {kb:.0f} KB)" for k, (t, r, kb) in res["tabs"].items()))
    search = f"layer search to drawn {res['search_ms']:.0f} ms; " if "search_ms" in res else ""
    print(f"  {search}tensor list of {res['options']} filtered in "
          f"{res['filter_ms']:.0f} ms; server RSS after {res['rss_end_mb']:.0f} MB (peak {res['hwm_mb']:.0f} MB); "
          f"load average {os.getloadavg()[0]:.1f}")


VIEWS_TIME = """
import json, sys, time
from tensortap.ui.jobs import JobSet
from tensortap.ui.server import to_json
from tensortap.ui.views import render_view
t0, c0 = time.perf_counter(), time.process_time()
js = JobSet(sys.argv[1:])
for j in js.jobs:
    j.warm()
out = {"start": (round(time.perf_counter() - t0, 2), round(time.process_time() - c0, 2))}
for v in ("overview", "layers", "heatmap", "distribution"):
    t, c = time.perf_counter(), time.process_time()
    n = len(to_json({"blocks": render_view(js, v, {})}))
    out[v] = (round(time.perf_counter() - t, 2), round(time.process_time() - c, 2), n // 1024)
print(json.dumps(out))
"""


def server_views(paths: list[str], old: str | None) -> None:
    """The server's work per view (render_view after Job.warm, as the dashboard runs it), in one process: wall s,
    CPU s, JSON KB; `old`: also that of the tensortap checkout at OLD, alternated."""
    here = os.path.dirname(HERE)
    for name, root in (("this", here), ("old", old)) if old else (("this", here),):
        env = {**os.environ, "PYTHONPATH": root}
        got = subprocess.run([sys.executable, "-c", VIEWS_TIME, *paths], capture_output=True, text=True, env=env,
                             cwd="/", check=True).stdout.strip()
        print(f"  server views ({name}): {got}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", action="store_true", help="the large-job and many-jobs cases (issue #42)")
    ap.add_argument("--big-steps", type=int, default=1_000_000)
    ap.add_argument("--big-tensors", type=int, default=1000)
    ap.add_argument("--big-every", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--case", choices=("big", "many", "both"), default="both",
                    help="--scale: the large job (A), the many jobs (B), or both")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--report-steps", type=int, default=1000)
    ap.add_argument("--reuse", action="store_true", help="keep jobs written by an earlier run")
    ap.add_argument("--server-only", action="store_true",
                    help="--scale: only the server's work per view (no browser), of this checkout and --old")
    ap.add_argument("--old", help="--server-only: a tensortap checkout to compare with")
    args = ap.parse_args()
    if args.scale and args.server_only:
        big = os.path.join(OUT, f"big_{args.big_steps}x{args.big_tensors}")
        many = os.path.join(OUT, f"many_{args.jobs}")
        if args.case != "many":
            print(f"A ({load_text()}):")
            server_views([big], args.old)
        if args.case != "big":
            print(f"B ({load_text()}):")
            server_views(sorted(os.path.join(many, d) for d in os.listdir(many)), args.old)
        return
    if args.scale:
        big = os.path.join(OUT, f"big_{args.big_steps}x{args.big_tensors}")
        if args.case != "many":
            if not (args.reuse and os.path.isdir(big)):
                print(f"writing {args.big_steps} steps x {args.big_tensors} tensors ...", flush=True)
                print(f"  written in {write_big_job(big, args.big_steps, args.big_tensors, args.big_every):.0f} s",
                      flush=True)
            report_scale(f"{args.big_steps:,} steps x {args.big_tensors:,} tensors ({load_text()})",
                         measure_scale([big], args.rounds, zoom=True))
        if args.case == "big":
            return
        many = os.path.join(OUT, f"many_{args.jobs}")
        if not (args.reuse and os.path.isdir(many)):
            print(f"writing {args.jobs} jobs ...", flush=True)
            print(f"  written in {write_many_jobs(many, args.jobs):.0f} s", flush=True)
        paths = sorted(os.path.join(many, d) for d in os.listdir(many))
        report_scale(f"{len(paths)} jobs side by side ({load_text()})", measure_scale(paths, args.rounds, zoom=False))
        return
    job = os.path.join(OUT, f"job_{args.steps}")
    print(f"writing {args.steps} steps x 100 tensors ...", flush=True)
    if not (args.reuse and os.path.isdir(job)):
        print(f"  written in {write_job(job, args.steps):.1f} s", flush=True)
    res = measure(job, args.rounds)
    pm = res["paint_ms"]
    print(f"server start (opens the trial) {res['server_start_s']:.2f} s, RSS {res['rss_start_mb']:.0f} MB")
    wm, fm = res["warm_ms"], res["floor_ms"]
    print(f"first complete paint (overview), {len(pm)} cold page loads (fresh profile): median "
          f"{statistics.median(pm):.0f} ms, min {min(pm):.0f}, max {max(pm):.0f} ms  {[round(x) for x in pm]}")
    print(f"  plotly.js alone (alternated with the above, same conditions): median {statistics.median(fm):.0f} ms  "
          f"{[round(x) for x in fm]}; dashboard - plotly.js alone, median of pairs: "
          f"{statistics.median([a - b for a, b in zip(pm, fm, strict=True)]):+.0f} ms")
    fl = res["full_ms"]
    print(f"  the plotly package's full plotly.js alone (alternated too): median {statistics.median(fl):.0f} ms  "
          f"{[round(x) for x in fl]}")
    print("  cold load timeline, median ms since navigation start: " + timeline(res["marks"]) +
          f"; {res['marks'][-1]['figures']} figures, "
        f"{res['marks'][-1]['points']} points drawn, view JSON {res['marks'][-1].get('view-kb', 0):.0f} KB")
    print(f"  warm reloads (same profile): median {statistics.median(wm):.0f} ms, max {max(wm):.0f} ms; "
          f"overview JSON {res['json_kb'][-1]:.0f} KB")
    print(f"  load average during the run: {os.getloadavg()[0]:.1f}")
    print("tab switches, click to drawn (of which the view's request; its JSON): " + ", ".join(
        f"{k} {t:.0f} ms ({r:.0f} ms; {kb:.0f} KB)" for k, (t, r, kb) in res["tabs"].items()))
    print(f"server RSS after: {res['rss_end_mb']:.0f} MB (peak {res['hwm_mb']:.0f} MB)")

    lat = live_latency(args.rounds)
    print(f"live job: a new step drawn {statistics.median(lat):.2f} s (median), {max(lat):.2f} s (max) after "
          f"its flush, {len(lat)} steps, no reload")

    from tensortap.ui.report import write_report

    rjob = os.path.join(OUT, f"job_{args.report_steps}")
    if not (args.reuse and os.path.isdir(rjob)):
        write_job(rjob, args.report_steps)
    t = time.perf_counter()
    size = write_report([rjob], os.path.join(OUT, "report.html"))
    print(f"report of a {args.report_steps}-step job x 100 tensors: {size / 1e6:.2f} MB "
          f"(written in {time.perf_counter() - t:.1f} s)")
    paint, first, figures = report_paint(os.path.join(OUT, "report.html"), args.rounds)
    print(f"  opened from disk, cold (medians of {len(paint)}): its first figure drawn after "
          f"{statistics.median(first):.0f} ms, all {figures} after {statistics.median(paint):.0f} ms "
          f"(max {max(paint):.0f})")


def report_paint(path: str, rounds: int) -> tuple[list[float], list[float], int]:
    """ms from navigation start to every figure of the report drawn, and to its first, per cold load; and
    how many figures."""
    from playwright.sync_api import sync_playwright

    out, first = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        for _ in range(rounds):
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            page.goto("file://" + path)
            out.append(wait(page, "window.ttPaintedAt"))
            first.append(page.evaluate("window.ttFirstFigureAt"))
            figures = page.evaluate("document.querySelectorAll('div.figure').length")
            ctx.close()
        b.close()
    return out, first, figures


if __name__ == "__main__":
    main()
