"""The save schedule and the step clock of the capture core, on their own (no framework, no writer)."""

from __future__ import annotations

import math

import pytest

import tensortap as tt
from tensortap import modes
from tensortap.capture.clock import StepClock
from tensortap.capture.schedule import SaveSchedule
from tensortap.collection import CollectionManager


def _schedule(include, default=None, **per_collection):
    cm = CollectionManager()
    for name in include:
        cm.get(name)
    for name, cfg in per_collection.items():
        cm.get(name).save_config = cfg
    return cm, SaveSchedule(cm, list(include), tt.SaveConfig.coerce(default))


def _names(colls):
    return sorted(c.name for c in colls)


def test_every_collection_on_one_interval():
    _cm, s = _schedule(["weights", "losses"], tt.SaveConfig(save_interval=3))
    saving = [step for step in range(10) if s.at(modes.TRAIN, step)]
    assert saving == [0, 3, 6, 9]
    assert _names(s.at(modes.TRAIN, 6)) == ["losses", "weights"]
    assert [s.next_saving_step(modes.TRAIN, k) for k in (0, 1, 4, 9)] == [0, 3, 6, 9]


def test_collections_on_their_own_configs_and_the_next_saving_step():
    _cm, s = _schedule(["weights", "losses"], tt.SaveConfig(save_interval=4),
                       losses=tt.SaveConfig(save_interval=3, start_step=2, end_step=8))
    assert {k: _names(s.at(modes.TRAIN, k)) for k in range(10) if s.at(modes.TRAIN, k)} == {
        0: ["weights"], 3: ["losses"], 4: ["weights"], 6: ["losses"], 8: ["weights"]}
    assert [s.next_saving_step(modes.TRAIN, k) for k in (1, 4, 5, 7, 9)] == [3, 4, 6, 8, 12]


def test_train_only_collections_never_save_in_eval_or_predict():
    _cm, s = _schedule(["gradients", "losses"], tt.SaveConfig(save_interval=1))
    assert _names(s.at(modes.TRAIN, 0)) == ["gradients", "losses"]
    assert _names(s.at(modes.EVAL, 0)) == ["losses"]
    assert _names(s.at(modes.PREDICT, 5)) == ["losses"]


def test_nothing_saves_after_the_end_step():
    _cm, s = _schedule(["losses"], tt.SaveConfig(save_interval=2, end_step=5))
    assert s.next_saving_step(modes.TRAIN, 5) == math.inf
    assert s.at(modes.TRAIN, 6) == []


def test_the_same_list_while_the_set_stays_and_tensor_membership():
    cm, s = _schedule(["weights", "losses"], tt.SaveConfig(save_interval=2))
    cm.get("weights").include("weight$")
    cm.get("losses").include("loss")
    s.invalidate()
    first = s.at(modes.TRAIN, 0)
    assert s.at(modes.TRAIN, 2) is first  # a caller may key its plans on the list
    assert _names(s.for_tensor("fc.weight", first)) == ["weights"]
    assert s.for_tensor("fc.weight", s.at(modes.TRAIN, 1)) == []
    cm.get("losses").include("weight$")  # a change the caller announces
    s.invalidate()
    assert _names(s.for_tensor("fc.weight", s.at(modes.TRAIN, 4))) == ["losses", "weights"]


def test_a_new_default_config_takes_effect():
    _cm, s = _schedule(["losses"], tt.SaveConfig(save_interval=5))
    assert s.at(modes.TRAIN, 2) == []
    s.default = tt.SaveConfig(save_interval=2)
    assert _names(s.at(modes.TRAIN, 2)) == ["losses"]


class _Tally:
    skipped = 0


