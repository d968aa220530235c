import numpy as np

import tensortap as tt
from tensortap.rules.builtin import LossNotDecreasing

NOISE = np.random.default_rng(0).uniform(-1, 1, 1000)


def test_fires_when_the_loss_never_falls(job, run_rule):
    # noisy around 2.0 and creeping up: judged from 4 windows of 5 saved steps on (the warm-up, step 19)
    trial = job(40, {"loss": ("losses", lambda s: np.float32(2.0 + 0.01 * s + 0.05 * NOISE[s]))})
    rep = run_rule(LossNotDecreasing(trial))
    assert rep.first_fired_step == 19 and rep.status == "IssuesFound"
    cond = rep.first_violations[0].condition
    assert "the TRAIN loss stopped decreasing before it fell" in cond and "over steps 15-19" in cond, cond
    assert "over steps 0-4" in cond and "a loss that learns falls more than 10%" in cond, cond


def test_a_noisy_mini_batch_loss_that_falls_does_not_fire(job, run_rule):
    # the case: two single mini-batch losses 10 steps apart often go up; the trend does not
    def loss(s):
        return np.float32((0.15 + 0.85 * np.exp(-s / 80)) * (1 + 0.15 * NOISE[s]))

    trial = job(400, {"loss": ("losses", loss)})
    rep = run_rule(LossNotDecreasing(trial))
    assert not rep.triggered and rep.status == "NoIssuesFound" and rep.judged > 30


def test_a_converged_plateau_does_not_fire_unless_asked(job, run_rule):
    # falls 2.0 -> 0.5 by step 30, then a noisy plateau: converged, not "not decreasing"
    def loss(s):
        return np.float32(max(0.5, 2.0 - 0.05 * s) + 0.02 * NOISE[s])

    trial = job(120, {"loss": ("losses", loss)})
    assert not run_rule(LossNotDecreasing(trial)).triggered
    # min_drop_percent=100: every plateau counts, as in smdebug
    rep = run_rule(LossNotDecreasing(tt.create_trial(trial.path), min_drop_percent="100"))
    assert rep.triggered and rep.first_fired_step >= 35


def test_diff_percent(job, run_rule):
    trial = job(60, {"loss": ("losses", lambda s: np.float32(100.0 * 0.999 ** s))})
    assert not run_rule(LossNotDecreasing(trial, num_steps=5, min_drop_percent=100)).triggered
    # a 0.1% fall per step is less than 5% over the 10 steps between the window medians
    rep = run_rule(LossNotDecreasing(tt.create_trial(trial.path), num_steps="5", diff_percent="5",
                                     min_drop_percent="100"))
    assert rep.first_fired_step == 19
    assert "is not more than 5% below" in rep.first_violations[0].condition


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
    assert rep.first_fired_step == 49 and rep.to_dict()["parameters"]["mode_judged"] == "EVAL"
    assert "the EVAL loss" in rep.first_violations[0].condition


def test_train_default_does_not_switch_when_eval_appears(job, run_rule):
    # one EVAL step per "epoch" of 20 TRAIN steps; the TRAIN loss never falls: judged on TRAIN steps throughout
    def mode_of(s):
        return tt.modes.EVAL if s % 21 == 20 else tt.modes.TRAIN

    trial = job(84, {"loss": ("losses", lambda s: np.float32(1.0 if s % 21 == 20 else 3.0 + s % 2))},
                mode_of=mode_of)
    rep = run_rule(LossNotDecreasing(trial, num_steps=10))
    assert rep.triggered and rep.fired_steps[0] == 19
    assert not rep.warnings


def test_warns_when_few_points_were_judged(job, run_rule):
    trial = job(30, {"loss": ("losses", lambda s: np.float32(100.0 - s))})
    rep = run_rule(LossNotDecreasing(trial, num_steps=10))
    assert not rep.triggered
    assert any("only 2 comparison(s) of the TRAIN loss" in w for w in rep.warnings), rep.warnings


def test_no_data_before_the_warm_up_ends(job, run_rule):
    trial = job(19, {"loss": ("losses", lambda s: np.float32(1.0))})
    assert run_rule(LossNotDecreasing(trial)).status == "NoData"


def test_quiet_on_decreasing_loss(job, run_rule):
    trial = job(50, {"loss": ("losses", lambda s: np.float32(1.0 / (s + 1)))})
    assert not run_rule(LossNotDecreasing(trial)).triggered
