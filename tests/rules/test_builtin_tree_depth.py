import numpy as np

import tensortap as tt
from tensortap.rules.builtin import TreeDepth


def nodes(depth):
    return lambda s: np.arange(2 ** (depth + 1) - 1, dtype=np.int64)  # complete tree, breadth-first ids


def test_fires_on_trees_deeper_than_depth(job, run_rule):
    # the default depth is XGBoost's own default max_depth, 6: a job left at XGBoost's defaults does not fire
    trial = job(3, {"trees/Node": ("trees", lambda s: nodes(8)(s) if s == 2 else nodes(6)(s))})
    rep = run_rule(TreeDepth(trial))
    assert rep.fired_steps == [2] and rep.first_violations[0].value == 8
    assert "8 levels deep" in rep.first_violations[0].condition and "depth=6" in rep.first_violations[0].condition
    assert run_rule(TreeDepth(tt.create_trial(trial.path), depth="4")).fired_steps == [0, 1, 2]


def test_quiet_at_the_allowed_depth(job, run_rule):
    trial = job(3, {"trees/Node": ("trees", nodes(4))})
    assert not run_rule(TreeDepth(trial, depth="4")).triggered
