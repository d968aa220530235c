"""The writers' hand-offs: float scalars of several steps at once (`submit_scalars`), and a writer thread that
starts only when its first flush is due (`start_after`)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.capture.writer import open_writer
from tensortap.format.records import Record, ScalarRows
from tensortap.storage import LocalStorage
from tensortap.transport.thread_writer import ChunkWriter

#: (name, step, mode step, value): values whose bits must survive (NaN, the smallest subnormal, -0.0, 1/3)
SCALARS = [
    ("train-logloss", 3, 3, 0.6931471805599453),
    ("validation-auc", 3, 3, float("nan")),
    ("train-logloss", 4, 4, 5e-324),
    ("validation-auc", 4, 4, -0.0),
    ("train-logloss", 9, 9, 1 / 3),
    ("validation-auc", 9, 9, -2.5e300),
]


def _rows(scalars: list[tuple[str, int, int, float]]) -> ScalarRows:
    names = list(dict.fromkeys(n for n, *_ in scalars))
    return ScalarRows(names, [names.index(n) for n, *_ in scalars], [s for _, s, _, _ in scalars],
                      tt.modes.TRAIN.value, [m for _, _, m, _ in scalars], [v for *_, v in scalars])


@pytest.mark.parametrize("kind", ["thread", "thread-late", "process", "thread-tensorboard"])
def test_scalar_rows_read_back_bit_for_bit_beside_other_records(tmp_path, kind):
    out = str(tmp_path / "run")
    opts: dict = {}
    if kind == "thread-late":
        opts["start_after"] = 60.0
    if kind == "thread-tensorboard":  # (the export: a sink attached to the writer)
        from tensortap.tensorboard.export import EventExporter

        opts["exporter"] = EventExporter(str(tmp_path / "tb"), "worker_0")
    w = open_writer(kind.split("-")[0], LocalStorage(out), "worker_0", **opts)
    try:
        other = np.arange(40, dtype=np.float32)
        assert w.submit(Record("weights", 3, tt.modes.TRAIN.value, 3, other))
        assert w.submit_scalars(_rows(SCALARS)) == len(SCALARS)
        assert w.submit(Record("train-logloss", 10, tt.modes.TRAIN.value, 10, np.array(0.25)))
        w.mark_step_passed(10, {"TRAIN": 10})
    finally:
        w.close()
    assert w.error is None and w.dropped_records == 0
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps
    for name, step, mode_step, value in SCALARS + [("train-logloss", 10, 10, 0.25)]:
        got = trial.tensor(name).value(step)
        assert got.dtype == np.float64 and got.shape == ()
        assert got.tobytes() == np.float64(value).tobytes(), (name, step)
        assert trial.tensor(name).value(mode_step, mode=tt.modes.TRAIN).tobytes() == got.tobytes()
    assert trial.tensor("train-logloss").steps() == [3, 4, 9, 10]
    assert trial.tensor("weights").value(3).tobytes() == other.tobytes()
    if kind == "thread-tensorboard":
        event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
        ea = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "worker_0" / "train"),
                                                size_guidance={"scalars": 0})
        ea.Reload()
        got = {e.step: e.value for e in ea.Scalars("train-logloss")}
        assert got == {3: np.float32(SCALARS[0][3]), 4: np.float32(5e-324), 9: np.float32(1 / 3), 10: 0.25}


def test_a_writer_closed_before_its_thread_starts_writes_everything(tmp_path):
    out = str(tmp_path / "run")
    w = ChunkWriter(LocalStorage(out), "worker_0", start_after=60.0, flush_interval=60.0)
    for step in range(5):
        w.submit_many([Record("loss", step, tt.modes.TRAIN.value, step, np.array(step * 0.5)),
                       Record("w", step, tt.modes.TRAIN.value, step, np.full(300, step, dtype=np.float32))])
        w.mark_step_passed(step, {"TRAIN": step})
    w.set_collections(tt.Hook(str(tmp_path / "other"), dry_run=True).collection_manager.to_json_dict())
    w.close()
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps and trial.steps() == list(range(5))
    for step in range(5):
        assert trial.tensor("loss").value(step) == step * 0.5
        assert np.array_equal(trial.tensor("w").value(step), np.full(300, step, dtype=np.float32))


def test_a_flush_before_the_thread_starts_makes_the_data_visible(tmp_path):
    out = str(tmp_path / "run")
    w = ChunkWriter(LocalStorage(out), "worker_0", start_after=60.0, flush_interval=60.0)
    try:
        w.submit(Record("loss", 0, tt.modes.TRAIN.value, 0, np.array(1.5)))
        w.mark_step_passed(0, {"TRAIN": 0})
        assert w.flush(timeout=30)
        trial = tt.create_trial(out)
        assert trial.tensor("loss").value(0) == 1.5
        assert not trial.loaded_all_steps
    finally:
        w.close()


def test_before_its_thread_starts_flushes_and_asking_step_marks_write_on_the_calling_thread(tmp_path):
    """A short job: a step mark that asks for an index block and a flush make the data readable when they return,
    written on the calling thread: no writer thread is started for them (nor for close())."""
    import threading

    out = str(tmp_path / "run")
    before = set(threading.enumerate())
    w = ChunkWriter(LocalStorage(out), "worker_0", start_after=60.0, flush_interval=0.05)
    try:
        w.submit(Record("loss", 0, tt.modes.TRAIN.value, 0, np.array(1.5)))
        time.sleep(0.01)  # (a mark asks at most once per tenth of the flush interval, from the writer's start)
        w.mark_step_passed(0, {"TRAIN": 0})
        assert tt.create_trial(out).tensor("loss").value(0) == 1.5  # (readable when the mark returned)
        w.submit(Record("loss", 1, tt.modes.TRAIN.value, 1, np.array(2.5)))
        assert w.flush(timeout=30)
        assert tt.create_trial(out).tensor("loss").value(1) == 2.5
        assert set(threading.enumerate()) - before == set()
    finally:
        w.close()
    assert set(threading.enumerate()) - before == set()
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps and trial.tensor("loss").steps() == [0, 1]


def test_a_writer_started_late_makes_its_data_visible_within_its_flush_interval(tmp_path):
    """No flush, no close: a hand-off once `start_after` has passed starts the thread, which then writes what
    waited and what comes, each within the flush interval."""
    out = str(tmp_path / "run")
    w = ChunkWriter(LocalStorage(out), "worker_0", start_after=0.2, flush_interval=0.1)
    try:
        w.submit(Record("loss", 0, tt.modes.TRAIN.value, 0, np.array(0.5)))  # (waits: the thread is not started)
        w.mark_step_passed(0, {"TRAIN": 0})
        time.sleep(0.3)
        w.submit(Record("loss", 1, tt.modes.TRAIN.value, 1, np.array(0.25)))
        w.mark_step_passed(1, {"TRAIN": 1})
        trial = tt.create_trial(out)
        trial.wait_for_steps([0, 1], timeout=20)
        assert [trial.tensor("loss").value(s) for s in (0, 1)] == [0.5, 0.25]
    finally:
        w.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon", True])
def test_a_bad_start_after_is_refused_when_the_writer_is_made(tmp_path, bad):
    with pytest.raises(ValueError, match="start_after"):
        ChunkWriter(LocalStorage(str(tmp_path / "run")), "worker_0", start_after=bad)
