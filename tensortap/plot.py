"""Plots of a trial in notebooks: each helper returns a plotly Figure (the dashboard's own views).

    import tensortap as tt, tensortap.plot
    trial = tt.create_trial("runs/job1")
    tensortap.plot.curves(trial)                    # losses and metrics per mode, rule markers
    tensortap.plot.layers(trial)                    # per-layer norms, min/max (small multiples)
    tensortap.plot.heatmap(trial)                   # layers x steps gradient norms, log scale
    tensortap.plot.distribution(trial, "gradient/Net_fc1.weight")

Needs tensortap[ui] (plotly). Long series are drawn as a min/max envelope: a spike is never hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tensortap.trials import Trial

__all__ = ["curves", "layers", "heatmap", "distribution", "workers", "xgboost"]


def _job(trial: Trial) -> Any:
    from tensortap.ui.jobs import Job

    if not isinstance(trial, Trial):
        raise TypeError(f"trial={trial!r}: expected a tensortap Trial (tensortap.create_trial(path))")
    return Job.of_trial(trial)


def _figure(blocks: list[dict[str, Any]], which: int = 0) -> Any:
    import plotly.graph_objects as go

    figs = [b for b in blocks if b["type"] == "figure"]
    if not figs:
        notes = "; ".join(b.get("text", "") for b in blocks if b["type"] == "note")
        raise ValueError(f"nothing to plot: {notes or 'no data'}")
    f = figs[min(which, len(figs) - 1)]
    out = go.Figure(f["figure"])
    out.update_layout(height=f.get("height", 360))
    return out


def curves(trial: Trial | Iterable[Trial], names: Iterable[str] | None = None, mode: str | None = None) -> Any:
    """Losses and metrics over global steps (one or several trials overlaid, each in its colour), in `mode`
    (TRAIN, EVAL, ...; default the first mode saved), with an x at each step where a rule fired. XGBoost
    trials' metrics are drawn per boosting round, never on one axis with a neural net's steps."""
    from tensortap.ui.views import scalars_view

    trials = [trial] if isinstance(trial, Trial) else list(trial)
    jobs = [_job(t) for t in trials]
    for i, j in enumerate(jobs):
        j.index = i
    blocks = scalars_view(jobs, list(names) if names is not None else None)
    figs = [b for b in blocks if b["type"] == "figure"]
    if mode is not None:
        want = str(mode).upper()
        match = [i for i, b in enumerate(figs) if b.get("mode") == want]
        if not match:
            raise ValueError(f"mode={mode!r}: this trial saved scalars in {[b.get('mode') for b in figs]}")
        return _figure(figs, match[0])
    return _figure(blocks)


def layers(trial: Trial, page: int = 0, stat: str = "norms") -> Any:
    """Per-layer small multiples of weight and gradient `stat`: "norms" (L2, log scale), "minmax" or
    "nonfinite" (NaN/inf counts), 24 layers per `page`."""
    from tensortap.ui.views import layers_view

    ids = {"norms": "layers-norms", "minmax": "layers-minmax", "nonfinite": "layers-nonfinite"}
    if stat not in ids:
        raise ValueError(f"stat={stat!r}: allowed are {', '.join(ids)}")
    blocks = layers_view(_job(trial), page)
    chosen = [b for b in blocks if b["type"] == "figure" and b["id"] == ids[stat]]
    if not chosen and stat == "nonfinite":
        raise ValueError("no NaN or inf in these layers' weights and gradients")
    return _figure(chosen or blocks)


def heatmap(trial: Trial) -> Any:
    """Layers x steps heatmap of gradient L2 norms, log10, each column the largest norm of its steps."""
    from tensortap.ui.views import heatmap_view

    return _figure(heatmap_view(_job(trial)))


def distribution(trial: Trial, tensor: str | None = None) -> Any:
    """Quantile bands (min-max, 5-95 %, 25-75 %, median) of `tensor`'s values over steps."""
    from tensortap.ui.views import distribution_choices, distribution_view

    job = _job(trial)
    if tensor is not None and tensor not in distribution_choices(job):
        raise ValueError(f"tensor={tensor!r}: not a saved non-scalar tensor; choose one of "
                         f"{distribution_choices(job)[:20]}")
    return _figure(distribution_view(job, tensor))


def workers(trial: Trial, tensor: str | None = None) -> Any:
    """One curve per worker of a distributed job for `tensor` (a scalar, or a tensor's L2 norm)."""
    from tensortap.ui.views import workers_view

    return _figure(workers_view([_job(trial)], tensor))


def xgboost(trial: Trial) -> list[Any]:
    """The XGBoost training report's figures: metrics per round, feature importance, label distribution,
    confusion matrix, SHAP summary (those whose data was saved)."""
    from tensortap.ui.views import xgboost_view

    blocks = xgboost_view(_job(trial))
    return [_figure([b]) for b in blocks if b["type"] == "figure"]
