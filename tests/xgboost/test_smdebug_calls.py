"""smdebug's XGBoost calls, as its docs and tests make them, on tensortap's hook (real xgboost, CPU): `metrics` is
always saved, `save_scalar(name, value, sm_metric, timestamp)` before and after training, the SHAP bias term left
out, and a JSON config with keys tensortap does not know."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap.xgboost as txgb  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402

TRAIN, GLOBAL = txgb.modes.TRAIN, txgb.modes.GLOBAL


def _data(seed=42):
    """tests/xgboost/test_hook_save_scalar_xgboost.py's data (more rows)."""
    rng = np.random.default_rng(seed)
    dtrain = xgb.DMatrix(rng.random((40, 10)), label=rng.integers(2, size=40))
    dtest = xgb.DMatrix(rng.random((40, 10)), label=rng.integers(2, size=40))
    return dtrain, dtest


def test_metrics_are_saved_whatever_include_collections_names(tmp_path):
    """The issue's case: include_collections=["losses"] with eval_metric="auc" (not a loss) saves train-auc."""
    dtrain, dtest = _data()
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["losses"],
                     save_config=txgb.SaveConfig(save_interval=2))
    evals_result: dict = {}
    xgb.train({"objective": "binary:logistic", "eval_metric": "auc"}, dtrain, num_boost_round=5,
              evals=[(dtrain, "train"), (dtest, "test")], evals_result=evals_result, callbacks=[hook],
              verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.tensor_names(collection="metrics") == ["test-auc", "train-auc"]
    assert t.tensor_names(collection="losses") == []  # (auc is not a loss)
    for s in (0, 2, 4):
        assert float(t.tensor("train-auc").value(s)) == evals_result["train"]["auc"][s]
        assert float(t.tensor("test-auc").value(s)) == evals_result["test"]["auc"][s]


def test_metrics_are_turned_off_by_a_save_config_that_saves_nothing(tmp_path):
    dtrain, dtest = _data()
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["feature_importance"],
                     save_config=txgb.SaveConfig(save_interval=1))
    hook.get_collection("metrics").save_config = txgb.SaveConfig(end_step=0)
    xgb.train({}, dtrain, num_boost_round=3, evals=[(dtest, "test")], callbacks=[hook], verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.tensor_names(collection="metrics") == []
    assert t.steps() == [0, 1, 2] and t.tensor_names(collection="feature_importance")


@pytest.mark.parametrize("collection", ["all", "scalars"])
def test_save_scalar_before_and_after_training_as_smdebugs_test(tmp_path, collection):
    """tests/xgboost/test_hook_save_scalar_xgboost.py: scalars before and after `xgboost.train`, by keyword. Each
    is saved; steps stay boosting rounds (one saved before training is saved at round 0, one after the last
    training at a GLOBAL step after the last round); the other tensors keep to the save config."""
    dtrain, dtest = _data()
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=[collection],
                     save_config=txgb.SaveConfig(save_steps=[0, 2, 4, 6, 8]), train_data=dtrain,
                     validation_data=dtest)
    ts = time.time()
    hook.save_scalar("xg_num_steps", 10, sm_metric=True, timestamp=ts)
    hook.save_scalar("xg_before_train", 1, sm_metric=False, timestamp=None)
    hook.set_mode(TRAIN)
    evals_result: dict = {}
    xgb.train({}, dtrain, evals=[(dtrain, "train"), (dtest, "test")], num_boost_round=10, callbacks=[hook],
              evals_result=evals_result, verbose_eval=False)
    hook.save_scalar("xg_after_train", 1.5, sm_metric=False, timestamp=ts)
    hook.close()

    t = txgb.create_trial(str(tmp_path))
    assert set(t.tensor_names(regex="^scalar/")) == {"scalar/xg_num_steps", "scalar/xg_before_train",
                                                    "scalar/xg_after_train"}
    assert t.tensor_names(collection="sm_metrics") == ["scalar/xg_num_steps"]
    assert t.tensor("scalar/xg_num_steps").steps(mode=TRAIN) == [0]
    assert float(t.tensor("scalar/xg_num_steps").value(0, mode=TRAIN)) == 10
    assert t.tensor("scalar/xg_after_train").steps(mode=GLOBAL) == [10]
    assert float(t.tensor("scalar/xg_after_train").value(10, mode=GLOBAL)) == 1.5
    assert t.steps(mode=TRAIN) == [0, 2, 4, 6, 8]
    for s in (0, 2, 4, 6, 8):
        assert float(t.tensor("train-rmse").value(s, mode=TRAIN)) == evals_result["train"]["rmse"][s]


def test_save_scalar_before_training_with_a_bad_value_is_refused_at_once(tmp_path):
    hook = txgb.Hook(out_dir=str(tmp_path))
    with pytest.raises(InvalidConfiguration, match="sm_metric='yes'"):
        hook.save_scalar("n", 1, "yes")
    hook.close()


def test_shap_bias_is_left_out_but_features_of_any_name_are_kept(tmp_path):
    """smdebug's regexes (`^average_shap/.*[^/bias]$`) mean to leave out the bias term; as a character class
    they also drop features whose names end in a, b, i, s or /: tensortap drops the bias term only."""
    rng = np.random.default_rng(0)
    names = ["alpha", "kb", "pi", "cos", "d"]
    d = xgb.DMatrix(rng.normal(size=(60, 5)), label=rng.integers(2, size=60), feature_names=names)
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["average_shap", "full_shap"],
                     save_config=txgb.SaveConfig(save_interval=1), train_data=d)
    bst = xgb.train({"objective": "binary:logistic", "max_depth": 2}, d, num_boost_round=2, callbacks=[hook])
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.tensor_names(collection="average_shap") == sorted(f"average_shap/{n}" for n in names)
    assert t.tensor_names(collection="full_shap") == sorted(f"full_shap/{n}" for n in names)
    assert not {"average_shap/bias", "full_shap/bias"} & set(t.tensor_names())
    shap = bst.predict(d, pred_contribs=True)
    for i, n in enumerate(names):
        np.testing.assert_allclose(t.tensor(f"full_shap/{n}").value(1), shap[:, i], rtol=1e-5, atol=2e-6)


def test_json_config_with_keys_tensortap_does_not_know(tmp_path, caplog):
    """A config written for SageMaker: its extra keys are warned about once, by name, and the hook works."""
    dtrain, dtest = _data()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "out"),
        "S3OutputPath": "s3://bucket/debug-output",
        "RuleConfigurations": [{"RuleConfigurationName": "LossNotDecreasing"}],
        "HookParameters": {"save_interval": "2", "sagemaker_job_prefix": "xgb-demo"},
        "CollectionConfigurations": [{"CollectionName": "feature_importance",
                                      "CollectionParameters": {"save_interval": "1", "unused_knob": "3"}}],
    }))
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        hook = txgb.Hook.create_from_json_file(str(cfg))
    xgb.train({}, dtrain, num_boost_round=4, evals=[(dtest, "test")], callbacks=[hook], verbose_eval=False)
    hook.close()
    warned = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    for key in ("RuleConfigurations", "sagemaker_job_prefix", "unused_knob"):
        assert sum(f"'{key}'" in m for m in warned) == 1, (key, warned)
    t = txgb.create_trial(str(tmp_path / "out"))
    assert t.tensor("test-rmse").steps() == [0, 2]
    assert t.tensor("feature_importance/weight/f0").steps() == [0, 1, 2, 3]
