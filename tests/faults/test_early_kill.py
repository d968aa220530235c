"""A training process killed before its writer process has attached to the ring (issue #39, item 1): what it
handed over is still written, because the writer process holds the ring from its start, and the ring is never
removed under it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensortap as tt

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer process is Linux only")

# The writer process is stopped right after it is started (as on a loaded machine, where it may take seconds to
# attach), the job trains, then it is SIGKILLed; only then does the writer process run.
TRAIN = textwrap.dedent(
    """
    import os, signal, sys, numpy as np, tensortap as tt
    out, steps = sys.argv[1], int(sys.argv[2])
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1))
    child = hook._get_writer()._proc.pid
    os.kill(child, signal.SIGSTOP)
    print(child, flush=True)
    for step in range(steps):
        hook.next_step()
        hook.save_tensor("x", np.full(1000, step, dtype=np.float32))
        hook.save_scalar("loss", 1.0 / (step + 1))
    hook.next_step()  # (the last step passed)
    print("trained", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # (a zombie nobody reaps has ended too)
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.parametrize("steps", [1, 60])
def test_a_job_killed_before_its_writer_process_attached_keeps_every_step_it_handed_over(tmp_path, steps):
    out = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-c", TRAIN, out, str(steps)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(p.stdout.readline())
        assert p.stdout.readline().strip() == "trained"
        assert p.wait(60) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
        if child is not None:
            os.kill(child, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the writer process did not finish after its training process was killed"
    t = tt.create_trial(out)
    x = t.tensor("x")
    assert x.steps(show_incomplete_steps=True) == list(range(steps))
    for s in range(steps):
        assert np.array_equal(x.value(s), np.full(1000, s, dtype=np.float32))
        assert t.tensor("scalar/loss").value(s) == 1.0 / (s + 1)
    assert t.steps() == list(range(steps))  # every step passed before the kill reads as complete
