"""Rule base class, RequiredTensors and invoke_rule: smdebug's semantics and the fixed bugs."""

import json
import os
import threading
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    StepNotYetAvailable,
    TensorUnavailable,
)
from tensortap.rules import Rule, Verdict, invoke_rule
from tensortap.rules.actions import Log, StopTraining


class AboveThreshold(Rule):
    """An smdebug-style custom rule: required tensors, then a check on their values."""

    def __init__(self, base_trial, threshold="5", other_trials=None, action_str=""):
        super().__init__(base_trial, action_str, other_trials)
        self.threshold = float(threshold)
        self.seen = []

    def set_required_tensors(self, step):
        self.req_tensors.add("x", [step])

    def invoke_at_step(self, step):
        self.seen.append(step)
        v = float(self.req_tensors.value("x", step))
        if v > self.threshold:
            self.violation(step, f"x={v} > {self.threshold}", "x", v)
        return v > self.threshold


def sparse_job(job, n=30, every=3):
    return job(n, {"x": ("default", lambda s: np.float32(s) if s % every == 0 else None),
                   "y": ("default", lambda s: np.float32(-s))})


def test_smdebug_semantics_skip_missing_and_raise_eval_cond(job):
    trial = sparse_job(job)
    rule = AboveThreshold(trial)
    with pytest.raises(RuleEvaluationConditionMet) as ei:
        invoke_rule(rule, raise_eval_cond=True)
    assert ei.value.step == 6 and ei.value.rule_name == "AboveThreshold"
    assert rule.seen == [0, 3, 6]  # steps without x were skipped, not failures


def test_finished_job_raises_no_more_data_unless_asked(job):
    trial = sparse_job(job)
    with pytest.raises(NoMoreData):
        invoke_rule(AboveThreshold(trial, threshold=100))
    rep = invoke_rule(AboveThreshold(trial, threshold=100), stop_at_job_end=True)
    assert rep.end_reason == "training job ended" and rep.steps_evaluated == 10 and rep.finished


def test_start_and_end_step_and_report(job, tmp_path):
    trial = sparse_job(job)
    rule = AboveThreshold(trial, threshold="10")
    rep = invoke_rule(rule, start_step=3, end_step=20, report_path=str(tmp_path / "reports") + "/")
    assert rule.seen == [3, 6, 9, 12, 15, 18]
    assert rep.first_fired_step == 12 and rep.fired_steps == [12, 15, 18] and rep.violations == 3
    data = json.loads((tmp_path / "reports" / "AboveThreshold.json").read_text())
    assert data["rule"] == "AboveThreshold" and data["first_fired_step"] == 12
    assert data["steps_evaluated"] == 6 and data["first_violations"][0]["tensor"] == "x"
    assert data["first_violations"][0]["value"] == 12.0 and data["end_reason"] == "end_step reached"
    assert rule.report.as_smdebug()["Violations"] == 3


def test_required_tensors_are_read_once(job):
    trial = sparse_job(job, n=9)
    reads = []
    orig = trial.source.read_values

    def counting(entries):
        reads.append(len(entries))
        return orig(entries)

    trial.source.read_values = counting
    rule = AboveThreshold(trial, threshold=100)
    invoke_rule(rule, stop_at_job_end=True)
    assert rule.seen == [0, 3, 6] and sum(reads) == 3  # smdebug read each value twice


def test_unknown_required_tensor(job):
    trial = sparse_job(job, n=3)

    class Needs(Rule):
        def set_required_tensors(self, step):
            self.req_tensors.add("nope", [step])

        def invoke_at_step(self, step):
            return False

    with pytest.raises(TensorUnavailable):
        Needs(trial, "").req_tensors.add("nope", [0])
    rep = invoke_rule(Needs(trial, ""), stop_at_job_end=True)  # logged and skipped, like smdebug
    assert rep.steps_evaluated == 0


def test_required_tensors_in_other_trials_and_regex(job):
    a = job(5, {"w1": ("weights", lambda s: np.ones(2) * s), "w2": ("weights", lambda s: np.ones(2))}, name="a")
    b = job(5, {"w1": ("weights", lambda s: np.ones(2) * s), "w2": ("weights", lambda s: np.ones(2))}, name="b")

    class Same(Rule):
        def set_required_tensors(self, step):
            self.req_tensors.add("w.*", [step], should_match_regex=True)
            self.req_tensors.add("w1", [step], trial=self.other_trials[0])

        def invoke_at_step(self, step):
            assert self.req_tensors.get_names() == ["w1", "w2"]
            assert [t.name for t in self.req_tensors.get(self.other_trials[0])] == ["w1"]
            return not np.array_equal(self.req_tensors.value("w1", step),
                                      self.req_tensors.value("w1", step, self.other_trials[0]))

    rep = invoke_rule(Same(a, "", other_trials=[str(b.path)]), stop_at_job_end=True)
    assert rep.steps_evaluated == 0 or not rep.triggered


