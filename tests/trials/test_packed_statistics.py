"""Packed statistics (docs/format.md §3.3): a step's statistics handed over as one vector land as one index entry
and one payload; every read gives what the same values written one record each give, bit for bit (per-tensor
reads, Trial.statistics, the whole-job read `tensortap.trials.read_statistics`), through both writers, over
several workers, modes, chunks and layouts; damage costs only the values it hit, reported once; a full disk
keeps readable + dropped equal to what was handed over."""

from __future__ import annotations

import glob
import os
import subprocess

import numpy as np
import pytest

import tensortap as tt
from tensortap.capture.writer import open_writer
from tensortap.format import codec
from tensortap.format.entries import PACKED, PACKED_SPARSE, is_packed
from tensortap.format.records import StatisticsLayout, StatisticsRows
from tensortap.format.writer import ChunkEncoder
from tensortap.storage import LocalStorage
from tensortap.trials import read_statistics

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")
KEYS = (("l2", False), ("nonfinite", False), ("max", True), ("mean", False))
STATS = ["l2", "nonfinite", "abs_max", "mean"]


def _layout(names: tuple[str, ...], dtype: np.dtype | None = None) -> StatisticsLayout:
    dtype = np.dtype(np.float32) if dtype is None else dtype
    dts = tuple(tuple(np.dtype(np.int64) if r == "nonfinite" else dtype for r, _ in KEYS) for _ in names)
    return StatisticsLayout(names, (KEYS,) * len(names), dts)


def _vector(lay: StatisticsLayout, step: int, worker: int, zeros: bool = False) -> np.ndarray:
    """A step's statistics; `zeros`: as in training, the non-finite counts are 0 but at steps 3 and 7 (kind 4 leaves
    them out), and at step 5 every value is 0, at step 6 every float (a payload of nothing, of the counts only)."""
    rng = np.random.default_rng(1000 * worker + step)
    v = rng.standard_normal(lay.vector_size) * 10.0 ** rng.integers(-30, 30, lay.vector_size)
    if step == 3:
        v[:3] = [np.nan, np.inf, -np.inf]
    counts = lay.order[1::4]
    v[counts] = rng.integers(0, 5, len(counts))  # the nonfinite counts: ints
    if zeros:
        if step in (5, 6):
            v[:] = 0.0
        if step in (3, 6, 7):
            v[counts] = rng.integers(1, 5, len(counts))
        else:
            v[counts] = 0
    return v


def _job(out: str, packed: bool, workers: int = 2, chunk_bytes: int = 256 << 20, zeros: bool = False) -> None:
    """Two workers; steps 0-5 TRAIN with 3 float32 tensors, 6-8 EVAL with 2 other tensors in float16; worker_1
    skips step 4; one block every 2 steps. `zeros`: values with runs of zeros (`_vector`)."""
    lay_a = _layout(("a/w", "a/b", "c/w"))
    lay_b = _layout(("d/w", "a/w"), np.dtype(np.float16))
    for w in range(workers):
        enc = ChunkEncoder(LocalStorage(out), f"worker_{w}", num_workers=workers, chunk_bytes=chunk_bytes)
        for step in range(9):
            mode, lay = (1, lay_a) if step < 6 else (2, lay_b)
            if not (w == 1 and step == 4):
                rows = StatisticsRows(lay, _vector(lay, step, w, zeros), step, mode, step if mode == 1 else step - 6)
                if packed:
                    enc.encode_statistics(rows)
                else:
                    enc.encode_many(rows.records())
            if step % 2 or step == 8:
                enc.write_block(passed={"step": step, "mode_steps": {}}, end=step == 8)
        enc.close()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("packed")
    out = {}
    for name, packed, chunk, zeros in (("packed", True, 256 << 20, False), ("records", False, 256 << 20, False),
                                       ("chunks", True, 200, False), ("zeros", True, 256 << 20, True),
                                       ("zeros_chunks", True, 200, True), ("zeros_records", False, 256 << 20, True)):
        out[name] = str(base / name)
        _job(out[name], packed, chunk_bytes=chunk, zeros=zeros)
    return out


