"""A job whose process was killed before close(): readers waiting for more steps learn it is gone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

import tensortap as tt
from tensortap.exceptions import NoMoreData
from tensortap.rules import invoke_rule
from tensortap.rules.builtin import LossNotDecreasing

_KILLED = textwrap.dedent("""
    import os, sys, numpy as np, tensortap as tt
    hook = tt.Hook(sys.argv[1], save_config=tt.SaveConfig(save_interval=1), include_collections=["losses"],
                   flush_interval=0.05)
    for step in range(5):
        hook.next_step()
        hook.save_tensor("loss_output_0", np.float32(1.0 + step), "losses")
    hook.next_step()
    hook.flush()
    os.kill(os.getpid(), 9)  # no close(), no end mark
""")


def _killed_job(tmp_path) -> str:
    out = str(tmp_path / "job")
    proc = subprocess.run([sys.executable, "-c", _KILLED, out], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    return out


def test_waiting_for_a_step_of_a_killed_job_ends_with_no_more_data(tmp_path, caplog):
    t = tt.create_trial(_killed_job(tmp_path))
    assert t.steps() == [0, 1, 2, 3, 4]
    raised = []

    def wait() -> None:
        try:
            t.wait_for_steps([7])  # no timeout: before, this waited forever
        except NoMoreData as e:
            raised.append(e)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    th.join(120)
    assert not th.is_alive(), "wait_for_steps still waits on a job whose process is gone"
    assert raised and t.loaded_all_steps
    assert "gone" in caplog.text


def test_a_rule_invoked_without_timeout_on_a_killed_job_finishes(tmp_path):
    t = tt.create_trial(_killed_job(tmp_path))
    rule = LossNotDecreasing(t, num_steps=2)
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("report", invoke_rule(rule, stop_at_job_end=True)),
                          daemon=True)
    th.start()
    th.join(120)
    assert not th.is_alive(), "invoke_rule still waits on a job whose process is gone"
    report = result["report"]
    assert report.finished
    assert report.last_step_evaluated == 4


def test_a_running_job_is_not_taken_for_gone(tmp_path):
    hook = tt.Hook(str(tmp_path / "live"), save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    hook.next_step()
    hook.save_scalar("x", 1.0)
    hook.next_step()
    hook.flush()
    t = tt.create_trial(str(tmp_path / "live"))
    from tensortap.exceptions import StepNotYetAvailable

    with pytest.raises(StepNotYetAvailable):
        t.wait_for_steps([5], timeout=3)  # longer than a look at the writers: this process still runs
    assert not t.loaded_all_steps
    hook.close()
