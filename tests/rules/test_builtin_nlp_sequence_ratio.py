import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin import NLPSequenceRatio


def seqs(pad_at):
    def f(s):
        x = np.arange(1, 101).reshape(4, 25)
        k = int(25 * pad_at(s))
        x[:, 25 - k:] = 0
        return x

    return f


def test_fires_on_too_much_padding(job, run_rule):
    trial = job(6, {"embedding0_input_0": ("inputs", seqs(lambda s: 0.8 if s >= 3 else 0.2))})
    rep = run_rule(NLPSequenceRatio(trial))
    assert rep.first_fired_step == 3 and rep.first_violations[0].value == 80.0


def test_several_tokens(job, run_rule):
    trial = job(2, {"embedding0_input_0": ("inputs", lambda s: np.array([[0, 0, 2, 2, 2, 3]]))})
    rep = run_rule(NLPSequenceRatio(trial, token_values="0,2", token_thresholds_percent="50,40"))
    assert rep.fired_steps == [0, 1] and rep.first_violations[0].condition.startswith("token 2")


def test_quiet_and_errors(job, run_rule):
    trial = job(6, {"embedding0_input_0": ("inputs", seqs(lambda s: 0.2))})
    assert not run_rule(NLPSequenceRatio(trial)).triggered
    with pytest.raises(InvalidConfiguration, match="token_thresholds_percent"):
        NLPSequenceRatio(trial, token_values="0,1,2", token_thresholds_percent="1,2")
