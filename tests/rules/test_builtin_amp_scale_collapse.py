"""AmpScaleCollapse on real trainings with torch.amp.GradScaler on CPU: a loss made to overflow from step 20 makes
the scaler skip every step, and the rule fires at the tenth skip in a row; the healthy run is judged and quiet."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import _faulty_jobs as jobs  # noqa: E402

import tensortap as tt  # noqa: E402
from tensortap.rules.builtin import AmpScaleCollapse  # noqa: E402


def test_fires_when_the_scaler_skips_ten_steps_in_a_row(tmp_path, run_rule):
    out = str(tmp_path / "amp")
    scales = jobs.amp_job(out, overflow_from=20)
    trial = tt.create_trial(out)
    assert trial.tensor("grad_scaler/skipped").steps() == list(range(20, 40))
    rep = run_rule(AmpScaleCollapse(trial))
    assert rep.status == "IssuesFound"
    assert rep.fired_steps[0] == 29  # steps 20..29: the tenth skip in a row
    v = rep.first_violations[0]
    assert "skipped 10 optimizer steps in a row (steps 20-29)" in v.condition
    assert f"scale now {scales[28]:.4g}" in v.condition  # the scale it skipped step 29 with
    # the scale itself falls below 1 at the 18th skip: 2**16 / 2**17
    rep2 = run_rule(AmpScaleCollapse(tt.create_trial(out), consecutive_skips=100))
    assert rep2.status == "IssuesFound" and rep2.fired_steps[0] == 37
    assert "collapsed to 0.5" in rep2.first_violations[0].condition


def test_quiet_on_a_healthy_amp_job(tmp_path, run_rule):
    out = str(tmp_path / "amp_ok")
    jobs.amp_job(out, overflow_from=None)
    rep = run_rule(AmpScaleCollapse(tt.create_trial(out)))
    assert rep.status == "NoIssuesFound" and rep.datapoints >= 8


def test_a_job_without_a_scaler_is_no_data(tmp_path, run_rule):
    out = str(tmp_path / "plain")
    jobs.spike_job(out, steps=6, corrupt_step=None)
    rep = run_rule(AmpScaleCollapse(tt.create_trial(out)))
    assert rep.status == "NoData" and "register_scaler" in rep.no_data_message()
