"""`tensortap run` around rules, on corpus trainings with no tensortap code in them (bench/corpus): a healthy job
ends with status 0 (every rule judged data and found nothing), a broken one is stopped with status 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = ["loss_not_decreasing", "overfit", "overtraining", "exploding_tensor", "vanishing_gradient",
         "unchanged_tensor", "weight_update_ratio", "dead_relu"]


def run(out: str, job: str, *extra: str) -> tuple[int, dict]:
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    args = [exe, "run", "--out-dir", out, "--save-interval", "10", "--json", *extra]
    for r in RULES:
        args += ["--rule", r]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    p = subprocess.run([*args, "--", sys.executable, "-m", "bench.corpus", job], capture_output=True, text=True,
                       timeout=600, cwd=ROOT, env=env)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        raise AssertionError((p.returncode, p.stdout[-2000:], p.stderr[-4000:])) from None
    return p.returncode, {x["name"]: x for x in doc["rules"]}


def test_a_healthy_corpus_job_exits_0(tmp_path):
    code, rules = run(str(tmp_path / "job"), "mlp_adam_s0")
    assert {n: r["status"] for n, r in rules.items()} == dict.fromkeys(RULES, "NoIssuesFound"), rules
    assert code == 0


def test_a_broken_corpus_job_is_stopped_with_exit_1(tmp_path):
    code, rules = run(str(tmp_path / "job"), "frozen_mlp", "--stop-on-issue")
    assert code == 1
    assert rules["unchanged_tensor"]["status"] == "IssuesFound"
    fired = {n for n, r in rules.items() if r["status"] == "IssuesFound"}
    assert fired <= {"unchanged_tensor", "weight_update_ratio", "loss_not_decreasing", "overtraining",
                     "vanishing_gradient"}, rules