def _same(a: dict, b: dict) -> None:
    """`a` (read as saved: float32/float16 statistics, int64 counts) holds `b`'s float64 values, bit for bit."""
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].keys() == b[n].keys(), n
        for s in a[n]:
            assert a[n][s][0].tolist() == b[n][s][0].tolist(), (n, s)
            assert b[n][s][1].dtype == np.float64
            want = np.float64 if a[n][s][1].dtype == np.float64 else np.int64 if s == "nonfinite" else np.floating
            assert np.issubdtype(a[n][s][1].dtype, want), (n, s, a[n][s][1].dtype)
            assert a[n][s][1].astype(np.float64).tobytes() == b[n][s][1].tobytes(), (n, s)


def test_a_packed_step_is_one_index_entry_and_one_payload(jobs):
    (idx,) = glob.glob(os.path.join(jobs["packed"], "tensortap", "worker_0", "*.idx"))
    with open(idx, "rb") as f:
        dec = codec.decode_blocks(f.read(), 0, idx, final=True)
    entries = np.concatenate([d for _, d, _ in dec.blocks])
    assert is_packed(entries["kind"]).sum() == len(entries) == 9  # one per step, not one per value
    assert all(b[0].get("names") == [] for b in dec.blocks)  # the tensor names travel in the layouts


def _kinds(out: str) -> list[tuple[int, int, int, int]]:
    """(step, kind, run mask, payload length) of each packed entry of worker_0."""
    got = []
    for idx in sorted(glob.glob(os.path.join(out, "tensortap", "worker_0", "*.idx"))):
        with open(idx, "rb") as f:
            dec = codec.decode_blocks(f.read(), 0, idx, final=True)
        got += [(int(e["step"]), int(e["kind"]), int(e["shape"]), int(e["length"])) for _, d, _ in dec.blocks
                for e in d[is_packed(d["kind"])]]
    return sorted(got)


def test_runs_of_zeros_are_left_out_of_the_payload(jobs):
    """Kind 4 (docs/format.md §3.3): a run of zeros takes no bytes; the mask names the runs the payload holds."""
    # layout a: 3 tensors x (l2, abs_max, mean as float32: run 0, 12 values; nonfinite as int64: run 1, 3 values)
    # layout b: 2 tensors, float16 (run 0, 6 values) and int64 (run 1, 2 values)
    assert _kinds(jobs["zeros"]) == [
        (0, PACKED_SPARSE, 0b01, 36), (1, PACKED_SPARSE, 0b01, 36), (2, PACKED_SPARSE, 0b01, 36),
        (3, PACKED, 0, 60), (4, PACKED_SPARSE, 0b01, 36), (5, PACKED_SPARSE, 0, 0),
        (6, PACKED_SPARSE, 0b10, 16), (7, PACKED, 0, 28), (8, PACKED_SPARSE, 0b01, 12)]
    assert {k for _, k, _, _ in _kinds(jobs["packed"])} <= {PACKED, PACKED_SPARSE}


