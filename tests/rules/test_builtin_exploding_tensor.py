import numpy as np

import tensortap as tt
from tensortap.rules.builtin import ExplodingTensor


def test_fires_on_nan_and_inf(job, run_rule):
    def w(s):
        a = np.ones(5, np.float32)
        if s == 7:
            a[2] = np.inf
        if s >= 9:
            a[0] = np.nan
        return a

    trial = job(12, {"fc.weight": ("weights", w), "loss": ("losses", lambda s: np.float32(1.0))})
    rep = run_rule(ExplodingTensor(trial))
    assert rep.first_fired_step == 7 and rep.fired_steps == [7, 9, 10, 11]
    assert rep.first_violations[0].tensor == "fc.weight" and rep.first_violations[0].value == "inf"
    rep2 = run_rule(ExplodingTensor(tt.create_trial(trial.path), only_nan="true"))
    assert rep2.first_fired_step == 9


def test_restricted_by_collection_and_regex(job, run_rule):
    trial = job(5, {"a": ("weights", lambda s: np.array([np.nan])), "b": ("gradients", lambda s: np.ones(2))})
    assert not run_rule(ExplodingTensor(trial, collection_names="gradients")).triggered
    assert run_rule(ExplodingTensor(tt.create_trial(trial.path), tensor_regex="^a$")).first_fired_step == 0


def test_quiet_on_finite_values(job, run_rule):
    trial = job(10, {"fc.weight": ("weights", lambda s: np.arange(6, dtype=np.float32) * s)})
    rep = run_rule(ExplodingTensor(trial))
    assert not rep.triggered and rep.steps_evaluated == 10


def test_reductions_only_tensors(job, run_rule):
    rc = tt.ReductionConfig(reductions=["max"])
    trial = job(4, {"w": ("weights", lambda s: np.array([1.0, np.nan if s == 2 else 0.0]))}, reduction_config=rc)
    assert run_rule(ExplodingTensor(trial)).fired_steps == [2]