def test_the_clock_counts_modes_and_adds_steps_counted_elsewhere():
    clock = StepClock()
    clock.mode = modes.TRAIN
    assert clock.advance() == 0 and clock.mode_step == 0
    clock.tally = _Tally()
    clock.tally.skipped = 4  # e.g. forwards a C counter saw
    assert clock.passed() == {"TRAIN": 4, "GLOBAL": 4}
    assert clock.tally.skipped == 0
    clock.mode = modes.EVAL
    assert clock.advance() == 5
    assert (clock.mode_steps[modes.TRAIN], clock.mode_steps[modes.EVAL]) == (4, 0)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_write_tensors_sends_raw_values_as_one_batch_bit_for_bit(tmp_path, writer):
    """The generic hook's hand-off: raw values of one dtype go as one batch (copied straight into the writer),
    the others (another dtype, reductions only, shapes) as records; every value reads back bit for bit."""
    import numpy as np

    hook = tt.Hook(str(tmp_path), writer=writer, save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["a", "b", "c"])
    hook.get_collection("c").reduction_config = tt.ReductionConfig(reductions=["max"], save_raw_tensor=False)
    rng = np.random.default_rng(0)
    sent = []
    for step in range(3):
        hook.next_step()
        colls = {n: [hook.get_collection(n)] for n in "abc"}
        items = [
            ("w0", rng.standard_normal((3, 4)).astype(np.float32), colls["a"]),
            ("w1", rng.standard_normal(5).astype(np.float32)[::-1], colls["a"]),  # not contiguous
            ("i", np.arange(step, step + 6, dtype=np.int64).reshape(2, 3), colls["b"]),
            ("loss", np.float32(step * 0.5).reshape(()), colls["a"]),
            ("m", rng.standard_normal(4).astype(np.float32), colls["c"]),
            ("z", np.zeros((0, 3), np.float32), colls["a"]),
        ]
        sent.append({n: np.array(v, copy=True) for n, v, _c in items})
        hook.write_tensors(items)
    hook.close()
    t = tt.create_trial(str(tmp_path))
    for step, values in enumerate(sent):
        for name in ("w0", "w1", "i", "loss", "z"):
            got = t.tensor(name).value(step)
            assert got.dtype == values[name].dtype and np.array_equal(got, values[name]), (step, name)
        assert t.tensor("m").reduction_value(step, "max") == pytest.approx(float(values["m"].max()))
    assert hook.dropped_records == 0


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_step_handed_over_after_it_ended_is_complete_only_once_its_mark_is_released(tmp_path, writer):
    """A hook may hand a step's tensors over after the step ended (`write_tensors(..., at=step_id())`, or from
    (address, bytes) sources with `write_planned`): readers see that step, and the ones after it, only once
    the hook releases the marks it held; the values land at their own step, bit for bit."""
    import numpy as np

    from tensortap.capture.batch import BatchSpec

    hook = tt.Hook(str(tmp_path), writer=writer, save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["a"])
    a = [hook.get_collection("a")]
    hook.next_step()
    at0 = hook.step_id()
    hook.hold_step_marks()
    hook.next_step()  # step 0 ends, its mark held
    at1 = hook.step_id()
    hook.next_step()  # step 1 ends, held too
    hook.flush()
    assert tt.create_trial(str(tmp_path)).steps() == []
    v0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    v1 = np.linspace(-1, 1, 2000, dtype=np.float32)
    v2 = np.float32(7.5).reshape(())
    hook.write_tensors([("w", v2, a)])  # the current step (2), handed over first
    hook.write_tensors([("w", v0, a)], at=at0)
    hook.handoff.note_membership("w", a)
    spec = BatchSpec(("w",), True, None, (v1.shape,), np_dtype=v1.dtype)
    assert hook.write_planned(spec, [(v1.ctypes.data, v1.nbytes)], at=at1)
    hook.release_step_marks()
    hook.flush()
    assert tt.create_trial(str(tmp_path)).steps() == [0, 1]  # (step 2 has not ended)
    hook.close()
    t = tt.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2]
    for step, v in enumerate((v0, v1, v2)):
        got = t.tensor("w").value(step)
        assert got.dtype == v.dtype and np.array_equal(got, v), step
    assert hook.dropped_records == 0



def test_losses_and_metrics_save_at_every_eval_and_predict_step():
    # an evaluation once per epoch gives a curve: a save interval counts each mode's own steps
    _cm, s = _schedule(["weights", "losses", "metrics"], tt.SaveConfig(save_interval=10))
    assert [k for k in range(12) if s.at(modes.TRAIN, k)] == [0, 10]
    for mode in (modes.EVAL, modes.PREDICT):
        assert {k: _names(s.at(mode, k)) for k in (0, 1, 2, 10)} == {
            0: ["losses", "metrics", "weights"], 1: ["losses", "metrics"], 2: ["losses", "metrics"],
            10: ["losses", "metrics", "weights"]}
        assert s.next_saving_step(mode, 1) == 1
    # a collection config given for all modes (as `--save-interval` / SageMaker's CollectionConfigurations) too
    _cm, s = _schedule(["losses"], None, losses=tt.SaveConfig(save_interval=10))
    assert [k for k in range(4) if s.at(modes.EVAL, k)] == [0, 1, 2, 3]
    # EVAL given a config of its own (different from TRAIN's) keeps it
    own = tt.SaveConfig(mode_save_configs={"TRAIN": {"save_interval": 10}, "EVAL": {"save_interval": 5},
                                           "PREDICT": {"save_interval": 10}, "GLOBAL": {"save_interval": 10}})
    _cm, s = _schedule(["losses"], own)
    assert [k for k in range(12) if s.at(modes.EVAL, k)] == [0, 5, 10]
    assert [k for k in range(3) if s.at(modes.PREDICT, k)] == [0, 1, 2]
