"""tensortap.xgboost with real XGBoost (CPU): every collection's values equal XGBoost's own."""

from __future__ import annotations

import logging

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap.xgboost as txgb  # noqa: E402
from tensortap.exceptions import InvalidConfiguration  # noqa: E402

PARAMS = {"max_depth": 3, "eta": 0.3, "objective": "binary:logistic", "eval_metric": ["logloss", "auc"],
          "nthread": 1, "seed": 0}


def _data(n: int = 300, f: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, f)).astype(np.float32)
    y = ((x[:, 0] + 0.5 * x[:, 1] + 0.3 * rng.normal(size=n)) > 0).astype(np.float32)
    return x, y


@pytest.fixture
def dm() -> tuple:
    x, y = _data()
    xv, yv = _data(120, seed=1)
    return xgb.DMatrix(x, label=y), xgb.DMatrix(xv, label=yv)


def test_import_does_not_import_xgboost() -> None:
    import subprocess
    import sys

    code = "import sys, tensortap, tensortap.xgboost as t; t.SaveConfig; t.get_hook; print('xgboost' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_collection_equals_xgboosts_own(tmp_path, dm) -> None:
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path / "run"), save_config=txgb.SaveConfig(save_interval=2),
                     include_collections=["hyperparameters", "metrics", "losses", "predictions", "labels",
                                          "feature_importance", "average_shap", "full_shap", "trees"],
                     train_data=dtrain, validation_data=dval, hyperparameters=PARAMS)
    assert isinstance(hook, xgb.callback.TrainingCallback)
    evals_result: dict = {}
    bst = xgb.train(PARAMS, dtrain, num_boost_round=5, evals=[(dtrain, "train"), (dval, "validation")],
                    evals_result=evals_result, callbacks=[hook], verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 2, 4]
    assert t.steps(mode=txgb.modes.TRAIN) == [0, 2, 4]
    assert t.workers() == ["worker_0"]
    feats = [f"f{i}" for i in range(5)]
    for s in t.steps():
        rounds = (0, s + 1)
        for data in ("train", "validation"):
            for metric in ("logloss", "auc"):
                assert t.tensor(f"{data}-{metric}").value(s) == pytest.approx(evals_result[data][metric][s], abs=0)
        assert np.array_equal(t.tensor("predictions").value(s), bst.predict(dval, iteration_range=rounds))
        assert np.array_equal(t.tensor("labels").value(s), dval.get_label())
        for kind in txgb.hook.IMPORTANCE_TYPES:
            # the booster of round s: the first s + 1 trees
            scores = bst[: s + 1].get_score(importance_type=kind)
            total = sum(scores.values())
            for f in feats:
                assert t.tensor(f"feature_importance/{kind}/{f}").value(s) == pytest.approx(
                    scores.get(f, 0.0) / total, rel=1e-12)
        shap = bst.predict(dtrain, pred_contribs=True, iteration_range=rounds)
        for i, f in enumerate(feats):  # (the bias term is left out of full_shap and average_shap, as in smdebug)
            got = t.tensor(f"full_shap/{f}").value(s)
            if s == 0:  # the first saving round: XGBoost's own values; then its sum up to float32 rounding
                assert np.array_equal(got, shap[:, i])
            else:
                np.testing.assert_allclose(got, shap[:, i], rtol=1e-5, atol=2e-6)
            assert t.tensor(f"average_shap/{f}").value(s) == pytest.approx(got.mean(dtype=np.float64), rel=1e-12)
        frame = bst[: s + 1].trees_to_dataframe()
        for col in frame.columns:
            got = t.tensor(f"trees/{col}").value(s)
            want = frame[col].to_numpy()
            if got.dtype.kind == "U":
                want = np.array(["" if v != v else str(v) for v in want.astype(object)])
                assert np.array_equal(got, want)
            else:
                assert np.array_equal(got, want, equal_nan=True)
    assert not {"full_shap/bias", "average_shap/bias"} & set(t.tensor_names())
    assert t.tensor("hyperparameters/max_depth").value(0) == 3
    assert str(t.tensor("hyperparameters/objective").value(0)) == "binary:logistic"
    assert list(t.tensor("hyperparameters/eval_metric").value(0)) == ["logloss", "auc"]
    assert set(t.tensor_names(collection="metrics")) == {
        "train-logloss", "train-auc", "validation-logloss", "validation-auc"}
    assert set(t.tensor_names(collection="losses")) == {"train-logloss", "validation-logloss"}
    assert "trees/Node" in t.tensor_names(collection="trees")


