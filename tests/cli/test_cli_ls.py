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
    # global steps 0, 2 (TRAIN mode steps 0, 2) and 4 (EVAL mode step 0)
    assert info["tensors"]["w"] == {"count": 3, "first": 0, "last": 4, "interval": 2, "modes": {
        "TRAIN": {"count": 2, "first": 0, "last": 2, "interval": 2},
        "EVAL": {"count": 1, "first": 0, "last": 0, "interval": None}}}
    assert info["tensors"]["scalar/loss"]["modes"]["EVAL"] == {"count": 2, "first": 0, "last": 1, "interval": 1}
    assert info["collections"]["scalars"] == ["scalar/loss"]


def test_ls_text_on_smdebug_job_and_error_on_missing_dir(tmp_path):
    r = _tensortap("ls", os.path.join(FIXTURES, "pytorch_job"))
    assert r.returncode == 0, r.stderr
    assert "smdebug format" in r.stdout and "Sequential_0.weight" in r.stdout and "TRAIN" in r.stdout
    r = _tensortap("ls", str(tmp_path / "missing"))
    assert r.returncode == 2 and "no such directory" in r.stderr


def test_ls_refuses_what_is_not_a_job(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a job")
    (tmp_path / "file").write_text("x")
    for d in ("empty", "other"):
        r = _tensortap("ls", str(tmp_path / d))
        assert r.returncode == 2 and "not a job's out_dir" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""
    r = _tensortap("ls", str(tmp_path / "file"))
    assert r.returncode == 2 and "not a directory" in r.stderr and "no such" not in r.stderr
    r = _tensortap("ls", str(tmp_path / "file"), "--json")
    assert r.returncode == 2 and json.loads(r.stdout) == {"error": f"{tmp_path / 'file'}: not a directory"}


def _long_job(out):
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_steps=[0, 1, 2, 5, 6, 9, 10, 20, 21, 30, 33, 40, 41, 50,
                                                              55, 60, 61, 70, 77, 80, 81, 90]))
    for _ in range(100):
        hook.next_step()
        for i in range(800):
            hook.save_tensor(f"layer{i}/weight", np.ones(4))
    hook.close()


def test_ls_summarises_step_lists(tmp_path):
    _long_job(str(tmp_path))
    r = _tensortap("ls", str(tmp_path))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "layer7/weight" in ln)
    assert line.split() == ["layer7/weight", "22", "steps", "0..90,", "irregular", "(gaps", "1..10)"]
    info = json.loads(_tensortap("ls", str(tmp_path), "--json").stdout)
    summary = {"count": 22, "first": 0, "last": 90, "interval": None, "gaps": [1, 10]}
    assert info["tensors"]["layer7/weight"] == {**summary, "modes": {"GLOBAL": summary}}


def test_ls_counts_each_modes_own_steps_and_lists_collections_with_tensors(tmp_path):
    """Training saved every 10 steps with an EVAL pass per epoch (EVAL losses are saved at every step by default):
    two regular series in mode steps, where the global steps interleave irregularly."""
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=10),
                   include_collections=["weights", "losses"])
    for _epoch in range(3):
        hook.set_mode(tt.modes.TRAIN)
        for _ in range(20):
            hook.next_step()
            hook.save_tensor("fc.weight", np.ones(2), "weights")
            hook.save_tensor("loss", np.float32(1.0), "losses")
        hook.set_mode(tt.modes.EVAL)
        for _ in range(10):
            hook.next_step()
            hook.save_tensor("loss", np.float32(1.0), "losses")
    hook.close()
    out = _tensortap("ls", str(tmp_path)).stdout
    lines = out.splitlines()
    assert "  TRAIN    6 steps, 0..50" in lines and "  EVAL     30 steps, 0..29" in lines, out
    assert "irregular" not in out
    header = next(ln for ln in lines if ln.startswith("tensors:"))
    assert header.split()[1:] == ["TRAIN", "steps", "EVAL", "steps"]
    loss = next(ln for ln in lines if ln.split()[0] == "loss")
    assert loss.split()[1:] == ["6", "steps", "0..50,", "every", "10", "30", "steps", "0..29,", "every", "1"]
    weight = next(ln for ln in lines if ln.startswith("  fc.weight"))
    assert weight.split()[1:] == ["6", "steps", "0..50,", "every", "10", "-"]
    collections = lines[lines.index(next(ln for ln in lines if ln.startswith("collections:"))) + 1:
                        lines.index(header)]
    assert [c.split() for c in collections] == [["losses", "1", "tensor"], ["weights", "1", "tensor"]]
    assert "without tensors not shown: --all lists them" in out
    every = _tensortap("ls", str(tmp_path), "--all").stdout
    assert "  default              0 tensors" in every.splitlines()
    assert "1 tensors" not in every and "1 steps" not in every


def test_ls_into_a_closed_pipe_ends_quietly(tmp_path):
    _long_job(str(tmp_path))
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    r = subprocess.run(f"'{exe}' ls --json '{tmp_path}' | head -n 2", shell=True, capture_output=True,
                       text=True, timeout=60)
    assert len(r.stdout.splitlines()) == 2
    assert r.stderr == ""
