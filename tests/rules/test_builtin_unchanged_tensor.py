import numpy as np

from tensortap.rules.builtin import UnchangedTensor


def test_fires_after_num_steps_unchanged(job, run_rule):
    # changes until step 5, then frozen: steps 5,6,7 are the first 3 equal saves
    trial = job(10, {"fc.weight": ("weights", lambda s: np.full(4, float(min(s, 5))))})
    rep = run_rule(UnchangedTensor(trial, collection_names="weights"))
    assert rep.first_fired_step == 7 and rep.fired_steps == [7, 8, 9]


def test_steps_need_not_be_consecutive(job, run_rule):
    trial = job(12, {"w": ("weights", lambda s: np.ones(3) if s % 3 == 0 else None)})
    rep = run_rule(UnchangedTensor(trial, tensor_regex="w", num_steps="2"))
    assert rep.first_fired_step == 3


def test_quiet_when_changing_and_tolerance(job, run_rule):
    trial = job(10, {"w": ("weights", lambda s: np.full(4, 1.0 + s * 1e-3))})
    assert not run_rule(UnchangedTensor(trial)).triggered
    rep = run_rule(UnchangedTensor(job(10, {"w": ("weights", lambda s: np.full(4, 1.0 + s * 1e-3))}, name="b"),
                                   atol="0.01"))
    assert rep.first_fired_step == 2
