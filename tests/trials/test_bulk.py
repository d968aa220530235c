"""Trial.statistics and Trial.values_of (tensortap.trials.bulk): many tensors in one pass, bit for bit what the
per-tensor reads give, for tensortap's store (one and two workers, saved and computed statistics, every dtype
and the odd values) and for out_dirs written by the real smdebug."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensortap as tt
from tensortap import modes
from tensortap.exceptions import InvalidConfiguration, InvalidWorker, TensorUnavailable, TensorUnavailableForStep

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")
pytestmark = pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
STATS = ("l2", "min", "max", "mean", "nonfinite", "abs_max", "l1")


def _values(rng: np.random.Generator, step: int, rank: int) -> dict[str, np.ndarray]:
    big = rng.standard_normal((7, 9)).astype(np.float32)
    if step == 3:
        big[2, 4], big[0, 0], big[6, 8] = np.nan, np.inf, -np.inf
    big[1, :3] = -0.0
    return {
        "layer/big": big,
        "layer/small": rng.standard_normal(3).astype(np.float32),  # 12 bytes: inline in the index
        "layer/half": rng.standard_normal(20).astype(np.float16),
        "layer/ints": rng.integers(-50, 50, 33).astype(np.int32),
        "layer/bools": rng.random(10) > 0.5,
        "layer/zeros": np.zeros(40, np.float32),
        "layer/empty": np.zeros(0, np.float32),
        "layer/f64": rng.standard_normal(1000) * (rank + 1),
        "layer/scalar": np.float32(rng.random()),
    }


def _write(out: str, workers: int = 1) -> None:
    hooks = []
    for r in range(workers):
        # worker_0 also saves some reductions (read back as saved), worker_1 only raw values
        red = tt.ReductionConfig(reductions=["min"], norms=["l2"], save_raw_tensor=True) if r == 0 else None
        hooks.append(tt.Hook(out, include_workers="all", rank=r, world_size=workers,
                             save_config=tt.SaveConfig(save_interval=1), reduction_config=red))
    rng = np.random.default_rng(7)
    for step in range(8):
        for r, h in enumerate(hooks):
            h.set_mode(modes.EVAL if step in (5, 6) else modes.TRAIN)
            h.next_step()
            if r == 1 and step == 2:
                continue  # worker_1 saved nothing at step 2: worker_0's values stand alone
            for name, v in _values(rng, step, r).items():
                h.save_tensor(name, v, "weights")
    for h in hooks:
        h.close()


def _bits(a: np.ndarray) -> list[int]:
    return np.asarray(a, dtype=np.float64).view(np.int64).tolist()


def _per_tensor(trial, name: str, stat: str, mode, worker):
    t = trial.tensor(name)
    steps, vals = [], []
    for s in t.steps(mode):
        try:
            v = t.reduction_value(s, stat[4:] if stat.startswith("abs_") else stat, mode, worker=worker,
                                  abs=stat.startswith("abs_"))
            if np.iscomplexobj(v):
                continue  # no float64 statistic of a complex tensor
            f = float(v)
        except (TensorUnavailableForStep, InvalidWorker, ValueError, TypeError):
            continue  # no value, or not a real number (strings, complex)
        steps.append(s)
        vals.append(f)
    return steps, vals


def _check_statistics(trial, mode=modes.GLOBAL, worker=None, steps=None) -> int:
    names = trial.tensor_names()
    bulk = trial.statistics(names, STATS, mode=mode, worker=worker, steps=steps)
    assert list(bulk) == names
    checked = 0
    for name in names:
        for stat in STATS:
            want_steps, want = _per_tensor(trial, name, stat, mode, worker)
            if steps is not None:
                keep = [i for i, s in enumerate(want_steps) if steps[0] <= s <= steps[1]]
                want_steps, want = [want_steps[i] for i in keep], [want[i] for i in keep]
            got = bulk[name].get(stat)
            if not want_steps:
                assert got is None, (name, stat)
                continue
            assert got is not None, (name, stat)
            assert got[0].tolist() == want_steps, (name, stat)
            assert _bits(got[1]) == _bits(want), (name, stat)  # bit for bit, NaN and -0.0 included
            checked += len(want_steps)
    return checked


def _check_values(trial, mode=modes.GLOBAL, worker=None, steps=None) -> int:
    names = trial.tensor_names()
    bulk = trial.values_of(names, mode=mode, worker=worker, steps=steps)
    checked = 0
    for name in names:
        t = trial.tensor(name)
        try:
            st, vals = t.stacked(mode, worker)
        except InvalidWorker:
            st, vals = np.empty(0, np.int64), []
        pairs = [(int(s), v) for s, v in zip(st.tolist(), vals, strict=True)
                 if steps is None or steps[0] <= s <= steps[1]]
        if not pairs:
            assert name not in bulk or not len(bulk[name][0]), name
            continue
        got_steps, got_vals = bulk[name]
        assert got_steps.tolist() == [s for s, _ in pairs], name
        for (_, want), got in zip(pairs, got_vals, strict=True):
            want, got = np.asarray(want), np.asarray(got)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name
            checked += 1
    return checked


@pytest.mark.parametrize("workers", [1, 2])
def test_native_statistics_and_values_equal_the_per_tensor_reads(tmp_path, workers):
    _write(str(tmp_path), workers)
    trial = tt.create_trial(str(tmp_path))
    assert len(trial.workers()) == workers
    assert _check_statistics(trial) > 300
    assert _check_statistics(trial, mode=modes.TRAIN) > 200
    assert _check_statistics(trial, mode=modes.EVAL) > 20
    assert _check_statistics(trial, steps=(2, 5)) > 100
    assert _check_values(trial) > 50
    assert _check_values(trial, mode=modes.EVAL, steps=(0, 0)) > 5
    if workers == 2:
        assert _check_statistics(trial, worker="worker_1") > 100
        assert _check_values(trial, worker="worker_1") > 40
    # what the test is about: NaN/inf counted at step 3, exact zeros, a saved L2 norm and a computed one
    got = trial.statistics(["layer/big", "layer/zeros"], ["nonfinite", "l2", "max"])
    assert got["layer/big"]["nonfinite"][1][3] == 3
    assert got["layer/zeros"]["l2"][1].tolist() == [0.0] * 8
    assert "min" not in trial.statistics(["layer/empty"], ["min"])["layer/empty"]  # no min of an empty tensor


def test_bulk_reads_take_a_list_of_steps_and_check_their_arguments(tmp_path):
    _write(str(tmp_path))
    trial = tt.create_trial(str(tmp_path))
    got = trial.statistics(["layer/big"], ["l2"], steps=[0, 4, 7])
    assert got["layer/big"]["l2"][0].tolist() == [0, 4, 7]
    assert trial.values_of(["layer/small"], steps=range(1, 3))["layer/small"][0].tolist() == [1, 2]
    assert set(trial.statistics(stats=["max"])) == set(trial.tensor_names())
    with pytest.raises(TensorUnavailable):
        trial.statistics(["layer/nope"])
    with pytest.raises(InvalidConfiguration, match="unknown reduction"):
        trial.statistics(["layer/big"], ["l3"])
    with pytest.raises(InvalidConfiguration, match="steps="):
        trial.values_of(["layer/big"], steps="all")
    with pytest.raises(InvalidWorker):
        trial.values_of(["layer/big"], worker="worker_9")


@pytest.mark.parametrize("job", ["pytorch_job", "two_workers", "dtypes"])
def test_smdebug_statistics_and_values_equal_the_per_tensor_reads(job):
    trial = tt.create_trial(os.path.join(FIXTURES, job))
    trial.assume_ended()  # dtypes/ is a running job: its steps count once it is taken as ended
    assert _check_statistics(trial) > 5
    assert _check_values(trial) > 5
    for mode in trial.modes():
        _check_statistics(trial, mode=mode)
    if len(trial.workers()) > 1:
        assert _check_statistics(trial, worker=trial.workers()[-1]) > 5


def test_a_damaged_payload_raises_as_the_per_tensor_read_does(tmp_path):
    from tensortap.exceptions import CorruptData

    _write(str(tmp_path))
    dat = tmp_path / "tensortap" / "worker_0" / "00000000.dat"
    raw = bytearray(dat.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    dat.write_bytes(bytes(raw))
    trial = tt.create_trial(str(tmp_path))
    with pytest.raises(CorruptData):
        trial.statistics(["layer/big", "layer/f64", "layer/half", "layer/ints"], ["max"])
    with pytest.raises(CorruptData):
        trial.values_of(["layer/big", "layer/f64", "layer/half", "layer/ints"])
