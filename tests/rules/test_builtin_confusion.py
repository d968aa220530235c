import numpy as np

import tensortap as tt
from tensortap.rules.builtin import Confusion

Y = np.array([0, 1, 2] * 10)


def test_fires_when_predictions_go_wrong(job, run_rule):
    # 30 labels a step: the first 500 are a warm-up (steps 0-16), then the latest 500 are judged
    def preds(s):
        return np.zeros_like(Y) if s >= 40 else Y.copy()

    trial = job(60, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)})
    rep = run_rule(Confusion(trial))
    assert rep.first_fired_step == 48  # class 0's predictions are mostly wrong once 9 of 17 steps are wrong
    conds = " ".join(v.condition for v in rep.first_violations)
    assert "class 0: only 49% of the 350 predictions of class 0 of the latest 510 labels are right" in conds, conds
    rep = run_rule(Confusion(tt.create_trial(trial.path), min_diag="0.9", max_off_diag="0.1"))
    assert rep.first_fired_step == 40  # smdebug's thresholds
    assert "label 1 predicted as 0" in " ".join(v.condition for v in rep.last_violations)


def test_a_learning_model_is_not_judged_on_its_first_guesses(job, run_rule):
    trial = job(40, {"labels": ("labels", lambda s: Y),
                     "predictions": ("predictions", lambda s: np.zeros_like(Y) if s < 10 else Y.copy())})
    rep = run_rule(Confusion(trial))
    assert not rep.triggered and rep.status == "NoIssuesFound"
    assert run_rule(Confusion(job(20, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", lambda s: Y)},
                                  name="b"))).status == "NoData"  # 600 < 2 * samples labels


def test_probability_predictions_and_category_no(job, run_rule):
    eye = np.eye(4)[Y]  # one-hot over 4 classes, class 3 never occurs
    trial = job(40, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", lambda s: eye)})
    rep = run_rule(Confusion(trial, category_no="4"))
    assert not rep.triggered and rep.status == "NoIssuesFound"


def test_quiet_on_good_predictions(job, run_rule):
    def preds(s):
        p = Y.copy()
        p[0] = 1  # one mistake in 30: column 1 has 10/11 correct = 0.909 >= 0.9
        return p

    trial = job(40, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)})
    rep = run_rule(Confusion(trial, min_diag="0.9", max_off_diag="0.1"))
    assert not rep.triggered and rep.steps_evaluated == 40
    rep = run_rule(Confusion(job(40, {"labels": ("labels", lambda s: Y), "predictions": ("predictions", preds)},
                                 name="b"), min_diag="0.95"))
    assert rep.first_fired_step == 33  # judged from 2 * samples labels on
