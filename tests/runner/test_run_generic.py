"""`tensortap run` and `tensortap rules` end to end, with real training processes (generic numpy hook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

TRAIN = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    vanish_from = int(sys.argv[1])   # gradients vanish from this step on (-1: never)
    steps = int(sys.argv[2])
    hook = tt.Hook.create_from_json_file()   # the runner's config
    for step in range(steps):
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        small = 0 <= vanish_from <= step
        hook.save_tensor("gradient/fc.weight", np.full((4, 4), 1e-10 if small else 0.3), "gradients")
        hook.save_tensor("fc.weight", np.full((4, 4), 1.0 + step), "weights")
        hook.save_tensor("loss", np.float32(1.0 / (step + 1)), "losses")
        print(f"step {step}", flush=True)
        time.sleep(0.03)
    hook.close()
    print("training finished", flush=True)
    """
)

BAD_RULE = textwrap.dedent(
    """
    from tensortap.rules import Rule

    class Broken(Rule):
        def __init__(self, base_trial, **kw):
            super().__init__(base_trial, **kw)

        def invoke_at_step(self, step):
            raise RuntimeError("this rule is broken")
    """
)


def tensortap(*args, timeout=180):
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def train_py(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    return str(p)


def _doc(r):
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def test_broken_training_is_stopped_by_the_rule_that_fires(tmp_path, train_py):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--rule", "vanishing_gradient",
                  "--rule", "loss_not_decreasing:num_steps=5,window=1", "--stop-on-issue", "--json",
                  "--", sys.executable, train_py, "10", "2000")
    doc = _doc(r)
    assert r.returncode == 1, r.stderr
    rules = {x["name"]: x for x in doc["rules"]}
    assert rules["vanishing_gradient"]["status"] == "IssuesFound"
    assert rules["vanishing_gradient"]["first_step"] == 10
    assert rules["loss_not_decreasing"]["status"] == "NoIssuesFound"
    assert doc["training"]["stopped_by"] == "vanishing_gradient"
    assert doc["training"]["exit_code"] == 3  # TrainingStopped
    assert "training finished" not in r.stderr
    # The data up to the stop was flushed and the job is marked ended.
    import tensortap as tt

    trial = tt.create_trial(out)
    assert trial.loaded_all_steps
    last = trial.steps()[-1]
    assert 10 <= last < 1999
    status = json.load(open(os.path.join(out, "rules", "vanishing_gradient", "status.json")))
    assert status["status"] == "IssuesFound" and status["report"]["first_fired_step"] == 10
    assert os.path.exists(os.path.join(out, "rules", "vanishing_gradient", "report.json"))


def test_healthy_training_ends_with_no_issues(tmp_path, train_py):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "2", "--rule", "VanishingGradient",
                  "--rule", "exploding_tensor", "--rule", "loss_not_decreasing:num_steps=4,window=1", "--json",
                  "--", sys.executable, train_py, "-1", "30")
    doc = _doc(r)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert [x["status"] for x in doc["rules"]] == ["NoIssuesFound"] * 3
    assert doc["training"]["exit_code"] == 0 and doc["training"]["stopped_by"] is None
    assert doc["training"]["duration_s"] > 0.03 * 30  # it slept 30 ms a step
    assert doc["out_dir"] == out and doc["interrupted_by"] is None
    assert doc["duration_s"] >= doc["training"]["duration_s"]
    for rule in doc["rules"]:  # what each verdict rests on
        assert rule["steps_judged"] == 15 and rule["first_step_judged"] == 0 and rule["last_step_judged"] == 28
        assert rule["data_points"] >= 15 and rule["duration_s"] > 0
    assert "training finished" in r.stderr  # training output is passed through


def test_a_rule_that_raises_ends_as_error_without_killing_the_others(tmp_path, train_py):
    out = str(tmp_path / "job")
    rule_file = tmp_path / "my_rules.py"
    rule_file.write_text(BAD_RULE)
    r = tensortap("run", "--out-dir", out, "--save-interval", "1", "--collection", "gradients",
                  "--rule-file", f"{rule_file}:Broken", "--rule", "vanishing_gradient", "--json",
                  "--", sys.executable, train_py, "-1", "15")
    doc = _doc(r)
    assert r.returncode == 2
    rules = {x["name"]: x for x in doc["rules"]}
    assert rules["broken"]["status"] == "Error" and "this rule is broken" in rules["broken"]["message"]
    assert rules["vanishing_gradient"]["status"] == "NoIssuesFound"
    assert doc["training"]["exit_code"] == 0


def test_failed_training_exits_2(tmp_path):
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--rule", "vanishing_gradient", "--json",
                  "--", sys.executable, "-c", "import sys; sys.exit(7)")
    doc = _doc(r)
    assert r.returncode == 2 and doc["training"]["exit_code"] == 7


def test_bad_rules_and_parameters_fail_before_training_starts(tmp_path, train_py):
    out = str(tmp_path / "job")
    for args, needle in [
        (["--rule", "no_such_rule"], "no_such_rule"),
        (["--rule", "vanishing_gradient:threshold=abc"], "threshold='abc'"),
        (["--rule", "vanishing_gradient:bogus=1"], "bogus"),
        (["--collection", "weights:save_every=3"], "save_every"),
        (["--rule-file", "nope.py:X"], "nope.py"),
    ]:
        r = tensortap("run", "--out-dir", out, *args, "--", sys.executable, train_py, "-1", "3")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
    assert not os.path.exists(out)


def test_job_file_and_offline_rules_run(tmp_path, train_py):
    out = str(tmp_path / "job")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(textwrap.dedent(f"""
        out_dir: {out}
        save_interval: 1
        rules:
          - name: vanishing_gradient
            params: {{threshold: 1e-7}}
        """))
    r = tensortap("run", "--config", str(cfg), "--json", "--", sys.executable, train_py, "5", "12")
    doc = _doc(r)
    assert r.returncode == 1 and doc["rules"][0]["first_step"] == 5
    # The same rules again, offline, on the saved job: same verdicts and exit codes.
    r2 = tensortap("rules", "run", out, "--rule", "vanishing_gradient", "--rule", "exploding_tensor", "--json")
    doc2 = _doc(r2)
    assert r2.returncode == 1
    assert {x["name"]: x["status"] for x in doc2["rules"]} == {"vanishing_gradient": "IssuesFound",
                                                               "exploding_tensor": "NoIssuesFound"}
    r3 = tensortap("rules", "list", "--json")
    names = {x["snake_name"] for x in json.loads(r3.stdout)}
    assert {"vanishing_gradient", "dead_relu", "loss_not_decreasing", "loss_spike", "grad_norm_spike",
            "rank_divergence", "amp_scale_collapse"} <= names and len(names) == 24
    reads = {x["snake_name"]: x["collections"] for x in json.loads(r3.stdout)}
    assert reads["dead_relu"] == ["relu_output"] and reads["saturated_activation"] == ["tanh_input", "sigmoid_input"]
    assert reads["all_zero"] == []
