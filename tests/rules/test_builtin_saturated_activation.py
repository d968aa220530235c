import numpy as np

from tensortap.rules.builtin import SaturatedActivation


def pre(scale_at):
    rng = np.random.default_rng(6)
    return lambda s: rng.standard_normal((64, 10)) * scale_at(s)


def test_fires_when_tanh_and_sigmoid_saturate(job, run_rule):
    trial = job(10, {"net_tanh_input_0": ("inputs", pre(lambda s: 1e5 if s >= 4 else 1.0)),
                     "net_sigmoid_input_0": ("inputs", pre(lambda s: 1e5 if s >= 7 else 1.0))})
    rep = run_rule(SaturatedActivation(trial))
    assert rep.first_fired_step == 4 and rep.violations == 6
    assert {v.tensor for v in rep.last_violations} == {"net_tanh_input_0", "net_sigmoid_input_0"}


def test_custom_ranges(job, run_rule):
    trial = job(3, {"x_tanh_input": ("inputs", lambda s: np.full((8, 4), 3.0))})
    assert not run_rule(SaturatedActivation(trial)).triggered
    trial2 = job(3, {"x_tanh_input": ("inputs", lambda s: np.full((8, 4), 3.0))}, name="b")
    assert run_rule(SaturatedActivation(trial2, threshold_tanh="(-2, 2)")).first_fired_step == 0


def test_quiet_on_moderate_inputs(job, run_rule):
    trial = job(10, {"net_sigmoid_input_0": ("inputs", pre(lambda s: 2.0))})
    rep = run_rule(SaturatedActivation(trial))
    assert not rep.triggered and rep.steps_evaluated == 10