def test_default_saves_metrics_every_10_rounds(tmp_path, dm) -> None:
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path))
    assert txgb.get_hook() is hook
    assert hook.has_default_hook_configuration()
    xgb.train(PARAMS, dtrain, num_boost_round=21, evals=[(dval, "validation")], callbacks=[hook], verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == [0, 10, 20]
    assert set(t.tensor_names()) == {"validation-logloss", "validation-auc"}


def test_every_round_is_reported_passed(tmp_path, dm) -> None:
    """Rounds that save nothing are only counted, yet readers learn that each passed: the trailing ones when
    training ends, before close()."""
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path))
    xgb.train(PARAMS, dtrain, num_boost_round=25, evals=[(dval, "validation")], callbacks=[hook], verbose_eval=False)
    hook.flush()
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == [0, 10, 20] and t.complete_upto() == 24
    hook.close()


def test_save_config_changed_during_training(tmp_path, dm) -> None:
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path))

    class Change(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):  # noqa: ANN001, ANN201
            if epoch == 3:
                hook.get_collection("metrics").save_config = txgb.SaveConfig(save_interval=3)
            return False

    xgb.train(PARAMS, dtrain, num_boost_round=14, evals=[(dval, "validation")], callbacks=[hook, Change()],
              verbose_eval=False)
    hook.close()
    assert txgb.create_trial(str(tmp_path)).steps() == [0, 6, 9, 12]


def test_save_all_and_include_regex(tmp_path, dm) -> None:
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path / "a"), save_all=True, save_config=txgb.SaveConfig(save_steps=[1]),
                     train_data=dtrain, validation_data=dval)
    xgb.train(PARAMS, dtrain, num_boost_round=3, evals=[(dval, "val")], callbacks=[hook], verbose_eval=False)
    hook.close()
    names = set(txgb.create_trial(str(tmp_path / "a")).tensor_names())
    assert {"val-logloss", "predictions", "labels", "trees/Node", "full_shap/f0", "average_shap/bias",
            "feature_importance/gain/f0"} <= names
    hook = txgb.Hook(out_dir=str(tmp_path / "b"), include_regex=["^feature_importance/weight/"],
                     save_config=txgb.SaveConfig(save_steps=[1]))
    xgb.train(PARAMS, dtrain, num_boost_round=3, callbacks=[hook], verbose_eval=False)
    hook.close()
    names = set(txgb.create_trial(str(tmp_path / "b")).tensor_names(collection="default"))
    assert names == {f"feature_importance/weight/f{i}" for i in range(5)}


def test_multiclass_shap_and_predictions(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = np.digitize(x[:, 0], [-0.5, 0.5]).astype(np.float32)
    d = xgb.DMatrix(x, label=y, feature_names=["a", "b", "c", "d"])
    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 2, "nthread": 1}
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["predictions", "full_shap", "average_shap"],
                     include_regex=[r"^(full|average)_shap/bias$"],  # (the bias term, saved only when asked)
                     save_config=txgb.SaveConfig(save_steps=[2]), train_data=d, validation_data=d)
    bst = xgb.train(params, d, num_boost_round=3, callbacks=[hook])
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert np.array_equal(t.tensor("predictions").value(2), bst.predict(d))
    shap = bst.predict(d, pred_contribs=True)
    assert shap.shape == (200, 3, 5)
    assert t.steps() == [0, 2]  # (save_steps=[2] and the default interval's step 0)
    for i, f in enumerate(["a", "b", "c", "d", "bias"]):
        got = t.tensor(f"full_shap/{f}").value(2)
        np.testing.assert_allclose(got, shap[..., i], rtol=1e-5, atol=2e-6)
        assert t.tensor(f"average_shap/{f}").value(2) == pytest.approx(got.mean(dtype=np.float64), rel=1e-12)


