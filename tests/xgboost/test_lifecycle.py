"""The step lifecycle (tensortap.capture.engine) as the XGBoost hook fires it: a boosting round is one step,
built in one call into XGBoost's C library (no forward, backward or optimizer step of its own to see): step_begin
and step_end per round, nothing else (docs/capture.md)."""

from __future__ import annotations

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import tensortap.xgboost as txgb  # noqa: E402
from tensortap.capture.engine import EVENTS  # noqa: E402
from tensortap.trials import create_trial  # noqa: E402


def test_each_round_begins_and_ends_and_the_saved_steps_stay_the_same(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    dtrain = xgb.DMatrix(x, label=(x[:, 0] > 0).astype(np.float32))
    hook = txgb.Hook(out_dir=str(tmp_path / "run"), save_config=txgb.SaveConfig(save_interval=3),
                     include_collections=["metrics"])
    heard: list[tuple[str, int, bool]] = []
    for e in EVENTS:
        hook.add_listener(e, lambda ev: heard.append((ev.name, ev.step, ev.saving)))
    xgb.train({"max_depth": 2, "objective": "binary:logistic", "nthread": 1, "seed": 0}, dtrain,
              num_boost_round=7, evals=[(dtrain, "train")], callbacks=[hook], verbose_eval=False)
    hook.close()
    assert [(n, s) for n, s, _sv in heard] == [(n, s) for s in range(7) for n in ("step_begin", "step_end")]
    assert [s for n, s, sv in heard if n == "step_begin" and sv] == [0, 3, 6]
    assert create_trial(str(tmp_path / "run")).tensor("train-logloss").steps() == [0, 3, 6]
