import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin import VanishingGradient


def grads(scale_at):
    rng = np.random.default_rng(0)
    return lambda s: rng.standard_normal((4, 4)).astype(np.float32) * scale_at(s)


def test_fires_at_the_step_gradients_vanish(job, run_rule):
    trial = job(20, {"gradient/fc1.weight": ("gradients", grads(lambda s: 1e-9 if s >= 12 else 1.0)),
                     "gradient/fc2.weight": ("gradients", grads(lambda s: 1.0))})
    rep = run_rule(VanishingGradient(trial))
    assert rep.first_fired_step == 12
    assert rep.violations == 8
    v = rep.first_violations[0]
    assert v.tensor == "gradient/fc1.weight" and v.value < 1e-7
    assert rep.datapoints == 40 and rep.steps_evaluated == 20


def test_quiet_on_healthy_gradients(job, run_rule):
    trial = job(20, {"gradient/fc1.weight": ("gradients", grads(lambda s: 1.0))})
    rep = run_rule(VanishingGradient(trial, threshold="1e-7"))
    assert not rep.triggered and rep.steps_evaluated == 20


def test_uses_saved_abs_mean_reduction(job, run_rule):
    rc = tt.ReductionConfig(abs_reductions=["mean"])
    trial = job(6, {"gradient/w": ("gradients", lambda s: np.full(3, 1e-9 if s == 4 else 1.0, np.float32))},
                reduction_config=rc)
    rep = run_rule(VanishingGradient(trial))
    assert rep.first_fired_step == 4 and rep.fired_steps == [4]


def test_string_parameters_and_errors(job):
    trial = job(1, {"gradient/w": ("gradients", lambda s: np.ones(2))})
    assert VanishingGradient(trial, threshold="0.001").threshold == 0.001
    with pytest.raises(InvalidConfiguration, match="threshold"):
        VanishingGradient(trial, threshold="tiny")
