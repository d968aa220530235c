import numpy as np

from tensortap.rules.builtin import DeadRelu


def relu_out(dead_frac_at):
    rng = np.random.default_rng(2)

    def f(s):
        x = np.maximum(rng.standard_normal((32, 20)), 0)
        k = int(20 * dead_frac_at(s))
        x[:, :k] = 0.0
        return x

    return f


def test_fires_when_most_units_die(job, run_rule):
    trial = job(10, {"net_relu_output_0": ("outputs", relu_out(lambda s: 0.8 if s >= 6 else 0.1))})
    rep = run_rule(DeadRelu(trial))
    assert rep.first_fired_step == 6 and rep.violations == 4
    assert rep.first_violations[0].value == 80.0


def test_quiet_when_units_live_and_custom_regex(job, run_rule):
    trial = job(10, {"act1": ("outputs", relu_out(lambda s: 0.3))})
    assert not run_rule(DeadRelu(trial, tensor_regex="act1")).triggered
    rep = run_rule(DeadRelu(job(10, {"act1": ("outputs", relu_out(lambda s: 0.3))}, name="b"),
                            tensor_regex="act1", threshold_layer="20"))
    assert rep.first_fired_step == 0
