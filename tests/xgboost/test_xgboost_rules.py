"""The XGBoost rules and LossNotDecreasing on real XGBoost jobs: each fires on the job with the problem and
stays quiet on the same job without it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap.xgboost as txgb  # noqa: E402
from tensortap.rules import invoke_rule  # noqa: E402
from tensortap.rules.builtin import (  # noqa: E402
    ClassImbalance,
    Confusion,
    FeatureImportanceOverweight,
    LossNotDecreasing,
    TreeDepth,
)


def _job(out_dir: str, params: dict, x: np.ndarray, y: np.ndarray, rounds: int, collections: list[str],
         interval: int = 1) -> Any:
    d = xgb.DMatrix(x, label=y)
    hook = txgb.Hook(out_dir=out_dir, save_config=txgb.SaveConfig(save_interval=interval),
                     include_collections=collections, train_data=d, validation_data=d)
    xgb.train({"nthread": 1, "seed": 0, **params}, d, num_boost_round=rounds, evals=[(d, "train")],
              callbacks=[hook], verbose_eval=False)
    hook.close()
    return txgb.create_trial(out_dir)


def _report(rule: Any) -> Any:
    return invoke_rule(rule, stop_at_job_end=True)


def test_tree_depth_fires_on_deep_trees_only(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6)).astype(np.float32)
    y = (np.sin(3 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=600)).astype(np.float32)
    deep = _job(str(tmp_path / "deep"), {"max_depth": 100, "min_child_weight": 0, "lambda": 0}, x, y, 3, ["trees"])
    shallow = _job(str(tmp_path / "shallow"), {"max_depth": 4}, x, y, 3, ["trees"])
    rep = _report(TreeDepth(deep))
    assert rep.triggered and rep.first_violations[0].value > 4
    rep = _report(TreeDepth(shallow))
    assert not rep.triggered and rep.steps_evaluated == 3


def test_class_imbalance_fires_on_99_to_1_labels(tmp_path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1000, 4)).astype(np.float32)
    params = {"objective": "binary:logistic", "max_depth": 3}
    imbalanced = (np.arange(1000) % 100 == 0).astype(np.float32)  # 990:10
    balanced = (x[:, 0] > 0).astype(np.float32)
    cols = ["labels", "predictions"]
    assert _report(ClassImbalance(_job(str(tmp_path / "a"), params, x, imbalanced, 2, cols))).triggered
    rep = _report(ClassImbalance(_job(str(tmp_path / "b"), params, x, balanced, 2, cols)))
    assert not rep.triggered and rep.steps_evaluated


def test_confusion_fires_when_two_classes_are_confused(tmp_path) -> None:
    rng = np.random.default_rng(2)
    n = 900
    y = np.repeat([0, 1, 2], n // 3).astype(np.float32)
    centers = np.array([[-3.0, 0.0], [3.0, 0.0], [3.0, 0.0]])  # classes 1 and 2: the same features
    x = (centers[y.astype(int)] + rng.normal(size=(n, 2))).astype(np.float32)
    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 3}
    # classes 1 and 2 cannot be told apart: half of the predictions of one are the other (50%, on the line of the
    # defaults min_diag=max_off_diag=0.5)
    rep = _report(Confusion(_job(str(tmp_path / "a"), params, x, y, 3, ["labels", "predictions"]), min_diag="0.6"))
    assert rep.triggered
    separated = (np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 6.0]])[y.astype(int)] + rng.normal(size=(n, 2)) * 0.3)
    rep = _report(Confusion(_job(str(tmp_path / "b"), params, separated.astype(np.float32), y, 3,
                                 ["labels", "predictions"])))
    assert not rep.triggered and rep.steps_evaluated


def test_feature_importance_overweight_fires_on_one_dominant_feature(tmp_path) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(800, 10)).astype(np.float32)
    params = {"objective": "reg:squarederror", "max_depth": 3}
    dominant = (5 * x[:, 0] + 0.05 * rng.normal(size=800)).astype(np.float32)
    spread = x.sum(axis=1).astype(np.float32)
    # judged from round 20 (min_round) on
    rep = _report(FeatureImportanceOverweight(_job(str(tmp_path / "a"), params, x, dominant, 22,
                                                   ["feature_importance"])))
    assert rep.triggered and rep.first_violations[0].tensor == "feature_importance/weight/f0"
    assert rep.first_fired_step == 20
    rep = _report(FeatureImportanceOverweight(_job(str(tmp_path / "b"), params, x, spread, 22,
                                                   ["feature_importance"])))
    assert not rep.triggered and rep.steps_evaluated


def test_loss_not_decreasing_on_boosting_jobs(tmp_path) -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    learning = _job(str(tmp_path / "a"), {"objective": "binary:logistic", "eta": 0.3}, x, y, 30, ["metrics"])
    rep = _report(LossNotDecreasing(learning, num_steps=3))
    assert not rep.triggered and rep.status == "NoIssuesFound"
    stuck = _job(str(tmp_path / "b"), {"objective": "binary:logistic", "eta": 0.0}, x, y, 30, ["metrics"])
    assert _report(LossNotDecreasing(stuck, num_steps=3)).triggered  # from its warm-up (20 saved rounds) on
    rep = _report(LossNotDecreasing(txgb.create_trial(str(tmp_path / "b")), num_steps=3, window=1))
    assert rep.first_fired_step == 3  # window=1: exact boosting metrics need no warm-up beyond two values
