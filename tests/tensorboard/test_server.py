"""A real `tensorboard --logdir` server on 127.0.0.1, queried over HTTP: a converted job and a live export."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensortap as tt
from tensortap.tensorboard.convert import convert
from tensortap.tensorboard.export import EventExporter


def _write_job(out_dir: str) -> None:
    hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(norms=["l2"], save_raw_tensor=True))
    for s in range(8):
        hook.set_mode(tt.modes.EVAL if s % 4 == 3 else tt.modes.TRAIN)
        hook.next_step()
        w = np.random.default_rng(s).normal(size=(16, 16))
        if s == 2:
            w[0, :4] = [np.nan, np.inf, -np.inf, np.nan]
        hook.save_tensor("w", w, collections_to_write="weights")
        hook.save_scalar("loss", 10.0 - s)
    hook.close()


def test_tensorboard_server_shows_a_converted_job_and_a_live_export(tmp_path, tensorboard_server, tb):
    logdir = tmp_path / "tb"
    out = str(tmp_path / "job")
    _write_job(out)
    convert(out, str(logdir / "converted"))
    live = EventExporter(str(logdir / "live"), "worker_0")
    live.set_collections({"collections": {}})  # as a hook's writer does
    live.add("scalar/acc", 0, "TRAIN", 0, np.asarray(0.5), {})
    live.flush()

    server = tensorboard_server(str(logdir))
    runs = server.wait_for("/data/runs", lambda r: {"converted/worker_0/train", "converted/worker_0/eval",
                                                    "live/worker_0/train"} <= set(r))
    assert "converted/worker_0/eval" in runs

    trial = tt.create_trial(out)
    for mode in (tt.modes.TRAIN, tt.modes.EVAL):
        run = f"converted/worker_0/{mode.name.lower()}"
        loss = trial.tensor("scalar/loss")
        expected = {trial.global_step(mode, ms): np.float32(v) for ms, v in loss.values(mode).items()}
        n = len(expected)
        got = server.wait_for("/data/plugin/scalars/scalars", lambda a, n=n: len(a) == n, run=run, tag="scalar/loss")
        assert {step: np.float32(v) for _, step, v in got} == expected
        l2 = server.get("/data/plugin/scalars/scalars", run=run, tag="w/l2")
        assert [step for _, step, _ in l2] == sorted(expected)
        np.testing.assert_array_equal(  # the NaN of step 2 is shown as NaN
            np.float32([v for _, _, v in l2]),
            np.float32([trial.tensor("w").reduction_value(g, "l2") for g in sorted(expected)]))
        hist = server.get("/data/plugin/histograms/histograms", run=run, tag="weights/w")
        assert sorted(step for _, step, _ in hist) == sorted(expected)
        for _, step, buckets in hist:
            value = trial.tensor("w").value(step)
            counts = np.array([c for _, _, c in buckets])
            np.testing.assert_array_equal(counts, tb.numpy_counts(value))
        nonfinite = server.get("/data/plugin/scalars/scalars", run=run, tag="nonfinite/w")
        # from the first histogram that left values out (global step 2) on
        assert {step: v for _, step, v in nonfinite} == {g: (4.0 if g == 2 else 0.0) for g in expected if g >= 2}

    # the live run: what the exporter flushes appears while its files stay open
    got = server.wait_for("/data/plugin/scalars/scalars", lambda a: len(a) == 1, run="live/worker_0/train",
                          tag="scalar/acc")
    assert [(s, v) for _, s, v in got] == [(0, 0.5)]
    for s in range(1, 6):
        live.add("scalar/acc", s, "TRAIN" if s % 2 else "EVAL", s, np.asarray(0.5 + s / 10), {})
    live.flush()
    got = server.wait_for("/data/plugin/scalars/scalars", lambda a: len(a) == 4, run="live/worker_0/train",
                          tag="scalar/acc")
    assert [s for _, s, _ in got] == [0, 1, 3, 5]
    got = server.wait_for("/data/plugin/scalars/scalars", lambda a: len(a) == 2, run="live/worker_0/eval",
                          tag="scalar/acc")
    assert [(s, round(v, 6)) for _, s, v in got] == [(2, 0.7), (4, 0.9)]
    live.close()
    assert len(os.listdir(logdir / "live" / "worker_0" / "train")) == 1


def test_cli_serve_starts_tensorboard_on_localhost_and_stops_it(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from tensortap.tensorboard.cli import tensorboard_command

    out = str(tmp_path / "job")
    _write_job(out)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensortap.cli.main", "tensorboard", out, "--serve", "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=10) as r:
                    runs = r.read().decode()
                if "worker_0/eval" in runs and "worker_0/train" in runs:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "TensorBoard never listed the job's runs"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion above: stop it the way that also stops TensorBoard
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert f"http://127.0.0.1:{port}/" in stdout
    with pytest.raises(OSError):  # the server went with the command
        urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5)
    cmd = tensorboard_command("/x", 1)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
