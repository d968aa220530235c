"""create_trial on out_dirs written by the real smdebug 1.0.34 (fixtures from tests/fixtures/smdebug/generate.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.format.smdebug import SmdebugSource

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
