"""The diagnosis first: the dashboard's overview and the report open with what went wrong (a real PyTorch job
whose second layer's gradient is corrupted at step 60), and distributions count the NaN and infinities they
leave out of their bands."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import _faulty_jobs as jobs  # noqa: E402

from tensortap.ui.jobs import JobSet  # noqa: E402
from tensortap.ui.views import render_view  # noqa: E402


@pytest.fixture(autouse=True)
def _wait_for_the_diagnosis(monkeypatch):
    """These tests read the diagnosis in the first answer: the view waits for the process making it, and for its
    turn when diagnoses started by other tests' views still take the turns (as the report does)."""
    import math

    import tensortap.ui.diagnosis as diagnosis

    monkeypatch.setattr(diagnosis, "WAIT_S", math.inf)


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ui") / "spiky")
    jobs.spike_job(out, corrupt_step=60)
    return out


def test_the_overview_opens_with_the_diagnosis(spiky):
    blocks = render_view(JobSet([spiky]), "overview", {})
    assert blocks[0] == {"type": "note", "text": "Diagnosis: 2 findings: 2 spikes."}
    table = blocks[1]
    assert table["type"] == "table" and table["columns"] == ["finding", "step", "what"]
    rows = {r["finding"]: r for r in table["rows"]}
    assert rows["loss spike"]["step"] == "61" and rows["gradient norm spike"]["step"] == "60"
    assert "moved first: gradient/Sequential_2.weight at step 60" in rows["loss spike"]["what"]
    tries = [b["text"] for b in blocks if b["type"] == "note" and b["text"].startswith("To try: ")]
    assert any("lowering the learning rate" in t for t in tries)
    assert any(b["type"] == "figure" for b in blocks)  # the curves follow


def test_a_view_that_waits_waits_for_its_turn_too(spiky, monkeypatch):
    """Diagnoses started elsewhere hold every turn (here a process that ends in 2 s holds the only one): the view
    told to wait (as the report is) waits for the turn, then for its own diagnosis."""
    import subprocess
    import tempfile

    import tensortap.ui.diagnosis as diagnosis

    monkeypatch.setattr(diagnosis, "MAX_MAKING", 1)
    holder = diagnosis._Making()
    holder.out, holder.err = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
    holder.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    diagnosis._RUNNING.add(holder)
    try:
        blocks = render_view(JobSet([spiky]), "overview", {})
        assert holder.proc is None  # the turn was waited for, not taken
        assert blocks[0] == {"type": "note", "text": "Diagnosis: 2 findings: 2 spikes."}
    finally:
        holder.stop()


def test_the_report_s_first_section_is_the_diagnosis(spiky):
    from tensortap.ui.report import build_report

    html = build_report([spiky])
    packed = re.search(r'id="tt-report-data">([^<]*)</script>', html).group(1)
    doc = json.loads(gzip.decompress(base64.b64decode(packed)))
    first = doc["sections"][0]
    assert (first["name"], first["title"]) == ("diagnosis", "Diagnosis")
    assert first["blocks"][0]["text"].startswith("Diagnosis: 2 findings")


def test_a_healthy_job_says_so(tmp_path):
    out = str(tmp_path / "ok")
    jobs.spike_job(out, steps=30, corrupt_step=None)
    blocks = render_view(JobSet([out]), "overview", {})
    assert blocks[0]["text"].startswith("Diagnosis: nothing wrong found (")
    assert blocks[1]["type"] != "table" or blocks[1]["id"] != "diagnosis"


