import numpy as np

from tensortap.rules.builtin import TreeDepth


def nodes(depth):
    return lambda s: np.arange(2 ** (depth + 1) - 1, dtype=np.int64)  # complete tree, breadth-first ids


def test_fires_on_trees_deeper_than_depth(job, run_rule):
    trial = job(3, {"trees/Node": ("trees", lambda s: nodes(6)(s) if s == 2 else nodes(3)(s))})
    rep = run_rule(TreeDepth(trial))
    assert rep.fired_steps == [2] and rep.first_violations[0].value == 6


def test_quiet_at_the_allowed_depth(job, run_rule):
    trial = job(3, {"trees/Node": ("trees", nodes(4))})
    assert not run_rule(TreeDepth(trial, depth="4")).triggered
