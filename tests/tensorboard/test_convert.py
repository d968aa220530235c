"""`tensortap tensorboard`: saved jobs (native, smdebug, s3://) converted, read back with TensorBoard's reader."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from urllib.parse import quote

import numpy as np
import pytest

import tensortap as tt
from tensortap.cli.main import main as cli_main
from tensortap.exceptions import InvalidConfiguration
from tensortap.tensorboard.convert import STATE_FILE, convert
from tensortap.tensorboard.export import EventExporter

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def _tensortap(*args, timeout=120):
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def write_job(out_dir, steps=range(10), hook=None, close=True):
    """A native job: TRAIN steps with EVAL every fourth, a weight with reductions (NaN at step 5), a loss."""
    if hook is None:
        hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1),
                       reduction_config=tt.ReductionConfig(reductions=["mean", "max"], norms=["l2"],
                                                           abs_reductions=["max"], save_raw_tensor=True))
    for s in steps:
        hook.set_mode(tt.modes.EVAL if s % 4 == 3 else tt.modes.TRAIN)
        hook.next_step()
        w = np.random.default_rng(s).normal(size=(30, 20)).astype(np.float32)
        if s == 5:
            w[:2, :2] = np.nan
            w[3, 3] = -np.inf
        hook.save_tensor("dense/weight", w, collections_to_write="weights")
        hook.save_scalar("loss", 1.0 / (s + 1))
    if close:
        hook.close()
    return hook


def test_native_job_values_equal_the_trial(tmp_path, read_run, tb):
    out, logdir = tmp_path / "job", tmp_path / "tb"
    write_job(str(out))
    r = convert(str(out), str(logdir))
    assert r.steps == 10 and r.ended and r.converted_upto == 9
    _, modes = tb.matches_trial(out, logdir)
    assert modes == {"TRAIN", "EVAL"}
    train = read_run(logdir / "worker_0" / "train")
    assert sorted(train.Tags()["histograms"]) == ["weights/dense/weight"]
    assert tb.scalars(train, "nonfinite/dense/weight")[5] == 5
    assert tb.scalars(read_run(logdir / "worker_0" / "eval"), "scalar/loss") == {
        s: np.float32(1.0 / (s + 1)) for s in (3, 7)}
    # converting again finds nothing new and writes no new file
    files = sorted(glob.glob(str(logdir / "**" / "*tfevents*"), recursive=True))
    assert len(files) == 2
    again = convert(str(out), str(logdir))
    assert again.steps == 0 and sorted(glob.glob(str(logdir / "**" / "*tfevents*"), recursive=True)) == files


@pytest.mark.parametrize("fixture", ["pytorch_job", "two_workers", "dtypes"])
def test_smdebug_fixtures(fixture, tmp_path, read_run, tb):
    src = os.path.join(FIXTURES, fixture)
    r = convert(src, str(tmp_path))
    if fixture == "dtypes":  # written without an end marker or collections: an interrupted job
        assert r.steps == 0 and r.waiting > 0 and not r.ended
        r = convert(src, str(tmp_path), assume_ended=True)
    assert r.steps > 0 and r.ended
    trial, modes = tb.matches_trial(src, tmp_path, expect_histograms=fixture != "dtypes")
    assert sorted(os.listdir(tmp_path)) == sorted([STATE_FILE, *(quote(w, safe="") for w in trial.workers())])
    if fixture == "pytorch_job":
        assert modes == {"TRAIN", "EVAL"}
        ea = read_run(tmp_path / "worker_0" / "train")
        # <collection>/<tensor> histograms without a repeated prefix; the loss a scalar leading the page, no
        # histogram for it; no non-finite chart where no value was NaN or inf
        assert {"weights/Sequential_0.weight", "gradient/Sequential_0.weight"} <= set(ea.Tags()["histograms"])
        assert not any(t.startswith("gradients/") for t in ea.Tags()["histograms"])
        assert "1_losses/CrossEntropyLoss_output_0" in ea.Tags()["scalars"]
        assert not any(t.startswith("nonfinite/") for t in ea.Tags()["scalars"])


def test_smdebug_job_on_s3(s3_url, tmp_path, read_run, tb):
    from tensortap.storage import open_storage

    st = open_storage(s3_url)
    src = os.path.join(FIXTURES, "pytorch_job")
    for root, _, files in os.walk(src):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                st.write(os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/"), fh.read())
    r = convert(s3_url, str(tmp_path / "from_s3"))
    convert(src, str(tmp_path / "local"))
    assert r.ended and r.steps == 6
    for mode in ("train", "eval"):
        a = read_run(tmp_path / "from_s3" / "worker_0" / mode)
        b = read_run(tmp_path / "local" / "worker_0" / mode)
        assert a.Tags()["scalars"] == b.Tags()["scalars"] and a.Tags()["histograms"] == b.Tags()["histograms"]
        for tag in a.Tags()["scalars"]:
            assert [(e.step, e.value) for e in a.Scalars(tag)] == [(e.step, e.value) for e in b.Scalars(tag)]


def test_a_logdir_belongs_to_one_job(tmp_path):
    write_job(str(tmp_path / "a"), steps=range(2))
    write_job(str(tmp_path / "b"), steps=range(2))
    convert(str(tmp_path / "a"), str(tmp_path / "tb"))
    with pytest.raises(InvalidConfiguration, match="holds the conversion of"):
        convert(str(tmp_path / "b"), str(tmp_path / "tb"))
    assert json.loads((tmp_path / "tb" / STATE_FILE).read_text())["source"] == str(tmp_path / "a")
    live = EventExporter(str(tmp_path / "live"), "worker_0")  # a live export's directory is no conversion's
    live.add("x", 0, "TRAIN", 0, np.float32(1), {})
    live.close()
    with pytest.raises(InvalidConfiguration, match="no conversion wrote"):
        convert(str(tmp_path / "a"), str(tmp_path / "live"))


def test_cli_errors_name_the_problem(tmp_path, capsys):
    assert cli_main(["tensorboard", str(tmp_path / "missing"), "--logdir", str(tmp_path / "tb")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert cli_main(["tensorboard", str(tmp_path)]) == 2
    assert "--logdir" in capsys.readouterr().err
    assert cli_main(["tensorboard", str(tmp_path), "--logdir", str(tmp_path / "tb"), "--interval", "0"]) == 2
    assert "--interval" in capsys.readouterr().err


def test_follow_converts_a_live_job_incrementally(tmp_path, read_run, tb):
    out, logdir = tmp_path / "job", tmp_path / "tb"
    hook = write_job(str(out), steps=range(5), close=False)
    hook.flush()
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    proc = subprocess.Popen([exe, "tensorboard", str(out), "--logdir", str(logdir), "--follow", "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run = logdir / "worker_0" / "train"
        deadline = time.monotonic() + 90
        while True:  # steps 0-3 are complete (the hook is still in step 4)
            if run.is_dir() and tb.scalars(read_run(run), "scalar/loss").keys() >= {0, 1, 2}:
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first steps never appeared"
            time.sleep(0.2)
        first = {p: open(p, "rb").read() for p in glob.glob(str(logdir / "**" / "*tfevents*"), recursive=True)}
        write_job(str(out), steps=range(5, 12), hook=hook)  # more steps, then the job ends
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "the job has ended" in stdout
    loss = tb.scalars(read_run(run), "scalar/loss")
    assert sorted(loss) == [s for s in range(12) if s % 4 != 3]
    assert sorted(tb.scalars(read_run(logdir / "worker_0" / "eval"), "scalar/loss")) == [3, 7, 11]
    for path, data in first.items():  # appended to, never rewritten
        assert open(path, "rb").read()[: len(data)] == data
    assert json.loads((logdir / STATE_FILE).read_text())["converted_upto"] == 11
    tb.matches_trial(out, logdir)


def test_cli_on_an_interrupted_job_converts_complete_steps_or_all(tmp_path):
    src = os.path.join(FIXTURES, "dtypes")
    r = _tensortap("tensorboard", src, "--logdir", str(tmp_path))
    assert r.returncode == 0 and "not complete yet" in r.stdout and "--all" in r.stdout
    assert not (tmp_path / "worker_0").exists()
    r = _tensortap("tensorboard", src, "--logdir", str(tmp_path), "--all")
    assert r.returncode == 0 and "converted" in r.stdout, r.stderr
    assert glob.glob(str(tmp_path / "*" / "*" / "*tfevents*"))
