import numpy as np

import tensortap as tt
from tensortap.rules.builtin import Overtraining


def test_fires_when_training_loss_stops_improving(job, run_rule):
    trial = job(20, {"loss": ("losses", lambda s: np.float32(10.0 - min(s, 8)))})
    rep = run_rule(Overtraining(trial))
    assert rep.first_fired_step == 13  # best at 8, then 5 steps without improvement


def test_validation_patience(job, run_rule):
    def mode_of(s):
        return tt.modes.EVAL if s >= 10 else tt.modes.TRAIN

    trial = job(30, {"loss": ("losses", lambda s: np.float32(10.0 - s if s < 10 else 3.0))}, mode_of=mode_of)
    rep = run_rule(Overtraining(trial, patience_validation="10"))
    assert rep.first_fired_step == 20


def test_quiet_while_improving(job, run_rule):
    trial = job(20, {"loss": ("losses", lambda s: np.float32(10.0 - 0.5 * s))})
    assert not run_rule(Overtraining(trial)).triggered
