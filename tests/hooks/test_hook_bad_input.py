"""The generic Hook with odd values: refused one by one, never turning the hook off; torch bfloat16 stored."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt


def test_save_scalar_none_skips_that_value_only(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    try:
        hook.save_scalar("x", None)
    except tt.exceptions.InvalidConfiguration as e:  # refusing it with a clear error is fine too
        assert "None" in str(e)
    hook.save_scalar("y", 2.0)
    hook.save_tensor("w", np.arange(3.0))
    hook.close()
    assert not hook.disabled and hook.error_count == 0
    trial = tt.create_trial(str(tmp_path))
    assert trial.tensor("scalar/y").value(0) == 2.0
    assert np.array_equal(trial.tensor("w").value(0), np.arange(3.0))


def test_save_tensor_none_skips_that_value_only(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("nothing", None)
    hook.save_tensor("w", np.arange(3.0))
    hook.close()
    assert not hook.disabled
    trial = tt.create_trial(str(tmp_path))
    assert not trial.has_tensor("nothing") and np.array_equal(trial.tensor("w").value(0), np.arange(3.0))


def test_torch_bfloat16_in_the_generic_hook_is_stored_bit_exact(tmp_path):
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = torch.randn(5, 7).to(torch.bfloat16)
    g = torch.randn(4, requires_grad=True)  # a tensor that needs grad: saved without a copy of the graph
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("bf", x)
    hook.save_tensor("bf_t", x.t())  # not contiguous
    hook.save_tensor("grad", g)
    hook.close()
    assert hook.error_count == 0
    trial = tt.create_trial(str(tmp_path))
    got = trial.tensor("bf").value(0)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16) and got.shape == (5, 7)
    assert got.tobytes() == x.view(torch.int16).numpy().tobytes()
    assert trial.tensor("bf_t").value(0).tobytes() == x.t().contiguous().view(torch.int16).numpy().tobytes()
    assert trial.tensor("grad").value(0).tobytes() == g.detach().numpy().tobytes()


def test_hook_refuses_out_dirs_it_cannot_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a hook that takes 123 for a relative path writes in here, not in the repo
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for bad in (123, str(a_file), "/proc/tensortap-x", "job\x00name", ["a"]):
        with pytest.raises(tt.exceptions.InvalidConfiguration) as ei:
            tt.Hook(bad)
        assert repr(bad) in str(ei.value) or str(bad) in str(ei.value)
