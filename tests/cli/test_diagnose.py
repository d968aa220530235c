"""`tensortap diagnose OUT_DIR [--json]`: one screen saying what happened, also written to OUT_DIR/diagnosis.md;
exit status 0 when nothing was found, 1 when something was, 2 on error (one line; {"error"} with --json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import _faulty_jobs as jobs  # noqa: E402


def _diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensortap.cli.main", "diagnose", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    spiky, healthy = str(root / "spiky"), str(root / "healthy")
    jobs.spike_job(spiky, steps=75, corrupt_step=60)
    jobs.spike_job(healthy, steps=75, corrupt_step=None)
    return spiky, healthy


def test_a_job_with_a_spike_exits_1_and_says_where(runs):
    spiky, _ = runs
    r = _diagnose(spiky)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"# Diagnosis of {spiky}"
    assert lines[2].startswith("2 findings: 2 spikes")
    assert "loss spike: loss CrossEntropyLoss_output_0" in r.stdout and "at step 61" in r.stdout
    assert "moved first: the gradient norm of gradient/Sequential_2.weight at step 60" in r.stdout
    assert "## What to try" in r.stdout and "Consider lowering the learning rate" in r.stdout
    assert len(lines) < 60  # one screen
    with open(os.path.join(spiky, "diagnosis.md"), encoding="utf-8") as f:
        assert f.read() == r.stdout  # the same account, for a person or an assistant that runs nothing


def test_json_is_one_valid_document(runs):
    spiky, healthy = runs
    r = _diagnose(spiky, "--json")
    assert r.returncode == 1
    d = json.loads(r.stdout)
    assert d["findings"] == 2 and d["path"] == spiky
    assert {s["kind"]: s["step"] for s in d["spikes"]} == {"gradient norm": 60, "loss": 61}
    assert d["spikes"][0]["movers"][0]["tensor"] == "gradient/Sequential_2.weight"
    assert d["first_nonfinite"] is None and d["diverging_ranks"] == [] and d["suggestions"]
    h = _diagnose(healthy, "--json")
    assert h.returncode == 0, h.stdout
    assert json.loads(h.stdout)["findings"] == 0


def test_a_healthy_job_exits_0(runs):
    _, healthy = runs
    r = _diagnose(healthy)
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines()[2].startswith("nothing wrong found (")
    assert "rules judged the data and found no issue" in r.stdout.splitlines()[2]
    assert "## What to try" not in r.stdout


def test_rules_that_fired_are_listed_with_where(runs, tmp_path):
    spiky, _ = runs
    r = subprocess.run([sys.executable, "-m", "tensortap.cli.main", "rules", "run", spiky, "--rule", "loss_spike"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    d = json.loads(_diagnose(spiky, "--json").stdout)
    (rule,) = [r for r in d["rules"] if r["run"] == "offline"]
    assert not any(r["name"] == "loss_spike" and r["run"] == "diagnose" for r in d["rules"])  # not run twice
    assert (rule["name"], rule["run"], rule["status"], rule["fired_steps"][0]) == ("loss_spike", "offline",
                                                                                  "IssuesFound", 61)
    text = _diagnose(spiky).stdout
    assert "- loss_spike (offline): IssuesFound first at step 61" in text
    assert d["findings"] == 3


@pytest.mark.parametrize("json_flag", [False, True])
def test_errors_exit_2_in_one_line(tmp_path, json_flag):
    args = [str(tmp_path / "missing")] + (["--json"] if json_flag else [])
    r = _diagnose(*args)
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "no such directory" in err[0] and "Traceback" not in r.stderr
    if json_flag:
        assert "no such directory" in json.loads(r.stdout)["error"]
    (tmp_path / "empty").mkdir()
    r = _diagnose(str(tmp_path / "empty"))
    assert r.returncode == 2 and "not a job's out_dir" in r.stderr


def test_no_rules_runs_none(runs):
    _, healthy = runs
    d = json.loads(_diagnose(healthy, "--json", "--no-rules").stdout)
    assert d["rules"] == [] and d["findings"] == 0
