"""Damage is reported in the words of what happened: an index block damaged at offset N costs steps a–b, and
a step lost that way is never "not saved and never will be". An index cut short at a block boundary (no damage
to see, no end mark) is told from a live job once its writing process is gone: the job ends instead of
looking live for ever, while a live job that is merely idle keeps waiting. Jobs written by real processes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import NoMoreData, StepUnavailable
from tensortap.format import codec
from tensortap.format.native import NativeSource
from tensortap.storage import LocalStorage
from tensortap.trials import StepState, Trial

STEPS = 12
SETTLE_S = 0.2
JOB = textwrap.dedent(
    """
    import os, sys, time, numpy as np, tensortap as tt
    out, pause_at, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=60, writer="thread")
    for step in range(int(sys.argv[4])):
        if step == pause_at:
            hook.flush()
            print("paused", flush=True)
            while not os.path.exists(go):
                time.sleep(0.01)
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        hook.save_tensor("w", np.full((4, 8), step, dtype=np.float32), "weights")
        hook.save_scalar("loss", 1.0 / (step + 1))
        hook.flush()  # one index block per step
    hook.close()
    """
)


def _start(out: str, pause_at: int = -1, go: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB, out, str(pause_at), go, str(STEPS)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _write(out: str) -> str:
    p = _start(out)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    (idx,) = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.endswith(".idx")]
    return idx


def _blocks(idx: str) -> list[tuple[int, int, set[int]]]:
    """(start, end, global steps of its records) of each block of the index."""
    with open(idx, "rb") as f:
        data = f.read()
    dec = codec.decode_blocks(data, 0, idx, final=True)
    ends = [at for _, _, at in dec.blocks[1:]] + [len(data)]
    return [(at, end, {int(s) for s in e["step"]}) for (_, e, at), end in zip(dec.blocks, ends, strict=True)]


def _trial(out: str) -> Trial:
    return Trial(NativeSource(LocalStorage(out), settle_s=SETTLE_S), "job")


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("victims", [[5], [3, 4]])
def test_a_damaged_index_block_is_reported_with_the_steps_it_cost(tmp_path, caplog, victims):
    out = str(tmp_path / "job")
    idx = _write(out)
    blocks = _blocks(idx)
    hit = [next(b for b in blocks if b[2] == {s}) for s in victims]
    for _, end, _ in hit:
        _flip(idx, end - 5)  # inside the block's entries: its checksum no longer matches
    caplog.set_level(logging.WARNING, logger="tensortap")
    trial = tt.create_trial(out)
    lost = f"step {victims[0]}" if len(victims) == 1 else f"steps {victims[0]}–{victims[-1]}"
    assert trial.tensor("w").steps() == [s for s in range(STEPS) if s not in victims]
    for mode in (tt.modes.GLOBAL, tt.modes.TRAIN):
        for s in victims:
            assert trial.has_passed_step(s, mode) == StepState.UNAVAILABLE
            with pytest.raises(StepUnavailable) as e:
                trial.wait_for_steps([s], mode)
            msg = str(e.value)
            assert "never will be" not in msg and "was lost" in msg and f"offset {hit[0][0]}" in msg, msg
    # neighbouring damaged blocks are one damaged place: decoding resumes at the next intact block
    start = hit[0][0]
    assert [(d.path, d.offset) for d in trial.damage] == [(idx, start)]
    assert trial.damage[0].lost == f"{lost} of worker worker_0 lost", trial.damage
    said = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(said) == 1, said
    assert f"index block damaged in {idx} at offset {start}" in said[0] and f"{lost} of worker worker_0 lost" in said[0]
    # a step that was not saved (past the end) is still told as such
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([STEPS + 5])


def test_an_index_cut_at_a_block_boundary_ends_once_its_writer_is_gone(tmp_path, caplog):
    out = str(tmp_path / "job")
    idx = _write(out)
    blocks = _blocks(idx)
    cut = next(end for _, end, steps in blocks if steps == {7})
    with open(idx, "r+b") as f:
        f.truncate(cut)  # steps 8.. and the end mark gone, no torn block left
    caplog.set_level(logging.WARNING, logger="tensortap")
    trial = _trial(out)
    deadline = time.monotonic() + 60
    while trial.has_passed_step(STEPS + 3) == StepState.NOT_YET_AVAILABLE and time.monotonic() < deadline:
        time.sleep(SETTLE_S / 2)
        trial.refresh_data()
    assert trial.has_passed_step(STEPS + 3) == StepState.UNAVAILABLE, "a cut index of a finished job looks live"
    assert trial.loaded_all_steps
    assert trial.tensor("w").steps() == list(range(8))
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([9])
    said = [r.getMessage() for r in caplog.records if "without the end mark" in r.getMessage()]
    assert len(said) == 1 and idx in said[0] and "after step 7" in said[0], said


def test_an_idle_live_job_is_not_taken_for_a_cut_index(tmp_path):
    out, go = str(tmp_path / "job"), str(tmp_path / "go")
    proc = _start(out, pause_at=6, go=go)
    try:
        assert proc.stdout.readline().strip() == "paused"
        trial = _trial(out)
        for _ in range(20):  # ten settle times idle: its writer is alive, so the job may go on
            time.sleep(SETTLE_S / 2)
            trial.refresh_data()
            assert trial.has_passed_step(STEPS - 1) == StepState.NOT_YET_AVAILABLE
        assert not trial.loaded_all_steps and trial.damage == []
        open(go, "w").close()
        trial.wait_for_steps([STEPS - 1], timeout=120)
        assert trial.tensor("w").steps() == list(range(STEPS))
        assert np.array_equal(trial.tensor("w").value(STEPS - 1), np.full((4, 8), STEPS - 1, dtype=np.float32))
    finally:
        open(go, "w").close()
        proc.communicate(timeout=120)