def test_bad_input_is_refused_at_construction(tmp_path) -> None:
    with pytest.raises(InvalidConfiguration, match="parquet"):
        txgb.Hook(out_dir=str(tmp_path), train_data=(str(tmp_path), "parquet"))
    with pytest.raises(InvalidConfiguration, match="not a local file"):
        txgb.Hook(out_dir=str(tmp_path), validation_data=(str(tmp_path / "missing.csv"), "csv"))
    with pytest.raises(InvalidConfiguration, match="DMatrix"):
        txgb.Hook(out_dir=str(tmp_path), train_data=[1, 2, 3])
    with pytest.raises(InvalidConfiguration, match="hyperparameters"):
        txgb.Hook(out_dir=str(tmp_path), hyperparameters=[("max_depth", 3)])


def test_data_from_files_and_arrays(tmp_path) -> None:
    x, y = _data(100)
    x = np.round(x, 3).astype(np.float32)  # the text files hold these exactly
    csv = tmp_path / "train.csv"
    np.savetxt(csv, np.column_stack([y, x]), delimiter=",", fmt="%.6f")
    svm = tmp_path / "train.svm"
    with open(svm, "w") as f:
        for row, label in zip(x, y, strict=True):
            f.write(f"{int(label)} " + " ".join(f"{i}:{v:.6f}" for i, v in enumerate(row)) + "\n")
    for i, data in enumerate([(str(csv), "csv"), (str(svm), "libsvm"), (x, y)]):
        out = tmp_path / f"run{i}"
        hook = txgb.Hook(out_dir=str(out), include_collections=["labels", "predictions"], validation_data=data,
                         save_config=txgb.SaveConfig(save_steps=[0]))
        bst = xgb.train(PARAMS, xgb.DMatrix(x, label=y), num_boost_round=2, callbacks=[hook])
        hook.close()
        t = txgb.create_trial(str(out))
        assert np.array_equal(t.tensor("labels").value(0), y)
        assert np.allclose(t.tensor("predictions").value(0), bst[:1].predict(xgb.DMatrix(x)))


def test_quantile_dmatrix(tmp_path) -> None:
    x, y = _data()
    q = xgb.QuantileDMatrix(x, label=y)
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["metrics", "predictions", "labels", "full_shap"],
                     save_config=txgb.SaveConfig(save_steps=[1]), train_data=q, validation_data=q)
    res: dict = {}
    bst = xgb.train(PARAMS, q, num_boost_round=2, evals=[(q, "train")], evals_result=res, callbacks=[hook],
                    verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.tensor("train-logloss").value(1) == res["train"]["logloss"][1]
    assert np.array_equal(t.tensor("predictions").value(1), bst.predict(q))
    assert np.array_equal(t.tensor("full_shap/f0").value(1), bst.predict(q, pred_contribs=True)[:, 0])


def test_continued_training_keeps_counting(tmp_path, dm) -> None:
    dtrain, dval = dm
    bst = xgb.train(PARAMS, dtrain, num_boost_round=4)
    path = tmp_path / "model.json"
    bst.save_model(path)
    hook = txgb.Hook(out_dir=str(tmp_path / "run"), save_config=txgb.SaveConfig(save_interval=1),
                     include_collections=["metrics", "trees"])
    res: dict = {}
    bst2 = xgb.train(PARAMS, dtrain, num_boost_round=3, xgb_model=str(path), evals=[(dval, "val")],
                     evals_result=res, callbacks=[hook], verbose_eval=False)
    # the same hook again: rounds 7, 8
    xgb.train(PARAMS, dtrain, num_boost_round=2, xgb_model=bst2, callbacks=[hook], evals=[(dval, "val")],
              verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path / "run"))
    assert t.steps() == [4, 5, 6, 7, 8]
    assert t.tensor("val-logloss").value(6) == res["val"]["logloss"][2]
    assert int(t.tensor("trees/Tree").value(8).max()) == 8


def test_cv_saves_metrics_means(tmp_path, dm) -> None:
    dtrain, _ = dm
    hook = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1),
                     include_collections=["metrics", "feature_importance"])
    res = xgb.cv(PARAMS, dtrain, num_boost_round=3, nfold=2, callbacks=[hook], seed=0)
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == [0, 1, 2]
    for s in range(3):
        assert t.tensor("test-logloss").value(s) == pytest.approx(res["test-logloss-mean"][s], rel=1e-12)
        assert t.tensor("train-auc").value(s) == pytest.approx(res["train-auc-mean"][s], rel=1e-12)
    assert not t.tensor_names(collection="feature_importance")


