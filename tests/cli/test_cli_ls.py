"""`tensortap ls` through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np

import tensortap as tt

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def _tensortap(*args):
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def test_ls_json_on_native_job(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=2))
    for s in range(6):
        hook.set_mode(tt.modes.TRAIN if s < 4 else tt.modes.EVAL)
        hook.next_step()
        hook.save_tensor("w", np.ones(3) * s)
        hook.save_scalar("loss", float(s))
    hook.close()
    r = _tensortap("ls", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["workers"] == ["worker_0"] and info["ended"]
    assert info["steps"] == {"count": 6, "first": 0, "last": 5}
    assert info["modes"]["TRAIN"]["count"] == 4 and info["modes"]["EVAL"]["count"] == 2
    assert info["tensors"]["w"]["steps"] == [0, 2, 4]
    assert info["tensors"]["scalar/loss"]["count"] == 6
    assert info["collections"]["scalars"] == ["scalar/loss"]


def test_ls_text_on_smdebug_job_and_error_on_missing_dir(tmp_path):
    r = _tensortap("ls", os.path.join(FIXTURES, "pytorch_job"))
    assert r.returncode == 0, r.stderr
    assert "smdebug format" in r.stdout and "Sequential_0.weight" in r.stdout and "TRAIN" in r.stdout
    r = _tensortap("ls", str(tmp_path / "missing"))
    assert r.returncode == 2 and "no such directory" in r.stderr
