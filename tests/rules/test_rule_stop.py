"""StopTraining: the stop-request protocol, and a real training process stopped by a rule."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt
from tensortap.rules import invoke_rule
from tensortap.rules.actions import (
    STOP_EXIT_CODE,
    StopSignal,
    StopTraining,
    TrainingStopped,
    check_stop,
    clear_stop_request,
    request_stop,
    stop_requested,
)
from tensortap.rules.builtin import VanishingGradient

TRAIN = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tensortap as tt
    from tensortap.rules.actions import check_stop

    out = sys.argv[1]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), include_collections=["gradients"],
                   flush_interval=0.05)
    hook.set_mode(tt.modes.TRAIN)
    for step in range(3000):
        check_stop(hook, min_interval=0.02)      # the step boundary: what Hook.next_step will call
        hook.next_step()
        g = np.full(8, 1e-9 if step >= 20 else 1.0, np.float32)
        hook.save_tensor("gradient/fc.weight", g, "gradients")
        try:
            time.sleep(0.01)
        except Exception:                         # a script's broad except must not swallow the stop
            pass
    hook.close()
    print("trained all steps")
""")


def test_protocol_roundtrip(tmp_path):
    out = str(tmp_path / "job")
    assert stop_requested(out, min_interval=0) is None
    where = request_stop(out, rule="R", step=7, reason="why", report={"x": 1})
    assert where.endswith("tensortap/control/stop.json")
    request_stop(out, rule="R", step=8)  # the first request is kept
    req = stop_requested(out)
    assert req["rule"] == "R" and req["step"] == 7 and req["report"] == {"x": 1}
    clear_stop_request(out)
    assert stop_requested(out, min_interval=0) is None


def test_check_stop_closes_the_hook_and_exits(tmp_path, capsys):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("w", np.ones(3))
    check_stop(hook)  # nothing requested: no effect
    request_stop(out, rule="VanishingGradient", step=0, reason="gradient/w: tiny")
    with pytest.raises(TrainingStopped) as ei:
        check_stop(hook)
    assert isinstance(ei.value, SystemExit) and not isinstance(ei.value, Exception)
    assert ei.value.code == STOP_EXIT_CODE and "VanishingGradient fired at step 0" in str(ei.value)
    assert "training stopped" in capsys.readouterr().err
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps and trial.tensor("w").steps() == [0]  # flushed, job marked ended
    check_stop(hook)  # a closed hook is not stopped twice
    assert StopSignal(out).check()["rule"] == "VanishingGradient"


def test_a_rule_stops_a_real_training_process(tmp_path):
    out = str(tmp_path / "job")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    os.makedirs(out)  # a job that has not started yet: an empty out_dir (docs/format.md §5.2)
    proc = subprocess.Popen([sys.executable, str(script), out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        trial = tt.create_trial(out)
        stop = StopTraining()
        rule = VanishingGradient(trial, actions=[stop])
        rep = invoke_rule(rule, stop_at_job_end=True, timeout=60)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rep.first_fired_step == 20 and rep.end_reason == "training job ended"
    assert stop.out_dir == trial.path and stop.failures == 0
    assert proc.returncode == STOP_EXIT_CODE, stderr
    assert "trained all steps" not in stdout
    assert "training stopped: VanishingGradient fired at step 20" in stderr
    final = tt.create_trial(out)
    steps = final.tensor("gradient/fc.weight").steps()
    assert final.loaded_all_steps and steps == list(range(len(steps))) and 20 < len(steps) < 1000
