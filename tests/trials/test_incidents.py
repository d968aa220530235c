"""The incident files (docs/format.md §11): written whole per worker, read back sorted, through any storage."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration
from tensortap.format.incidents import IncidentLog, incidents_key, make_incident
from tensortap.storage import open_storage
from tensortap.trials import create_trial
from tensortap.trials.incidents import read_incidents


def _nonfinite(step: int, worker: str, module: str = "layers.2") -> dict:
    return make_incident("non_finite", step, "TRAIN", step, worker, 1.0e9 + step, (0, step), {
        "phase": "forward", "module": module, "parameter": None, "tensor": f"Net_{module}_output_0",
        "nan": 0, "posinf": 3, "neginf": 0,
        "inputs": [{"name": f"Net_{module}_input_0", "count": 8, "nonfinite": 0, "l2": 2.0, "max_abs": 1.0,
                    "mean_abs": 0.5}]})


def _job(tmp_path) -> str:
    """A real job's out_dir (a hook that saved one scalar)."""
    out = str(tmp_path / "job")
    hook = tt.Hook(out_dir=out)
    hook.next_step()
    hook.save_scalar("loss", 1.0)
    hook.close()
    return out


def test_written_lines_read_back_sorted_by_step_then_worker(tmp_path):
    out = _job(tmp_path)
    storage = open_storage(out)
    logs = {w: IncidentLog(storage, w) for w in ("worker_10", "worker_2", "worker_0")}
    logs["worker_10"].append(_nonfinite(5, "worker_10"))
    logs["worker_2"].append(_nonfinite(5, "worker_2", "layers.0"))
    logs["worker_2"].append(make_incident("exception", 7, "TRAIN", 7, "worker_2", 2.0, None,
                                          {"type": "RuntimeError", "message": "boom"}))
    logs["worker_0"].append(make_incident("loss_spike", 6, "TRAIN", 6, "worker_0", 3.0, (0, 6),
                                          {"value": 40.0, "median": 1.0, "mad": 0.1, "z": 24.9,
                                           "running_max": 2.0, "ratio": 20.0, "tensor": "loss", "why": "z"}))
    got = read_incidents(storage)
    assert [(i["step"], i["worker"], i["kind"]) for i in got] == [
        (5, "worker_2", "non_finite"), (5, "worker_10", "non_finite"), (6, "worker_0", "loss_spike"),
        (7, "worker_2", "exception")]
    # each line is one JSON object with exactly the contract's keys
    lines = (tmp_path / "job" / "incidents" / "worker_2.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert set(json.loads(lines[0])) == {"kind", "step", "mode", "mode_step", "worker", "wall_time", "ring", "detail"}
    assert got[0]["ring"] == {"first_step": 0, "last_step": 5} and got[3]["ring"] is None

    trial = create_trial(out)
    assert [i["kind"] for i in trial.incidents()] == ["non_finite", "non_finite", "loss_spike", "exception"]
    assert [i["worker"] for i in trial.incidents("non_finite")] == ["worker_2", "worker_10"]
    first = trial.first_nonfinite()
    assert first["worker"] == "worker_2" and first["step"] == 5 and first["detail"]["module"] == "layers.0"
    assert trial.incidents("stop") == []


def test_a_job_without_incidents(tmp_path):
    trial = create_trial(_job(tmp_path))
    assert trial.incidents() == [] and trial.first_nonfinite() is None


def test_bad_kind_is_a_one_line_error(tmp_path):
    trial = create_trial(_job(tmp_path))
    with pytest.raises(InvalidConfiguration, match="incident kind 'nan'.*non_finite"):
        trial.incidents("nan")
    with pytest.raises(ValueError, match="incident kind 'oops'"):
        make_incident("oops", 0, "TRAIN", 0, "worker_0", 0.0, None, {})
    with pytest.raises(ValueError, match="phase"):
        make_incident("non_finite", 0, "TRAIN", 0, "worker_0", 0.0, None, {"phase": "sideways"})


def test_non_finite_numbers_are_valid_json(tmp_path):
    storage = open_storage(str(tmp_path))
    IncidentLog(storage, "worker_0").append(make_incident(
        "grad_norm_spike", 3, "TRAIN", 3, "worker_0", 0.0, None,
        {"value": float("inf"), "median": float("nan"), "z": -float("inf")}))
    raw = (tmp_path / incidents_key("worker_0")).read_text()
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    (inc,) = read_incidents(storage)
    assert inc["detail"] == {"value": "inf", "median": "nan", "z": "-inf"}


def test_a_damaged_line_costs_that_line_with_one_warning(tmp_path, caplog):
    storage = open_storage(str(tmp_path))
    log = IncidentLog(storage, "worker_0")
    log.append(_nonfinite(1, "worker_0"))
    log.append(_nonfinite(2, "worker_0"))
    path = tmp_path / "incidents" / "worker_0.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:20] + "\n" + "[1, 2]\n")
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        got = read_incidents(storage)
        read_incidents(storage)
    assert [i["step"] for i in got] == [1]
    warned = [r.getMessage() for r in caplog.records if "not an incident" in r.getMessage()]
    assert len(warned) == 2 and "line 2" in warned[0] and "line 3" in warned[1]


def test_the_file_keeps_earlier_incidents_and_is_bounded(tmp_path):
    storage = open_storage(str(tmp_path))
    IncidentLog(storage, "w/1").append(_nonfinite(0, "w/1"))
    later = IncidentLog(storage, "w/1", max_incidents=3)  # (another process of the same worker)
    assert [later.append(_nonfinite(s, "w/1")) for s in (1, 2, 3)] == [True, True, False]
    assert later.dropped == 1
    assert [i["step"] for i in read_incidents(storage)] == [0, 1, 2]
    assert (tmp_path / "incidents" / "w%2F1.jsonl").exists()  # (percent-encoded as worker folders are)


def test_on_s3(s3_url):
    storage = open_storage(s3_url)
    log = IncidentLog(storage, "worker_0")
    log.append(_nonfinite(4, "worker_0"))
    log.append(make_incident("stop", 9, "TRAIN", 9, "worker_0", 0.0, (0, 9), {"rule": "exploding_tensor",
                                                                              "reason": "NaN"}))
    hook = tt.Hook(out_dir=s3_url, writer="thread")
    hook.next_step()
    hook.save_tensor("x", np.ones(3))
    hook.close()
    trial = create_trial(s3_url)
    assert [(i["kind"], i["step"]) for i in trial.incidents()] == [("non_finite", 4), ("stop", 9)]
    assert trial.first_nonfinite()["detail"]["posinf"] == 3
