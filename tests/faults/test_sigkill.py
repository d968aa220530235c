"""SIGKILL of a training process at random points, for both writers: nothing readable is wrong, nothing
flushed before the kill is lost, and the steps it had finished are seen as complete."""

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

TRAIN = textwrap.dedent(
    """
    import sys, numpy as np, tensortap as tt
    out, writer = sys.argv[1], sys.argv[2]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.01, writer=writer)
    base = np.arange(300, dtype=np.float32)
    step = 0
    while True:
        hook.next_step()
        hook.save_tensor("w", base + step)
        hook.save_tensor("b", np.full((7,), step, dtype=np.int64))
        hook.save_scalar("loss", 1.0 / (step + 1))
        if step % 5 == 0:
            hook.flush()
            print(step, flush=True)  # every record of steps <= this one is on disk
        step += 1
    """
)


def reference(name: str, step: int) -> bytes:
    """What the unkilled job saves: the training script's values, bit for bit."""
    if name == "w":
        return (np.arange(300, dtype=np.float32) + step).tobytes()
    if name == "b":
        return np.full((7,), step, dtype=np.int64).tobytes()
    if name == "scalar/loss":
        return np.asarray(1.0 / (step + 1)).tobytes()
    raise AssertionError(f"unexpected tensor {name!r}")


def _kill_after(out: str, writer: str, delay: float) -> int:
    """Start the job, SIGKILL it `delay` s after its first flush; the last step it had flushed."""
    p = subprocess.Popen([sys.executable, "-c", TRAIN, out, writer], stdout=subprocess.PIPE, text=True)
    try:
        flushed = int(p.stdout.readline())
        t0 = time.monotonic()
        while time.monotonic() - t0 < delay:
            line = p.stdout.readline()
            if not line:
                break
            flushed = int(line)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return flushed


def _check_killed_job(out: str, flushed: int) -> None:
    trial = tt.create_trial(out)
    shown = trial.steps(show_incomplete_steps=True)
    assert set(range(flushed + 1)) <= set(shown), "a step flushed before the kill is missing"
    for name in ("w", "b", "scalar/loss"):
        t = trial.tensor(name)
        steps = t.steps(show_incomplete_steps=True)
        assert set(range(flushed + 1)) <= set(steps), (name, "a value flushed before the kill is missing")
        for s in steps:
            assert t.value(s).tobytes() == reference(name, s), (name, s)
    # every step before the last flushed one was finished (next_step passed it) before the flush
    assert set(range(flushed)) <= set(trial.steps()), (
        f"steps finished and flushed before the kill are not complete: complete={trial.steps()[-3:]}, "
        f"flushed up to {flushed}")
    # The job never closed: a trial ends it once its index stops growing with its process gone (docs/format.md
    # §5.1), or at assume_ended; then everything written counts as complete.
    ended = tt.create_trial(out)
    ended.assume_ended()
    assert set(range(flushed + 1)) <= set(ended.steps())


KILL_DELAYS = np.random.default_rng(20).uniform(0.05, 1.2, 3).round(3).tolist()


@pytest.mark.parametrize("delay", KILL_DELAYS)
def test_sigkill_process_writer(tmp_path, delay):
    out = str(tmp_path / "job")
    _check_killed_job(out, _kill_after(out, "process", delay))


@pytest.mark.parametrize("delay", KILL_DELAYS)
def test_sigkill_thread_writer(tmp_path, delay):
    out = str(tmp_path / "job")
    _check_killed_job(out, _kill_after(out, "thread", delay))


LAGGING = textwrap.dedent(
    """
    import sys, numpy as np, tensortap as tt
    out, writer = sys.argv[1], sys.argv[2]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), writer=writer, max_pending_bytes=64 << 20)
    big = np.ones((1 << 20,), dtype=np.float32)  # 4 MiB a step: the writer falls behind
    step = 0
    while True:
        hook.next_step()
        hook.save_tensor("big", big * step)
        hook.save_scalar("loss", float(step))
        if step == 0:
            hook.flush()
            print(step, flush=True)
        step += 1
    """
)


def _kill_lagging(out: str, writer: str, delay: float) -> None:
    p = subprocess.Popen([sys.executable, "-c", LAGGING, out, writer], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "0"
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _wait_quiet(out: str, quiet_s: float = 1.0, limit_s: float = 30.0) -> None:
    """Until no file under `out` has grown for `quiet_s` (a writer process outliving its parent drains first)."""
    last, since, t0 = None, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < limit_s:
        sizes = sorted((os.path.join(d, f), os.path.getsize(os.path.join(d, f)))
                       for d, _, fs in os.walk(out) for f in fs)
        if sizes != last:
            last, since = sizes, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)


def _check_passed_marks(out: str) -> None:
    _wait_quiet(out)
    trial = tt.create_trial(out)
    shown = trial.steps(show_incomplete_steps=True)
    big = trial.tensor("big")
    for s in big.steps(show_incomplete_steps=True)[-3:]:
        assert np.array_equal(big.value(s), np.full((1 << 20,), s, dtype=np.float32))
    newest = shown[-1]
    # Records of step `newest` were handed over after the hook had passed step newest - 1 (next_step), so a
    # block holding them can carry that mark (docs/format.md §4 rule 4): every earlier step is complete.
    assert set(range(newest)) <= set(trial.steps()), (
        f"records up to step {newest} are on disk but only steps up to "
        f"{trial.steps()[-1] if trial.steps() else None} are complete")


LAG_DELAYS = np.random.default_rng(21).uniform(0.3, 1.5, 2).round(3).tolist()


@pytest.mark.parametrize("delay", LAG_DELAYS)
def test_sigkill_lagging_thread_writer_keeps_passed_marks(tmp_path, delay):
    out = str(tmp_path / "job")
    _kill_lagging(out, "thread", delay)
    _check_passed_marks(out)


@pytest.mark.parametrize("delay", LAG_DELAYS)
def test_sigkill_lagging_process_writer_keeps_passed_marks(tmp_path, delay):
    out = str(tmp_path / "job")
    _kill_lagging(out, "process", delay)
    _check_passed_marks(out)
