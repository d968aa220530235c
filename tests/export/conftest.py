"""Jobs for the export tests (small: real PyTorch and XGBoost on CPU, tensortap's numpy hook, smdebug fixtures),
and the trial's own values to check an export against."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensortap as tt

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")


def numpy_job(out_dir: str, steps=range(10), hook=None, close: bool = True, scale: float = 1.0):
    """TRAIN steps with EVAL every fourth; a weight saved raw with reductions (NaN at step 5), a gradient saved raw
    only (its statistics are computed at export), a loss."""
    if hook is None:
        hook = tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1),
                       reduction_config=tt.ReductionConfig(reductions=["mean", "max"], norms=["l2"],
                                                           abs_reductions=["max"], save_raw_tensor=True),
                       include_collections=["weights", "gradients"])
    for s in steps:
        hook.set_mode(tt.modes.EVAL if s % 4 == 3 else tt.modes.TRAIN)
        hook.next_step()
        w = np.random.default_rng(s).normal(size=(6, 5)).astype(np.float32)
        if s == 5:
            w[:2, :2] = np.nan
        hook.save_tensor("dense/weight", w, collections_to_write="weights")
        hook.save_scalar("loss", scale / (s + 1))
    if close:
        hook.close()
    return hook


def torch_job(out_dir: str) -> None:
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = tp.Hook(out_dir, save_config=tp.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    hook.set_mode(tp.modes.TRAIN)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    hook.set_mode(tp.modes.EVAL)
    with torch.no_grad():
        loss_fn(model(x), y)
    hook.close()


def xgboost_job(out_dir: str) -> None:
    xgb = pytest.importorskip("xgboost")
    import tensortap.xgboost as txgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=200) > 0).astype(np.float32)
    dtrain = xgb.DMatrix(x, label=y)
    params = {"max_depth": 2, "eta": 0.3, "objective": "binary:logistic", "eval_metric": ["logloss"], "nthread": 1,
              "seed": 0}
    hook = txgb.Hook(out_dir=out_dir, save_config=txgb.SaveConfig(save_interval=1),
                     include_collections=["metrics", "losses", "feature_importance", "average_shap", "labels",
                                          "predictions", "trees"],
                     train_data=dtrain, hyperparameters=params)
    xgb.train(params, dtrain, num_boost_round=4, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()


def expected_scalars(trial) -> dict[tuple, np.float64]:
    """(job-less) rows the scalars table must hold, from the trial's own API: scalar values, saved reductions, and
    the statistics computed from raw values saved without reductions. Key: (tensor, statistic, worker, step)."""
    from tensortap.trials.columns import COMPUTED

    out: dict[tuple, np.float64] = {}
    for name in trial.tensor_names():
        t = trial.tensor(name)
        for worker in trial.workers():
            for step in t.steps():
                if worker not in t.workers(step):
                    continue
                saved = t.reduction_values(step, worker=worker)
                for (red, ab), v in saved.items():
                    out[(name, ("abs_" if ab else "") + red, worker, step)] = np.float64(v)
                try:
                    raw = np.asarray(t.value(step, worker=worker))
                except tt.exceptions.TensorUnavailableForStep:
                    continue
                if raw.dtype.kind not in "biufV":
                    continue
                if raw.size == 1:
                    out[(name, "value", worker, step)] = np.float64(raw.reshape(-1)[0])
                elif not saved and raw.size:
                    for stat in COMPUTED:
                        out[(name, stat, worker, step)] = np.float64(t.reduction_value(step, stat, worker=worker))
    return out


def assert_same_values(rows, expected) -> None:
    """`rows`: (tensor, statistic, worker, step, value) read back by an engine; equal to `expected` bit for bit."""
    got = {(r[0], r[1], r[2], int(r[3])): np.float64(r[4] if r[4] is not None else np.nan) for r in rows}
    assert len(got) == len(rows), "a (tensor, statistic, worker, step) appears twice"
    assert set(got) == set(expected), (sorted(set(got) ^ set(expected))[:5])
    bad = [k for k, v in expected.items() if got[k].tobytes() != v.tobytes() and not (np.isnan(v) and np.isnan(got[k]))]
    assert not bad, [(k, got[k], expected[k]) for k in bad[:5]]
