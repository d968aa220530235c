import numpy as np

import tensortap as tt
from tensortap.rules.builtin import LossNotDecreasing


def test_fires_when_loss_plateaus(job, run_rule):
    # decreasing until step 20, then flat; evaluated at 10, 20, 30, ...
    trial = job(50, {"loss": ("losses", lambda s: np.float32(100.0 - min(s, 20)))})
    rep = run_rule(LossNotDecreasing(trial))
    assert rep.first_fired_step == 30 and rep.fired_steps == [30, 40]
    assert rep.steps_evaluated == 50


def test_diff_percent(job, run_rule):
    trial = job(30, {"loss": ("losses", lambda s: np.float32(100.0 * 0.999 ** s))})
    assert not run_rule(LossNotDecreasing(trial, num_steps=5)).triggered
    rep = run_rule(LossNotDecreasing(tt.create_trial(trial.path), num_steps="5", diff_percent="1"))
    assert rep.first_fired_step == 5


def test_uses_eval_steps_when_present(job, run_rule):
    # TRAIN loss decreases, EVAL loss is flat: with mode=None the rule judges EVAL
    def mode_of(s):
        return tt.modes.EVAL if s >= 30 else tt.modes.TRAIN

    def loss(s):
        return np.float32(5.0) if s >= 30 else np.float32(100.0 - s)

    trial = job(60, {"loss": ("losses", loss)}, mode_of=mode_of)
    rep = run_rule(LossNotDecreasing(trial))
    assert rep.first_fired_step == 40
    assert not run_rule(LossNotDecreasing(tt.create_trial(trial.path), mode="TRAIN")).triggered


def test_quiet_on_decreasing_loss(job, run_rule):
    trial = job(50, {"loss": ("losses", lambda s: np.float32(1.0 / (s + 1)))})
    assert not run_rule(LossNotDecreasing(trial)).triggered
