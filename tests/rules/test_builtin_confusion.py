import numpy as np

from tensortap.rules.builtin import Confusion

Y = np.array([0, 1, 2] * 10)


def test_fires_when_predictions_go_wrong(job, run_rule):
    def preds(s):
        return np.zeros_like(Y) if s >= 5 else Y.copy()

    trial = job(8, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)})
    rep = run_rule(Confusion(trial))
    assert rep.first_fired_step == 5 and rep.violations == 3
    conds = " ".join(v.condition for v in rep.first_violations)
    assert "class 0" in conds and "predicted as 0" in conds


def test_probability_predictions_and_category_no(job, run_rule):
    eye = np.eye(4)[Y]  # one-hot over 4 classes, class 3 never occurs
    trial = job(3, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", lambda s: eye)})
    assert not run_rule(Confusion(trial, category_no="4")).triggered


def test_quiet_on_good_predictions(job, run_rule):
    def preds(s):
        p = Y.copy()
        p[0] = 1  # one mistake in 30: column 1 has 10/11 correct = 0.909 >= 0.9
        return p

    trial = job(5, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)})
    rep = run_rule(Confusion(trial))
    assert not rep.triggered and rep.steps_evaluated == 5
    rep = run_rule(Confusion(job(5, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)},
                                 name="b"), min_diag="0.95"))
    assert rep.first_fired_step == 0
