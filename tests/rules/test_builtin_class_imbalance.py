import numpy as np

from tensortap.rules.builtin import ClassImbalance


def test_fires_after_enough_samples_of_one_class(job, run_rule):
    logits = np.tile(np.array([[2.0, 0.1, 0.1]]), (100, 1))
    trial = job(10, {"labels": ("labels", lambda s: np.zeros(100, np.int64)),
                     "predictions": ("predictions", lambda s: logits)})
    rep = run_rule(ClassImbalance(trial, argmax="True"))
    assert rep.first_fired_step == 4  # 500 samples seen after step 4
    assert "the largest has inf times the labels of the smallest" in rep.first_violations[0].condition


def test_fires_on_mispredicted_minority_class(job, run_rule):
    y = np.array([0] * 80 + [1] * 20)
    p = np.zeros(100, np.int64)  # class 1 (under-represented: 20% < half of an even 50%) is always mispredicted
    trial = job(12, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: p)})
    rep = run_rule(ClassImbalance(trial))
    assert rep.first_fired_step == 9  # the first 500 labels are a warm-up, then the latest 500 are judged
    want = "under-represented class 1 is mostly mispredicted: 100% of its 100 labels among the latest 500"
    assert any(want in v.condition for v in rep.first_violations), rep.first_violations


def test_a_model_that_learns_is_not_blamed_for_its_first_guesses(job, run_rule):
    y = np.array([0] * 80 + [1] * 20)
    # class 1 mispredicted for the first 10 steps (1000 labels), then learnt: only the latest 500 count
    trial = job(20, {"labels": ("labels", lambda s: y),
                     "predictions": ("predictions", lambda s: np.zeros(100, np.int64) if s < 10 else y)})
    rep = run_rule(ClassImbalance(trial))
    assert rep.fired_steps == [9, 10]  # until the wrong guesses are no more than 70% of the window
    assert rep.status == "IssuesFound"
    trial = job(20, {"labels": ("labels", lambda s: y),
                     "predictions": ("predictions", lambda s: np.zeros(100, np.int64) if s < 4 else y)}, name="b")
    assert not run_rule(ClassImbalance(trial)).triggered


def test_a_mispredicted_class_that_is_not_under_represented_is_not_imbalance(job, run_rule):
    y = np.array([0] * 60 + [1] * 40)  # class 1 has 40%: a model still learning it is not an imbalance issue
    trial = job(12, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: np.zeros(100, int))})
    assert not run_rule(ClassImbalance(trial)).triggered


def test_no_data_until_samples_were_seen(job, run_rule):
    y = np.arange(100) % 4
    trial = job(4, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: y)})
    assert run_rule(ClassImbalance(trial)).status == "NoData"  # 400 < samples labels: never judged


def test_quiet_on_balanced_well_predicted_classes(job, run_rule):
    y = np.arange(100) % 4
    trial = job(10, {"labels": ("labels", lambda s: y), "predictions": ("predictions", lambda s: y)})
    rule = ClassImbalance(trial)
    rep = run_rule(rule)
    assert not rep.triggered and rule.seen == 1000 and rep.steps_evaluated == 10
