"""Every record a job handed over is readable or counted as dropped, exactly once (issue #39, item 2): after a kill
of the writer process under a real PyTorch job, and when the object store goes away for good mid-job."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest

import tensortap as tt


def _readable_records(out: str) -> int:
    """Records a reader finds: every (tensor, step) with a value, also a last step not marked passed."""
    t = tt.create_trial(out)
    return sum(len(t.tensor(n).steps(show_incomplete_steps=True)) for n in t.tensor_names())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer process is Linux only")
@pytest.mark.parametrize("kill_at", [0, 40])
def test_a_killed_writer_process_under_pytorch_counts_every_lost_record_once(tmp_path, kill_at):
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, save_config=tp.SaveConfig(save_interval=1), writer="process", flush_interval=0.05,
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    steps = 200
    for step in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if step == kill_at:
            os.kill(hook._writer._proc.pid, signal.SIGKILL)
    hook.close()
    per_step = 9  # 2 weights, 2 biases, their 4 gradients, the loss
    readable = _readable_records(out)
    assert readable + hook.dropped_records == steps * per_step, (readable, hook.dropped_records)
    assert hook.dropped_records > 0


class _Front:
    """A TCP front for the S3 server that can be taken down: the store becomes unreachable for the client (connections
    refused) as a stopped server would, while moto keeps what it stored."""

    def __init__(self, target: str):
        host, port = target.replace("http://", "").rsplit(":", 1)
        self.target = (host, int(port))
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            self._conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._sock.close()
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass


def test_a_store_gone_for_good_mid_job_counts_every_record_it_did_not_get(s3_url, s3_server, monkeypatch):
    front = _Front(s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{front.port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    hook = tt.Hook(s3_url, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    hook._writer_opts["seal_interval"] = 0.1
    steps = 30
    for step in range(steps):
        hook.next_step()
        hook.save_tensor("w", np.full(100, step, dtype=np.float32))
        hook.save_scalar("loss", 1.0 / (step + 1))
        if step == 9:
            hook.flush()  # (steps 0..9 are on the server)
            front.stop()  # the store goes away and never comes back
        time.sleep(0.01)
    hook._writer.close_timeout = 1.0  # (how long close() keeps retrying the store)
    hook.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    readable = _readable_records(s3_url)
    assert readable >= 20  # what reached the store before it went away
    assert readable + hook.dropped_records == 2 * steps, (readable, hook.dropped_records)
    assert hook.dropped_records > 0
