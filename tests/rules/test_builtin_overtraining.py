import numpy as np

import tensortap as tt
from tensortap.rules.builtin import Overtraining

NOISE = np.random.default_rng(1).uniform(-1, 1, 1000)


def test_fires_when_training_loss_stops_improving(job, run_rule):
    # best median-of-5 at step 10, then flat: patience_train saved steps later it fires
    trial = job(70, {"loss": ("losses", lambda s: np.float32(10.0 - min(s, 8)))})
    rep = run_rule(Overtraining(trial, patience_train="10"))
    assert rep.first_fired_step == 20  # the median of the last 5 reaches its best, 2, at step 10
    assert "has not improved on its best 2 by more than 0 for 10 saved steps" in rep.first_violations[0].condition
    assert run_rule(Overtraining(tt.create_trial(trial.path))).first_fired_step == 50  # patience_train 40


def test_a_noisy_training_loss_is_judged_by_its_trend(job, run_rule):
    # slowly falling with +-20% mini-batch noise: single values miss their best by chance, the median does not
    trial = job(200, {"loss": ("losses", lambda s: np.float32((1.0 - 0.002 * s) * (1 + 0.2 * NOISE[s])))})
    assert not run_rule(Overtraining(trial)).triggered
    assert run_rule(Overtraining(tt.create_trial(trial.path), patience_train="5", window="1")).triggered  # smdebug's


def test_validation_patience_counts_evaluations(job, run_rule):
    def mode_of(s):  # epochs of 10 TRAIN steps and 3 EVAL steps
        return tt.modes.EVAL if s % 13 >= 10 else tt.modes.TRAIN

    def loss(s):
        e = s // 13
        return np.float32(1.0 / (e + 1) if mode_of(s) == tt.modes.TRAIN else max(0.5, 1.0 - 0.1 * e))

    trial = job(13 * 20, {"loss": ("losses", loss)}, mode_of=mode_of)
    rep = run_rule(Overtraining(trial, patience_validation="4"))
    # the validation loss is best (0.5) at evaluation 5 and flat after: the 4th evaluation after it fires
    assert rep.first_fired_step == 9 * 13 + 12  # judged once the evaluation is complete (3 EVAL steps)
    assert "for 4 evaluations (patience_validation 4)" in rep.first_violations[0].condition


def test_quiet_while_improving(job, run_rule):
    trial = job(100, {"loss": ("losses", lambda s: np.float32(10.0 - 0.05 * s))})
    rep = run_rule(Overtraining(trial))
    assert not rep.triggered and rep.status == "NoIssuesFound"
