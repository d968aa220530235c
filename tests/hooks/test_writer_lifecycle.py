"""What a hook's writer costs before the first saved value and after the last (issue #43): a disabled hook, or one
that never saves, starts no process and no thread; closing a hook loses nothing, with either writer, whether the
writer process had attached to its ring or not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

WRITERS = ["thread", "process"] if sys.platform.startswith("linux") else ["thread"]


SAVES_NOTHING = textwrap.dedent(
    """
    import json, os, sys, numpy as np, tensortap as tt
    out, writer = sys.argv[1], sys.argv[2]

    def threads():  # OS threads of this process, also those the threading module does not list
        return len(os.listdir("/proc/self/task"))

    def children():  # live processes whose parent is this one
        found = set()
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state, ppid = f.read().rsplit(") ", 1)[1].split()[:2]
            except OSError:
                continue
            if ppid == str(os.getpid()) and state != "Z":
                found.add(int(pid))
        return found

    before = (threads(), children())
    hook = tt.Hook(out, writer=writer, save_config=tt.SaveConfig(save_interval=1, start_step=10_000))
    seen = []
    for step in range(50):
        hook.next_step()
        hook.save_tensor("w", np.full(1000, step, dtype=np.float32))  # (saving starts at step 10,000)
        seen.append((threads(), children()))
    hook.close()
    seen.append((threads(), children()))
    print(json.dumps({"changed": [i for i, s in enumerate(seen) if s != before], "dropped": hook.dropped_records}))
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads and processes through /proc")
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("case", ["disabled", "never saves"])
def test_a_hook_that_saves_nothing_starts_no_process_or_thread(tmp_path, writer, case):
    """In a fresh interpreter (nothing else starting threads beside it)."""
    out = str(tmp_path / "run")
    env = dict(os.environ, TENSORTAP_STOP_CHECK_INTERVAL="60")  # (a local stop check is a stat, never a thread)
    env.pop("TENSORTAP_DISABLE", None)
    if case == "disabled":
        env["TENSORTAP_DISABLE"] = "1"
    r = subprocess.run([sys.executable, "-c", SAVES_NOTHING, out, writer], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["changed"] == [], "a thread or process was started (at these steps; 50: after close)"
    if case == "disabled":
        assert not os.path.exists(out)  # (nothing written at all)
    else:  # the job reads as ended: a rule or a waiting reader is not left hanging
        t = tt.create_trial(out)
        assert t.steps() == [] and t.loaded_all_steps
        assert result["dropped"] == 0


def _job(hook: tt.Hook, steps: int, first: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Steps `first` .. `first + steps - 1`: what they saved, as the script had it."""
    rng = np.random.default_rng(first)
    saved = {}
    for s in range(first, first + steps):
        hook.next_step()
        w = rng.standard_normal((64, 33)).astype(np.float32)
        b = rng.integers(0, 9, 200_000).astype(np.int16)  # (400 KB: written to the data file)
        hook.save_tensor("w", w)
        hook.save_tensor("b", b, "other")
        hook.save_scalar("loss", 1.0 / (s + 1))
        saved[s] = (w.copy(), b.copy())
    return saved


def _assert_all_readable(out: str, saved: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    t = tt.create_trial(out)
    assert t.loaded_all_steps  # the end of the job is written
    assert t.steps() == sorted(saved)
    for s, (w, b) in saved.items():
        assert np.array_equal(t.tensor("w").value(s), w)
        assert np.array_equal(t.tensor("b").value(s), b)
        assert t.tensor("scalar/loss").value(s) == 1.0 / (s + 1)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("steps", [1, 40])
def test_every_step_saved_is_readable_once_close_returns(tmp_path, writer, steps):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer=writer, save_config=tt.SaveConfig(save_interval=1), flush_interval=30)
    saved = _job(hook, steps)
    hook.close()
    assert hook.dropped_records == 0
    _assert_all_readable(out, saved)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer process is Linux only")
@pytest.mark.parametrize("attached", [False, True])
def test_close_loses_nothing_whether_the_writer_process_attached_or_not(tmp_path, attached):
    """Not attached: the writer process is stopped before it could (as on a loaded machine); close() writes the
    ring itself. Attached: a flush has gone through it; close() waits for what it still has to write."""
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1), flush_interval=30)
    saved = _job(hook, 3)
    proc = hook._writer._proc
    if attached:
        hook.flush()
    else:
        os.kill(proc.pid, signal.SIGSTOP)
    saved.update(_job(hook, 5, first=3))
    hook.close()
    assert hook.dropped_records == 0
    _assert_all_readable(out, saved)
    if not attached:
        assert proc.wait(10) == -signal.SIGKILL  # (it never wrote: close() did)

