import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin import AllZero


def test_fires_when_all_zero(job, run_rule):
    trial = job(10, {"relu_out": ("outputs", lambda s: np.zeros(8) if s >= 4 else np.arange(8.0))})
    rep = run_rule(AllZero(trial, collection_names="outputs"))
    assert rep.first_fired_step == 4 and rep.violations == 6


def test_threshold_percent(job, run_rule):
    trial = job(3, {"t": ("outputs", lambda s: np.array([0, 0, 0, s + 1.0]))})
    assert run_rule(AllZero(trial, tensor_regex="^t$", threshold="75")).fired_steps == [0, 1, 2]


def test_quiet_when_not_all_zero(job, run_rule):
    trial = job(6, {"t": ("outputs", lambda s: np.array([0, 0, 1.0]))})
    assert not run_rule(AllZero(trial, tensor_regex="t")).triggered


def test_needs_collection_or_regex(job):
    trial = job(1, {"t": ("outputs", lambda s: np.zeros(2))})
    with pytest.raises(InvalidConfiguration, match="collection_names or tensor_regex"):
        AllZero(trial)
