import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin import TensorVariance


def test_fires_above_max_and_below_min(job, run_rule):
    rng = np.random.default_rng(3)
    trial = job(10, {"w": ("weights", lambda s: rng.standard_normal(100) * (10.0 if s == 3 else 1.0)),
                     "b": ("biases", lambda s: np.full(5, 1.0) if s >= 7 else rng.standard_normal(5))})
    rep = run_rule(TensorVariance(trial, max_threshold="10", min_threshold="1e-6"))
    assert rep.fired_steps == [3, 7, 8, 9]
    assert rep.first_violations[0].tensor == "w"


def test_quiet_inside_bounds(job, run_rule):
    rng = np.random.default_rng(4)
    trial = job(10, {"w": ("weights", lambda s: rng.standard_normal(100))})
    assert not run_rule(TensorVariance(trial, collection_names="weights", max_threshold=5, min_threshold=0.1)).triggered


def test_needs_a_threshold(job):
    trial = job(1, {"w": ("weights", lambda s: np.ones(2))})
    with pytest.raises(InvalidConfiguration, match="threshold"):
        TensorVariance(trial, tensor_regex="w")
