"""`tensortap tensorboard` on damaged jobs converts what a trial can read: a damaged value is skipped with one
line naming its file and offset and a summary, everything else is converted (read back with TensorBoard's own
reader); a job whose data has no index is an error naming the missing index file."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tensortap as tt

STEPS = 60
NAMES = ("a", "b", "c")


def _value(step: int, k: int) -> np.ndarray:
    return np.full((64,), step * 3 + k + 0.5, dtype=np.float32)


def _write(out: str) -> None:
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for step in range(STEPS):
        hook.set_mode(tt.modes.TRAIN)
        hook.next_step()
        for k, name in enumerate(NAMES):
            hook.save_tensor(name, _value(step, k), "weights")
    hook.close()


def _tensortap(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def _histograms(logdir: str) -> dict[str, dict[int, float]]:
    """{tag: {step: the histogram's sum}} of every run under `logdir`, read by TensorBoard's reader."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for run in {os.path.dirname(f) for f in glob.glob(os.path.join(logdir, "**", "*tfevents*"), recursive=True)}:
        ea = EventAccumulator(run, size_guidance={"histograms": 0, "scalars": 0, "tensors": 0})
        ea.Reload()
        for tag in ea.Tags()["histograms"]:
            out.setdefault(tag, {}).update({e.step: e.histogram_value.sum for e in ea.Histograms(tag)})
    return out


def test_one_damaged_value_is_skipped_and_the_rest_converted(tmp_path):
    out, logdir = str(tmp_path / "job"), str(tmp_path / "tb")
    _write(out)
    (dat,) = glob.glob(os.path.join(out, "tensortap", "worker_0", "*.dat"))
    with open(dat, "r+b") as f:
        data = f.read()
        at = data.find(_value(17, 2).tobytes())
        assert at >= 0 and data.find(_value(17, 2).tobytes(), at + 1) < 0
        f.seek(at + 100)
        f.write(bytes([data[at + 100] ^ 0x10]))
    r = _tensortap("tensorboard", out, "--logdir", logdir)
    assert r.returncode == 0, r.stdout + r.stderr
    hist = _histograms(logdir)
    tags = {name: next(t for t in hist if t.endswith("/" + name)) for name in NAMES}
    for k, name in enumerate(NAMES):
        want = {s: float(_value(s, k).sum()) for s in range(STEPS) if (s, k) != (17, 2)}
        assert hist[tags[name]] == pytest.approx(want), name
    assert sum(len(v) for v in hist.values()) == STEPS * len(NAMES) - 1
    lines = [ln for ln in r.stderr.splitlines() if "damaged" in ln and "c at step 17" in ln]
    assert len(lines) == 1, r.stderr
    assert dat in lines[0] and f"offset {at}" in lines[0]
    assert "skipped damaged data" in r.stderr and "1 value(s)" in r.stderr


def test_data_without_its_index_is_an_error_naming_the_missing_file(tmp_path):
    out, logdir = str(tmp_path / "job"), str(tmp_path / "tb")
    _write(out)
    (idx,) = glob.glob(os.path.join(out, "tensortap", "worker_0", "*.idx"))
    os.remove(idx)
    r = _tensortap("tensorboard", out, "--logdir", logdir)
    assert r.returncode == 2, r.stdout + r.stderr
    assert idx in r.stderr and "missing" in r.stderr
    assert not glob.glob(os.path.join(logdir, "**", "*tfevents*"), recursive=True)
