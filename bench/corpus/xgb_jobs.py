"""XGBoost trainings of the rules corpus: boosted trees on synthetic tabular data, with or without a defect.
`train(out_dir, **spec)` attaches tensortap's XGBoost hook when `out_dir` is given."""

from __future__ import annotations

from typing import Any

import numpy as np

#: what every XGBoost corpus job saves
COLLECTIONS = ["metrics", "losses", "feature_importance", "trees", "labels", "predictions", "hyperparameters"]


def _data(seed: int, n: int, d: int, task: str, leak: bool, imbalance: bool) -> tuple[np.ndarray, np.ndarray]:
    """The signal is spread over the first 8 features (weights 1, 0.9, ... 0.3), the rest is noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = np.zeros(d)
    w[:8] = np.linspace(1.0, 0.3, 8)
    z = x @ w + 0.3 * np.sin(3 * x[:, 0]) + 0.5 * rng.normal(size=n)
    if task == "regression":
        y = z
    else:
        cut = np.quantile(z, 0.97) if imbalance else 0.0
        y = (z > cut).astype(np.float32)
    if leak:  # the bug: a column computed from the label slipped into the features
        x[:, d - 1] = y + 0.01 * rng.normal(size=n)
    return x, y.astype(np.float32)


def train(out_dir: str | None, *, seed: int = 0, task: str = "binary", rounds: int = 60, max_depth: int = 4,
          eta: float = 0.1, n: int = 3000, d: int = 12, save_interval: int = 1, leak: bool = False,
          imbalance: bool = False, subsample: float = 1.0, grow_policy: str | None = None,
          max_leaves: int | None = None, min_child_weight: float = 1.0) -> None:
    import xgboost as xgb

    x, y = _data(seed, n, d, task, leak, imbalance)
    cut = int(n * 0.8)
    dtrain = xgb.DMatrix(x[:cut], label=y[:cut])
    dval = xgb.DMatrix(x[cut:], label=y[cut:])
    params: dict[str, Any] = {"max_depth": max_depth, "eta": eta, "seed": seed, "subsample": subsample,
                              "min_child_weight": min_child_weight, "nthread": 1,
                              "objective": "reg:squarederror" if task == "regression" else "binary:logistic",
                              "eval_metric": "rmse" if task == "regression" else "logloss"}
    if grow_policy:
        params["grow_policy"] = grow_policy
        params["tree_method"] = "hist"
    if max_leaves is not None:
        params["max_leaves"] = max_leaves
    callbacks = []
    if out_dir is not None:
        import tensortap.xgboost as txgb

        callbacks.append(txgb.Hook(out_dir=out_dir, save_config=txgb.SaveConfig(save_interval=save_interval),
                                   include_collections=list(COLLECTIONS), train_data=dtrain,
                                   validation_data=dval, hyperparameters=params))
    xgb.train(params, dtrain, num_boost_round=rounds, evals=[(dtrain, "train"), (dval, "validation")],
              callbacks=callbacks, verbose_eval=False)
    for c in callbacks:
        c.close()
