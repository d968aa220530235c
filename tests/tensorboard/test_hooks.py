"""Live export from the hooks (export_tensorboard / tensorboard_dir), read back with TensorBoard's reader."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensortap as tt


def _generic_job(hook, steps=9):
    for s in range(steps):
        hook.set_mode(tt.modes.EVAL if s % 3 == 2 else tt.modes.TRAIN)
        hook.next_step()
        w = np.random.default_rng(s).normal(size=(20, 10)).astype(np.float32)
        if s == 4:
            w[0, :2] = np.nan
            w[1, 1] = np.inf
        hook.save_tensor("fc.weight", w, collections_to_write="weights")
        hook.save_tensor("small", np.arange(3.0) * s)  # the default collection
        hook.save_scalar("loss", 1.0 / (s + 1))
    hook.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_generic_hook_exports_every_step_and_mode(tmp_path, writer, read_run, tb):
    out, tbdir = tmp_path / "job", tmp_path / "tb"
    hook = tt.Hook(str(out), export_tensorboard=True, tensorboard_dir=str(tbdir),
                   save_config=tt.SaveConfig(save_interval=1), writer=writer,
                   reduction_config=tt.ReductionConfig(reductions=["mean"], norms=["l2"], save_raw_tensor=True))
    _generic_job(hook)
    _, modes = tb.matches_trial(out, tbdir)
    assert modes == {"TRAIN", "EVAL"}
    train = read_run(tbdir / "worker_0" / "train")
    assert {"weights/fc.weight", "default/small"} <= set(train.Tags()["histograms"])
    assert tb.scalars(train, "nonfinite/fc.weight")[4] == 3
    assert sorted(tb.scalars(train, "scalar/loss")) == [s for s in range(9) if s % 3 != 2]
    assert sorted(tb.scalars(read_run(tbdir / "worker_0" / "eval"), "scalar/loss")) == [2, 5, 8]
    for mode in ("train", "eval"):  # files grow with data, not with steps
        assert len(os.listdir(tbdir / "worker_0" / mode)) == 1


def test_export_tensorboard_alone_writes_under_out_dir(tmp_path, read_run, tb):
    out = tmp_path / "job"
    _generic_job(tt.Hook(str(out), export_tensorboard=True, save_config=tt.SaveConfig(save_interval=1)))
    tb.matches_trial(out, out / "tensorboard")


def test_tensorboard_dir_alone_turns_export_on(tmp_path, tb):
    # smdebug: a tensorboard_dir is enough (spec 1.1)
    out, tbdir = tmp_path / "job", tmp_path / "tb"
    _generic_job(tt.Hook(str(out), tensorboard_dir=str(tbdir), save_config=tt.SaveConfig(save_interval=1)))
    tb.matches_trial(out, tbdir)


def test_hook_json_config_tensorboard_keys(tmp_path, monkeypatch, tb):
    out, tbdir = tmp_path / "job", tmp_path / "tb"
    cfg = tmp_path / "hook.json"
    cfg.write_text(json.dumps({"LocalPath": str(out), "HookParameters": {
        "save_interval": "1", "export_tensorboard": "true", "tensorboard_dir": str(tbdir)}}))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(cfg))
    _generic_job(tt.Hook.create_from_json_file())
    tb.matches_trial(out, tbdir)


def test_pytorch_hook_exports_weights_gradients_and_losses(tmp_path, read_run, tb):
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    out, tbdir = tmp_path / "job", tmp_path / "tb"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = tp.Hook(str(out), export_tensorboard=True, tensorboard_dir=str(tbdir),
                   save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _epoch in range(2):
        hook.set_mode(tp.modes.TRAIN)
        model.train()
        for _ in range(3):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        hook.set_mode(tp.modes.EVAL)
        model.eval()
        with torch.no_grad():
            loss_fn(model(x), y)
    hook.close()
    trial, modes = tb.matches_trial(out, tbdir)
    assert modes == {"TRAIN", "EVAL"}
    train = read_run(tbdir / "worker_0" / "train")
    hists = set(train.Tags()["histograms"])
    weights = trial.tensor_names(collection="weights")
    gradients = trial.tensor_names(collection="gradients")
    assert weights and gradients
    assert {f"weights/{n}" for n in weights} <= hists and set(gradients) <= hists  # gradient/<name>
    losses = {f"1_losses/{n}" for n in trial.tensor_names(collection="losses")}
    assert losses and losses <= set(train.Tags()["scalars"])
    assert losses <= set(read_run(tbdir / "worker_0" / "eval").Tags()["scalars"])


TRAIN = """
import numpy as np, tensortap as tt
hook = tt.Hook.create_from_json_file()
for step in range(6):
    hook.set_mode(tt.modes.TRAIN)
    hook.next_step()
    hook.save_tensor("fc.weight", np.arange(12.0).reshape(3, 4) * step, "weights")
    hook.save_scalar("loss", 1.0 / (step + 1))
hook.close()
"""


def test_run_with_tensorboard_dir(tmp_path, tb):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out, tbdir = tmp_path / "job", tmp_path / "tb"
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    r = subprocess.run([exe, "run", "--out-dir", str(out), "--tensorboard-dir", str(tbdir), "--collection", "weights",
                        "--save-interval", "1", "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    tb.matches_trial(out, tbdir)


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_an_export_that_cannot_keep_up_skips_histograms_never_data(tmp_path, monkeypatch, writer, read_run, tb):
    # a budget of 1e-9 of the writer's time: the first step's histograms and no more
    monkeypatch.setenv("TENSORTAP_TENSORBOARD_BUDGET", "1e-9")
    out, tbdir = tmp_path / "job", tmp_path / "tb"
    hook = tt.Hook(str(out), tensorboard_dir=str(tbdir), save_config=tt.SaveConfig(save_interval=1), writer=writer)
    _generic_job(hook)
    trial = tt.create_trial(str(out))
    assert trial.tensor("fc.weight").steps() == list(range(9))  # the store has every value
    hists, skipped = 0, []
    for mode, steps in (("train", [0, 1, 3, 4, 6, 7]), ("eval", [2, 5, 8])):
        ea = read_run(tbdir / "worker_0" / mode)
        assert sorted(tb.scalars(ea, "scalar/loss")) == steps  # every scalar
        for tag in ea.Tags()["histograms"]:
            for e in ea.Histograms(tag):
                np.testing.assert_array_equal(np.asarray(e.histogram_value.bucket),
                                              tb.numpy_counts(trial.tensor(tag.split("/", 1)[1]).value(e.step)))
                hists += 1
        if "tensortap/skipped_histograms" in ea.Tags()["scalars"]:
            skipped += [e.value for e in ea.Scalars("tensortap/skipped_histograms")]
    # fc.weight and small at 9 steps: 18 histograms, the skipped ones counted in the event files
    assert 1 <= hists < 18 and max(skipped) == 18 - hists


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_bad_budget_is_refused_when_the_hook_is_made(tmp_path, monkeypatch, writer):
    from tensortap.exceptions import InvalidConfiguration

    monkeypatch.setenv("TENSORTAP_TENSORBOARD_BUDGET", "lots")
    with pytest.raises(InvalidConfiguration, match="TENSORTAP_TENSORBOARD_BUDGET='lots'"):
        tt.Hook(str(tmp_path / "job"), tensorboard_dir=str(tmp_path / "tb"), writer=writer)
