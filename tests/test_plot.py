"""tensortap.plot: notebook helpers return plotly Figures of a trial (the dashboard's own views)."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes

go = pytest.importorskip("plotly.graph_objects")
import tensortap.plot as ttplot  # noqa: E402


@pytest.fixture
def trial(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(save_raw_tensor=True))
    for step in range(20):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        hook.save_tensor("loss", np.float32(1.0 / (step + 1)), "losses")
        hook.save_tensor("gradients/fc", np.full(8, 0.5 ** step, np.float32), "gradients")
        hook.save_tensor("weights/fc", np.full(8, 1.0 + step, np.float32), "weights")
        if step % 5 == 4:
            hook.set_mode(modes.EVAL)
            hook.next_step()
            hook.save_tensor("loss", np.float32(2.0 / (step + 1)), "losses")
    hook.close()
    return tt.create_trial(out)


def test_helpers_return_figures_of_the_saved_values(trial):
    fig = ttplot.curves(trial)
    assert isinstance(fig, go.Figure)
    (loss,) = fig.data
    t = trial.tensor("loss")
    assert list(loss.x) == [trial.global_step(modes.TRAIN, s) for s in t.steps(modes.TRAIN)]
    assert list(loss.y) == pytest.approx(list(t.values(modes.TRAIN).values()), rel=1e-6)
    ev = ttplot.curves(trial, mode="eval")
    assert list(ev.data[0].y) == pytest.approx(list(t.values(modes.EVAL).values()), rel=1e-6)
    with pytest.raises(ValueError, match="mode='predict'"):
        ttplot.curves(trial, mode="predict")

    norms = ttplot.layers(trial)
    grad = next(d for d in norms.data if d.meta["tensor"] == "gradients/fc")
    assert list(grad.y) == pytest.approx([np.sqrt(8) * 0.5 ** s for s in range(20)], rel=1e-6)
    assert norms.layout.yaxis.type == "log"
    assert len(ttplot.layers(trial, stat="minmax").data) == 4
    with pytest.raises(ValueError, match="no NaN or inf"):
        ttplot.layers(trial, stat="nonfinite")
    with pytest.raises(ValueError, match="allowed are norms, minmax, nonfinite"):
        ttplot.layers(trial, stat="mean")

    heat = ttplot.heatmap(trial).data[0]
    assert heat.z[0][:3] == pytest.approx([np.log10(np.sqrt(8) * 0.5 ** s) for s in range(3)], rel=1e-6)
    dist = ttplot.distribution(trial, "weights/fc")
    assert list(dist.data[-1].y) == pytest.approx([1.0 + s for s in range(20)])  # the median
    with pytest.raises(ValueError, match="not a saved non-scalar tensor"):
        ttplot.distribution(trial, "nope")
    with pytest.raises(TypeError, match="expected a tensortap Trial"):
        ttplot.curves("runs/job1")
