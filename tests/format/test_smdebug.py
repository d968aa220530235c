"""SmdebugSource on out_dirs written by the real smdebug 1.0.34 (tests/fixtures/smdebug, see generate.py)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tensortap.exceptions import CorruptData, IndexReaderException
from tensortap.format import _proto
from tensortap.format.entries import (
    ABS_FLAG,
    INLINE_CHUNK,
    NO_REDUCTION,
    RAW,
    REDUCTION,
    SHAPE,
    reduction_code,
)
from tensortap.format.smdebug import (
    PASSED_ALL_STEPS,
    UNKNOWN_DTYPE,
    UNKNOWN_DTYPE_ID,
    UNKNOWN_SHAPE,
    UNKNOWN_SHAPE_ID,
    SmdebugSource,
    index_key_prefix,
    is_smdebug_out_dir,
    reduction_tensor_name,
    split_reduction_name,
)
from tensortap.format.tfrecord import encode_record
from tensortap.storage import LocalStorage

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smdebug")
TF_DEVICE = "/job:worker/replica:0/task:0/device:GPU:0"


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def source(path: str, **kw) -> SmdebugSource:
    return SmdebugSource(LocalStorage(path), **kw)


def expected(name: str) -> tuple[list[dict], dict[str, np.ndarray]]:
    with open(os.path.join(fixture(name), "expected.json")) as f:
        rows = json.load(f)["events"]
    with np.load(os.path.join(fixture(name), "expected.npz"), allow_pickle=False) as z:
        values = {k: z[k] for k in z.files}
    return rows, values


def full_name(src: SmdebugSource, e: np.void) -> str:
    name = src.names[e["name"]]
    if e["kind"] == REDUCTION:
        return reduction_tensor_name(name, int(e["reduction"]))
    return name


def worker_of_file(row: dict) -> str:
    w = row["worker"]
    return w.replace("_", "/").replace("-", ":") if w.startswith("_") else w


def assert_bit_exact(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    if want.dtype.kind == "U":
        assert got.dtype.kind == "U", what
        assert got.tolist() == want.tolist(), what
        return
    assert got.dtype == want.dtype, what
    assert got.tobytes() == want.tobytes(), what


# ------------------------------------------------------------------------------------------------ listing
@pytest.mark.parametrize("job", ["pytorch_job", "two_workers", "dtypes"])
def test_every_event_listed_and_bit_exact(job):
    src = source(fixture(job))
    entries = src.refresh()
    rows, values = expected(job)
    # A name written twice into one step's file (smdebug's save_scalar of an unsaved step, its bug 10.7): the
    # last record is the value, as smdebug's reader keeps it.
    last = {(r["event_file"], r["name"]): r for r in sorted(rows, key=lambda r: r["offset"])}
    assert len(last) < len(rows) if job == "pytorch_job" else len(last) == len(rows)
    rows = list(last.values())
    located = entries[entries["kind"] != SHAPE]
    assert len(located) == len(rows)
    by_loc = {(r["event_file"], r["offset"]): r for r in rows}
    got_values = src.read_values(located)
    for e, v in zip(located, got_values, strict=True):
        r = by_loc[(src.event_files[e["chunk"]], int(e["offset"]))]
        assert full_name(src, e) == r["name"]
        assert int(e["step"]) == r["step"]
        assert int(e["length"]) == r["length"]
        assert src.workers[e["worker"]] == worker_of_file(r)
        assert e["crc"] == 0 and e["dtype"] == UNKNOWN_DTYPE_ID
        assert_bit_exact(v, values[r["key"]], f"{r['name']}@{r['step']}")
    assert src.dtypes[UNKNOWN_DTYPE_ID] == UNKNOWN_DTYPE
    assert src.shapes[UNKNOWN_SHAPE_ID] == UNKNOWN_SHAPE


def test_pytorch_job_steps_modes_and_metadata():
    src = source(fixture("pytorch_job"))
    e = src.refresh()
    steps = {int(x["step"]): (int(x["mode"]), int(x["mode_step"])) for x in e}
    # TRAIN saved every 2nd step, then EVAL every step (mode = ModeKeys value)
    assert steps == {0: (1, 0), 2: (1, 2), 4: (1, 4), 5: (2, 0), 6: (2, 1), 7: (2, 2)}
    names = set(src.names)
    assert {"Sequential_0.weight", "Sequential_0.bias", "CrossEntropyLoss_output_0", "scalar/lr"} <= names
    assert "gradient/Sequential_0.weight" in names
    assert not any(n.startswith("smdebug/") for n in names)
    assert src.workers == ["worker_0"]
    assert src.num_workers == 1
    assert src.ended_workers == {"worker_0"} and src.training_ended()
    assert src.passed_step == {"worker_0": PASSED_ALL_STEPS}
    assert {"weights", "biases", "gradients", "losses"} <= set(src.collections)
    w = src.collections["weights"]
    assert w.tensor_names == {"Sequential_0.weight", "Sequential_2.weight"}
    assert w.include_regex == ["^(?!gradient).*weight"]
    assert w.config["reduction_config"]["save_shape"] is True
    assert src.location == LocalStorage(fixture("pytorch_job")).url
    assert len(src.refresh()) == 0


def test_reductions_and_shapes_with_raw_value():
    src = source(fixture("pytorch_job"))
    e = src.refresh()
    wid = src.names.index("Sequential_0.weight")
    at0 = e[(e["name"] == wid) & (e["step"] == 0)]
    raw = at0[at0["kind"] == RAW]
    reds = at0[at0["kind"] == REDUCTION]
    assert len(raw) == 1 and not (at0["kind"] == SHAPE).any()  # the shape is merged into the raw entry
    assert src.shapes[raw[0]["shape"]] == (3, 4)
    assert raw[0]["reduction"] == NO_REDUCTION
    codes = {int(c) for c in reds["reduction"]}
    assert codes == {
        reduction_code("min"),
        reduction_code("max"),
        reduction_code("mean"),
        reduction_code("l1"),
        reduction_code("l2"),
        reduction_code("mean", abs=True),
        reduction_code("l2", abs=True),
    }
    assert all(src.shapes[s] == (3, 4) for s in reds["shape"])  # the tensor's shape, not the reduction's
    vals = src.read_values(np.concatenate([raw, reds]))
    w = vals[0].astype(np.float64)
    assert w.shape == (3, 4)
    by_code = {int(c): v for c, v in zip(reds["reduction"], vals[1:], strict=True)}
    for v in by_code.values():
        assert v.shape == () and v.dtype == np.float32  # torch reductions are stored 0-d
    np.testing.assert_allclose(by_code[reduction_code("min")], w.min(), rtol=1e-6)
    np.testing.assert_allclose(by_code[reduction_code("max")], w.max(), rtol=1e-6)
    np.testing.assert_allclose(by_code[reduction_code("mean")], w.mean(), rtol=1e-5)
    np.testing.assert_allclose(by_code[reduction_code("l1")], np.abs(w).sum(), rtol=1e-5)  # flattened norm
    np.testing.assert_allclose(by_code[reduction_code("l2")], np.sqrt((w**2).sum()), rtol=1e-5)
    np.testing.assert_allclose(by_code[reduction_code("mean", abs=True)], np.abs(w).mean(), rtol=1e-5)
    # biases: reductions only, no raw value and no shape
    bid = src.names.index("Sequential_0.bias")
    b = e[e["name"] == bid]
    assert set(b["kind"].tolist()) == {REDUCTION}
    assert set(b["reduction"].tolist()) == {reduction_code("max"), reduction_code("l1") | ABS_FLAG}
    assert set(b["shape"].tolist()) == {UNKNOWN_SHAPE_ID}


def test_shape_only_entry_and_tf_device_worker():
    src = source(fixture("dtypes"))
    e = src.refresh()
    assert set(src.workers) == {"worker_0", TF_DEVICE}
    so = e[e["name"] == src.names.index("dt/shape_only")]
    assert len(so) == 1 and so[0]["kind"] == SHAPE and so[0]["chunk"] == INLINE_CHUNK
    assert src.shapes[so[0]["shape"]] == (5, 7)
    assert src.workers[so[0]["worker"]] == TF_DEVICE
    assert (int(so[0]["mode"]), int(so[0]["mode_step"]), int(so[0]["step"])) == (4, 1, 1)
    assert src.read_values(so)[0].tolist() == [5, 7]
    f32 = e[(e["name"] == src.names.index("dt/float32")) & (e["step"] == 1)]
    assert len(f32) == 1 and f32[0]["kind"] == RAW and src.shapes[f32[0]["shape"]] == (2, 3)
    # no collections file and no end marker
    assert src.num_workers is None and not src.training_ended()
    assert src.passed_step == {"worker_0": -1, TF_DEVICE: 0}


def test_two_workers():
    src = source(fixture("two_workers"))
    e = src.refresh()
    assert sorted(src.workers) == ["worker_0", "worker_1"]
    assert src.num_workers == 2 and src.training_ended()
    assert src.ended_workers == {"worker_0", "worker_1"}
    for step in (0, 1, 2):
        at = e[e["step"] == step]
        assert {src.workers[w] for w in at["worker"]} == {"worker_0", "worker_1"}
    # each worker's weights differ (different seeds), both readable
    lw = src.names.index("Linear_weight")
    at0 = e[(e["step"] == 0) & (e["name"] == lw)]
    v = src.read_values(at0)
    assert len(v) == 2 and not np.array_equal(v[0], v[1])


def test_range_steps():
    src = source(fixture("pytorch_job"), range_steps=(2, 6))
    e = src.refresh()
    assert set(e["step"].tolist()) == {2, 4, 5}
    assert set(source(fixture("pytorch_job"), range_steps=(None, 1)).refresh()["step"].tolist()) == {0}
    with pytest.raises(ValueError):
        source(fixture("pytorch_job"), range_steps=(3, 3))


def test_is_smdebug_out_dir(tmp_path):
    assert is_smdebug_out_dir(LocalStorage(fixture("pytorch_job")))
    assert not is_smdebug_out_dir(LocalStorage(str(tmp_path)))


def test_split_reduction_name():
    assert split_reduction_name("smdebug/reductions/abs_l2/a/b") == ("a/b", reduction_code("l2", True))
    assert split_reduction_name("smdebug/reductions/mean/x") == ("x", reduction_code("mean"))
    assert split_reduction_name("smdebug/reductions/bogus/x") is None
    assert split_reduction_name("weights/x") is None


# ------------------------------------------------------------------------------------------ incremental
class RecordingStorage(LocalStorage):
    """LocalStorage that remembers the start_after of every index listing."""

    def __init__(self, root: str):
        super().__init__(root)
        self.start_afters: list[str | None] = []

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        if prefix == "index/":
            self.start_afters.append(start_after)
        return super().list(prefix, start_after)


def _staged_copy(src_dir: str, dst: str) -> list[str]:
    """Copy an out_dir without its index files and end marker; returns the index keys held back."""
    shutil.copytree(src_dir, dst, ignore=shutil.ignore_patterns("index", "training_job_end.ts"))
    keys = []
    for dirpath, _d, files in os.walk(os.path.join(src_dir, "index")):
        for f in files:
            keys.append(os.path.relpath(os.path.join(dirpath, f), src_dir).replace(os.sep, "/"))
    return sorted(keys)


def _publish(src_dir: str, dst: str, key: str) -> None:
    os.makedirs(os.path.dirname(os.path.join(dst, key)), exist_ok=True)
    shutil.copy(os.path.join(src_dir, key), os.path.join(dst, key))


def test_incremental_refresh_one_worker(tmp_path):
    job = fixture("pytorch_job")
    dst = str(tmp_path / "job")
    keys = _staged_copy(job, dst)
    src = source(dst)
    assert len(src.refresh()) == 0 and src.passed_step == {}
    total = 0
    for key in keys:
        _publish(job, dst, key)
        step = int(os.path.basename(key).split("_")[0])
        new = src.refresh()
        assert len(new) > 0 and set(new["step"].tolist()) == {step}
        assert len(src.refresh()) == 0
        assert src.passed_step == {"worker_0": step - 1}
        assert not src.training_ended()
        total += len(new)
    open(os.path.join(dst, "training_job_end.ts"), "w").close()
    assert len(src.refresh()) == 0
    assert src.training_ended() and src.passed_step == {"worker_0": PASSED_ALL_STEPS}
    assert total == len(source(job).refresh())


def test_incremental_refresh_lagging_worker(tmp_path):
    job = fixture("two_workers")
    dst = str(tmp_path / "job")
    keys = _staged_copy(job, dst)
    w0 = [k for k in keys if k.endswith("worker_0.json")]
    w1 = [k for k in keys if k.endswith("worker_1.json")]
    storage = RecordingStorage(dst)
    src = SmdebugSource(storage)
    for k in w0:  # worker_0 runs ahead: all its steps first
        _publish(job, dst, k)
    e = src.refresh()
    assert set(e["step"].tolist()) == {0, 1, 2} and src.num_workers == 2
    assert storage.start_afters[-1] is None  # worker_1 unheard of: nothing is settled
    got = []
    for k in w1:  # lexically BEFORE worker_0's last key
        _publish(job, dst, k)
        new = src.refresh()
        assert {src.workers[w] for w in new["worker"]} == {"worker_1"}
        got.append(new)
        assert len(src.refresh()) == 0
    assert src.passed_step == {"worker_0": 1, "worker_1": 1}
    # both workers reached step 2: the listing now starts at step 2, not at the beginning
    src.refresh()
    assert storage.start_afters[-1] == index_key_prefix(2)
    assert len(e) + sum(len(g) for g in got) == len(source(job).refresh())


# ------------------------------------------------------------------------------------------- corruption
def test_corrupt_event_record(tmp_path):
    dst = str(tmp_path / "job")
    shutil.copytree(fixture("dtypes"), dst)
    src = source(dst)
    e = src.refresh()
    e = e[e["kind"] != SHAPE]
    i8 = e[e["name"] == src.names.index("dt/int8")][0]
    key = src.event_files[i8["chunk"]]
    path = os.path.join(dst, *key.split("/"))
    with open(path, "r+b") as f:
        f.seek(int(i8["offset"]) + 2)  # inside the length: its CRC no longer matches
        b = f.read(1)
        f.seek(int(i8["offset"]) + 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CorruptData) as ei:
        src.read_values(e)
    assert ei.value.path == path and ei.value.offset == int(i8["offset"])
    others = e[e["name"] != i8["name"]]
    vals = src.read_values(others)
    assert len(vals) == len(others)


def test_event_record_payload_mismatch(tmp_path):
    dst = str(tmp_path / "job")
    shutil.copytree(fixture("dtypes"), dst)
    src = source(dst)
    e = src.refresh()
    e = e[e["kind"] == RAW]
    target = e[e["name"] == src.names.index("dt/float64")][0]
    path = os.path.join(dst, *src.event_files[target["chunk"]].split("/"))
    with open(path, "r+b") as f:
        f.seek(int(target["offset"]))
        rec = bytearray(f.read(int(target["length"])))
        rec[12:-4] = b"\xff" * (len(rec) - 16)  # garbage protobuf under a valid frame
        f.seek(int(target["offset"]))
        f.write(rec)
    with pytest.raises(CorruptData) as ei:
        src.read_values(target[None])
    assert ei.value.offset == int(target["offset"]) and ei.value.path == path


def test_missing_event_file(tmp_path):
    dst = str(tmp_path / "job")
    shutil.copytree(fixture("two_workers"), dst)
    src = source(dst)
    e = src.refresh()
    key = src.event_files[e[0]["chunk"]]
    os.remove(os.path.join(dst, *key.split("/")))
    with pytest.raises(CorruptData, match="missing"):
        src.read_values(e[:1])


def test_corrupt_index_json(tmp_path):
    dst = str(tmp_path / "job")
    shutil.copytree(fixture("pytorch_job"), dst)
    bad = os.path.join(dst, "index", "000000000", "000000000002_worker_0.json")
    with open(bad, "w") as f:
        f.write('{"meta": {"mode": "TRAIN"')
    src = source(dst)
    with pytest.raises(IndexReaderException) as ei:
        src.refresh()
    assert "000000000002_worker_0.json" in str(ei.value)
    # the other files' entries are not lost, and the bad file is reported once
    e = src.refresh()
    assert set(e["step"].tolist()) == {0, 4, 5, 6, 7}
    assert len(src.refresh()) == 0


def test_invalid_index_contents(tmp_path):
    dst = str(tmp_path / "job")
    shutil.copytree(fixture("pytorch_job"), dst)
    with open(os.path.join(dst, "index", "000000000", "000000000004_worker_0.json"), "w") as f:
        json.dump({"meta": {}, "tensor_payload": []}, f)
    with pytest.raises(IndexReaderException, match="000000000004_worker_0.json"):
        source(dst).refresh()


# ---------------------------------------------------------------------------------------- synthetic dirs
def _write_out_dir(root: str, tensors: dict[str, np.ndarray], tensor_protos: dict[str, bytes] | None = None):
    """An out_dir with one step written by tensortap's own encoder, the way smdebug lays it out."""
    ev_key = "events/000000000000/000000000000_worker_0.tfevents"
    payload, offset, buf = [], 0, b""
    items = [(n, _proto.encode_tensor(a, n)) for n, a in tensors.items()] + list((tensor_protos or {}).items())
    for name, tproto in items:
        value = _proto.field_bytes(1, name) + _proto.field_bytes(8, tproto)
        value += _proto.field_bytes(
            9, _proto.field_bytes(1, _proto.field_bytes(1, "mode_step") + _proto.field_bytes(2, "0"))
        )
        rec = encode_record(_proto.encode_event(1.5, 0, [value]), checksum=False)
        payload.append({"tensorname": name, "start_idx": offset, "length": len(rec)})
        offset += len(rec)
        buf += rec
    storage = LocalStorage(root)
    storage.write(ev_key, buf)
    index = {"meta": {"mode": "TRAIN", "mode_step": 0, "event_file_name": ev_key}, "tensor_payload": payload}
    storage.write("index/000000000/000000000000_worker_0.json", json.dumps(index).encode())


