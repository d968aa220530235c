"""Fixtures of the dashboard tests: real jobs (a PyTorch job run by `tensortap run` with a rule that fires,
generic-hook jobs), the dashboard server, and headless Chromium from Debian's `chromium` package driven by
Playwright's Python client (never a downloaded browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM = os.environ.get("TENSORTAP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
#: the global step at which the test job's gradients start to vanish (train step 30 = global step 33)
SATURATE_AT = 30
HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"


def artifacts_dir() -> str:
    """Where screenshots and reports of the browser tests are kept: $TENSORTAP_TEST_ARTIFACTS or
    tests/_artifacts/ (ignored by git)."""
    d = os.environ.get("TENSORTAP_TEST_ARTIFACTS") or os.path.join(HERE, "..", "_artifacts", "ui")
    os.makedirs(d, exist_ok=True)
    return os.path.abspath(d)


@pytest.fixture(scope="session")
def pytorch_job(tmp_path_factory) -> str:
    """A real PyTorch job run by `tensortap run`, watched by vanishing_gradient, which fires once the
    sigmoids saturate."""
    pytest.importorskip("torch")
    out = str(tmp_path_factory.mktemp("ui") / "pytorch_job")
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    cmd = [exe, "run", "--out-dir", out, "--save-interval", "5", "--collection", "weights", "--collection",
           "gradients", "--collection", "losses", "--rule", "vanishing_gradient", "--",
           sys.executable, os.path.join(HERE, "train_turns_saturated.py"), str(SATURATE_AT), "50"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1: a rule found an issue
    return out


def _train(script: str, out: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), out, *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="session")
def keras_job(tmp_path_factory) -> str:
    """A real Keras 3 MLP of three Dense layers, three epochs with validation (train_keras.py)."""
    pytest.importorskip("keras")
    return _train("train_keras.py", str(tmp_path_factory.mktemp("ui") / "keras_job"))


@pytest.fixture(scope="session")
def xgboost_job(tmp_path_factory) -> str:
    """Real XGBoost, 3 classes, 20 rounds, under the XGBoost hook (train_xgboost.py)."""
    pytest.importorskip("xgboost")
    return _train("train_xgboost.py", str(tmp_path_factory.mktemp("ui") / "xgboost_job"))


@pytest.fixture(scope="session")
def dead_layer_job(tmp_path_factory) -> str:
    """PyTorch whose first layer is dead: its gradients are exactly 0 at every step (train_dead_layer.py)."""
    pytest.importorskip("torch")
    return _train("train_dead_layer.py", str(tmp_path_factory.mktemp("ui") / "dead_layer"), "30", "-100")


@pytest.fixture(scope="session")
def healthy_job(tmp_path_factory) -> str:
    """The same model as dead_layer_job, healthy (bias 0), 40 steps: a run to compare with."""
    pytest.importorskip("torch")
    return _train("train_dead_layer.py", str(tmp_path_factory.mktemp("ui") / "healthy"), "40", "0")


def fired_steps(out_dir: str, rule: str = "vanishing_gradient") -> list[int]:
    with open(os.path.join(out_dir, "rules", rule, "report.json"), encoding="utf-8") as f:
        return json.load(f)["fired_steps"]


def write_scalar_job(out: str, steps: int = 40, hostile: bool = True, workers: int = 1) -> None:
    """A job of the generic hook: a loss, weights and gradients of two layers, and (hostile) a scalar
    whose name is markup."""
    hooks = [tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), include_workers="all" if workers > 1 else "one",
                     rank=r, world_size=workers, reduction_config=tt.ReductionConfig(save_raw_tensor=True))
             for r in range(workers)]
    rng = np.random.default_rng(0)
    for step in range(steps):
        for r, hook in enumerate(hooks):
            hook.set_mode(modes.TRAIN)
            hook.next_step()
            drift = 5.0 if r == workers - 1 and workers > 1 else 1.0  # the last rank diverges
            hook.save_tensor("loss", np.float32(drift / (step + 1)), "losses")
            if hostile:
                hook.save_tensor(HOSTILE, np.float32(step % 7), "losses")
            for layer in ("fc1", "fc2"):
                g = rng.standard_normal((4, 4)).astype(np.float32) * 0.8 ** step
                hook.save_tensor(f"gradients/{layer}", g, "gradients")
                hook.save_tensor(f"weights/{layer}", np.ones((4, 4), np.float32) + step, "weights")
    for hook in hooks:
        hook.close()


def write_xgboost_job(out: str, rounds: int = 12) -> None:
    """A job with what the XGBoost hook saves, under smdebug's names: metrics per round, feature importance,
    average SHAP values, labels and predictions (90 rows, 3 classes, 80 % right)."""
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 90).astype(np.float32)
    for rnd in range(rounds):
        hook.next_step()
        hook.save_tensor("train-mlogloss", np.float32(1.0 / (rnd + 1)), "metrics")
        hook.save_tensor("validation-mlogloss", np.float32(1.2 / (rnd + 1)), "metrics")
        for f, w in (("f0", 0.5), ("f1", 0.3), ("f2", 0.2)):
            hook.save_tensor(f"feature_importance/gain/{f}", np.float32(w), "feature_importance")
            hook.save_tensor(f"average_shap/{f}", np.float32(w * rnd), "average_shap")
        hook.save_tensor("labels", labels, "labels")
        hook.save_tensor("predictions", np.where(rng.random(90) < 0.8, labels, (labels + 1) % 3), "predictions")
    hook.close()


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium; "
                    "`make install` does it when run as root with apt-get)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests skipped: Playwright's Python client is not installed (requirements/test.txt)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser page that records console errors and page errors."""

    def __init__(self, browser, width: int = 1280, height: int = 900):
        self.ctx = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def js(self, expr: str):
        return self.page.evaluate(expr)

    def wait(self, expr: str, timeout: float = 30.0) -> object:
        """Poll `expr` (evaluated through the DevTools protocol, which the page's CSP does not block) until
        it is truthy."""
        end = time.monotonic() + timeout
        while True:
            v = self.page.evaluate(expr)
            if v:
                return v
            if time.monotonic() > end:
                raise TimeoutError(f"{expr!r} still falsy after {timeout}s; errors: {self.errors}")
            time.sleep(0.05)

    def screenshot(self, name: str) -> str:
        path = os.path.join(artifacts_dir(), name)
        self.page.screenshot(path=path, full_page=True)
        return path

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    p.close()


