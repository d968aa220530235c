"""Jobs written to and read from a real S3-compatible server (moto's, on 127.0.0.1)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import CorruptData
from tensortap.storage import open_storage

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def test_values_round_trip_bit_exact_through_s3(s3_url):
    rng = np.random.default_rng(0)
    saved = {}
    hook = tt.Hook(s3_url, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(norms=["l2"], save_raw_tensor=True))
    for step in range(5):
        hook.next_step()
        for name, shape, dt in [("w", (16, 8), np.float32), ("i", (3,), np.int64), ("h", (5,), np.float16)]:
            v = rng.standard_normal(shape).astype(dt) if dt != np.int64 else rng.integers(-9, 9, shape)
            saved[(name, step)] = v
            hook.save_tensor(name, v)
        hook.save_scalar("loss", 1.0 / (step + 1))
    hook.close()
    trial = tt.create_trial(s3_url)
    assert trial.steps() == list(range(5)) and trial.loaded_all_steps
    for (name, step), v in saved.items():
        got = trial.tensor(name).value(step)
        assert got.dtype == v.dtype and got.tobytes() == v.tobytes()
    assert trial.tensor("w").reduction_value(3, "l2") == pytest.approx(
        float(np.linalg.norm(saved[("w", 3)].astype(np.float64))), rel=1e-5)
    assert trial.tensor("scalar/loss").values() == pytest.approx({s: 1 / (s + 1) for s in range(5)})
    # Objects grow with chunks (seals), not with steps: one chunk here.
    keys = open_storage(s3_url).list("tensortap/")
    assert len(keys) <= 4, keys


def test_two_workers_on_one_prefix(s3_url):
    hooks = [tt.Hook(s3_url, include_workers="all", rank=r, world_size=2, save_config=tt.SaveConfig(save_interval=1))
             for r in range(2)]
    for step in range(3):
        for r, h in enumerate(hooks):
            h.next_step()
            h.save_tensor("x", np.array([step, r]))
    for h in hooks:
        h.close()
    trial = tt.create_trial(s3_url)
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor("x").value(2, worker="worker_1").tolist() == [2, 1]
    keys = open_storage(s3_url).list("tensortap/")
    assert {k.split("/")[1] for k in keys} == {"worker_0", "worker_1"}  # nobody overwrote anybody


WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    from tensortap.transport.thread_writer import ChunkWriter
    url, n = sys.argv[1], int(sys.argv[2])
    hook = tt.Hook(url, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.1)
    hook._writer_opts["seal_interval"] = 0.3
    for step in range(n):
        hook.next_step()
        hook.save_tensor("w", np.full((4, 4), step, dtype=np.float32))
        hook.end_step()
        print(step, flush=True)
        time.sleep(0.15)
    hook.close()
    """
)


def test_reader_tails_a_live_job_on_s3(s3_url):
    n = 8
    p = subprocess.Popen([sys.executable, "-c", WRITER, s3_url, str(n)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    try:
        assert p.stdout.readline()
        trial = tt.create_trial(s3_url)
        for step in range(n):
            trial.wait_for_steps([step], timeout=20)
            assert np.all(trial.tensor("w").value(step) == step)
        assert p.wait(timeout=30) == 0
        trial.refresh_data()
        assert trial.loaded_all_steps
    finally:
        p.kill()


class _Front:
    """A TCP front for the S3 server that can be taken down and brought back on the same port.

    moto keeps its objects in memory, so stopping moto itself would lose everything stored; stopping
    this front makes the server unreachable for the client exactly as a stopped server would
    (connections refused), while what it stored before the outage survives.
    """

    def __init__(self, target: tuple[str, int]):
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._sock = None
        self._conns: list[socket.socket] = []

    def start(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._sock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            self._conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self._sock.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self._conns = []


def test_outage_mid_job_training_survives_and_buffered_data_lands(s3_url, s3_server, monkeypatch):
    host, port = s3_server.rsplit(":", 1)
    front = _Front((host.replace("http://", ""), int(port)))
    front.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{front.port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    hook = tt.Hook(s3_url, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    hook._writer_opts["seal_interval"] = 0.1
    for step in range(5):
        hook.next_step()
        hook.save_tensor("w", np.full(10, step))
    hook.flush()  # steps 0..4 are on the server before the outage
    front.stop()
    for step in range(5, 15):  # training goes on while the store is down
        hook.next_step()
        hook.save_tensor("w", np.full(10, step))
        time.sleep(0.05)
    deadline = time.monotonic() + 30
    while not hook._writer.outage and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hook._writer.outage  # the writer noticed, buffers, and training was never blocked
    front.start()  # the store comes back: buffered chunks are uploaded
    hook.close()
    assert hook.error_count == 0
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    trial = tt.create_trial(s3_url)
    assert trial.steps() == list(range(15))
    for step in range(15):
        assert np.all(trial.tensor("w").value(step) == step)
    front.stop()


def test_missing_or_truncated_object_named_in_error(s3_url):
    hook = tt.Hook(s3_url, save_config=tt.SaveConfig(save_interval=1))
    hook.save_tensor("w", np.arange(100.0))
    hook.close()
    st = open_storage(s3_url)
    idx = [k for k in st.list("tensortap/") if k.endswith(".idx")][0]
    dat = idx[:-4] + ".dat"
    trial = tt.create_trial(s3_url)
    st.delete(dat)
    with pytest.raises(CorruptData, match="missing") as ei:
        trial.tensor("w").value(0)
    assert ei.value.path.endswith(dat)
    data = st.read(idx)
    st.write(idx, data[:-5])
    # A published index object never grows: its cut last block is damage, reported with file and offset.
    trial = tt.create_trial(s3_url)
    assert len(trial.damage) == 1 and "truncated" in trial.damage[0].reason
    assert trial.damage[0].path.endswith(idx)


def test_smdebug_out_dir_on_s3(s3_url, tmp_path):
    st = open_storage(s3_url)
    src = os.path.join(FIXTURES, "pytorch_job")
    for root, _, files in os.walk(src):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/")
            with open(os.path.join(root, f), "rb") as fh:
                st.write(rel, fh.read())
    s3_trial = tt.create_trial(s3_url)
    local = tt.create_trial(src)
    assert type(s3_trial.source).__name__ == "SmdebugSource"
    assert s3_trial.steps() == local.steps() and s3_trial.tensor_names() == local.tensor_names()
    for name in local.tensor_names():
        for step in local.tensor(name).steps():
            try:
                v = local.tensor(name).value(step)
            except Exception:  # noqa: BLE001 - reduction-only tensors
                continue
            assert s3_trial.tensor(name).value(step).tobytes() == v.tobytes()
    shutil.rmtree(tmp_path, ignore_errors=True)
