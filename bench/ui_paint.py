"""Dashboard speed and report size (issue #25).

Writes a job of STEPS steps × 100 tensors with the generic hook (a loss and an accuracy every step,
49 weights and 49 gradients of 16 float32 each, raw, every step: 1,000,000 saved values at 10,000 steps),
starts `tensortap ui` on it in its own process, and opens the page in headless Chromium (Debian's, driven
by Playwright) ROUNDS times: the first complete paint is the page's performance.now() when every figure
of the first view is drawn (0 = navigation start). Also the paint of the layers and heatmap tabs, the
server's resident memory, and the size of `tensortap report` for a 1,000-step job of the same shape.

    .venv/bin/python bench/ui_paint.py [--steps 10000] [--rounds 5]
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
    res = {"server_start_s": start_s, "rss_start_mb": rss_kb(proc.pid)[0] / 1024, "paint_ms": [], "tabs": {}}
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                  "--disable-background-networking"])
            for r in range(rounds):
                ctx = b.new_context(viewport={"width": 1280, "height": 900})
                page = ctx.new_page()
                page.goto(url)
                res["paint_ms"].append(wait(page, "window.ttPaintedAt"))
                if r == rounds - 1:
                    for tab in ("layers", "heatmap", "distribution"):
                        n = page.evaluate("window.ttRenders")
                        t = time.perf_counter()
                        page.click(f"nav button[data-view={tab}]")
                        wait(page, f"window.ttRenders > {n}")
                        res["tabs"][tab] = (time.perf_counter() - t) * 1000
                    res["points"] = page.evaluate(
                        "Array.from(document.querySelectorAll('div.figure')).map(d => d.data.length)")
                ctx.close()
            b.close()
        res["rss_end_mb"], res["hwm_mb"] = (x / 1024 for x in rss_kb(proc.pid))
    finally:
        proc.terminate()
        proc.wait()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--report-steps", type=int, default=1000)
    args = ap.parse_args()
    job = os.path.join(OUT, f"job_{args.steps}")
    print(f"writing {args.steps} steps x 100 tensors ...", flush=True)
    print(f"  written in {write_job(job, args.steps):.1f} s", flush=True)
    res = measure(job, args.rounds)
    pm = res["paint_ms"]
    print(f"server start (opens the trial) {res['server_start_s']:.2f} s, RSS {res['rss_start_mb']:.0f} MB")
    print(f"first complete paint (overview), {len(pm)} page loads: first {pm[0]:.0f} ms, median "
          f"{statistics.median(pm):.0f} ms, max {max(pm):.0f} ms")
    print("tab switches (click to drawn): " + ", ".join(f"{k} {v:.0f} ms" for k, v in res["tabs"].items()))
    print(f"server RSS after: {res['rss_end_mb']:.0f} MB (peak {res['hwm_mb']:.0f} MB)")

    from tensortap.ui.report import write_report

    rjob = os.path.join(OUT, f"job_{args.report_steps}")
    write_job(rjob, args.report_steps)
    t = time.perf_counter()
    size = write_report([rjob], os.path.join(OUT, "report.html"))
    print(f"report of a {args.report_steps}-step job x 100 tensors: {size / 1e6:.2f} MB "
          f"(written in {time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
