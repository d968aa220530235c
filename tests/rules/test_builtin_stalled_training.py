import threading
import time

import numpy as np

import tensortap as tt
from tensortap.rules import invoke_rule
from tensortap.rules.builtin import StalledTrainingRule


def test_fires_when_the_job_stalls(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    for _ in range(3):
        hook.next_step()
        hook.save_tensor("w", np.ones(2))
    hook.end_step()
    hook.flush()
    rule = StalledTrainingRule(tt.create_trial(out), threshold="1.0")
    t0 = time.monotonic()
    rep = invoke_rule(rule)  # ends by itself: the rule ends after firing
    took = time.monotonic() - t0
    assert rep.triggered and rep.first_fired_step == 3 and 0.9 <= took < 10
    assert "no new data" in rep.first_violations[0].condition
    hook.close()


def test_quiet_while_the_job_progresses(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    hook.next_step()
    hook.save_tensor("w", np.ones(2))
    hook.flush()

    def train():
        for _ in range(12):
            time.sleep(0.15)
            hook.next_step()
            hook.save_tensor("w", np.ones(2))
            hook.flush()
        hook.close()

    th = threading.Thread(target=train)
    th.start()
    rep = invoke_rule(StalledTrainingRule(tt.create_trial(out), threshold=1.0), stop_at_job_end=True)
    th.join()
    assert not rep.triggered and rep.steps_evaluated == 13 and rep.end_reason == "training job ended"