def test_early_stopping(tmp_path, dm) -> None:
    dtrain, dval = dm
    x, _ = _data(120, seed=1)
    noise = xgb.DMatrix(x, label=np.random.default_rng(5).integers(0, 2, 120).astype(np.float32))
    hook = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1))
    bst = xgb.train(PARAMS | {"eval_metric": "logloss"}, dtrain, num_boost_round=200, evals=[(noise, "val")],
                    early_stopping_rounds=3, callbacks=[hook], verbose_eval=False)
    hook.close()
    last = bst.num_boosted_rounds() - 1
    assert last < 199
    assert txgb.create_trial(str(tmp_path)).steps() == list(range(last + 1))


def test_sklearn_api(tmp_path) -> None:
    pytest.importorskip("sklearn")
    x, y = _data()
    xv, yv = _data(100, seed=1)
    hook = txgb.Hook(out_dir=str(tmp_path / "c"), save_config=txgb.SaveConfig(save_interval=2),
                     include_collections=["metrics", "feature_importance", "predictions", "labels"],
                     validation_data=(xv, yv))
    clf = xgb.XGBClassifier(n_estimators=4, max_depth=2, n_jobs=1, callbacks=[hook])
    clf.fit(x, y, eval_set=[(xv, yv)], verbose=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path / "c"))
    assert t.steps() == [0, 2]
    ev = clf.evals_result()
    assert t.tensor("validation_0-logloss").value(2) == ev["validation_0"]["logloss"][2]
    assert np.array_equal(t.tensor("labels").value(2), yv)
    assert np.allclose(t.tensor("predictions").value(2), clf.predict_proba(xv, iteration_range=(0, 3))[:, 1])

    # sklearn's clone (GridSearchCV, cross_val_score) copies the estimator's parameters: the copies share the hook
    from sklearn.base import clone

    fitted = clone(clf).fit(x, y, eval_set=[(xv, yv)], verbose=False)
    assert fitted.get_params()["callbacks"][0] is hook

    reg = txgb.Hook(out_dir=str(tmp_path / "r"), save_config=txgb.SaveConfig(save_interval=1))
    m = xgb.XGBRegressor(n_estimators=3, max_depth=2, n_jobs=1, callbacks=[reg])
    m.fit(x, x[:, 0], eval_set=[(xv, xv[:, 0])], verbose=False)
    reg.close()
    t = txgb.create_trial(str(tmp_path / "r"))
    assert [t.tensor("validation_0-rmse").value(s) for s in range(3)] == m.evals_result()["validation_0"]["rmse"]


def test_injected_failure_turns_the_hook_off_and_training_goes_on(tmp_path, dm, caplog, monkeypatch) -> None:
    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1),
                     include_collections=["metrics", "feature_importance"])

    def broken(*a, **k):
        raise RuntimeError("injected")

    calls = []
    real = xgb.Booster.get_score

    def fail_from_round_2(self, *a, **k):
        calls.append(1)
        if len(calls) > 2 * len(txgb.hook.IMPORTANCE_TYPES):
            broken()
        return real(self, *a, **k)

    monkeypatch.setattr(xgb.Booster, "get_score", fail_from_round_2)
    with caplog.at_level(logging.ERROR, logger="tensortap"):
        bst = xgb.train(PARAMS, dtrain, num_boost_round=6, evals=[(dval, "val")], callbacks=[hook],
                        verbose_eval=False)
    hook.close()
    assert bst.num_boosted_rounds() == 6
    assert hook.disabled and hook.error_count == 1
    assert [r for r in caplog.records if "injected" in str(r.exc_info)] and len(caplog.records) == 1
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == [0, 1]  # what was saved before the failure is kept


