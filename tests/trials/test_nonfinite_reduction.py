"""The `nonfinite` reduction (count of NaN and ±Inf elements): saved by a hook, computed by the reader from a
raw value, and shown by `to_dataframe()` beside the other statistics."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration


def test_saved_computed_and_in_the_dataframe(tmp_path):
    pytest.importorskip("pandas")
    rc = tt.ReductionConfig(reductions=["min", "max", "mean", "nonfinite"], norms=["l2"], save_raw_tensor=True)
    hook = tt.Hook(str(tmp_path / "job"), save_config=tt.SaveConfig(save_interval=1), reduction_config=rc,
                   include_collections=["gradients"])
    for s in range(3):
        hook.next_step()
        g = np.arange(6, dtype=np.float32)
        g[:s] = [np.nan, np.inf][:s]
        hook.save_tensor("gradient/w", g, "gradients")
    hook.close()
    trial = tt.create_trial(str(tmp_path / "job"))
    t = trial.tensor("gradient/w")
    assert [int(t.reduction_value(s, "nonfinite")) for s in range(3)] == [0, 1, 2]
    assert [int(t.reductions("nonfinite")[s]) for s in range(3)] == [0, 1, 2]  # as saved
    df = trial.to_dataframe(collection="gradients")
    curves = df[df["reduction"] == "nonfinite"].sort_values("step")["value"].tolist()
    assert curves == [0, 1, 2]
    assert {"min", "max", "mean", "l2"} <= set(df["reduction"])


def test_computed_from_a_raw_value_when_not_saved(tmp_path):
    hook = tt.Hook(str(tmp_path / "job"), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("w", np.array([1.0, np.nan, -np.inf, 2.0]))
    hook.next_step()
    hook.save_tensor("w", np.array([1, 2, 3], dtype=np.int32))
    hook.close()
    t = tt.create_trial(str(tmp_path / "job")).tensor("w")
    assert int(t.reduction_value(0, "nonfinite")) == 2 and int(t.reduction_value(1, "nonfinite")) == 0


def test_unknown_reduction_names_nonfinite_among_the_allowed():
    with pytest.raises(InvalidConfiguration, match="nonfinite"):
        tt.ReductionConfig(reductions=["nan_count"])


def test_to_dataframe_computes_statistics_of_raw_values_saved_without_reductions(tmp_path):
    import tensortap as tt

    out = str(tmp_path / "run")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    values = [np.array([[s, -2.0], [np.inf, 4.0]], dtype=np.float32) for s in range(3)]
    for v in values:
        hook.next_step()
        hook.save_tensor("gradient/w", v, "gradients")
    hook.close()
    df = tt.create_trial(out).to_dataframe(collection="gradients")
    assert sorted(set(df["reduction"])) == ["l2", "max", "mean", "min", "nonfinite"]
    got = {(r.step, r.reduction): r.value for r in df.itertuples()}
    for s, v in enumerate(values):
        assert got[(s, "min")] == -2.0 and got[(s, "max")] == np.inf and got[(s, "nonfinite")] == 1
        assert got[(s, "mean")] == np.float32(np.mean(v))
