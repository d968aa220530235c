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


def test_judges_train_by_default_and_eval_only_when_asked(job, run_rule):
    # TRAIN loss decreases, EVAL loss is flat: by default the rule judges TRAIN, and says so
    def mode_of(s):
        return tt.modes.EVAL if s >= 30 else tt.modes.TRAIN

    def loss(s):
        return np.float32(5.0) if s >= 30 else np.float32(100.0 - s)

    trial = job(60, {"loss": ("losses", loss)}, mode_of=mode_of)
    rep = run_rule(LossNotDecreasing(trial))
    assert not rep.triggered and rep.status == "NoIssuesFound"
    assert rep.to_dict()["parameters"]["mode_judged"] == "TRAIN"
    assert rep.steps_evaluated == 30  # the TRAIN steps only
    rep = run_rule(LossNotDecreasing(tt.create_trial(trial.path), mode="EVAL"))
    assert rep.first_fired_step == 40 and rep.to_dict()["parameters"]["mode_judged"] == "EVAL"


def test_train_default_does_not_switch_when_eval_appears(job, run_rule):
    # one EVAL step per "epoch" of 20 TRAIN steps; the TRAIN loss never falls: judged on TRAIN steps throughout
    def mode_of(s):
        return tt.modes.EVAL if s % 21 == 20 else tt.modes.TRAIN

    trial = job(84, {"loss": ("losses", lambda s: np.float32(1.0 if s % 21 == 20 else 3.0 + s % 2))},
                mode_of=mode_of)
    rep = run_rule(LossNotDecreasing(trial, num_steps=10))
    assert rep.triggered and rep.fired_steps[0] == 10
    assert not rep.warnings


def test_warns_when_few_points_were_judged(job, run_rule):
    trial = job(25, {"loss": ("losses", lambda s: np.float32(100.0 - s))})
    rep = run_rule(LossNotDecreasing(trial, num_steps=10))
    assert not rep.triggered
    assert any("only 2 comparison(s) of the TRAIN loss" in w for w in rep.warnings), rep.warnings


def test_quiet_on_decreasing_loss(job, run_rule):
    trial = job(50, {"loss": ("losses", lambda s: np.float32(1.0 / (s + 1)))})
    assert not run_rule(LossNotDecreasing(trial)).triggered