def test_create_from_json_file(tmp_path, dm, monkeypatch) -> None:
    import json

    dtrain, _ = dm
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [{"CollectionName": "feature_importance"}, {"CollectionName": "metrics"}],
    }))
    hook = txgb.Hook.create_from_json_file(str(cfg))
    assert isinstance(hook, txgb.Hook)
    xgb.train(PARAMS, dtrain, num_boost_round=4, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path / "run"))
    assert t.steps() == [0, 3]
    assert "feature_importance/weight/f0" in t.tensor_names()
    txgb.del_hook()
    cfg.write_text(json.dumps({"LocalPath": str(tmp_path / "run2"), "CollectionConfigurations": [
        {"CollectionName": "metrics"}, {"CollectionName": "trees"}]}))
    monkeypatch.setenv("TENSORTAP_CONFIG", str(cfg))
    hook = txgb.get_hook(create_if_not_exists=True)
    assert isinstance(hook, txgb.Hook) and hook.out_dir == str(tmp_path / "run2")
    # a config without save keys: every 10 rounds, as smdebug.xgboost, for the hook and each collection
    xgb.train(PARAMS, dtrain, num_boost_round=21, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()
    t = txgb.create_trial(str(tmp_path / "run2"))
    assert t.tensor("train-logloss").steps() == t.tensor("trees/Node").steps() == [0, 10, 20]
    (tmp_path / "run2").rename(tmp_path / "run2-done")
    assert isinstance(txgb.hook_from_config(), txgb.Hook)
    monkeypatch.delenv("TENSORTAP_CONFIG")
    txgb.del_hook()
    assert txgb.get_hook() is None
    assert txgb.get_hook(str(tmp_path / "nope.json"), create_if_not_exists=True) is None


def test_second_job_in_the_same_out_dir_writes_nothing_and_trains(tmp_path, dm) -> None:
    dtrain, _ = dm
    first = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1))
    second = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1))
    res: dict = {}
    xgb.train(PARAMS, dtrain, num_boost_round=2, evals=[(dtrain, "a")], evals_result=res, callbacks=[first],
              verbose_eval=False)
    bst = xgb.train(PARAMS, dtrain, num_boost_round=3, evals=[(dtrain, "b")], callbacks=[second], verbose_eval=False)
    first.close()
    second.close()
    assert bst.num_boosted_rounds() == 3
    assert second.disabled and second.error_count == 1
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == [0, 1] and set(t.tensor_names()) == {"a-logloss", "a-auc"}
    assert t.tensor("a-logloss").value(1) == res["a"]["logloss"][1]


def test_metric_names_and_losses(tmp_path) -> None:
    hook = txgb.Hook(out_dir=str(tmp_path))
    metrics, losses = hook.get_collection("metrics"), hook.get_collection("losses")
    for name in ("train-rmse", "validation_0-logloss", "eval-error@0.7", "valid-mlogloss", "test-rmsle"):
        assert metrics.matches(name) and losses.matches(name), name
    for name in ("train-auc", "validation-aucpr", "eval-map@3", "eval-ndcg@5-", "test-pre@10"):
        assert metrics.matches(name) and not losses.matches(name), name
    for name in ("predictions", "labels", "hyperparameters/max_depth", "feature_importance/gain/f-1"):
        assert not metrics.matches(name) and not losses.matches(name), name


@pytest.mark.parametrize("booster", ["gbtree", "dart"])
@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob"])
def test_shap_at_every_round_equals_xgboosts_own(tmp_path, booster, objective) -> None:
    x, y = _data(200)
    params = {"objective": objective, "booster": booster, "max_depth": 4, "nthread": 1, "seed": 0}
    if objective == "multi:softprob":
        params["num_class"] = 3
        y = np.digitize(x[:, 1], [-0.5, 0.5]).astype(np.float32)
    # binary: a base margin per row (the bias column's base then differs from row to row)
    d = xgb.DMatrix(x, label=y, base_margin=np.linspace(-1, 1, 200) if objective == "binary:logistic" else None)
    hook = txgb.Hook(out_dir=str(tmp_path), include_collections=["full_shap", "average_shap"],
                     include_regex=[r"^full_shap/bias$"],  # (the bias term, saved only when asked)
                     save_config=txgb.SaveConfig(save_interval=1), train_data=d)
    bst = xgb.train(params, d, num_boost_round=12, callbacks=[hook])
    hook.close()
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == list(range(12))
    for s in range(12):
        want = bst[: s + 1].predict(d, pred_contribs=True)
        for i, f in enumerate([f"f{j}" for j in range(5)] + ["bias"]):
            got = t.tensor(f"full_shap/{f}").value(s)
            if booster == "dart" or s == 0:
                assert np.array_equal(got, want[..., i])
            else:
                np.testing.assert_allclose(got, want[..., i], rtol=1e-5, atol=2e-6)


