"""Real XGBoost (3 classes, 20 rounds, train and validation sets) under tensortap's XGBoost hook: metrics,
feature importance, average SHAP values, labels and predictions every round. Usage: train_xgboost.py OUT_DIR"""

import sys

import numpy as np
import xgboost as xgb

import tensortap.xgboost as txgb

out = sys.argv[1]
rng = np.random.default_rng(0)


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float32) + (x[:, 2] > 0.8).astype(np.float32)
    return x, y


xt, yt = data(400)
xv, yv = data(150)
dtrain, dval = xgb.DMatrix(xt, label=yt), xgb.DMatrix(xv, label=yv)
params = {"max_depth": 3, "eta": 0.3, "objective": "multi:softprob", "num_class": 3,
          "eval_metric": ["mlogloss", "merror"], "nthread": 1, "seed": 0}
hook = txgb.Hook(out_dir=out, save_config=txgb.SaveConfig(save_interval=1), train_data=dtrain, validation_data=dval,
                 include_collections=["metrics", "feature_importance", "average_shap", "labels", "predictions"],
                 hyperparameters=params)
xgb.train(params, dtrain, num_boost_round=20, evals=[(dtrain, "train"), (dval, "validation")], callbacks=[hook],
          verbose_eval=False)
hook.close()
print("training finished", flush=True)
