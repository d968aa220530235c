"""TensorBoard's own reader and a real TensorBoard server on 127.0.0.1, for the export tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from urllib.parse import quote

import numpy as np
import pytest

#: a server left behind by a crashed test run stops itself after this many seconds
SERVER_LIFETIME_S = 300


def load_run(run_dir):
    """TensorBoard's EventAccumulator over one run directory, fully loaded (it checks every CRC)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert os.path.isdir(run_dir), f"no run directory {run_dir}"
    ea = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


@pytest.fixture
def read_run():
    """read_run(run_dir) -> TensorBoard's EventAccumulator over that run, fully loaded."""
    pytest.importorskip("tensorboard")
    return load_run


def scalars(ea, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in ea.Scalars(tag)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TensorBoardServer:
    """`tensorboard --logdir` on 127.0.0.1; `get(path, **params)` returns the decoded JSON."""

    def __init__(self, logdir: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
               "--port", str(self.port), "--reload_interval", "1"]
        if shutil.which("timeout"):
            cmd = ["timeout", str(SERVER_LIFETIME_S), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.get("/data/runs")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tensorboard exited: {self.proc.stderr.read().decode()[-2000:]}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError("tensorboard did not answer within 120 s") from None
                time.sleep(0.3)

    def get(self, path: str, **params):
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.url + path + q, timeout=30) as r:
            return json.loads(r.read())

    def wait_for(self, path: str, ok, timeout: float = 90.0, **params):
        """Poll `path` until `ok(answer)` (the server reloads the logdir every second); the last answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ans = self.get(path, **params)
            except urllib.error.HTTPError:
                ans = None
            if ans is not None and ok(ans):
                return ans
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} {params}: never as expected; last answer {str(ans)[:500]}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def tensorboard_server():
    """tensorboard_server(logdir) -> a running TensorBoardServer, stopped after the test."""
    pytest.importorskip("tensorboard")
    servers: list[TensorBoardServer] = []

    def start(logdir: str) -> TensorBoardServer:
        s = TensorBoardServer(logdir)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def numpy_counts(values: np.ndarray) -> np.ndarray:
    """numpy's histogram of the finite values with the default edges, trimmed as the exporter trims it
    (one empty bucket before the first non-empty one, up to the last non-empty one)."""
    from tensortap.tensorboard.histogram import default_edges

    v = np.asarray(values, dtype=np.float64).reshape(-1)
    counts, _ = np.histogram(v[np.isfinite(v)], bins=default_edges())
    nz = np.flatnonzero(counts)
    start, end = int(nz[0]), int(nz[-1]) + 1
    return np.concatenate([[0], counts[start:end]]).astype(np.float64)


def matches_trial(out_dir, logdir, expect_histograms=True):
    """Asserts every scalar, reduction and histogram of the trial, at every step, is in its worker's and mode's
    run; (trial, modes seen)."""
    import tensortap as tt
    from tensortap.exceptions import TensorUnavailableForStep
    from tensortap.tensorboard.export import LEADING_GROUPS, clean_tag, histogram_tag, scalar_tag

    trial = tt.create_trial(str(out_dir))
    checked_hist = 0
    leading = {n: c for c in LEADING_GROUPS for n in trial.tensor_names(collection=c)}
    member = {n: [c for c, info in trial.collections().items() if n in info.tensor_names]
              for n in trial.tensor_names()}
    modes_seen = set()
    for worker in trial.workers():
        runs = {}
        for name in trial.tensor_names():
            t = trial.tensor(name)
            for step in t.steps():
                if worker not in t.workers(step):
                    continue
                mode = trial.mode(step)
                modes_seen.add(mode.name)
                if mode.name not in runs:
                    runs[mode.name] = load_run(os.path.join(logdir, quote(worker, safe=""), mode.name.lower()))
                ea = runs[mode.name]
                tags = ea.Tags()
                tag = scalar_tag(name, leading.get(name))
                for (red, is_abs), v in t.reduction_values(step, worker=worker).items():
                    rtag = f"{tag}/{'abs_' if is_abs else ''}{red}"
                    assert np.array_equal(scalars(ea, rtag)[step], np.float32(v), equal_nan=True), (rtag, step)
                try:
                    value = np.asarray(t.value(step, worker=worker))
                except TensorUnavailableForStep:
                    continue
                if value.size == 1 and value.dtype.kind in "biuf":
                    assert np.array_equal(scalars(ea, tag)[step], np.float32(value.reshape(-1)[0]),
                                          equal_nan=True), (tag, step)
                hist_tags = sorted({histogram_tag(c, name) for c in member[name] + ["default"]}
                                   & set(tags["histograms"]))
                if value.size > 1 and value.dtype.kind in "iuf" and hist_tags:
                    (htag,) = hist_tags
                    h = {e.step: e.histogram_value for e in ea.Histograms(htag)}[step]
                    finite = np.isfinite(value.astype(np.float64))
                    assert h.num == np.count_nonzero(finite)
                    np.testing.assert_array_equal(np.asarray(h.bucket), numpy_counts(value))
                    # the count of what the histogram left out, written from the first non-zero one on
                    ntag = clean_tag(f"nonfinite/{name}")
                    nonfinite = scalars(ea, ntag) if ntag in tags["scalars"] else {}
                    assert nonfinite.get(step, 0) == value.size - np.count_nonzero(finite), (ntag, step)
                    checked_hist += 1
    assert not expect_histograms or checked_hist
    return trial, modes_seen


@pytest.fixture
def tb():
    """Helpers: tb.scalars(ea, tag) -> {step: value}; tb.numpy_counts(values) -> the expected bucket counts;
    tb.matches_trial(out_dir, logdir) asserts the event files hold the trial's data."""
    pytest.importorskip("tensorboard")
    import types

    return types.SimpleNamespace(scalars=scalars, numpy_counts=numpy_counts, matches_trial=matches_trial)
