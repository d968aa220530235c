"""`tensortap run` on real XGBoost trainings with no tensortap code in them (zero script change)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap as tt  # noqa: E402

PLAIN = textwrap.dedent(
    """
    import numpy as np, xgboost as xgb
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 6)).astype(np.float32)
    y = (np.arange(1000) % 100 == 0).astype(np.float32)  # 99:1
    dtrain = xgb.DMatrix(x[:800], label=y[:800])
    dval = xgb.DMatrix(x[800:], label=y[800:])
    params = {"objective": "binary:logistic", "max_depth": 100, "min_child_weight": 0, "lambda": 0,
              "nthread": 1, "eval_metric": "logloss"}
    bst = xgb.train(params, dtrain, num_boost_round=20, evals=[(dtrain, "train"), (dval, "validation")],
                    verbose_eval=False)
    print("rounds", bst.num_boosted_rounds())
    """
)

SKLEARN_OWN_HOOK = textwrap.dedent(
    """
    import numpy as np, xgboost as xgb
    import tensortap.xgboost as txgb
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)
    hook = txgb.Hook(out_dir="ignored-out-dir", include_collections=["metrics"])
    clf = xgb.XGBClassifier(n_estimators=6, max_depth=2, n_jobs=1, callbacks=[hook])
    clf.fit(x, y, eval_set=[(x, y)], verbose=False)
    """
)


def tensortap(*args: str, timeout: int = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_plain_script_is_captured_and_judged_live(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "5", "--collection", "hyperparameters",
                  "--rule", "tree_depth:depth=4", "--rule", "class_imbalance",
                  "--rule", "overtraining:patience_train=1,window=1",
                  "--json", "--", sys.executable, str(script), cwd=str(tmp_path))
    assert r.returncode == 1, (r.stdout, r.stderr[-3000:])
    doc = json.loads(r.stdout)
    status = {x["name"]: x["status"] for x in doc["rules"]}
    # trees grown to the last sample overfit: the validation loss rises
    assert status == {"tree_depth": "IssuesFound", "class_imbalance": "IssuesFound",
                      "overtraining": "IssuesFound"}  # (tree_depth: smdebug's depth 4; the default is 6)
    t = tt.create_trial(out)
    assert t.tensor("validation-logloss").value(15) > t.tensor("validation-logloss").value(5)
    assert t.steps() == [0, 5, 10, 15]
    assert t.workers() == ["worker_0"]
    names = set(t.tensor_names())
    assert {"train-logloss", "validation-logloss", "labels", "predictions", "trees/Node",
            "hyperparameters/max_depth"} <= names
    assert t.tensor("hyperparameters/max_depth").value(0) == 100
    assert np.array_equal(t.tensor("labels").value(5), (np.arange(800, 1000) % 100 == 0).astype(np.float32))


def test_script_with_its_own_hook_uses_the_runners_config(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SKLEARN_OWN_HOOK)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "2", "--rule", "tree_depth", "--json", "--",
                  sys.executable, str(script), cwd=str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    assert {x["name"]: x["status"] for x in json.loads(r.stdout)["rules"]} == {"tree_depth": "NoIssuesFound"}
    assert not (tmp_path / "ignored-out-dir").exists()
    t = tt.create_trial(out)
    assert t.steps() == [0, 2, 4]
    assert "validation_0-logloss" in t.tensor_names() and "trees/Node" in t.tensor_names()


OWN_HOOK = textwrap.dedent(
    """
    import numpy as np, xgboost as xgb
    import tensortap.xgboost as txgb
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    hook = txgb.Hook(out_dir="ignored-out-dir", include_collections=["metrics"])
    xgb.train({"max_depth": 2, "nthread": 1}, xgb.DMatrix(x, label=y), num_boost_round=12, callbacks=[hook])
    """
)


@pytest.mark.parametrize("source", [PLAIN, OWN_HOOK], ids=["plain", "own-hook"])
def test_rules_collections_save_at_the_hooks_interval(tmp_path, source) -> None:
    """Without --save-interval the XGBoost hook's own interval (every 10 rounds) decides when the rules'
    collections save, not the deep-learning hooks' 500 steps (which would save the trees at round 0 only)."""
    script = tmp_path / "train.py"
    script.write_text(source)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--rule", "tree_depth", "--json", "--", sys.executable, str(script),
                  cwd=str(tmp_path))
    assert r.returncode in (0, 1), (r.stdout, r.stderr[-3000:])
    assert [x["name"] for x in json.loads(r.stdout)["rules"]] == ["tree_depth"]
    t = tt.create_trial(out)
    assert t.tensor("trees/Node").steps() == [0, 10]


DASK = textwrap.dedent(
    """
    import json, numpy as np, dask.array as da
    from xgboost import dask as dxgb
    from distributed import Client, LocalCluster
    if __name__ == "__main__":
        with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \\
                Client(cluster) as client:
            rng = np.random.default_rng(0)
            x = rng.normal(size=(400, 4)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.float32)
            d = dxgb.DaskDMatrix(client, da.from_array(x, chunks=(200, 4)), da.from_array(y, chunks=200))
            out = dxgb.train(client, {"objective": "binary:logistic", "max_depth": 2, "nthread": 1}, d,
                             num_boost_round=5, evals=[(d, "train")])
            print("logloss", json.dumps([float(v) for v in out["history"]["train"]["logloss"]]))
    """
)


def test_dask_script_is_captured_on_every_worker(tmp_path) -> None:
    pytest.importorskip("distributed")
    script = tmp_path / "train.py"
    script.write_text(DASK)
    out = str(tmp_path / "job")
    r = tensortap("run", "--out-dir", out, "--save-interval", "2", "--rule", "loss_not_decreasing:num_steps=2,window=1",
                  "--json", "--", sys.executable, str(script), cwd=str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    assert {x["name"]: x["status"] for x in json.loads(r.stdout)["rules"]} == {"loss_not_decreasing": "NoIssuesFound"}
    t = tt.create_trial(out)
    assert t.workers() == ["worker_0", "worker_1"]  # the runner's default: include_workers="all"
    assert t.steps() == [0, 2, 4]
    history = json.loads(next(ln for ln in r.stderr.splitlines() if ln.startswith("logloss ")).split(" ", 1)[1])
    for w in t.workers():
        assert {s: float(v) for s, v in t.tensor("train-logloss").values(worker=w).items()} == {
            s: history[s] for s in (0, 2, 4)}
