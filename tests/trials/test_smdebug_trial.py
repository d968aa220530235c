"""create_trial on out_dirs written by the real smdebug 1.0.34 (fixtures from tests/fixtures/smdebug/generate.py)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.exceptions import (
    InvalidWorker,
    NoMoreData,
    StepNotYetAvailable,
    TensorUnavailableForStep,
)
from tensortap.format.smdebug import SmdebugSource
from tensortap.rules.invoke import invoke_rule
from tensortap.rules.rule import Rule
from tensortap.trials import StepState

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def _expected(name):
    with open(os.path.join(FIXTURES, name, "expected.json")) as f:
        rows = json.load(f)["events"]
    with np.load(os.path.join(FIXTURES, name, "expected.npz"), allow_pickle=False) as z:
        values = {k: z[k] for k in z.files}
    return rows, values


@pytest.mark.parametrize("job", ["pytorch_job", "two_workers", "dtypes"])
def test_every_saved_raw_value_reads_back_bit_exact(job):
    trial = tt.create_trial(os.path.join(FIXTURES, job))
    assert isinstance(trial.source, SmdebugSource)
    # dtypes/ was written without the end marker: a job still running.
    assert trial.loaded_all_steps == (job != "dtypes")
    rows, values = _expected(job)
    checked = 0
    for r in rows:
        name = r["name"]
        if name.startswith(("smdebug/reductions/", "scalar/")):
            continue  # reductions are checked below; smdebug writes a scalar twice per step (its bug 7)
        worker = r["worker"]
        if worker not in trial.workers():  # a TF device name, serialized in the file name
            worker = worker.replace("_", "/").replace("-", ":")
        got = trial.tensor(name).value(r["step"], worker=worker)
        exp = values[r["key"]]
        assert got.shape == exp.shape, name
        if exp.dtype.kind in "US":
            assert got.tolist() == exp.tolist()
        else:
            assert got.dtype == exp.dtype, name
            assert got.tobytes() == exp.tobytes(), name
        checked += 1
    assert checked > 5


def test_pytorch_job_modes_reductions_and_shapes():
    trial = tt.create_trial(os.path.join(FIXTURES, "pytorch_job"))
    assert trial.steps(modes.TRAIN) == [0, 2, 4]
    assert trial.steps(modes.EVAL) == [0, 1, 2]
    assert trial.mode(5) == modes.EVAL
    w = trial.tensor("Sequential_0.weight")
    raw = w.value(2)
    # Saved reductions come back, and the raw value stays readable next to the saved shape.
    assert w.reduction_value(2, "mean") == pytest.approx(float(raw.mean()), rel=1e-5)
    assert w.reduction_value(2, "l2") == pytest.approx(float(np.linalg.norm(raw.ravel())), rel=1e-5)
    assert w.reduction_value(2, "mean", abs=True) == pytest.approx(float(np.abs(raw).mean()), rel=1e-5)
    assert w.shape(2) == raw.shape
    assert "weights" in trial.collections()
    assert "Sequential_0.weight" in trial.tensor_names(collection="weights")
    losses = trial.tensor("CrossEntropyLoss_output_0").values(modes.TRAIN)
    assert sorted(losses) == [0, 2, 4]


def test_two_workers():
    trial = tt.create_trial(os.path.join(FIXTURES, "two_workers"))
    assert trial.workers() == ["worker_0", "worker_1"]
    assert trial.num_workers == 2
    name = trial.tensor_names()[0]
    assert trial.tensor(name).workers(trial.steps()[0]) == ["worker_0", "worker_1"]


# ---------------------------------------------------------------------------------------------------------------
# Running jobs written by the real smdebug (generate.py --live): the six behaviours of issue #27, as smdebug's
# own trial answers them (tests/differential compares every answer with smdebug itself when its venv exists).
class _Counting(Rule):
    """A rule that records the steps it was evaluated at."""

    seen: list[int] = []

    def __init__(self, trial):
        super().__init__(trial, action_str="")
        _Counting.seen = []

    def invoke_at_step(self, step):
        _Counting.seen.append(step)
        return False


def _live_copy(tmp_path, name: str) -> str:
    dst = str(tmp_path / name)
    shutil.copytree(os.path.join(FIXTURES, name), dst)
    return dst


def _end(path: str) -> None:
    open(os.path.join(path, "training_job_end.ts"), "w").close()


def test_steps_counted_per_worker_number_not_name(tmp_path):
    """#27.1 / #21: events written as algo-1, collection file worker_0 (num_workers 1)."""
    path = _live_copy(tmp_path, "live_other_name")
    trial = tt.create_trial(path)
    assert trial.workers() == ["worker_0"]  # smdebug lists the collection files' workers
    assert trial.steps() == [0, 1, 2] and trial.last_complete_step == 2
    assert trial.has_passed_step(0) == StepState.AVAILABLE
    assert trial.has_passed_step(3) == StepState.NOT_YET_AVAILABLE
    w = trial.tensor("dense.weight")
    assert w.workers(1) == ["algo-1"] and w.value(1, worker="algo-1").shape == (3, 2)
    with pytest.raises(StepNotYetAvailable):  # a live job: the next step may come (bounded wait)
        trial.wait_for_steps([3], timeout=0.2)
    invoke_rule(_Counting(trial), end_step=3, timeout=5)  # the written steps are evaluated without waiting
    assert _Counting.seen == [0, 1, 2]
    _end(path)
    with pytest.raises(NoMoreData):  # the job ended: no wait hangs
        trial.wait_for_steps([3])
    report = invoke_rule(_Counting(trial), stop_at_job_end=True)
    assert report.finished and _Counting.seen == [0, 1, 2]