#: the plotly traces of every figure on the page: [{fig, traces: [{name, type, x, y, meta}]}]
FIGURES_JS = """
Array.from(document.querySelectorAll('div.figure')).map(d => ({
  fig: d.dataset.fig,
  traces: (d.data || []).map(t => ({name: t.name || null, type: t.type, x: Array.from(t.x || []),
                                    y: Array.from(t.y || []), meta: t.meta || null})),
  svgText: Array.from(d.querySelectorAll('text')).map(e => e.textContent),
}))
"""


def open_page(page: Page, url: str) -> None:
    """Open `url`, refusing (and recording in page.outside) any request that leaves its origin."""
    outside: list[str] = []
    origin = "/".join(url.split("/", 3)[:3])

    def check(route):
        u = route.request.url
        if not (u.startswith(origin) or u.startswith("data:") or u.startswith("file:")):
            outside.append(u)
            return route.abort()
        return route.continue_()

    page.ctx.route("**/*", check)
    page.outside = outside
    page.page.goto(url)
    page.wait("window.ttPaintedAt")


def show(page: Page, view: str) -> None:
    """Click the tab of `view` and wait until it is drawn."""
    n = page.js("window.ttRenders")
    page.page.click(f"nav button[data-view={view}]")
    page.wait(f"document.getElementById('view').dataset.view === '{view}' && window.ttRenders > {n}")


def figure_data(page: Page, fig: str) -> dict:
    """{data, layout} of figure `fig` as plotly holds it (what is drawn)."""
    return page.page.evaluate("f => { const d = document.querySelector('div.figure[data-fig=\"' + f + '\"]'); "
                              "return {data: d.data, layout: d.layout}; }", fig)


@pytest.fixture(scope="session")
def ui():
    """The helpers of these tests (test modules cannot import conftest under --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(FIGURES_JS=FIGURES_JS, HOSTILE=HOSTILE, SATURATE_AT=SATURATE_AT, Page=Page,
                                 open_page=open_page, show=show,
                                 figure_data=figure_data,
                                 fired_steps=fired_steps, write_scalar_job=write_scalar_job,
                                 write_xgboost_job=write_xgboost_job,
                                 artifacts_dir=artifacts_dir)