def test_tensortap_disable(tmp_path, dm, monkeypatch) -> None:
    monkeypatch.setenv("TENSORTAP_DISABLE", "1")
    dtrain, _ = dm
    hook = txgb.Hook(out_dir=str(tmp_path / "run"), save_config=txgb.SaveConfig(save_interval=1))
    bst = xgb.train(PARAMS, dtrain, num_boost_round=3, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()
    assert bst.num_boosted_rounds() == 3
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.idx*"))


def test_rounds_saving_metrics_only_are_all_saved(tmp_path, dm) -> None:
    """Rounds that save only metrics, losses and hyperparameters keep their values and hand them off together
    (at the next full round, a flush, the end of training): every round's values are saved all the same, and
    a flush during training makes the rounds so far readable (readers learn that they passed at the next full
    round)."""
    import time

    dtrain, dval = dm
    hook = txgb.Hook(out_dir=str(tmp_path), save_config=txgb.SaveConfig(save_interval=1),
                     include_collections=["metrics", "losses", "hyperparameters", "feature_importance"],
                     hyperparameters={"max_depth": 3, "objective": "binary:logistic"})
    hook.get_collection("feature_importance").save_config = txgb.SaveConfig(save_interval=4)
    seen: dict = {}

    class Probe(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):  # noqa: ANN001, ANN201
            if epoch == 9:
                time.sleep(0.06)  # (the next round takes the full path)
            if epoch == 14:
                hook.flush()
                seen["steps"] = txgb.create_trial(str(tmp_path)).steps(show_incomplete_steps=True)
            return False

    res: dict = {}
    bst = xgb.train(PARAMS, dtrain, num_boost_round=23, evals=[(dtrain, "train"), (dval, "val")], evals_result=res,
                    callbacks=[hook, Probe()], verbose_eval=False)
    hook.close()
    assert seen["steps"] == list(range(15))
    t = txgb.create_trial(str(tmp_path))
    assert t.steps() == list(range(23))
    for s in range(23):
        for data in ("train", "val"):
            for metric in ("logloss", "auc"):
                assert t.tensor(f"{data}-{metric}").value(s) == res[data][metric][s]
        assert t.tensor("hyperparameters/max_depth").value(s) == 3
        assert str(t.tensor("hyperparameters/objective").value(s)) == "binary:logistic"
    assert set(t.tensor_names(collection="losses")) == {"train-logloss", "val-logloss"}
    assert t.tensor("feature_importance/weight/f0").steps() == list(range(0, 23, 4))
    scores = bst[:9].get_score(importance_type="weight")
    assert t.tensor("feature_importance/weight/f0").value(8) == scores["f0"] / sum(scores.values())


_KILLED_JOB = """
import os, signal, sys
import numpy as np, xgboost as xgb
import tensortap.xgboost as txgb
rng = np.random.default_rng(0)
x = rng.normal(size=(300, 5)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.float32)
d = xgb.DMatrix(x, label=y)
hook = txgb.Hook(out_dir=sys.argv[1], save_config=txgb.SaveConfig(save_interval=1))

class Kill(xgb.callback.TrainingCallback):
    def after_iteration(self, model, epoch, evals_log):
        if epoch == 7:
            hook.flush()
        if epoch == 11:
            os.kill(os.getpid(), signal.SIGKILL)
        return False

xgb.train({"max_depth": 3, "nthread": 1, "seed": 0, "objective": "binary:logistic", "eval_metric": "logloss"},
          d, num_boost_round=20, evals=[(d, "train")], callbacks=[hook, Kill()], verbose_eval=False)
"""


def test_killed_job_keeps_its_flushed_rounds(tmp_path) -> None:
    import signal
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_KILLED_JOB)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    d = xgb.DMatrix(x, label=(x[:, 0] > 0).astype(np.float32))
    res: dict = {}
    xgb.train({"max_depth": 3, "nthread": 1, "seed": 0, "objective": "binary:logistic", "eval_metric": "logloss"},
              d, num_boost_round=12, evals=[(d, "train")], evals_result=res, verbose_eval=False)
    t = txgb.create_trial(str(out))
    steps = t.steps(show_incomplete_steps=True)
    assert steps[:8] == list(range(8)) and steps == list(range(len(steps))) and len(steps) <= 12
    for s in steps:
        assert t.tensor("train-logloss").value(s) == res["train"]["logloss"][s]