def test_distributions_count_the_non_finite_values_they_leave_out(tmp_path):
    out = str(tmp_path / "nan")
    jobs.spike_job(out, steps=30, corrupt_step=20, factor=float("inf"))
    from tensortap.trials import create_trial

    t = create_trial(out)
    g = t.tensor("gradient/Sequential_2.weight")
    expect = {s: (int(np.isnan(v).sum()), int(np.isposinf(v).sum()), int(np.isneginf(v).sum()))
              for s in g.steps() if not np.isfinite(v := g.value(s)).all()}
    assert expect and min(expect) == 20
    blocks = render_view(JobSet([out]), "distribution", {"tensor": "gradient/Sequential_2.weight"})
    fig = next(b for b in blocks if b["type"] == "figure" and b["id"] == "distribution-nonfinite")
    by = {tr["name"]: dict(zip(tr["x"], tr["y"], strict=True)) for tr in fig["figure"]["data"]}
    for s, (nan, pos, neg) in expect.items():
        assert (by.get("NaN", {}).get(s, 0), by.get("+inf", {}).get(s, 0), by.get("−inf", {}).get(s, 0)) == \
            (nan, pos, neg), s
    note = next(b["text"] for b in blocks if b["type"] == "note" and "held NaN or infinite" in b["text"])
    assert note.startswith(f"gradient/Sequential_2.weight: {len(expect)} of the ")


def test_the_dashboard_answers_before_the_diagnosis_is_made_and_shows_it_when_it_is(spiky, monkeypatch):
    """A view does not wait for a diagnosis being made (a large job's takes minutes): it says it is being made in
    a block marked pending (the page asks for the view again), and the overview shows it once it is ready."""
    import time

    import tensortap.ui.diagnosis as diagnosis

    monkeypatch.setattr(diagnosis, "WAIT_S", 0.0)
    jobs_ = JobSet([spiky])
    blocks = render_view(jobs_, "overview", {})
    assert blocks[0]["type"] == "group" and blocks[0]["pending"] == "diagnosis"
    assert blocks[0]["blocks"][0]["text"].startswith("Diagnosis: being made")
    assert any(b["type"] == "figure" for b in blocks)  # the curves are not held back
    deadline = time.monotonic() + 600
    while blocks[0].get("pending") and time.monotonic() < deadline:
        time.sleep(0.2)
        blocks = render_view(jobs_, "diagnosis", {})  # (what the page asks for in the pending block's place)
    assert blocks[0] == {"type": "note", "text": "Diagnosis: 2 findings: 2 spikes."}
    assert render_view(jobs_, "overview", {})[0] == blocks[0]


def test_the_page_draws_the_diagnosis_in_place_when_it_is_ready(page, tmp_path, ui, monkeypatch):
    """In the browser: the overview is drawn at once with the diagnosis being made; when it is ready it takes
    that block's place, and the figures drawn meanwhile are left as they are (not drawn again)."""
    import tensortap.ui.diagnosis as diagnosis
    from tensortap.ui.server import Server

    monkeypatch.setattr(diagnosis, "WAIT_S", 0.0)
    out = str(tmp_path / "job")
    ui.write_scalar_job(out, hostile=False)
    server = Server([out], port=0).start()
    try:
        ui.open_page(page, server.url)
        assert page.js("document.querySelector('#view div.pending p.note').textContent").startswith(
            "Diagnosis: being made")
        page.js("document.querySelectorAll('#view div.figure').forEach(d => { d.dataset.mark = 'kept'; })")
        marked = page.js("document.querySelectorAll('#view div.figure[data-mark=kept]').length")
        assert marked > 0
        page.wait("!document.querySelector('#view div.pending') && Array.from(document.querySelectorAll("
                  "'#view p.note')).some(p => p.textContent.startsWith('Diagnosis: ') && "
                  "!p.textContent.startsWith('Diagnosis: being made'))", timeout=300)
        assert page.js("document.querySelectorAll('#view div.figure[data-mark=kept]').length") == marked
        assert not page.errors
    finally:
        server.stop()


def test_a_diagnosis_that_cannot_be_made_says_why(tmp_path):
    """The process making the diagnosis fails (the job's folder went away): the panel says so, with its reason."""
    import shutil

    out = str(tmp_path / "gone")
    jobs.spike_job(out, steps=30, corrupt_step=None)
    jobs_ = JobSet([out])
    shutil.rmtree(out)
    (block,) = render_view(jobs_, "diagnosis", {})
    assert block["text"].startswith("Diagnosis: could not be made (RuntimeError: the diagnosis process exited "
                                    "with 1: "), block
    assert len(block["text"]) > len("Diagnosis: could not be made (RuntimeError: the diagnosis process exited "
                                    "with 1: ") + 5


