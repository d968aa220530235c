"""`tensortap run` as a Unix tool: stop signals, failed starts, no process left behind, progress in logs.

Every process a run starts inherits its environment; each test tags the run with a unique variable and looks
in /proc for any process still carrying it once the run has exited.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

TRAIN = textwrap.dedent(
    """
    import time, numpy as np, tensortap as tt
    hook = tt.Hook.create_from_json_file()   # the runner's config
    for step in range(100000):
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        hook.save_tensor("gradient/fc.weight", np.full((4, 4), 0.3), "gradients")
        hook.save_tensor("loss", np.float32(1.0 / (step + 1)), "losses")
        time.sleep(0.02)
    """
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc to find leftover processes")


def _exe() -> str:
    return os.path.join(os.path.dirname(sys.executable), "tensortap")


def _tagged_env(tag: str) -> dict[str, str]:
    return {**os.environ, "TENSORTAP_TEST_RUN_TAG": tag}


def _processes_with(tag: str) -> list[str]:
    """Command lines of the live processes whose environment carries `tag` (zombies excluded)."""
    found = []
    needle = f"TENSORTAP_TEST_RUN_TAG={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def _wait_gone(tag: str, within: float = 20.0) -> list[str]:
    """Processes of the run still alive `within` seconds after it exited (rules exit at once; this only
    absorbs a slow machine's scheduling)."""
    deadline = time.monotonic() + within
    left = _processes_with(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _processes_with(tag)
    return left


def _status(out: str, rule: str) -> dict:
    with open(os.path.join(out, "rules", rule, "status.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_stops_training_and_rules_and_prints_the_summary(tmp_path, sig):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    out = str(tmp_path / "job")
    tag = uuid.uuid4().hex
    log = open(tmp_path / "out.txt", "w+")
    p = subprocess.Popen([_exe(), "run", "--out-dir", out, "--save-interval", "2", "--rule", "vanishing_gradient",
                          "--rule", "exploding_tensor", "--", sys.executable, str(train)],
                         stdout=log, stderr=subprocess.STDOUT, env=_tagged_env(tag), start_new_session=True)
    try:
        # Wait until both rules have judged a saved step: training and rules are running.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if all((_status(out, r).get("last_step") or 0) >= 4
                       for r in ("vanishing_gradient", "exploding_tensor")):
                    break
            except (OSError, ValueError):
                pass
            assert p.poll() is None, open(tmp_path / "out.txt").read()
            time.sleep(0.1)
        else:
            pytest.fail("the rules never judged step 4")
        assert len(_processes_with(tag)) >= 4  # runner, training, its writer, rules
        p.send_signal(sig)
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    log.seek(0)
    text = log.read()
    assert rc == 2, text
    assert _wait_gone(tag) == []
    name = signal.Signals(sig).name
    assert f"[tensortap] {name}: stopping training and rules" in text
    assert f"stopped by {name}" in text
    for rule in ("vanishing_gradient", "exploding_tensor"):
        s = _status(out, rule)
        assert s["status"] == "Stopped", (s["status"], s.get("message"), s.get("traceback"))
        assert s["report"]["steps_evaluated"] >= 3  # what it had judged when stopped
        assert f"[tensortap] {rule}: Stopped" in text
    # training unwound as after Ctrl-C: its hook closed and freed its shared memory
    assert "KeyboardInterrupt" in text
    assert "leaked" not in text and "resource_tracker" not in text
    import tensortap as tt

    assert tt.create_trial(out).loaded_all_steps  # the job is marked ended


def _write_bad_programs(tmp_path) -> dict[str, list[str]]:
    not_exec = tmp_path / "not_executable.sh"
    not_exec.write_text("echo hi\n")
    bad_format = tmp_path / "bad_format.bin"
    bad_format.write_bytes(b"\x00\x01 not a program\n")
    bad_format.chmod(0o755)
    return {"no_such_binary": ["no_such_binary"], "typo": ["pyhton", "train.py"],
            "not_executable": [str(not_exec)], "exec_format": [str(bad_format)],
            "missing_file": [str(tmp_path / "nowhere" / "train.sh")]}


@pytest.mark.parametrize("case", ["no_such_binary", "typo", "not_executable", "exec_format", "missing_file"])
def test_a_command_that_cannot_start_leaves_no_process_behind(tmp_path, case):
    command = _write_bad_programs(tmp_path)[case]
    out = str(tmp_path / "job")
    tag = uuid.uuid4().hex
    r = subprocess.run([_exe(), "run", "--out-dir", out, "--rule", "vanishing_gradient", "--rule",
                        "loss_not_decreasing", "--", *command], capture_output=True, text=True, timeout=120,
                       env=_tagged_env(tag))
    assert r.returncode == 2, (r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(("tensortap: error: training command",
                                 "tensortap: error: cannot start the training command")), r.stderr
    assert repr(command[0]) in errors[0]
    assert _wait_gone(tag) == []
    if case == "exec_format":  # it got past the checks and started the rules: they were stopped
        assert _status(out, "vanishing_gradient")["status"] == "Stopped"
    else:  # refused before anything started: nothing written
        assert not os.path.exists(out)


def test_piped_output_has_a_progress_line_every_few_seconds(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN.replace("range(100000)", "range(400)"))
    out = str(tmp_path / "job")
    r = subprocess.run([_exe(), "run", "--out-dir", out, "--save-interval", "5", "--rule", "vanishing_gradient",
                        "--", sys.executable, str(train)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if " s | training " in line]
    assert lines, r.stdout  # 400 steps of 20 ms: over 8 s of training
    assert all("vanishing_gradient " in line for line in lines)
    assert any(re.search(r"training running, step \d+ saved", line) for line in lines), lines
