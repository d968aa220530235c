"""A 4 MiB tmpfs as out_dir: training goes on, what is on disk is readable and right, every loss is counted
and reported in one warning."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

TRAIN = textwrap.dedent(
    """
    import json, sys, numpy as np, tensortap as tt
    out, writer = sys.argv[1], sys.argv[2]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), writer=writer, flush_interval=0.05)
    submitted = 0
    for step in range(600):
        hook.next_step()
        hook.save_tensor("w", np.full((8192,), step, dtype=np.float32))  # 32 KiB: 19 MiB in all
        hook.save_scalar("loss", float(step))
        submitted += 2
        if step % 10 == 0:
            hook.flush()  # index blocks land before the disk fills: those steps must stay readable
    hook.close()
    print(json.dumps({"submitted": submitted, "dropped": hook.dropped_records}), flush=True)
    """
)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs here (needs root and CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _run(out: str, writer: str) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", TRAIN, out, writer], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"training must finish on a full disk: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _readable(out: str) -> int:
    """Records readable from the full disk, each checked bit for bit."""
    trial = tt.create_trial(out)
    trial.assume_ended()
    n = 0
    for name, expected in (("w", lambda s: np.full((8192,), s, dtype=np.float32)),
                           ("scalar/loss", lambda s: np.asarray(float(s)))):
        if not trial.has_tensor(name):
            continue
        t = trial.tensor(name)
        for s in t.steps(show_incomplete_steps=True):
            assert t.value(s).tobytes() == expected(s).tobytes(), (name, s)
            n += 1
    return n


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_full_disk_training_finishes_and_what_is_readable_is_right(small_disk, writer):
    out = os.path.join(small_disk, "job")
    _run(out, writer)
    _readable(out)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_full_disk_losses_are_counted_and_reported_once(small_disk, writer):
    out = os.path.join(small_disk, "job")
    counts, stderr = _run(out, writer)
    readable = _readable(out)
    assert readable > 0, "the index must get room: what was flushed before the disk filled stays readable"
    assert readable + counts["dropped"] == counts["submitted"], (readable, counts)
    assert "Traceback" not in stderr, stderr[-3000:]
    causes = [ln for ln in stderr.splitlines() if "no space" in ln.lower()]
    assert len(causes) == 1, stderr[-3000:]
    assert tt.create_trial(out).loaded_all_steps  # the end of the job was still written


FAST = textwrap.dedent(
    """
    import json, sys, numpy as np, tensortap as tt
    out, writer = sys.argv[1], sys.argv[2]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), writer=writer)  # (flushes every 0.5 s)
    submitted = 0
    for step in range(600):
        hook.next_step()
        hook.save_tensor("w", np.full((8192,), step, dtype=np.float32))  # 32 KiB: 19 MiB in all
        hook.save_scalar("loss", float(step))
        submitted += 2
    hook.close()
    print(json.dumps({"submitted": submitted, "dropped": hook.dropped_records}), flush=True)
    """
)


def test_a_disk_filled_fast_keeps_what_fitted_with_either_writer(small_disk):
    """No flush before the disk fills (a fast job, the default flush interval): each writer keeps the records whose
    payloads fitted, not only those indexed before, so both keep the same steps, about the whole disk's worth."""
    kept = {}
    for writer in ("thread", "process"):
        out = os.path.join(small_disk, writer)
        counts, _stderr = _run_script(FAST, out, writer)
        readable = _readable(out)  # (bit for bit)
        assert readable + counts["dropped"] == counts["submitted"], (writer, readable, counts)
        kept[writer] = _kept_steps(out)
        gc.collect()  # (a trial's mappings of the data file hold its space)
        subprocess.run(["rm", "-rf", out], check=True)
    # 32 KiB a step on a 4 MiB disk: at least 3 MiB of it holds steps, with either writer, the same ones
    assert len(kept["thread"]) >= 96 and len(kept["process"]) >= 96, {w: len(s) for w, s in kept.items()}
    assert abs(len(kept["thread"]) - len(kept["process"])) <= 1, {w: len(s) for w, s in kept.items()}
    for steps in kept.values():
        assert steps == list(range(len(steps)))  # the first steps, none missing


def _kept_steps(out: str) -> list[int]:
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps
    return trial.tensor("w").steps(show_incomplete_steps=True) if trial.has_tensor("w") else []


def _run_script(script: str, out: str, writer: str) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", script, out, writer], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"training must finish on a full disk: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr
