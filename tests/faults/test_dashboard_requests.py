"""A real `tensortap ui` server, asked by a real HTTP client: it answers only requests naming the address it
listens on (a web page using DNS rebinding sends its own name and is refused before any job is read), bounds
every request parameter with a clear 400, and shows a job whose folder disappeared as gone, with a message,
never as an ended job with its old data."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import tensortap as tt

pytest.importorskip("flask")


def _write_job(out: str, steps: int = 12) -> None:
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for step in range(steps):
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        hook.save_scalar("loss", 1.0 / (step + 1))
        hook.save_tensor("fc.weight", np.linspace(0, 1, 64).reshape(8, 8) * step, "weights")
    hook.close()


class UI:
    """`tensortap ui` in its own process, on a free port."""

    def __init__(self, paths: list[str], host: str = "127.0.0.1"):
        exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
        self.proc = subprocess.Popen([exe, "ui", *paths, "--port", "0", "--host", host],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://(\S+):(\d+)/", line)
        assert m, line + self.proc.stderr.read()
        self.host, self.port = m.group(1).strip("[]"), int(m.group(2))

    def get(self, path: str, host: str | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.putrequest("GET", path, skip_host=True)
            conn.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
            conn.endheaders()
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {"text": body.decode("utf-8", "replace")}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def jobs(tmp_path):
    paths = [str(tmp_path / "alpha"), str(tmp_path / "beta")]
    for p in paths:
        _write_job(p)
    return paths


@pytest.fixture
def ui(jobs):
    server = UI(jobs)
    yield server
    server.close()


PATHS = ["/", "/api/jobs", "/api/poll", "/api/view/overview", "/api/view/distribution?job=0&tensor=fc.weight",
         "/static/app.js"]


def test_only_the_hosts_it_listens_on_are_answered(ui, jobs):
    for path in PATHS:
        for host in (f"127.0.0.1:{ui.port}", f"localhost:{ui.port}", f"[::1]:{ui.port}", f"LOCALHOST:{ui.port}"):
            status, _ = ui.get(path, host)
            assert status == 200, (path, host)
        for host in (f"attacker.example:{ui.port}", "attacker.example", f"127.0.0.1.attacker.example:{ui.port}",
                     f"localhost.:{ui.port}", "127.0.0.1", f"127.0.0.1:{ui.port + 1}", f"10.0.0.1:{ui.port}", ""):
            status, body = ui.get(path, host)
            assert status in (403, 421), (path, host, status)
            text = json.dumps(body)
            assert all(p not in text and os.path.basename(p) not in text for p in jobs), (path, host)


def test_a_host_named_by_host_is_answered(jobs):
    server = UI(jobs, host="127.0.0.2")
    try:
        assert server.get("/api/jobs", f"127.0.0.2:{server.port}")[0] == 200
        assert server.get("/api/jobs", f"localhost:{server.port}")[0] == 200
        assert server.get("/api/jobs", f"evil.example:{server.port}")[0] in (403, 421)
    finally:
        server.close()


def test_request_parameters_are_bounded(ui):
    status, body = ui.get("/api/view/overview?job=0&job=1")
    assert status == 200 and body["blocks"]
    for query, words in [
        ("job=0&job=0", "listed more than once"),
        ("job=0&job=1&job=0", "listed more than once"),
        ("&".join(["job=0"] * 1000), "listed more than once"),
        ("job=2", "0..1"),
        ("job=-1", "0..1"),
        ("job=%C2%B2", "0..1"),  # a superscript two: a digit to str.isdigit, not an index
        ("job=99999999999999999999999", "0..1"),
        ("page=-1", "page"),
        ("page=abc", "page"),
        ("page=" + "9" * 40, "page"),
        ("page=1&page=2", "page is given 2 times"),
        ("tensor=a&tensor=b", "tensor is given 2 times"),
        ("tensor=" + "x" * 5000, "tensor of 5000 characters"),
        ("find=a&find=b", "find is given 2 times"),
        ("find=" + "y" * 5000, "find of 5000 characters"),
    ]:
        status, body = ui.get("/api/view/layers?" + query)
        assert status == 400, (query[:60], status)
        assert words in body["error"], (query[:60], body)
    status, body = ui.get("/api/series?job=1&tensor=scalar/loss&mode=GLOBAL&lo=0&hi=5")
    assert status == 200 and body["x"], body
    for query in ("job=0&job=0", "job=7", "tensor=loss", "job=0&tensor=" + "z" * 5000):
        status, body = ui.get("/api/series?lo=0&hi=5&" + query)
        assert status == 400 and "error" in body, (query[:60], status)
    status, body = ui.get("/api/view/overview?" + "&".join(f"x{i}=1" for i in range(2000)))
    assert status in (400, 414), status
    assert "query string" in body["error"]


def test_a_job_whose_folder_is_deleted_shows_as_gone(ui, jobs):
    status, body = ui.get("/api/poll")
    assert status == 200 and all(j.get("ended") is True and not j.get("gone") for j in body["jobs"])
    status, body = ui.get("/api/view/distribution?job=0&tensor=fc.weight")
    assert status == 200
    shutil.rmtree(jobs[0])
    status, body = ui.get("/api/poll")
    assert status == 200
    gone, kept = body["jobs"]
    assert gone["gone"] is True and "no longer exists" in gone["error"] and jobs[0] in gone["error"]
    assert not kept.get("gone") and kept["last_step"] == 11
    status, body = ui.get("/api/jobs")
    assert "no longer exists" in body["jobs"][0]["gone"] and body["jobs"][1]["gone"] is None
    # the gone job's views say so; none draws its old data
    for view in ("distribution?job=0&tensor=fc.weight", "layers?job=0", "scalars?job=0", "overview?job=0"):
        status, body = ui.get("/api/view/" + view)
        assert status == 410, (view, status)
        assert "no longer exists" in body["error"] and jobs[0] in body["error"]
    # beside a job still there: a note for the gone one, the other's data
    status, body = ui.get("/api/view/scalars")
    assert status == 200
    notes = [b["text"] for b in body["blocks"] if b["type"] == "note"]
    assert any("no longer exists" in n and jobs[0] in n for n in notes)
    assert any(b["type"] == "figure" for b in body["blocks"])
    status, body = ui.get("/api/series?job=0&tensor=scalar/loss&mode=GLOBAL&lo=0&hi=5")
    assert status == 410 and "no longer exists" in body["error"]
    # a new folder made where the old one was is not the job the dashboard read
    _write_job(jobs[0], steps=3)
    time.sleep(0.01)
    status, body = ui.get("/api/view/scalars?job=0")
    assert status == 410 and "replaced" in body["error"]

