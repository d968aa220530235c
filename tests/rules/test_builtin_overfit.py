import numpy as np

import tensortap as tt
from tensortap.rules.builtin import Overfit


def mode_of(s):  # epochs of 10 train steps then 5 eval steps
    return tt.modes.EVAL if s % 15 >= 10 else tt.modes.TRAIN


def losses(val_gap_from_epoch):
    def f(s):
        epoch = s // 15
        train = 1.0 / (epoch + 1)
        if mode_of(s) == tt.modes.TRAIN:
            return np.float32(train)
        return np.float32(train * (1.5 if epoch >= val_gap_from_epoch else 1.05))

    return f


def test_fires_when_validation_loss_pulls_away(job, run_rule):
    trial = job(60, {"loss": ("losses", losses(2))}, mode_of=mode_of)
    rep = run_rule(Overfit(trial))
    assert rep.first_fired_step == 40  # first eval step of epoch 2


def test_patience_and_start_step(job, run_rule):
    trial = job(60, {"loss": ("losses", losses(2))}, mode_of=mode_of)
    assert run_rule(Overfit(trial, patience="3")).first_fired_step == 42
    rep = run_rule(Overfit(tt.create_trial(trial.path), start_step="50"))
    assert rep.first_fired_step == 55


def test_quiet_without_gap(job, run_rule):
    trial = job(60, {"loss": ("losses", losses(99))}, mode_of=mode_of)
    rep = run_rule(Overfit(trial, tensor_regex="^loss$"))
    assert not rep.triggered and rep.steps_evaluated == 60
