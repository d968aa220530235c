import numpy as np

from tensortap.rules.builtin import FeatureImportanceOverweight


def importances(weights_at):
    def feature(i):
        return lambda s: np.float32(weights_at(s)[i])

    return {f"feature_importance/weight/f{i}": ("feature_importance", feature(i)) for i in range(6)}


def test_fires_when_few_features_dominate(job, run_rule):
    flat = np.full(6, 1 / 6)
    skew = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])
    trial = job(4, importances(lambda s: skew if s >= 2 else flat))
    rep = run_rule(FeatureImportanceOverweight(trial))
    assert rep.first_fired_step == 2 and abs(rep.first_violations[0].value - 0.9) < 1e-6


def test_quiet_on_spread_importance(job, run_rule):
    trial = job(4, importances(lambda s: np.full(6, 1 / 6)))
    rep = run_rule(FeatureImportanceOverweight(trial, threshold="0.8", nfeatures="3"))
    assert not rep.triggered and rep.steps_evaluated == 4
