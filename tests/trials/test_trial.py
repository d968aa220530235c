"""Trial and Tensor semantics on jobs written through the generic Hook."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.analysis.utils import no_refresh, refresh
from tensortap.exceptions import (
    InvalidConfiguration,
    InvalidWorker,
    NoMoreData,
    ShapeUnavailableForStep,
    StepNotYetAvailable,
    StepUnavailable,
    TensorTapError,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from tensortap.trials import StepState


def _job(path, close=True, **kw):
    """TRAIN global 0..5, EVAL global 6..9 (mode steps 0..3); `w` every 2nd mode step, loss every step."""
    hook = tt.Hook(str(path), save_config=tt.SaveConfig(save_interval=2), include_collections=["weights", "default"],
                   reduction_config=tt.ReductionConfig(reductions=["mean"], abs_reductions=["max"], norms=["l2"],
                                                       save_raw_tensor=True), **kw)
    hook.get_collection("weights").include("^w")
    for s in range(10):
        hook.set_mode(modes.TRAIN if s < 6 else modes.EVAL)
        hook.next_step()
        hook.save_tensor("w", np.full((2, 3), s, dtype=np.float32), "weights")
        hook.save_scalar("loss", 1.0 / (s + 1))
    if close:
        hook.close()
    else:
        hook.flush()
    return hook


def test_steps_modes_and_mapping(tmp_path):
    _job(tmp_path)
    t = tt.create_trial(str(tmp_path))
    assert t.steps() == list(range(10))
    assert t.steps(modes.TRAIN) == list(range(6))
    assert t.steps("eval") == [0, 1, 2, 3]
    assert t.modes() == [modes.TRAIN, modes.EVAL]
    assert t.mode(7) == modes.EVAL and t.mode_step(7) == 1
    assert t.mode_modestep(42) == (None, None)
    assert t.global_step(modes.EVAL, 2) == 8
    assert t.workers() == ["worker_0"]
    assert t.loaded_all_steps and t.last_complete_step == 9
    w = t.tensor("w")
    assert w.steps() == [0, 2, 4, 6, 8]
    assert w.steps(modes.TRAIN) == [0, 2, 4]
    assert w.steps(modes.EVAL) == [0, 2]
    assert np.array_equal(w.value(2, mode=modes.EVAL), np.full((2, 3), 8, dtype=np.float32))
    assert w.prev_steps(6, n=2) == [4, 6]
    assert w.workers(4) == ["worker_0"]


def test_tensor_names_filters(tmp_path):
    _job(tmp_path)
    t = tt.create_trial(str(tmp_path))
    assert t.tensor_names() == ["scalar/loss", "w"]
    assert t.tensor_names(regex="^w") == ["w"]
    assert t.tensor_names(regex=["loss", "^w$"]) == ["scalar/loss", "w"]
    assert t.tensor_names(collection="weights") == ["w"]
    assert t.tensor_names(step=1, mode=modes.TRAIN) == ["scalar/loss"]
    assert t.tensor_names(step=2, mode=modes.TRAIN) == ["scalar/loss", "w"]
    with pytest.raises(ValueError):
        t.tensor_names(regex="w", collection="weights")
    assert "weights" in t.collections() and "w" in t.collection("weights").tensor_names
    with pytest.raises(TensorUnavailable):
        t.tensor("nope")
    assert not t.has_tensor("nope")


def test_reductions_saved_and_computed(tmp_path):
    _job(tmp_path)
    w = tt.create_trial(str(tmp_path)).tensor("w")
    assert w.reduction_value(4, "mean") == pytest.approx(4.0)
    assert w.reduction_value(4, "max", abs=True) == pytest.approx(4.0)
    assert w.reduction_value(4, "l2") == pytest.approx(np.sqrt(6 * 16))
    assert w.reduction_value(4, "l2_norm") == pytest.approx(np.sqrt(6 * 16))
    # Not saved: computed from the raw value.
    assert w.reduction_value(4, "min") == pytest.approx(4.0)
    assert w.reduction_value(4, "l1") == pytest.approx(24.0)
    assert set(w.reduction_values(4)) == {("mean", False), ("max", True), ("l2", False)}
    series = w.reductions("mean")
    assert series == {0: 0.0, 2: 2.0, 4: 4.0, 6: 6.0, 8: 8.0}
    with pytest.raises(ValueError):
        w.reduction_value(4, "bogus")


def test_reduction_only_tensor_raises_with_has_reductions(tmp_path):
    hook = tt.Hook(str(tmp_path), reduction_config=tt.ReductionConfig(reductions=["mean"], save_shape=True))
    hook.save_tensor("g", np.ones((4, 5)))
    hook.save_tensor("shape_only", np.ones((7,)), "shapes")
    hook.get_collection("shapes").reduction_config = tt.ReductionConfig(save_shape=True)
    hook.close()
    t = tt.create_trial(str(tmp_path))
    g = t.tensor("g")
    with pytest.raises(TensorUnavailableForStep) as ei:
        g.value(0)
    assert ei.value.has_reductions
    assert g.reduction_value(0, "mean") == 1.0
    assert g.shape(0) == (4, 5)
    assert g.shapes() == {0: (4, 5)}
    with pytest.raises(ShapeUnavailableForStep):
        g.shape(3)


def test_unavailable_steps_and_no_more_data(tmp_path):
    _job(tmp_path)
    t = tt.create_trial(str(tmp_path))
    w = t.tensor("w")
    with pytest.raises(TensorUnavailableForStep):
        w.value(1)  # step exists, w not saved there
    with pytest.raises(NoMoreData):
        t.wait_for_steps([23], modes.TRAIN)
    with pytest.raises(NoMoreData):
        t.wait_for_steps([100])
    assert t.has_passed_step(3, modes.EVAL) == StepState.AVAILABLE
    assert t.has_passed_step(4, modes.EVAL) == StepState.UNAVAILABLE
    assert t.has_passed_step(100) == StepState.UNAVAILABLE
    assert issubclass(NoMoreData, TensorTapError)


def test_skipped_step_is_unavailable(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=5))
    for _ in range(11):
        hook.next_step()
        hook.save_tensor("x", np.arange(3))
    hook.end_step()
    hook.flush()
    t = tt.create_trial(str(tmp_path))
    assert t.steps() == [0, 5, 10]
    assert t.has_passed_step(3) == StepState.UNAVAILABLE  # the writer moved past it without saving
    with pytest.raises(StepUnavailable):
        t.wait_for_steps([3])
    with pytest.raises(StepUnavailable):
        t.tensor("x").value(3)
    assert t.has_passed_step(11) == StepState.NOT_YET_AVAILABLE
    hook.close()


def test_live_job_not_yet_available_and_timeout(tmp_path):
    hook = _job(tmp_path, close=False)
    t = tt.create_trial(str(tmp_path))
    # Step 9 has not ended: it is incomplete; step 8 is complete.
    assert t.steps() == list(range(9))
    assert t.steps(show_incomplete_steps=True) == list(range(10))
    assert t.has_passed_step(9) == StepState.NOT_YET_AVAILABLE
    assert t.has_passed_step(50) == StepState.NOT_YET_AVAILABLE
    assert t.has_passed_step(4, modes.EVAL) == StepState.NOT_YET_AVAILABLE
    assert not t.loaded_all_steps
    with pytest.raises(StepNotYetAvailable):
        t.wait_for_steps([50], timeout=0.3)
    with pytest.raises(StepNotYetAvailable):
        t.tensor("w").value(20)
    hook.next_step()  # ends step 9 (EVAL mode step 4 begins)
    hook.flush()
    t.wait_for_steps([9], timeout=5)
    assert t.has_passed_step(9) == StepState.AVAILABLE
    hook.close()


def test_two_workers_completeness_and_worker_choice(tmp_path):
    hooks = [tt.Hook(str(tmp_path), include_workers="all", rank=r, world_size=2,
                     save_config=tt.SaveConfig(save_interval=1)) for r in range(2)]
    for s in range(3):
        for r, h in enumerate(hooks):
            h.next_step()
            h.save_tensor("x", np.array([s, r]))
    hooks[0].close()
    hooks[1].end_step()
    hooks[1].flush()
    t = tt.create_trial(str(tmp_path))
    assert t.workers() == ["worker_0", "worker_1"]
    assert t.num_workers == 2
    # worker_1 has finished steps 0..2 too (its last step ended), but not closed.
    assert t.steps() == [0, 1, 2]
    x = t.tensor("x")
    assert x.workers(1) == ["worker_0", "worker_1"]
    assert x.value(1).tolist() == [1, 0]
    assert x.value(1, worker="worker_1").tolist() == [1, 1]
    with pytest.raises(InvalidWorker):
        x.value(1, worker="worker_7")
    assert {s: v.tolist() for s, v in x.values(worker="worker_1").items()} == {0: [0, 1], 1: [1, 1], 2: [2, 1]}
    assert not t.loaded_all_steps
    hooks[1].close()
    t.refresh_data()
    assert t.loaded_all_steps


def test_step_incomplete_until_every_worker_passed_it(tmp_path):
    hooks = [tt.Hook(str(tmp_path), include_workers="all", rank=r, world_size=2) for r in range(2)]
    hooks[0].save_tensor("x", np.array([1]))
    hooks[0].next_step()
    hooks[0].flush()
    t = tt.create_trial(str(tmp_path))
    assert t.steps() == []  # worker_1 has written nothing: step 0 is not complete
    assert t.steps(show_incomplete_steps=True) == [0, 1] or t.steps(show_incomplete_steps=True) == [0]
    hooks[1].save_tensor("x", np.array([2]))
    hooks[1].next_step()
    hooks[1].flush()
    t.refresh_data()
    assert t.steps() == [0]
    for h in hooks:
        h.close()


def test_range_steps(tmp_path):
    _job(tmp_path)
    t = tt.create_trial(str(tmp_path), range_steps=(2, 6))
    assert t.steps() == [2, 3, 4, 5]
    assert t.tensor("w").steps() == [2, 4]
    for bad in [(5, 2), (-1, 3), "0,5", (1, 2, 3)]:
        with pytest.raises(InvalidConfiguration):
            tt.create_trial(str(tmp_path), range_steps=bad)


def test_bulk_values_and_dataframe(tmp_path):
    _job(tmp_path)
    t = tt.create_trial(str(tmp_path))
    loss = t.tensor("scalar/loss")
    steps, vals = loss.stacked()
    assert steps.tolist() == list(range(10))
    assert np.allclose(vals, [1.0 / (s + 1) for s in range(10)])
    assert loss.values(modes.EVAL) == pytest.approx({0: 1 / 7, 1: 1 / 8, 2: 1 / 9, 3: 1 / 10})
    ws = t.tensor("w").values()
    assert sorted(ws) == [0, 2, 4, 6, 8] and np.all(ws[6] == 6)
    df = t.to_dataframe()
    assert set(df.columns) == {"tensor", "worker", "step", "mode", "mode_step", "reduction", "value"}
    means = df[(df.tensor == "w") & (df.reduction == "mean")]
    assert means.value.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert len(df[df.tensor == "scalar/loss"]) == 10


def test_refresh_context_managers_restore_state(tmp_path):
    hook = _job(tmp_path, close=False)
    t = tt.create_trial(str(tmp_path))
    n = len(t.steps(show_incomplete_steps=True))
    with no_refresh(t):
        hook.next_step()
        hook.save_scalar("loss", 0.0)
        hook.flush()
        assert len(t.steps(show_incomplete_steps=True)) == n  # consistent view inside the block
        with refresh([t]):
            assert t.dynamic_refresh
        assert not t.dynamic_refresh
    assert t.dynamic_refresh
    import time

    time.sleep(t.refresh_interval)
    assert len(t.steps(show_incomplete_steps=True)) == n + 1
    hook.close()


def test_create_trial_bad_arguments(tmp_path):
    with pytest.raises(InvalidConfiguration):
        tt.create_trial("")
    with pytest.raises(InvalidConfiguration):
        tt.create_trial(str(tmp_path), bogus=1)
    with pytest.raises(ValueError):
        tt.create_trial("ftp://x/y")