@pytest.mark.parametrize("job", ["packed", "chunks", "zeros", "zeros_chunks"])
def test_every_read_of_packed_statistics_equals_the_same_values_written_one_record_each(jobs, job):
    packed, ref = tt.create_trial(jobs[job]), tt.create_trial(jobs["zeros_records" if "zeros" in job else "records"])
    assert packed.steps() == ref.steps() == list(range(9)) and packed.workers() == ref.workers()
    assert packed.tensor_names() == ref.tensor_names()
    assert not packed.damage
    for name in ref.tensor_names():
        for w in ref.workers():
            for step in ref.tensor(name).steps():
                for red, absolute in KEYS:
                    try:
                        want = ref.tensor(name).reduction_value(step, red, abs=absolute, worker=w)
                    except Exception as e:  # noqa: BLE001 - not saved by that worker: the same error
                        with pytest.raises(type(e)):
                            packed.tensor(name).reduction_value(step, red, abs=absolute, worker=w)
                        continue
                    got = packed.tensor(name).reduction_value(step, red, abs=absolute, worker=w)
                    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (name, w, step, red)
    for kw in ({}, {"mode": "TRAIN"}, {"mode": "EVAL"}, {"worker": "worker_1"}):
        want = ref.statistics(stats=STATS, **kw)
        want = {n: d for n, d in want.items() if d}
        _same({n: d for n, d in packed.statistics(stats=STATS, **kw).items() if d}, want)
        _same(read_statistics(jobs[job], STATS, **kw), want)
        _same(read_statistics(jobs[job], STATS, dtype="float64", **kw), want)
        _same(read_statistics(jobs["zeros_records" if "zeros" in job else "records"], STATS, **kw), want)
    _same(read_statistics(jobs[job], ["l2"]), {n: {"l2": d["l2"]} for n, d in ref.statistics(stats=["l2"]).items()})
    for kw in ({"names": ["c/w", "a/w"]}, {"steps": (2, 6)}, {"steps": [0, 5, 6, 8], "mode": "GLOBAL"},
               {"names": ["a/b"], "steps": (1, None), "worker": "worker_1"}, {"mode": "EVAL", "steps": [0, 2]}):
        want = {n: d for n, d in ref.statistics(kw.get("names"), STATS, **{k: v for k, v in kw.items()
                                                                             if k != "names"}).items() if d}
        _same(read_statistics(jobs[job], STATS, **kw), want)
        if "names" in kw:
            assert list(read_statistics(jobs[job], STATS, **kw)) == list(want)  # (in the order asked)


def test_a_running_job_shows_its_complete_steps_only(tmp_path):
    out = str(tmp_path / "live")
    lay = _layout(("a", "b"))
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    for step in range(4):
        enc.encode_statistics(StatisticsRows(lay, _vector(lay, step, 0), step, 1, step))
    enc.write_block(passed={"step": 2, "mode_steps": {}})  # step 3 is written, not passed
    got = read_statistics(out, ["l2"])
    trial = tt.create_trial(out)
    assert got["a"]["l2"][0].tolist() == trial.steps() == [0, 1, 2]
    enc.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_both_writers_write_packed_statistics_that_read_back_bit_for_bit(tmp_path, kind):
    out = str(tmp_path / kind)
    lay = _layout(tuple(f"t{i}" for i in range(300)))
    w = open_writer(kind, LocalStorage(out), "worker_0")
    vecs = {}
    for step in range(20):
        vecs[step] = _vector(lay, step, 0)
        assert w.submit_statistics(StatisticsRows(lay, vecs[step].copy(), step, 1, step)) == 300
        w.mark_step_passed(step, {"TRAIN": step})
    w.close()
    assert w.dropped_records == 0
    got = read_statistics(out)
    trial = tt.create_trial(out)
    _same(got, {n: d for n, d in trial.statistics(stats=STATS).items() if d})
    stored = {j: v for at, vals in lay.stored(vecs[7]) for j, v in zip(at.tolist(), vals, strict=True)}
    for j in range(len(lay)):
        name, (red, absolute) = lay.names[lay.tensor[j]], lay.keys[lay.tensor[j]][lay.slot[j]]
        v = trial.tensor(name).reduction_value(7, red, abs=absolute)
        assert v.tobytes() == np.asarray(stored[j]).tobytes()


