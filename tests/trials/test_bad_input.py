"""create_trial and trial queries refuse bad input with InvalidConfiguration naming the bad value."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration, StepNotYetAvailable


def _small_job(path) -> None:
    hook = tt.Hook(str(path), save_config=tt.SaveConfig(save_interval=1))
    for s in range(3):
        hook.next_step()
        hook.save_tensor("w", np.full(3, s, dtype=np.float32))
    hook.close()


def test_missing_path_is_refused(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(InvalidConfiguration, match="does not exist") as ei:
        tt.create_trial(missing)
    assert missing in str(ei.value) and "out_dir" in str(ei.value)


def test_plain_file_is_refused(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("hello")
    with pytest.raises(InvalidConfiguration, match="is a file") as ei:
        tt.create_trial(str(f))
    assert str(f) in str(ei.value)


def test_unrelated_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "src").mkdir()
    with pytest.raises(InvalidConfiguration, match="holds no training job data") as ei:
        tt.create_trial(str(tmp_path))
    assert str(tmp_path) in str(ei.value) and "notes.txt" in str(ei.value)


def test_empty_directory_is_a_job_not_started_yet_and_waits(tmp_path):
    trial = tt.create_trial(str(tmp_path))
    assert trial.steps() == [] and not trial.loaded_all_steps
    with pytest.raises(StepNotYetAvailable):
        trial.wait_for_steps([0], timeout=0.2)
    writer = threading.Thread(target=lambda: (time.sleep(0.3), _small_job(tmp_path)))
    writer.start()
    trial.wait_for_steps([0, 1, 2], timeout=60)
    writer.join()
    assert np.array_equal(trial.tensor("w").value(2), np.full(3, 2, dtype=np.float32))


def test_directory_with_only_rule_statuses_is_a_job_not_started(tmp_path):
    (tmp_path / "rules" / "r").mkdir(parents=True)
    (tmp_path / "rules" / "r" / "status.json").write_text("{}")
    assert tt.create_trial(str(tmp_path)).steps() == []


@pytest.mark.parametrize("bad", ["x", 3.5, None, ["a"], [-1], [True]])
def test_wait_for_steps_refuses_bad_steps(tmp_path, bad):
    _small_job(tmp_path)
    trial = tt.create_trial(str(tmp_path))
    with pytest.raises(InvalidConfiguration, match="required_steps") as ei:
        trial.wait_for_steps(bad)
    assert repr(bad) in str(ei.value)


def test_wait_for_steps_refuses_a_bad_timeout(tmp_path):
    _small_job(tmp_path)
    with pytest.raises(InvalidConfiguration, match="timeout='soon'"):
        tt.create_trial(str(tmp_path)).wait_for_steps([0], timeout="soon")


def test_queries_refuse_bad_arguments(tmp_path):
    _small_job(tmp_path)
    trial = tt.create_trial(str(tmp_path))
    w = trial.tensor("w")
    for call, needle in [
        (lambda: w.value("x"), "step_num='x'"),
        (lambda: w.value(-1), "step_num=-1"),
        (lambda: w.value(0, worker=3), "worker=3"),
        (lambda: w.reduction_value(0, "average"), "average"),
        (lambda: w.reduction_value(0, 7), "reduction_name=7"),
        (lambda: w.shape(None), "step_num=None"),
        (lambda: w.prev_steps("2"), "step='2'"),
        (lambda: trial.tensor_names(regex="("), "regex='('"),
        (lambda: trial.tensor_names(step="1"), "step='1'"),
        (lambda: trial.tensor_names(collection=5), "collection=5"),
        (lambda: trial.tensor(5), "name=5"),
        (lambda: trial.has_passed_step(1.5), "step=1.5"),
        (lambda: trial.mode_modestep("a"), "global_step='a'"),
        (lambda: trial.steps(mode="nope"), "nope"),
    ]:
        with pytest.raises(InvalidConfiguration) as ei:
            call()
        assert needle in str(ei.value), (needle, str(ei.value))


def test_create_trial_refuses_a_bad_refresh_interval_or_name(tmp_path):
    with pytest.raises(InvalidConfiguration, match="refresh_interval='x'"):
        tt.create_trial(str(tmp_path), refresh_interval="x")
    with pytest.raises(InvalidConfiguration, match="name=3"):
        tt.create_trial(str(tmp_path), name=3)