def test_encoder_round_trip_and_bfloat16(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = {
        "bf16": np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "s2d": np.array([["a", "b"], ["c", "d"]]),
        "u64_0d": np.array(2**64 - 1, dtype=np.uint64),
    }
    _write_out_dir(str(tmp_path), arrays)
    src = source(str(tmp_path))
    e = src.refresh()
    vals = dict(zip((src.names[i] for i in e["name"]), src.read_values(e), strict=True))
    for name, a in arrays.items():
        assert vals[name].shape == a.shape
        if a.dtype.kind == "U":
            assert vals[name].tolist() == a.tolist()
        else:
            assert vals[name].dtype == a.dtype and vals[name].tobytes() == a.tobytes()


def test_typed_value_fields(tmp_path):
    """TensorProtos without tensor_content (TensorFlow style): packed and unpacked *_val fields."""
    shape = _proto.field_bytes(2, _proto.encode_shape((3,)))
    packed_f = np.array([1.0, 2.5, -3.0], "<f4").tobytes()
    protos = {
        "floats": _proto.field_varint(1, _proto.DT_FLOAT) + shape + _proto.field_bytes(5, packed_f),
        "ints": _proto.field_varint(1, _proto.DT_INT32)
        + shape
        + b"".join(_proto.field_varint(7, v) for v in (-1, 0, 7)),
        "fill": _proto.field_varint(1, _proto.DT_INT64) + shape + _proto.field_varint(10, 9),
        "empty": _proto.field_varint(1, _proto.DT_DOUBLE) + shape,
    }
    _write_out_dir(str(tmp_path), {}, protos)
    src = source(str(tmp_path))
    e = src.refresh()
    vals = dict(zip((src.names[i] for i in e["name"]), src.read_values(e), strict=True))
    assert vals["floats"].tolist() == [1.0, 2.5, -3.0] and vals["floats"].dtype == np.float32
    assert vals["ints"].tolist() == [-1, 0, 7] and vals["ints"].dtype == np.int32
    assert vals["fill"].tolist() == [9, 9, 9]
    assert vals["empty"].tolist() == [0.0, 0.0, 0.0]
