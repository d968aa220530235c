"""LossSpike and GradNormSpike on a real PyTorch training whose second layer's gradient is corrupted at one step:
the gradient norm spikes at that step, the loss at the next, and both messages name that layer first; the same
training without the fault is judged and found healthy (the corpus test checks their defaults on every healthy
corpus job)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
import _faulty_jobs as jobs  # noqa: E402

import tensortap as tt  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402
from tensortap.rules.builtin import GradNormSpike, LossSpike  # noqa: E402

CORRUPT = 60


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("spiky") / "job")
    return out, jobs.spike_job(out, corrupt_step=CORRUPT)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("healthy") / "job")
    jobs.spike_job(out, corrupt_step=None)
    return out


def test_loss_spike_fires_at_the_spike_and_names_the_layer_that_moved_first(spiky, run_rule):
    out, rec = spiky
    rep = run_rule(LossSpike(tt.create_trial(out)))
    assert rep.status == "IssuesFound"
    assert rep.fired_steps[0] == CORRUPT + 1
    v = rep.first_violations[0]
    assert v.tensor == "CrossEntropyLoss_output_0" and v.value == pytest.approx(rec["losses"][CORRUPT + 1])
    first = v.condition.split("; moved first: ")[1].split("), ")[0]
    assert first.startswith("the gradient norm of gradient/Sequential_2.weight (x")
    assert first.endswith(f"at step {CORRUPT}")
    assert rep.judged > 40


def test_grad_norm_spike_fires_at_the_corrupted_step(spiky, run_rule):
    out, _ = spiky
    trial = tt.create_trial(out)
    rep = run_rule(GradNormSpike(trial))
    assert rep.status == "IssuesFound" and rep.fired_steps[0] == CORRUPT
    total = np.sqrt(sum(float(trial.tensor(n).reduction_value(CORRUPT, "l2")) ** 2
                        for n in trial.tensor_names(collection="gradients")))
    assert rep.first_violations[0].value == pytest.approx(total, rel=1e-6)
    assert "gradient/Sequential_2.weight" in rep.first_violations[0].condition


def test_both_quiet_on_the_same_training_without_the_fault(healthy, run_rule):
    for cls in (LossSpike, GradNormSpike):
        rep = run_rule(cls(tt.create_trial(healthy)))
        assert rep.status == "NoIssuesFound", rep.first_violations
        assert rep.judged >= 70


def test_too_little_history_is_no_data(tmp_path, run_rule):
    out = str(tmp_path / "short")
    jobs.spike_job(out, steps=8, corrupt_step=None)
    rep = run_rule(LossSpike(tt.create_trial(out)))
    assert rep.status == "NoData" and "min_history" in rep.no_data_message()


def test_bad_parameters_are_one_line_errors(healthy):
    t = tt.create_trial(healthy)
    with pytest.raises(InvalidConfiguration, match="min_ratio"):
        LossSpike(t, min_ratio=0.5)
    with pytest.raises(InvalidConfiguration, match="window"):
        GradNormSpike(t, window="x")


def test_steps_written_after_the_rule_passed_them_are_judged_in_order(tmp_path):
    """The flight recorder writes its ring when it sees the spike, after those steps ended: a rule that was at
    step 0 when the ring came (save_interval=500: nothing else saved) judges the ring's steps, in order, at the
    next step it is invoked at, and finds the spike where it was."""
    out = str(tmp_path / "flight")
    jobs.spike_job(out, corrupt_step=CORRUPT, save_interval=500, flight=True)
    for cls, at in ((LossSpike, CORRUPT + 1), (GradNormSpike, CORRUPT)):
        rule = cls(tt.create_trial(out))
        rule.invoke(0)  # the rule's first step
        last = rule.base_trial.steps()[-1]
        assert last >= CORRUPT + 1  # the ring ends at the loss spike
        with pytest.raises(tt.exceptions.RuleEvaluationConditionMet):
            rule.invoke(last)  # the next step it is invoked at: after the ring
        v = rule.report.first_violations[0]
        assert v.step == at, (cls.__name__, v)
        assert "gradient/Sequential_2.weight" in v.condition
