import numpy as np

import tensortap as tt
from tensortap.rules.builtin import FeatureImportanceOverweight


def importances(weights_at):
    def feature(i):
        return lambda s: np.float32(weights_at(s)[i])

    return {f"feature_importance/weight/f{i}": ("feature_importance", feature(i)) for i in range(6)}


FLAT = np.full(6, 1 / 6)
SKEW = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])


def test_fires_when_few_features_dominate_from_min_round(job, run_rule):
    # the first trees split on a few features whatever the data: rounds before min_round (20) are not judged
    trial = job(30, importances(lambda s: SKEW if s < 5 or s >= 25 else FLAT))
    rep = run_rule(FeatureImportanceOverweight(trial))
    assert rep.first_fired_step == 25 and abs(rep.first_violations[0].value - 0.9) < 1e-6
    cond = rep.first_violations[0].condition
    assert "hold 90% of the importance (more than 80%)" in cond and "f0 50%, f1 30%, f2 10%" in cond, cond
    rep = run_rule(FeatureImportanceOverweight(tt.create_trial(trial.path), min_round="0"))
    assert rep.first_fired_step == 0  # smdebug's behaviour: judged from round 0


def test_quiet_on_spread_importance(job, run_rule):
    trial = job(24, importances(lambda s: FLAT))
    rep = run_rule(FeatureImportanceOverweight(trial, threshold="0.8", nfeatures="3"))
    assert not rep.triggered and rep.steps_evaluated == 4 and rep.status == "NoIssuesFound"
