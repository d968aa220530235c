import numpy as np

from tensortap.rules.builtin import ClassImbalance


def test_fires_after_enough_samples_of_one_class(job, run_rule):
    logits = np.tile(np.array([[2.0, 0.1, 0.1]]), (100, 1))
    trial = job(10, {"labels": ("labels", lambda s: np.zeros(100, np.int64)),
                     "predictions": ("predictions", lambda s: logits)})
    rep = run_rule(ClassImbalance(trial, argmax="True"))
    assert rep.first_fired_step == 4  # 500 samples seen after step 4
    assert "imbalance inf" in rep.first_violations[0].condition


def test_fires_on_mispredicted_minority_class(job, run_rule):
    y = np.array([0] * 60 + [1] * 40)
    p = np.zeros(100, np.int64)  # class 1 is always mispredicted
    trial = job(6, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: p)})
    rep = run_rule(ClassImbalance(trial))
    assert rep.first_fired_step == 4
    assert any("class 1" in v.condition and "mispredicted" in v.condition for v in rep.first_violations)


def test_quiet_on_balanced_well_predicted_classes(job, run_rule):
    y = np.arange(100) % 4
    trial = job(10, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: y)})
    rule = ClassImbalance(trial)
    rep = run_rule(rule)
    assert not rep.triggered and rule.seen == 1000 and rep.steps_evaluated == 10
