"""Two `tensortap run` started on one out_dir, at several delays: exactly one runs the job; the other is refused
before it starts anything and writes nothing into the job's folder (no rule statuses, no control files), so the
job it did not start ends with its own rules' verdicts on its own data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

TRAIN = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    hook = tt.Hook.create_from_json_file()   # the runner's config
    for step in range(int(sys.argv[1])):
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        hook.save_tensor("gradient/fc.weight", np.full((4, 4), 0.3), "gradients")
        hook.save_tensor("loss", np.float32(1.0 / (step + 1)), "losses")
        time.sleep(0.005)
    hook.close()
    print("training finished", flush=True)
    """
)
STEPS = 400


def _start(out: str, train_py: str, rule: str) -> subprocess.Popen:
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.Popen([exe, "run", "--out-dir", out, "--save-interval", "1", "--rule", rule, "--json",
                             "--stop-on-issue", "--", sys.executable, train_py, str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _snapshot(out: str) -> dict[str, tuple[int, int]]:
    files = {}
    for root, _, names in os.walk(out):
        for n in names:
            p = os.path.join(root, n)
            st = os.stat(p)
            files[os.path.relpath(p, out)] = (st.st_mtime_ns, st.st_size)
    return files


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.2, 0.3, 0.6])
def test_a_refused_run_never_writes_into_the_job_it_lost_to(tmp_path, delay):
    train_py = tmp_path / "train.py"
    train_py.write_text(TRAIN)
    out = str(tmp_path / "job")
    # Different rules, so that whatever the loser writes into the folder shows: its rule's status folder.
    first = _start(out, str(train_py), "vanishing_gradient")
    time.sleep(delay)
    second = _start(out, str(train_py), "exploding_tensor")
    results = {}
    for name, p in (("vanishing_gradient", first), ("exploding_tensor", second)):
        stdout, stderr = p.communicate(timeout=300)
        results[name] = (p.returncode, stdout, stderr)
    refused = [n for n, (rc, _, _) in results.items() if rc == 2]
    assert len(refused) == 1, {n: (rc, e[-1500:]) for n, (rc, _, e) in results.items()}
    loser = refused[0]
    winner = next(n for n in results if n != loser)
    rc, stdout, stderr = results[loser]
    assert "already holds a job" in stdout + stderr and out in stdout + stderr
    rc, stdout, stderr = results[winner]
    assert rc == 0, stderr[-3000:]
    doc = json.loads(stdout)
    assert doc["training"]["exit_code"] == 0 and doc["training"]["stopped_by"] is None
    assert [(r["name"], r["status"]) for r in doc["rules"]] == [(winner, "NoIssuesFound")]
    # Only the winner's files: its rule's folder, its own control files, saying what happened to its training.
    assert sorted(os.listdir(os.path.join(out, "rules"))) == [winner]
    with open(os.path.join(out, "tensortap", "control", "training.json")) as f:
        assert json.load(f)["exit_code"] == 0
    import tensortap as tt

    trial = tt.create_trial(out)
    assert trial.tensor("loss").steps() == list(range(STEPS))
    before = _snapshot(out)
    time.sleep(0.5)  # nothing of the loser still running writes later
    assert _snapshot(out) == before
