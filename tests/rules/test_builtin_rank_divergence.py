"""RankDivergence on real two-process gloo DDP jobs: the rank whose gradient is corrupted after the all-reduce is
named, from the steps after the corruption; the same job without it is judged and found healthy."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import _faulty_jobs as jobs  # noqa: E402

import tensortap as tt  # noqa: E402
from tensortap.rules.builtin import RankDivergence  # noqa: E402


def test_the_corrupted_rank_is_named(tmp_path, run_rule):
    out = str(tmp_path / "ddp")
    jobs.ddp_job(out, str(tmp_path), corrupt_rank=1, corrupt_from=20)
    trial = tt.create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"]
    rep = run_rule(RankDivergence(trial))
    assert rep.status == "IssuesFound"
    assert 20 <= rep.fired_steps[0] <= 24
    for v in rep.first_violations:
        assert "worker_1" in v.condition and "of worker_0" not in v.condition
        assert v.value["workers"] == ["worker_1"]


def test_a_healthy_ddp_job_is_judged_and_quiet(tmp_path, run_rule):
    out = str(tmp_path / "ddp")
    jobs.ddp_job(out, str(tmp_path), corrupt_rank=-1)
    rep = run_rule(RankDivergence(tt.create_trial(out)))
    assert rep.status == "NoIssuesFound", rep.first_violations
    assert rep.judged >= 30


def test_one_worker_is_no_data(tmp_path, run_rule):
    out = str(tmp_path / "one")
    jobs.spike_job(out, steps=12, corrupt_step=None)
    rep = run_rule(RankDivergence(tt.create_trial(out)))
    assert rep.status == "NoData"