def _payload_offsets(out: str) -> list[tuple[str, int, int]]:
    (idx,) = glob.glob(os.path.join(out, "tensortap", "worker_0", "*.idx"))
    with open(idx, "rb") as f:
        dec = codec.decode_blocks(f.read(), 0, idx, final=True)
    got = []
    for h, d, _ in dec.blocks:
        for e in d[is_packed(d["kind"])]:
            got.append((idx[:-4] + ".dat", int(e["offset"]), int(e["step"])))
        for ref in h.get("statistics", []):
            got.append((idx[:-4] + ".dat", ref[0], -1))
    return got


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_damaged_packed_payload_costs_its_step_only_and_is_reported_once(tmp_path, caplog):
    out = str(tmp_path / "job")
    _job(out, True, workers=1)
    dat, off, step = next(p for p in _payload_offsets(out) if p[2] == 4)
    _flip(dat, off + 5)
    trial = tt.create_trial(out)
    (d,) = trial.damage
    assert d.path.endswith(".dat") and d.offset == off and "checksum" in d.reason
    assert "step 4 of worker worker_0" in d.lost
    assert trial.tensor("a/w").steps() == [0, 1, 2, 3, 5, 6, 7, 8]  # (step 4 held only these statistics)
    trial.refresh_data() if hasattr(trial, "refresh_data") else None
    assert len(trial.damage) == 1 and sum("packed statistics damaged" in r.message for r in caplog.records) == 1
    got = read_statistics(out, ["l2"])  # the same, reported by the trial it reads through
    assert got["a/w"]["l2"][0].tolist() == [0, 1, 2, 3, 5, 6, 7, 8]


