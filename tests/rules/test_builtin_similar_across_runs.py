import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.builtin import SimilarAcrossRuns


def weights(diverge_at=None):
    return lambda s: np.full((3, 3), float(s) + (0.5 if diverge_at is not None and s >= diverge_at else 0.0))


def test_fires_where_runs_diverge(job, run_rule):
    base = job(10, {"fc.weight": ("weights", weights())}, name="a")
    other = job(10, {"fc.weight": ("weights", weights(diverge_at=6))}, name="b")
    rep = run_rule(SimilarAcrossRuns(base, other))
    assert rep.first_fired_step == 6 and rep.violations == 4
    assert rep.first_violations[0].trial == str(other.path)


def test_quiet_on_identical_runs_and_accepts_paths(job, run_rule):
    base = job(10, {"fc.weight": ("weights", weights())}, name="a")
    other = job(10, {"fc.weight": ("weights", weights())}, name="b")
    rep = run_rule(SimilarAcrossRuns(base, str(other.path), collection_names="weights"))
    assert not rep.triggered and rep.steps_evaluated == 10


def test_shorter_other_run_is_not_an_error(job, run_rule):
    base = job(10, {"w": ("weights", weights())}, name="a")
    other = job(5, {"w": ("weights", weights())}, name="b")
    rep = run_rule(SimilarAcrossRuns(base, other))
    assert not rep.triggered and rep.steps_evaluated == 5


def test_other_trials_required(job):
    base = job(1, {"w": ("weights", weights())})
    with pytest.raises(InvalidConfiguration, match="other_trials"):
        SimilarAcrossRuns(base, None)
