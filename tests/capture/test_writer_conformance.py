"""Both writers keep the `Writer` contract (tensortap.capture.writer) the same way: every method of the Protocol is
called on each, and what a reader then finds is the same, bit for bit, through either; after `close()` every
hand-off is refused without raising."""

from __future__ import annotations

import numpy as np
import pytest

import tensortap as tt
from tensortap.capture.writer import Reservation, Writer, open_writer
from tensortap.format.records import Record, RecordBatch, ScalarRows, StatisticsLayout, StatisticsRows
from tensortap.storage import LocalStorage

TRAIN, EVAL = tt.modes.TRAIN.value, tt.modes.EVAL.value
F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
#: statistics of three tensors: float32 (l2, max, min, mean, nonfinite), float64 (l2, abs max), float16 (mean)
STAT_LAYOUT = StatisticsLayout(
    ("w", "g", "h"),
    ((("l2", False), ("max", False), ("min", False), ("mean", False), ("nonfinite", False)),
     (("l2", False), ("max", True)), (("mean", False),)),
    ((F32, F32, F32, F32, I64), (F64, F64), (np.dtype(np.float16),)),
    vector_dtype=F64,
    positions=((7, 0, 1, 2, 3), (4, 5), (6,)),  # (the order a batched computation produced them in)
)


def _statistics(step: int) -> np.ndarray:
    """A step's vector: values whose bits must survive the casts (NaN, -0.0, a subnormal, 1/3, a count)."""
    v = np.array([1 / 3, -0.0, float("nan"), 1e-40, 2.5e300, -7.0, 65504.0, 3.0], dtype=np.float64)
    v[0] += step
    return v


def _expected_statistics(step: int) -> dict[tuple[str, str, bool], bytes]:
    v = _statistics(step)
    out = {}
    for name, keys, dtypes, ps in zip(STAT_LAYOUT.names, STAT_LAYOUT.keys, STAT_LAYOUT.dtypes,
                                      ((7, 0, 1, 2, 3), (4, 5), (6,)), strict=True):
        for (red, ab), d, p in zip(keys, dtypes, ps, strict=True):
            out[(name, red, ab)] = np.asarray(v[p], dtype=d).tobytes()
    return out


def _use_every_method(w: Writer) -> None:
    """Every hand-off of the contract, at steps 0-3 (TRAIN) and 4 (EVAL)."""
    assert isinstance(w, Writer)
    assert w.kind in ("thread", "process") and w.reserve_min_bytes >= 0 and w.prompt_marks
    w.set_collections({"collections": {"weights": {"name": "weights", "tensor_names": ["w"]}},
                       "_meta": {"num_workers": 1}})
    rng = np.random.default_rng(7)
    names, shapes = ("w", "b", "g"), ((40, 30), (30,), (5000,))
    layout = w.batch_layout(names, F32, shapes)
    for step in range(4):
        vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        res = w.reserve_batch(names, F32, shapes, step, TRAIN, step, layout)
        assert isinstance(res, Reservation) and res.nbytes == sum(v.nbytes for v in vals)
        res.copy_in([(v.ctypes.data, v.nbytes) for v in vals])
        if step == 1:
            res.shrink(names[:2], F32, shapes[:2])  # (the last tensor not handed over)
        if step == 2:
            res.cancel()  # (nothing handed over)
        else:
            res.commit()
        assert w.submit(Record("loss", step, TRAIN, step, np.array(0.5 + step, dtype=np.float32)))
        assert w.submit_many([Record("act", step, TRAIN, step, np.arange(12, dtype=np.int16).reshape(3, 4)),
                              Record("red", step, TRAIN, step, np.linspace(0, 1, 50), save_raw=False,
                                     reductions=(("l2", False), ("max", True)))]) == 2
        flat = np.arange(20, dtype=np.float64) * step
        assert w.submit_batch(RecordBatch(("p", "q"), [flat[:5], flat[5:].reshape(3, 5)], flat, step, TRAIN,
                                          step)) == 2
        assert w.submit_statistics(StatisticsRows(STAT_LAYOUT, _statistics(step), step, TRAIN, step)) == 3
        w.mark_step_passed(step, {"TRAIN": step})
        if step == 1:
            assert w.flush(30)
    assert w.submit_scalars(ScalarRows(["acc"], [0, 0], [4, 5], EVAL, [0, 1], [0.25, float("nan")])) == 2
    w.mark_step_passed(5, {"TRAIN": 3, "EVAL": 1})
    assert w.flush(30)
    w.close()
    assert w.error is None and w.dropped_records == 0
    assert w.written_records == 4 * 11 - 1 - 3 + 2  # (step 1: one tensor shrunk off; step 2: the batch cancelled)
    # after close: refused (False, 0 or None), never raised
    assert not w.submit(Record("late", 9, TRAIN, 9, np.zeros(3)))
    assert w.submit_many([Record("late", 9, TRAIN, 9, np.zeros(3))]) == 0
    assert w.submit_statistics(StatisticsRows(STAT_LAYOUT, _statistics(9), 9, TRAIN, 9)) == 0
    assert not w.reserve_batch(names, F32, shapes, 9, TRAIN, 9)
    w.mark_step_passed(9, {"TRAIN": 9})
    w.set_collections({})
    w.close()