def test_a_damaged_layout_description_costs_the_values_it_describes(tmp_path):
    out = str(tmp_path / "job")
    _job(out, True, workers=1)
    dat, off, _ = next(p for p in _payload_offsets(out) if p[2] == -1)
    _flip(dat, off + 3)
    trial = tt.create_trial(out)
    assert trial.damage and "layout" in trial.damage[0].reason and trial.damage[0].offset == off
    assert trial.tensor("d/w").steps() == [6, 7, 8]  # the other layout stays readable
    assert "a/b" not in trial.tensor_names()


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here (needs root and CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_on_a_full_disk_readable_plus_dropped_is_what_was_handed_over(small_disk):
    out = os.path.join(small_disk, "job")
    lay = _layout(tuple(f"t{i}" for i in range(500)))  # 14 KB a step: the disk fills at about step 70
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    enc.open_first_chunk()
    vecs = {}
    for step in range(150):
        vecs[step] = _vector(lay, step, 0)
        enc.encode_statistics(StatisticsRows(lay, vecs[step], step, 1, step))
        if step % 5 == 4:
            enc.write_block(passed={"step": step, "mode_steps": {}})
    enc.write_block(end=True)
    enc.close()
    assert enc.full and enc.dropped_records > 0
    trial = tt.create_trial(out)
    readable = 0
    for j, name in enumerate(lay.names):
        t = trial.tensor(name) if trial.has_tensor(name) else None
        for step in (t.steps() if t else []):
            v = t.reduction_value(step, "l2")
            assert v.tobytes() == np.float32(vecs[step][lay.order[4 * j]]).tobytes()
            readable += 1
    assert readable > 0 and readable + enc.dropped_records == 500 * 150
    assert read_statistics(out, ["l2"])["t0"]["l2"][0].tolist() == trial.tensor("t0").steps()


def test_the_columns_read_of_an_index_range_reads_packed_statistics_as_the_trial(jobs):
    from tensortap.format import layout
    from tensortap.storage import open_storage
    from tensortap.trials import native_columns as nc
    from tensortap.trials.columns import Extract

    from .test_native_columns import _same as same_rows

    for job in ("packed", "chunks", "zeros", "zeros_chunks"):
        trial = tt.create_trial(jobs[job])
        storage = open_storage(jobs[job])
        for w in trial.workers():
            keys = sorted(k for k in storage.list(f"tensortap/{w}/") if k.endswith(layout.INDEX_SUFFIX))
            parts = [nc.read_scalars(storage, k) for k in keys]
            assert all(p is not None for p in parts)
            if len(parts) == 1:
                same_rows(parts[0], Extract(trial, workers=[w]).scalars())
                same_rows(nc.read_scalars(storage, keys[0], mode=2, names=["a/w"]),
                          Extract(trial, ["a/w"], 2, workers=[w]).scalars())
            else:  # (one chunk a block: together the trial's rows)
                assert sum(len(p) for p in parts) == len(Extract(trial, workers=[w]).scalars())


@pytest.mark.parametrize("packed_first", [True, False])
def test_the_first_written_of_two_values_of_a_statistic_at_a_step_is_kept(tmp_path, packed_first):
    """(the flight recorder writes its ring's statistics after a step's regular save: the regular save is kept)"""
    from tensortap.format.records import Record

    out = str(tmp_path / "job")
    lay = _layout(("a", "b"))
    packed_rows = StatisticsRows(lay, np.arange(8, dtype=np.float64), 0, 1, 0)
    other = Record("b", 0, 1, 0, value=None, save_raw=False, reduction_values={("l2", False): np.float32(99.0)})
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    for write in ((lambda: enc.encode_statistics(packed_rows)), (lambda: enc.encode(other)))[::1 if packed_first
                                                                                              else -1]:
        write()
    enc.write_block(end=True)
    enc.close()
    want = np.float32(packed_rows.values[lay.order[4]]) if packed_first else np.float32(99.0)
    trial = tt.create_trial(out)
    assert trial.tensor("b").reduction_value(0, "l2").tobytes() == want.tobytes()
    assert trial.statistics(["b"], ["l2"])["b"]["l2"][1].tolist() == [float(want)]
    assert read_statistics(out, ["l2"])["b"]["l2"][1].tolist() == [float(want)]


def test_packed_statistics_on_an_object_store_read_back_bit_for_bit(tmp_path, s3_url):
    """On S3 chunks are built in memory and published whole: each chunk describes its layouts again."""
    from tensortap.storage import open_storage

    lay = _layout(tuple(f"t{i}" for i in range(40)))
    enc = ChunkEncoder(open_storage(s3_url), "worker_0", sealed_chunk_bytes=3000)  # a few steps a chunk
    local = str(tmp_path / "local")
    ref = ChunkEncoder(LocalStorage(local), "worker_0")
    for step in range(12):
        for e in (enc, ref):
            e.encode_statistics(StatisticsRows(lay, _vector(lay, step, 0), step, 1, step))
            e.write_block(passed={"step": step, "mode_steps": {}}, flushing=True, end=step == 11)
    enc.close()
    ref.close()
    assert len([k for k in open_storage(s3_url).list("tensortap/") if k.endswith(".dat")]) >= 3
    got, want = read_statistics(s3_url), read_statistics(local, dtype="float64")
    _same(got, want)
    _same({n: d for n, d in tt.create_trial(s3_url).statistics(stats=STATS).items() if d}, want)


def test_a_layout_made_anew_at_every_step_is_described_once_a_chunk(tmp_path):
    out = str(tmp_path / "job")
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    for step in range(10):
        lay = _layout(("a", "b"))  # (a caller that does not keep its layout)
        enc.encode_statistics(StatisticsRows(lay, _vector(lay, step, 0), step, 1, step))
        enc.write_block(passed={"step": step, "mode_steps": {}}, end=step == 9)
    enc.close()
    assert len({p[1] for p in _payload_offsets(out) if p[2] == -1}) == 1  # one description, at one offset
    assert read_statistics(out, ["l2"])["a"]["l2"][0].tolist() == list(range(10))


def test_read_statistics_of_a_path_that_holds_no_job_says_so_in_one_line(tmp_path):
    from tensortap.exceptions import InvalidConfiguration

    missing = str(tmp_path / "no_such_job")
    with pytest.raises(InvalidConfiguration, match="no_such_job") as e:
        read_statistics(missing)
    assert "\n" not in str(e.value)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a job")
    with pytest.raises(InvalidConfiguration, match="holds no training job data"):
        read_statistics(str(tmp_path / "notes"))


def test_read_statistics_gives_each_statistic_as_saved_or_in_the_dtype_asked(jobs):
    got = read_statistics(jobs["zeros"], ["l2", "nonfinite"], names=["d/w", "a/b"])
    assert list(got) == ["d/w", "a/b"]
    assert got["d/w"]["l2"][1].dtype == np.float16 and got["a/b"]["l2"][1].dtype == np.float32
    assert got["a/b"]["nonfinite"][1].dtype == np.int64
    assert got["a/b"]["nonfinite"][1].tolist() == [0, 0, 0, 4, 0, 0]  # (steps 0-5: a count at step 3 only)
    f32 = read_statistics(jobs["zeros"], ["l2"], names=["a/b"], dtype="float32")["a/b"]["l2"][1]
    assert f32.dtype == np.float32 and f32.tobytes() == got["a/b"]["l2"][1].tobytes()
    assert read_statistics(jobs["zeros"], ["l2"], steps=[]) == {}


def test_read_statistics_refuses_bad_arguments_in_one_line(jobs):
    from tensortap.exceptions import InvalidConfiguration, TensorUnavailable

    for kw, match in (({"dtype": "object"}, "dtype='object' must be None"), ({"dtype": "nope"}, "dtype='nope'"),
                      ({"names": "a/w"}, "names='a/w' must be a list"), ({"steps": "3"}, "steps='3' must be")):
        with pytest.raises(InvalidConfiguration, match=match) as e:
            read_statistics(jobs["zeros"], **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(TensorUnavailable, match="no_such"):
        read_statistics(jobs["zeros"], names=["no_such"])


def test_a_reader_that_does_not_know_a_kind_reports_its_block_as_damage_and_never_misreads_it(tmp_path):
    """How a reader older than kind 4 sees kind 4 (it knew kinds up to 3): here kind 5 to this reader."""
    out = str(tmp_path / "job")
    _job(out, True, workers=1, zeros=True)
    (idx,) = glob.glob(os.path.join(out, "tensortap", "worker_0", "*.idx"))
    with open(idx, "rb") as f:
        dec = codec.decode_blocks(f.read(), 0, idx, final=True)
    blocks = []
    for h, d, _ in dec.blocks:
        d = d.copy()
        if len(d) and 6 in d["step"]:  # the block of steps 6 and 7
            d["kind"][d["step"] == 6] = 5
        blocks.append(codec.encode_block(h, d))
    with open(idx, "wb") as f:
        f.write(b"".join(blocks))
    trial = tt.create_trial(out)
    (d,) = trial.damage
    assert d.path == idx and "malformed block" in d.reason and "steps 6–7" in d.lost
    assert trial.tensor("d/w").steps() == [8]  # steps 6 and 7 lost with their block, nothing misread
    assert read_statistics(out, ["l2"])["d/w"]["l2"][0].tolist() == [8]


@pytest.mark.parametrize("slice_bytes", [256 << 20, 1000])
def test_a_long_job_with_rare_counts_reads_back_bit_for_bit(tmp_path, monkeypatch, slice_bytes):
    """Steps whose counts are stored (kind 3) among many that leave them out (kind 4), read a slice at a time."""
    from tensortap.trials import saved_statistics

    monkeypatch.setattr(saved_statistics, "SLICE_BYTES", slice_bytes)
    out = str(tmp_path / "job")
    lay = _layout(tuple(f"t{i}" for i in range(5)))
    enc = ChunkEncoder(LocalStorage(out), "worker_0")
    for step in range(200):
        v = _vector(lay, step, 0, zeros=True)
        v[lay.order[1::4]] = [1, 0, 0, 2, 0] if step in (37, 38, 150) else 0
        enc.encode_statistics(StatisticsRows(lay, v, step, 1, step))
        if step % 50 == 49:
            enc.write_block(passed={"step": step, "mode_steps": {}}, end=step == 199)
    enc.close()
    assert [s for s, k, _, _ in _kinds(out) if k == PACKED] == [37, 38, 150]
    want = {n: d for n, d in tt.create_trial(out).statistics(stats=STATS).items() if d}
    _same(read_statistics(out, STATS), want)
    _same(read_statistics(out, STATS, names=["t3", "t1"], steps=(30, 160)),
          {n: d for n, d in tt.create_trial(out).statistics(["t3", "t1"], STATS, steps=(30, 160)).items() if d})
