"""Distributed XGBoost on its own engines: xgboost.dask on a LocalCluster of two worker processes, and
XGBoost's collective with its tracker in two processes. Every worker's data is in the trial."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap.xgboost as txgb  # noqa: E402


def _data(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.float32)


@pytest.fixture(scope="module")
def dask_client():
    pytest.importorskip("dask")
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, protocol="tcp")
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_dask_two_workers(tmp_path, dask_client) -> None:
    import dask.array as da
    from xgboost import dask as dxgb

    x, y = _data()
    dx, dy = da.from_array(x, chunks=(200, 4)), da.from_array(y, chunks=200)
    dtrain = dxgb.DaskDMatrix(dask_client, dx, dy)
    # one training, two hooks: every worker writes / only the chief does
    hooks = {w: txgb.Hook(out_dir=str(tmp_path / w), save_config=txgb.SaveConfig(save_interval=2), include_workers=w,
                          include_collections=["metrics", "feature_importance", "trees"]) for w in ("all", "one")}
    res = dxgb.train(dask_client, {"objective": "binary:logistic", "max_depth": 2, "nthread": 1}, dtrain,
                     num_boost_round=4, evals=[(dtrain, "train")], callbacks=list(hooks.values()))
    bst = res["booster"]
    for include_workers, hook in hooks.items():
        hook.close()
        t = txgb.create_trial(str(tmp_path / include_workers))
        want = ["worker_0", "worker_1"] if include_workers == "all" else ["worker_0"]
        assert t.workers() == want
        assert t.steps() == [0, 2]
        assert t.tensor("trees/Node").workers(2) == want
        for s in (0, 2):
            gain = bst[: s + 1].get_score(importance_type="gain")
            for w in want:
                assert t.tensor("train-logloss").value(s, worker=w) == res["history"]["train"]["logloss"][s]
                # every worker has the same model: the same importances
                assert t.tensor("feature_importance/gain/f0").value(s, worker=w) == pytest.approx(
                    gain["f0"] / sum(gain.values()), rel=1e-12)


TRACKER_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np, xgboost as xgb
    import tensortap.xgboost as txgb
    args, out = json.loads(sys.argv[1]), sys.argv[2]
    with xgb.collective.CommunicatorContext(**args):
        rank = xgb.collective.get_rank()
        rng = np.random.default_rng(rank)
        x = rng.normal(size=(200, 4)).astype(np.float32)
        d = xgb.DMatrix(x, label=(x[:, 0] > 0).astype(np.float32))
        hooks = [txgb.Hook(out_dir=f"{out}/{w}", save_config=txgb.SaveConfig(save_interval=1), include_workers=w,
                           include_collections=["metrics", "labels"], validation_data=d) for w in ("all", "one")]
        xgb.train({"objective": "binary:logistic", "max_depth": 2, "nthread": 1}, d, num_boost_round=3,
                  evals=[(d, "train")], callbacks=hooks, verbose_eval=False)
        for hook in hooks:
            hook.close()
        np.save(f"{out}-labels-{rank}.npy", d.get_label())
    """
)


def test_collective_tracker_two_processes(tmp_path) -> None:
    import json

    from xgboost.tracker import RabitTracker

    tracker = RabitTracker(host_ip="127.0.0.1", n_workers=2)
    tracker.start()
    script = tmp_path / "worker.py"
    script.write_text(TRACKER_WORKER)
    out = str(tmp_path / "run")
    args = json.dumps(tracker.worker_args())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, str(script), args, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    tracker.wait_for(timeout=30)
    for include_workers in ("all", "one"):
        t = txgb.create_trial(f"{out}/{include_workers}")
        want = ["worker_0", "worker_1"] if include_workers == "all" else ["worker_0"]
        assert t.workers() == want
        assert t.steps() == [0, 1, 2]
        for i, w in enumerate(want):  # each worker's own data
            assert np.array_equal(t.tensor("labels").value(2, worker=w), np.load(f"{out}-labels-{i}.npy"))
