"""tensortap.trials.native_columns: the scalars rows of a native index read straight into columns equal the trial's
(Extract, what to_arrow and export read), whole or by ranges of whole blocks; and it declines (None) what needs a
trial."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.format import layout
from tensortap.storage import open_storage
from tensortap.trials import native_columns as nc
from tensortap.trials.columns import Extract

FIELDS = ("tensor", "worker", "mode", "step", "mode_step", "statistic", "value", "computed", "wall_time")


def _stats_job(out: str, workers: int = 1) -> None:
    """Scalars (float32, float64, int, bool) and reductions only, TRAIN and EVAL, several flushes, one value NaN."""
    hooks = [tt.Hook(out, include_workers="all", rank=r, world_size=workers,
                     save_config=tt.SaveConfig(save_interval=1),
                     reduction_config=tt.ReductionConfig(reductions=["min", "max"], norms=["l2"],
                                                         abs_reductions=["mean"], save_raw_tensor=False))
             for r in range(workers)]
    rng = np.random.default_rng(4)
    for step in range(40):
        for r, h in enumerate(hooks):
            h.set_mode(modes.EVAL if step % 10 == 9 else modes.TRAIN)
            h.next_step()
            h.save_scalar("loss", float(rng.random()) if step != 17 else float("nan"))
            h.save_tensor("count", np.int64(step * 3 + r))
            h.save_tensor("flag", np.bool_(step % 2))
            for i in range(3):
                h.save_tensor(f"gradients/layer{i}", rng.standard_normal((5, 4)).astype(np.float32), "gradients")
            if step % 7 == 6:
                h.flush()
    for h in hooks:
        h.close()


def _same(a, b) -> None:
    assert a.tensors == b.tensors and a.workers == b.workers
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert np.array_equal(x, y, equal_nan=True), f
        if f == "value":
            assert x.view(np.int64).tolist() == y.view(np.int64).tolist()  # bit for bit


@pytest.mark.parametrize("workers", [1, 2])
def test_columns_of_a_job_of_statistics_equal_the_trials(tmp_path, workers):
    _stats_job(str(tmp_path), workers)
    trial = tt.create_trial(str(tmp_path))
    storage = open_storage(str(tmp_path))
    for w in trial.workers():
        key = layout.chunk_key(w, 0, layout.INDEX_SUFFIX)
        got = nc.read_scalars(storage, key)
        assert got is not None and len(got) > 500
        ex = Extract(trial, workers=[w]).scalars()
        _same(got, ex)
        # by ranges of whole blocks: together the same rows
        ranges = nc.block_ranges(storage, key, 100)
        assert len(ranges) > 3 and ranges[0][0] == 0 and ranges[-1][1] == storage.size(key)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        parts = [nc.read_scalars(storage, key, a, b) for a, b in ranges]
        assert sum(len(p) for p in parts) == len(got)
        rows = sorted((p.tensors[t], int(s), int(st), v) for p in parts
                      for t, s, st, v in zip(p.tensor, p.step, p.statistic, p.value.view(np.int64), strict=True))
        assert rows == sorted((got.tensors[t], int(s), int(st), v) for t, s, st, v in
                              zip(got.tensor, got.step, got.statistic, got.value.view(np.int64), strict=True))
        # a mode and names, as the trial selects them
        _same(nc.read_scalars(storage, key, mode=modes.EVAL.value, names=["loss", "gradients/layer1"]),
              Extract(trial, ["loss", "gradients/layer1"], modes.EVAL.value, workers=[w]).scalars())


def test_raw_values_that_are_not_scalars_and_damage_need_a_trial(tmp_path):
    out = str(tmp_path / "raw")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for _ in range(3):
        hook.next_step()
        hook.save_tensor("w", np.ones((4, 4), np.float32))  # statistics computed from the payload: a trial's work
    hook.close()
    key = layout.chunk_key("worker_0", 0, layout.INDEX_SUFFIX)
    assert nc.read_scalars(open_storage(out), key) is None
    dmg = str(tmp_path / "damaged")
    _stats_job(dmg)
    path = f"{dmg}/{key}"
    with open(path, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 8)  # a damaged block: the trial reports it
    assert nc.read_scalars(open_storage(dmg), key) is None
