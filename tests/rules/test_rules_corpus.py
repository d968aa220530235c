"""A fast sample of the rules corpus (bench/corpus): real trainings, healthy and broken, each judged by every
built-in rule at its default parameters. Healthy jobs raise no alarm; each broken one is caught by the rule meant
for it. The whole corpus and its confusion table: `python bench/rules_corpus.py` (bench/RESULTS.md)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgboost")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.corpus import JOBS, build  # noqa: E402
from bench.rules_corpus import judge, outcome  # noqa: E402

SAMPLE = ["mlp_adam_s0", "xgb_binary_d6", "shuffled_labels", "frozen_mlp", "overfit_small_data", "xgb_label_leak"]


@pytest.mark.parametrize("name", SAMPLE)
def test_rules_at_their_defaults_on_a_corpus_job(name, tmp_path):
    job = JOBS[name]
    verdicts = judge(job, build(name, root=str(tmp_path)))
    fired = {r for r, v in verdicts.items() if v["status"] == "IssuesFound"}
    false_alarms = {r: verdicts[r]["message"] for r in fired if outcome(job, r, "IssuesFound") == "FP"}
    assert not false_alarms, false_alarms
    missed = {r: verdicts[r]["status"] for r in job.expect if r not in fired}
    assert not missed, missed
    if job.healthy:
        # no green without data: the loss rules judged this job
        judged = {r for r, v in verdicts.items() if v["status"] == "NoIssuesFound"}
        assert {"loss_not_decreasing", "overtraining"} <= judged, verdicts
        if job.framework == "torch":
            assert {"overfit", "vanishing_gradient", "unchanged_tensor", "dead_relu"} <= judged, verdicts
