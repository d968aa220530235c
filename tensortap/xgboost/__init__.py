"""tensortap for XGBoost, mirroring `smdebug.xgboost`.

    import tensortap.xgboost as txgb
    hook = txgb.Hook(out_dir="runs/x1", save_config=txgb.SaveConfig(save_interval=5),
                     include_collections=["metrics", "feature_importance", "average_shap", "labels",
                                          "predictions", "trees"],
                     train_data=dtrain, validation_data=dval, hyperparameters=params)
    bst = xgb.train(params, dtrain, num_boost_round=100, evals=[(dtrain, "train"), (dval, "validation")],
                    callbacks=[hook])

`Hook` is an `xgboost.callback.TrainingCallback`, so xgboost is imported when `Hook` is first used, not when
this package is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.trials import create_trial
from tensortap.xgboost.singleton import del_hook, get_hook, hook_from_config, set_hook

if TYPE_CHECKING:
    from tensortap.xgboost.hook import Hook

__all__ = [
    "Hook",
    "SaveConfig",
    "SaveConfigMode",
    "ReductionConfig",
    "Collection",
    "CollectionKeys",
    "modes",
    "create_trial",
    "get_hook",
    "set_hook",
    "del_hook",
    "hook_from_config",
]


def __getattr__(name: str) -> Any:
    if name == "Hook":
        from tensortap.xgboost.hook import Hook

        return Hook
    raise AttributeError(f"module 'tensortap.xgboost' has no attribute {name!r}")