def test_newest_step_of_a_running_job_is_complete(tmp_path):
    """#27.2: every worker's index of step 4 is written and no end marker: step 4 is there."""
    path = _live_copy(tmp_path, "live_pytorch_hook")
    trial = tt.create_trial(path)
    assert not trial.loaded_all_steps
    assert trial.steps() == [0, 1, 2, 4] and trial.steps(modes.TRAIN) == [0, 2]
    assert trial.has_passed_step(4) == StepState.AVAILABLE
    assert trial.has_passed_step(3) == StepState.UNAVAILABLE  # step 4 is complete: 3 will never come
    assert trial.tensor("Sequential_0.weight").value(4).shape == (3, 4)
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("Sequential_0.bias").value(4)  # only reductions saved
    trial.wait_for_steps([4], timeout=1)


def test_lagging_worker_and_skipped_step(tmp_path):
    path = _live_copy(tmp_path, "live_lagging_worker")
    trial = tt.create_trial(path)
    assert trial.num_workers == 2 and trial.workers() == ["worker_0", "worker_1"]
    # worker_1 skipped step 3; both wrote step 5: everything up to 5 is complete, 6 waits for worker_1
    assert trial.steps() == [0, 1, 2, 3, 5] and trial.steps(show_incomplete_steps=True)[-1] == 6
    assert trial.has_passed_step(3) == StepState.AVAILABLE
    assert trial.has_passed_step(1, modes.EVAL) == StepState.NOT_YET_AVAILABLE
    with pytest.raises(InvalidWorker):
        trial.tensor("dense.weight").value(3, worker="worker_1")


def test_out_dir_with_only_collections_detects_the_format_later(tmp_path):
    """#27.3: the trial is made while the job has written only its collections (and before that, nothing)."""
    src = os.path.join(FIXTURES, "live_other_name")
    path = str(tmp_path / "job")
    os.makedirs(path)
    empty = tt.create_trial(path)  # a job that has not started: an empty directory
    shutil.copytree(os.path.join(src, "collections"), os.path.join(path, "collections"))
    trial = tt.create_trial(path)
    for t in (empty, trial):
        assert t.steps() == [] and t.tensor_names() == []
    assert trial.workers() == ["worker_0"] and "weights" in trial.collections()
    shutil.copytree(os.path.join(src, "events"), os.path.join(path, "events"))
    shutil.copytree(os.path.join(src, "index"), os.path.join(path, "index"))
    for t in (empty, trial):
        t.refresh_data()
        assert isinstance(t.source, SmdebugSource)
        assert t.steps() == [0, 1, 2] and "dense.weight" in t.tensor_names()


def test_collection_of_an_unknown_name_is_new_and_empty():
    """#27.4"""
    trial = tt.create_trial(os.path.join(FIXTURES, "pytorch_job"))
    c = trial.collection("new")
    assert c.name == "new" and c.tensor_names == set() and c.include_regex == []
    assert trial.tensor_names(collection="new") == []
    c.include(".*weight")
    c.add_tensor_name("CrossEntropyLoss_output_0")
    assert trial.collection("new") is c
    expected = sorted({"CrossEntropyLoss_output_0", *trial.tensor_names(regex=".*weight")})
    assert "Sequential_0.weight" in expected
    assert trial.tensor_names(collection="new") == expected


def test_metadata_only_index_entries(tmp_path):
    """#27.5: start_idx 0, length 1, empty event file name: the step and mode count, the value is unavailable."""
    path = _live_copy(tmp_path, "live_metadata_only")
    trial = tt.create_trial(path)
    assert trial.steps(show_incomplete_steps=True) == [0, 1, 2, 4, 5, 6]
    assert trial.steps() == [0, 1, 2, 4]  # worker_1 wrote 0, 1, 4 of num_workers 2
    assert trial.mode_modestep(6) == (modes.EVAL, 0)
    assert trial.has_passed_step(3) == StepState.UNAVAILABLE
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("gradients/dummy:0").value(0)
    _end(path)
    trial.refresh_data()
    assert trial.steps() == [0, 1, 2, 4, 5, 6] and trial.loaded_all_steps


def test_local_and_s3_trial_classes(tmp_path):
    """#27.6: smdebug's trial classes, as create_trial returns them, with smdebug's constructors."""
    from tensortap.trials import LocalTrial, S3Trial, Trial

    path = os.path.join(FIXTURES, "pytorch_job")
    trial = tt.create_trial(path)
    assert type(trial) is LocalTrial and isinstance(trial, Trial) and not isinstance(trial, S3Trial)
    direct = LocalTrial("job", path, range_steps=(0, 3))
    assert direct.name == "job" and direct.steps() == [0, 2]
    assert issubclass(S3Trial, Trial)


def test_stop_request_in_an_smdebug_out_dir_is_not_tensortap_data(tmp_path):
    """A rule's stop request (tensortap/control/stop.json) in an smdebug out_dir does not make it a tensortap one."""
    from tensortap.format.control import STOP_KEY

    path = _live_copy(tmp_path, "live_other_name")
    os.makedirs(os.path.dirname(os.path.join(path, STOP_KEY)))
    with open(os.path.join(path, STOP_KEY), "w") as f:
        f.write("{}")
    trial = tt.create_trial(path)
    assert isinstance(trial.source, SmdebugSource) and trial.steps() == [0, 1, 2]