def test_verdict_end_of_rule_stops_the_loop(job):
    trial = sparse_job(job)

    class Once(Rule):
        def invoke_at_step(self, step):
            self.count()
            return Verdict(step == 4, end_of_rule=True)

    rep = invoke_rule(Once(trial))
    assert rep.fired_steps == [4] and rep.last_step_evaluated == 4 and "ended after firing" in rep.end_reason


def test_sparse_saves_are_skipped_quickly(job):
    trial = job(2001, {"x": ("default", lambda s: np.float32(1) if s % 500 == 0 else None)})
    rule = AboveThreshold(trial)
    t0 = time.perf_counter()
    invoke_rule(rule, stop_at_job_end=True)
    assert rule.seen == [0, 500, 1000, 1500, 2000] and time.perf_counter() - t0 < 5


def test_live_job_and_timeout(tmp_path):
    out = str(tmp_path / "live")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)

    def train():
        for s in range(15):
            hook.next_step()
            hook.save_tensor("x", np.float32(s))
            hook.flush()
            time.sleep(0.02)
        hook.close()

    th = threading.Thread(target=train)
    os.makedirs(out, exist_ok=True)  # a job that has not started yet: an empty out_dir (docs/format.md §5.2)
    trial = tt.create_trial(out)
    th.start()
    rule = AboveThreshold(trial, threshold=11)
    rep = invoke_rule(rule, stop_at_job_end=True, timeout=30)
    th.join()
    assert rule.seen == list(range(15)) and rep.first_fired_step == 12

    out2 = str(tmp_path / "stuck")
    h2 = tt.Hook(out2, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    h2.next_step()
    h2.save_tensor("x", np.float32(0))
    h2.end_step()
    h2.flush()
    with pytest.raises(StepNotYetAvailable):
        invoke_rule(AboveThreshold(tt.create_trial(out2)), timeout=0.3)
    h2.close()


def test_action_string_smdebug_style(job, caplog):
    trial = sparse_job(job, n=1)
    rule = AboveThreshold(trial, action_str=json.dumps([
        {"name": "StopTraining", "training_job_prefix": "MyJob-Prefix"},
        {"name": "log"},
        {"name": "sms", "endpoint": "+100"},
        {"name": "bogus"},
    ]))
    kinds = [type(a) for a in rule.actions]
    assert kinds == [StopTraining, Log]
    assert rule.actions.actions[0].training_job_prefix == "MyJob-Prefix"  # case kept (smdebug lower-cased it)
    assert rule.actions.actions[0].out_dir == trial.path
    assert "unknown action" in caplog.text


def test_parameters_introspection():
    from tensortap.rules.builtin import LossNotDecreasing

    params = dict(LossNotDecreasing.parameters())
    assert params == {"collection_names": None, "tensor_regex": None, "use_losses_collection": True,
                      "num_steps": 10, "diff_percent": 0.0, "mode": None, "window": 5, "min_drop_percent": 10.0}


def test_builtin_rules_live_match_offline(tmp_path):
    """The shared cache reads point-wise while the job runs and in bulk after: same verdicts either way."""
    from tensortap.rules.builtin import UnchangedTensor, VanishingGradient

    out = str(tmp_path / "live")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), include_collections=["gradients", "weights"],
                   flush_interval=0.02)

    def train():
        for s in range(60):
            hook.next_step()
            hook.save_tensor("gradient/w", np.full(4, 1e-9 if s in (17, 41) else 1.0, np.float32), "gradients")
            hook.save_tensor("w", np.full(3, float(min(s, 30) if s < 50 else s)), "weights")
            time.sleep(0.015)
        hook.close()

    os.makedirs(out, exist_ok=True)  # a job that has not started yet: an empty out_dir (docs/format.md §5.2)
    live = [VanishingGradient(tt.create_trial(out)), UnchangedTensor(tt.create_trial(out), collection_names="weights")]
    reps = [None, None]

    def watch(i):
        reps[i] = invoke_rule(live[i], stop_at_job_end=True, timeout=30)

    threads = [threading.Thread(target=train)] + [threading.Thread(target=watch, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert live[0].data().trial.loaded_all_steps
    offline = [invoke_rule(VanishingGradient(tt.create_trial(out)), stop_at_job_end=True),
               invoke_rule(UnchangedTensor(tt.create_trial(out), collection_names="weights"), stop_at_job_end=True)]
    assert reps[0].fired_steps == offline[0].fired_steps == [17, 41]
    assert reps[1].fired_steps == offline[1].fired_steps == list(range(32, 50))
