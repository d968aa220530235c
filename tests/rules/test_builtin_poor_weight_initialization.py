import numpy as np

from tensortap.rules.builtin import PoorWeightInitialization


def make(job, var2=1.0, grad_scale=1.0, loss=lambda s: 1.0 / (s + 1), name="job"):
    rng = np.random.default_rng(5)
    return job(20, {
        "Net_fc1_relu_input": ("relu_input", lambda s: rng.standard_normal((16, 8))),
        "Net_fc2_relu_input": ("relu_input", lambda s: rng.standard_normal((16, 8)) * np.sqrt(var2)),
        "gradient/fc1.weight": ("gradients", lambda s: rng.standard_normal(64) * grad_scale),
        "loss": ("losses", lambda s: np.float32(loss(s))),
    }, name=name)


def test_fires_on_mismatched_layer_variance(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job, var2=1000.0)))
    assert rep.first_fired_step == 0 and "variance ratio" in rep.first_violations[0].condition
    assert rep.last_step_evaluated == 9  # only the first `steps` steps are judged


def test_fires_on_collapsed_gradients(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job, grad_scale=1e-6)))
    assert rep.first_fired_step == 0 and "gradient" in rep.first_violations[0].condition


def test_fires_on_a_loss_that_does_not_move(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job, loss=lambda s: 2.0), patience=5))
    assert rep.first_fired_step == 5 and rep.first_violations[0].tensor == "loss"


def test_quiet_on_a_good_initialisation(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job), steps="20"))
    assert not rep.triggered and rep.steps_evaluated == 20
