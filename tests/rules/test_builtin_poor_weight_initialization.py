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
    rep = run_rule(PoorWeightInitialization(make(job, var2=1e5)))
    assert rep.first_fired_step == 0 and "fold across layers" in rep.first_violations[0].condition
    assert rep.last_step_evaluated == 9  # only the first `steps` steps are judged


def test_default_threshold_allows_what_default_initialisations_give(job, run_rule):
    # PyTorch's default init shrinks the variance several-fold per layer: a 30-fold spread is healthy
    assert not run_rule(PoorWeightInitialization(make(job, var2=1 / 30))).triggered
    rep = run_rule(PoorWeightInitialization(make(job, var2=1 / 30, name="b"), threshold="10"))
    assert rep.first_fired_step == 0  # smdebug's threshold


def test_fires_on_collapsed_gradients(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job, grad_scale=1e-6)))
    assert rep.first_fired_step == 0 and "gradient" in rep.first_violations[0].condition


def test_fires_on_a_loss_that_does_not_move(job, run_rule):
    # judged once, at the last of the first `steps` saved steps: the median of the last `patience` losses
    # against the median of the first `patience`
    noisy_flat = [2.0, 1.9, 2.1, 2.0, 1.8, 2.2, 2.0, 2.1, 1.9, 2.0]
    rep = run_rule(PoorWeightInitialization(make(job, loss=lambda s: noisy_flat[s % 10]), patience=5))
    assert rep.fired_steps == [9] and rep.first_violations[0].tensor == "loss"
    assert "has not moved over the first 10 saved steps" in rep.first_violations[0].condition


def test_an_early_plateau_that_the_loss_leaves_is_not_poor_initialisation(job, run_rule):
    # flat for 6 saved steps (mini-batch noise), then falling: smdebug's single-value patience fired at step 5
    def loss(s):
        return [1.38, 1.36, 1.39, 1.37, 1.38, 1.36, 1.2, 1.0, 0.8, 0.6][s % 10]

    assert not run_rule(PoorWeightInitialization(make(job, loss=loss), patience=5)).triggered


def test_quiet_on_a_good_initialisation(job, run_rule):
    rep = run_rule(PoorWeightInitialization(make(job), steps="20"))
    assert not rep.triggered and rep.steps_evaluated == 20
