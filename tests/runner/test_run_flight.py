"""`tensortap run` turns the flight recorder on (docs/pytorch.md "The flight recorder"); one flag turns it off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

import tensortap as tt  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    for step in range(12):
        if step == 5:
            with torch.no_grad():
                model[2].weight.fill_(3e38)  # its outputs overflow
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    """
)


def tensortap(*args, timeout=300):
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flag", [None, "--no-flight-recorder"])
def test_on_by_default_off_by_flag(tmp_path, flag):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "500", *([flag] if flag else []), "--",
                  sys.executable, str(script))
    assert r.returncode in (0, 3), (r.stdout, r.stderr[-3000:])
    trial = tt.create_trial(out)
    if flag:
        assert trial.incidents() == []
        return
    inc = trial.first_nonfinite()
    assert (inc["step"], inc["mode"], inc["detail"]["phase"], inc["detail"]["module"]) == (5, "TRAIN", "forward", "2")
    assert inc["ring"] == {"first_step": 0, "last_step": 5}
    assert "gradient/Sequential_4.weight" in trial.tensor_names(collection="flight")
