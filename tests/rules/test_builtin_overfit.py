import numpy as np

import tensortap as tt
from tensortap.rules.builtin import Overfit


def mode_of(s):  # epochs of 10 train steps then an evaluation of 5 EVAL steps
    return tt.modes.EVAL if s % 15 >= 10 else tt.modes.TRAIN


def job_of(job, train, val, epochs=8, name="job"):
    """train(epoch), val(epoch): the losses of each epoch's TRAIN and EVAL steps."""

    def f(s):
        e = s // 15
        return np.float32(train(e) if mode_of(s) == tt.modes.TRAIN else val(e))

    return job(epochs * 15, {"loss": ("losses", f)}, mode_of=mode_of, name=name)


VAL_RISES = [0.8, 0.6, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def test_fires_when_the_validation_loss_rises_while_training_goes_on(job, run_rule):
    trial = job_of(job, lambda e: 1.0 / (e + 1), lambda e: VAL_RISES[e])
    rep = run_rule(Overfit(trial))
    # evaluations 3 and 4 are 20% and 40% above the best (0.5) and far above the training loss: patience 2
    assert rep.first_fired_step == 4 * 15 + 14  # judged when evaluation 4 is complete (5 EVAL steps)
    cond = rep.first_violations[0].condition
    assert "the validation loss 0.7 (evaluation 5, mean of 5 EVAL steps) is 250% above the training loss 0.2" in cond
    assert "40% above its best evaluation (0.5)" in cond and "for 2 evaluation(s) in a row" in cond, cond


def test_patience_and_start_step(job, run_rule):
    trial = job_of(job, lambda e: 1.0 / (e + 1), lambda e: VAL_RISES[e])
    assert run_rule(Overfit(trial, patience="1")).first_fired_step == 3 * 15 + 14
    assert run_rule(Overfit(tt.create_trial(trial.path), patience="1", start_step="75")).first_fired_step == 5 * 15 + 14


def test_fires_when_training_memorises_while_validation_stalls(job, run_rule):
    # validation flat from epoch 2 on, the training loss halves every epoch
    trial = job_of(job, lambda e: 0.5 ** e, lambda e: max(0.5, 0.8 - 0.15 * e))
    rep = run_rule(Overfit(trial))
    assert rep.triggered
    assert "while the training loss fell from" in rep.first_violations[0].condition


def test_a_generalisation_gap_alone_is_not_overfitting(job, run_rule):
    # validation 50% above training, both falling: smdebug's rule fired at the first evaluation
    trial = job_of(job, lambda e: 1.0 / (e + 1), lambda e: 1.5 / (e + 1))
    rep = run_rule(Overfit(trial, tensor_regex="^loss$"))
    assert not rep.triggered and rep.status == "NoIssuesFound" and rep.steps_evaluated == 8 * 15


def test_too_few_evaluations_is_no_data_not_no_issues(job, run_rule):
    trial = job_of(job, lambda e: 1.0 / (e + 1), lambda e: 5.0, epochs=2)
    rep = run_rule(Overfit(trial))
    assert rep.status == "NoData" and "min_evaluations" in rep.no_data_message()
