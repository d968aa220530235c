import numpy as np

import tensortap as tt
from tensortap.rules.builtin import WeightUpdateRatio


def w(update):
    state = {"w": np.ones((4, 4))}

    def f(s):
        state["w"] = state["w"] + update(s)
        return state["w"].copy()

    return f


def test_fires_on_a_huge_update(job, run_rule):
    trial = job(10, {"fc.weight": ("weights", w(lambda s: 1000.0 if s == 6 else 0.01))})
    rep = run_rule(WeightUpdateRatio(trial))
    assert rep.first_fired_step == 6 and rep.fired_steps == [6]
    assert rep.first_violations[0].value > 10


def test_fires_on_frozen_weights(job, run_rule):
    trial = job(8, {"fc.weight": ("weights", w(lambda s: 0.0 if s >= 5 else 0.01))})
    rep = run_rule(WeightUpdateRatio(trial, small_threshold="1e-8"))
    assert rep.first_fired_step == 5


def test_quiet_on_normal_updates(job, run_rule):
    trial = job(10, {"fc.weight": ("weights", w(lambda s: 0.01))})
    rep = run_rule(WeightUpdateRatio(trial))
    assert not rep.triggered and rep.steps_evaluated == 9  # the first step has no previous one


def test_num_steps_and_train_steps_only(job, run_rule):
    # EVAL steps (every 4th) repeat the weights: they must not count as "no update"
    def mode_of(s):
        return tt.modes.EVAL if s % 4 == 3 else tt.modes.TRAIN

    trial = job(12, {"fc.weight": ("weights", w(lambda s: 0.0 if s % 4 == 3 else 0.01))}, mode_of=mode_of)
    assert not run_rule(WeightUpdateRatio(trial)).triggered
    rep = run_rule(WeightUpdateRatio(tt.create_trial(trial.path), num_steps="2", large_threshold="0.001"))
    assert rep.triggered and rep.first_fired_step == 1