def _diagnosing_children() -> int:
    """Processes of this one that make a diagnosis, read from /proc."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        n += ppid == os.getpid() and b"diagnose" in cmd
    return n


def test_several_jobs_diagnoses_come_as_they_are_made_a_few_at_a_time(tmp_path, monkeypatch):
    """Several jobs: a count, a table of the headlines of those with findings, the names of those being made and
    of those with nothing wrong in a note each (fifty jobs stay a few lines), then the findings of each job that
    has any, as one group the page asks for again while some are being made; at most MAX_MAKING diagnoses are made
    at once (fifty jobs at once would take every core from the server and the browser)."""
    import time

    import tensortap.ui.diagnosis as diagnosis

    monkeypatch.setattr(diagnosis, "WAIT_S", 0.0)
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"job{i}"))
        jobs.spike_job(paths[-1], steps=30, corrupt_step=20 if i == 2 else None)
    jobs_ = JobSet(paths)
    (group, *rest) = render_view(jobs_, "overview", {})
    assert group["type"] == "group" and group["pending"] == "diagnosis"
    texts = [b["text"] for b in group["blocks"]]
    assert texts[0] == "Diagnosis of 4 jobs: 0 with findings, 0 with nothing wrong found, 4 being made."
    assert texts[1].startswith("Being made (") and texts[1].endswith(": job0, job1, job2, job3; each appears here "
                                                                     "when it is ready.")
    assert any(b["type"] == "figure" for b in rest)
    most = 0
    deadline = time.monotonic() + 600
    blocks = [group]
    while blocks[0].get("type") == "group" and time.monotonic() < deadline:
        most = max(most, _diagnosing_children())
        time.sleep(0.1)
        blocks = render_view(jobs_, "diagnosis", {})
    assert 1 <= most <= diagnosis.MAX_MAKING
    assert blocks[0] == {"type": "note", "text": "Diagnosis of 4 jobs: 1 with findings, 3 with nothing wrong found."}
    table = blocks[1]
    assert table["id"] == "diagnosis-jobs" and [r["job"] for r in table["rows"]] == ["job2"]
    assert re.match(r"\d+ findings?: ", table["rows"][0]["diagnosis"]), table
    assert blocks[2] == {"type": "note", "text": "Nothing wrong found: job0, job1, job3."}
    assert blocks[3] == {"type": "heading", "text": f"Diagnosis of job2: {table['rows'][0]['diagnosis']}"}
    assert [b["id"] for b in blocks if b["type"] == "table"] == ["diagnosis-jobs", "diagnosis-2"]
    assert any(b["type"] == "note" and b["text"].startswith("To try (job2): ") for b in blocks)


def test_the_page_fills_several_jobs_diagnoses_in_one_place(page, tmp_path, ui, monkeypatch):
    """In the browser, two jobs: their diagnoses are filled in place as they are made, drawn once."""
    import tensortap.ui.diagnosis as diagnosis
    from tensortap.ui.server import Server

    monkeypatch.setattr(diagnosis, "WAIT_S", 0.0)
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    for p in paths:
        ui.write_scalar_job(p, hostile=False)
    server = Server(paths, port=0).start()
    try:
        ui.open_page(page, server.url)
        notes = "[...document.querySelectorAll('#view p.note')].map(p => p.textContent)"
        # (a diagnosis may be made before the page is drawn on a loaded machine: those still being made are pending)
        first = page.js(notes)[0]
        made = re.fullmatch(r"Diagnosis of 2 jobs: 0 with findings, ([01]) with nothing wrong found, "
                            r"([12]) being made\.", first)
        if made is not None:
            assert int(made[1]) + int(made[2]) == 2, first
            assert page.js("document.querySelectorAll('#view div.pending').length") == 1
        else:
            assert first == "Diagnosis of 2 jobs: 0 with findings, 2 with nothing wrong found.", first
        page.wait("!document.querySelector('#view div.pending')", timeout=300)
        got = [n for n in page.js(notes) if n.startswith(("Diagnosis", "Nothing", "Being"))]
        assert got == ["Diagnosis of 2 jobs: 0 with findings, 2 with nothing wrong found.",
                       "Nothing wrong found: a, b."]
        assert not page.errors
    finally:
        server.stop()