def _snapshot(out: str) -> dict:
    """Everything a reader finds: every value and reduction by (name, step, mode), the steps, the end."""
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps  # (the end of the job is written)
    seen: dict = {"steps": trial.steps(), "eval": trial.steps(mode=tt.modes.EVAL), "names": trial.tensor_names()}
    for name in seen["names"]:
        t = trial.tensor(name)
        for step in t.steps():
            if t.has_value(step) if hasattr(t, "has_value") else True:
                try:
                    v = t.value(step)
                    seen[(name, step)] = (v.dtype.str, v.shape, v.tobytes())
                except tt.exceptions.TensorUnavailableForStep:
                    pass
            for red, ab in (("l2", False), ("max", False), ("min", False), ("mean", False), ("nonfinite", False),
                            ("max", True)):
                try:
                    r = t.reduction_value(step, red, abs=ab)
                except tt.exceptions.TensorUnavailableForStep:
                    continue
                seen[(name, step, red, ab)] = np.asarray(r).tobytes()
    seen["weights"] = sorted(trial.collection("weights").tensor_names)
    return seen


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, dict]:
    out = {}
    for kind in ("thread", "process"):
        path = str(tmp_path_factory.mktemp(kind) / "run")
        w = open_writer(kind, LocalStorage(path), "worker_0", flush_interval=0.05)
        assert w.kind == kind
        _use_every_method(w)
        out[kind] = _snapshot(path)
    return out


def test_both_writers_save_the_same_bits(written):
    thread, process = written["thread"], written["process"]
    assert thread.keys() == process.keys()
    for key in thread:
        assert thread[key] == process[key], key


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_statistics_rows_read_back_as_computed(written, kind):
    seen = written[kind]
    for step in (0, 1, 2, 3):
        for (name, red, ab), want in _expected_statistics(step).items():
            assert seen[(name, step, red, ab)] == want, (kind, name, step, red, ab)
    assert seen["steps"] == [0, 1, 2, 3, 4, 5] and seen["eval"] == [0, 1]  # (EVAL mode steps)
    assert ("b", 1) in seen and ("g", 1) not in seen and ("w", 2) not in seen  # (shrunk, cancelled)
    assert seen["weights"] == ["w"]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_statistics_rows_are_stored_as_records_of_the_same_values(tmp_path, kind):
    """A step's statistics handed over packed read back exactly as the same values handed over one record per
    tensor (`reduction_values`), the way hooks handed them over before."""
    packed, single = str(tmp_path / "packed"), str(tmp_path / "single")
    for out, rows in ((packed, True), (single, False)):
        w = open_writer(kind, LocalStorage(out), "worker_0")
        r = StatisticsRows(STAT_LAYOUT, _statistics(3), 3, TRAIN, 3)
        if rows:
            assert w.submit_statistics(r) == 3
        else:
            assert w.submit_many(r.records()) == 3
        w.close()
        assert w.error is None
    assert _snapshot(packed) == _snapshot(single)
