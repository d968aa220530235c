"""The synchronous encoder (`ChunkEncoder`): hand-offs in, a readable store out, on the calling thread alone; a sink
attached by the caller gets every record it takes."""

from __future__ import annotations

import threading

import numpy as np

import tensortap as tt
from tensortap.format.records import Record, RecordBatch, ScalarRows, StatisticsLayout, StatisticsRows
from tensortap.format.writer import ChunkEncoder
from tensortap.storage import LocalStorage

TRAIN = tt.modes.TRAIN.value


class _Sink:
    def __init__(self) -> None:
        self.added: list[tuple] = []
        self.collections = None
        self.flushes = 0
        self.closed = False

    def add(self, name, step, mode, mode_step, value, reductions):
        self.added.append((name, step, mode, reductions))

    def set_collections(self, collections):
        self.collections = collections

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def _encode_all(enc: ChunkEncoder) -> None:
    flat = np.arange(30, dtype=np.float32)
    enc.encode(Record("loss", 0, TRAIN, 0, np.array(1.5, dtype=np.float32)))
    enc.encode_batch(RecordBatch(("w", "b"), [flat[:20].reshape(4, 5), flat[20:]], flat, 0, TRAIN, 0))
    enc.encode_scalars(ScalarRows(["acc"], [0, 0], [0, 1], TRAIN, [0, 1], [0.5, 0.75]))
    lay = StatisticsLayout(("g",), ((("l2", False), ("nonfinite", False)),), ((np.dtype(np.float32),
                                                                                 np.dtype(np.int64)),))
    enc.encode_statistics(StatisticsRows(lay, np.array([2.0, 0.0]), 0, TRAIN, 0))
    enc.take_collections({"collections": {}, "_meta": {"num_workers": 1}})
    enc.write_block(passed={"step": 0, "mode_steps": {"TRAIN": 0}})
    enc.encode(Record("loss", 1, TRAIN, 1, np.array(0.5, dtype=np.float32)))
    enc.write_block(end=True, passed={"step": 1, "mode_steps": {"TRAIN": 1}})
    enc.close()


def test_the_encoder_writes_a_readable_store_on_the_calling_thread(tmp_path):
    out = str(tmp_path / "run")
    threads = threading.active_count()
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    _encode_all(enc)
    assert threading.active_count() == threads  # (no thread of its own)
    assert enc.written_records == enc.durable_records == 7 and enc.dropped_records == 0
    trial = tt.create_trial(out)
    assert trial.loaded_all_steps and trial.steps() == [0, 1]
    assert trial.tensor("loss").value(1) == np.float32(0.5)
    assert trial.tensor("w").value(0).tolist() == np.arange(20, dtype=np.float32).reshape(4, 5).tolist()
    assert trial.tensor("acc").value(1) == 0.75
    g = trial.tensor("g")
    assert g.reduction_value(0, "l2").dtype == np.float32 and g.reduction_value(0, "l2") == 2.0
    assert g.reduction_value(0, "nonfinite").dtype == np.int64


def test_a_sink_attached_gets_every_record_and_each_block(tmp_path):
    sink = _Sink()
    enc = ChunkEncoder(LocalStorage(str(tmp_path / "run")), "worker_0", sink=sink)
    _encode_all(enc)
    names = [a[0] for a in sink.added]
    assert sorted(names) == ["acc", "acc", "b", "g", "loss", "loss", "w"]
    assert {"l2", "nonfinite"} <= set(next(a[3] for a in sink.added if a[0] == "g"))
    assert sink.collections is not None and sink.flushes == 2 and sink.closed
