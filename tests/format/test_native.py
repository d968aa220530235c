"""The native chunked store: round trips, file counts, corruption, torn tails, crash safety, tailing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import CorruptData
from tensortap.format import layout
from tensortap.format.native import NativeSource
from tensortap.format.records import Record
from tensortap.storage import LocalStorage
from tensortap.transport.thread_writer import ChunkWriter


def _dtypes_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    cases = {
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "f32": rng.standard_normal((4, 4)).astype(np.float32),
        "f64": rng.standard_normal(7),
        "f32_nan_inf": np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32),
        "i8": np.array([-128, -1, 0, 127], dtype=np.int8),
        "i16": np.array([-32768, 5, 32767], dtype=np.int16),
        "i32": np.arange(-5, 5, dtype=np.int32).reshape(2, 5),
        "i64": np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max]),
        "u8": np.arange(256, dtype=np.uint8),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "c64": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
        "c128": rng.standard_normal(2) + 1j,
        "str": np.array(["héllo", "wörld", ""]),
        "str2d": np.array([["a", "bb"], ["ccc", "d"]]),
        "bytes": np.array([b"ab", b"\x00\xff"]),
        "scalar0d": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "big": rng.standard_normal((64, 64)).astype(np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4))),
        "bigendian": np.arange(5, dtype=">i4"),
    }
    try:
        import ml_dtypes

        cases["bf16"] = rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        pass
    return cases


def test_every_dtype_round_trips_bit_exact(tmp_path):
    cases = _dtypes_cases()
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    for name, arr in cases.items():
        hook.save_tensor(name, arr)
    hook.close()
    trial = tt.create_trial(str(tmp_path))
    for name, arr in cases.items():
        got = trial.tensor(name).value(0)
        expected = np.asarray(arr)
        assert got.shape == expected.shape, name
        if expected.dtype.kind in "US":
            assert got.dtype.kind == expected.dtype.kind and got.tolist() == expected.tolist(), name
        else:
            assert got.dtype == expected.dtype.newbyteorder("<"), name
            assert got.tobytes() == np.ascontiguousarray(expected.astype(got.dtype)).tobytes(), name


def test_object_string_arrays_saved_as_strings_and_dicts_refused(tmp_path):
    hook = tt.Hook(str(tmp_path))
    hook.save_tensor("objstr", np.array(["x", "yz"], dtype=object))
    hook.save_tensor("dict", {"a": 1})  # refused with a warning, never pickled
    hook.close()
    trial = tt.create_trial(str(tmp_path))
    assert trial.tensor("objstr").value(0).tolist() == ["x", "yz"]
    assert not trial.has_tensor("dict")
    assert hook.error_count == 0


def test_files_grow_with_data_not_steps(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1), flush_interval=0.01)
    rng = np.random.default_rng(1)
    weights = {f"layer{i}.weight": rng.standard_normal((32, 32)).astype(np.float32) for i in range(5)}
    for _ in range(1000):
        hook.next_step()
        for name, w in weights.items():
            hook.save_tensor(name, w)
        hook.save_scalar("loss", 0.5)
    hook.close()
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert len(files) <= 10, files
    trial = tt.create_trial(str(tmp_path))
    assert trial.steps() == list(range(1000))
    assert np.array_equal(trial.tensor("layer3.weight").value(999), weights["layer3.weight"])


def test_chunks_roll_over_at_chunk_size(tmp_path):
    storage = LocalStorage(str(tmp_path))
    w = ChunkWriter(storage, "worker_0", chunk_bytes=10_000, flush_interval=0.01)
    arr = np.arange(1000, dtype=np.float32)  # 4000 bytes
    for s in range(20):
        w.submit(Record("x", s, 1, s, arr + s))
        w.flush()
    w.close()
    idx = [k for k in storage.list("tensortap/") if k.endswith(".idx")]
    assert len(idx) >= 3
    src = NativeSource(storage)
    e = src.refresh()
    vals = src.read_values(e)
    assert sorted(int(s) for s in e["step"]) == list(range(20))
    for row, v in zip(e, vals, strict=True):
        assert np.array_equal(v, arr + row["step"])


def _single_dat(tmp_path) -> str:
    dats = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".dat")]
    assert len(dats) == 1
    return dats[0]


def test_corrupt_payload_names_file_and_offset_and_rest_stays_readable(tmp_path):
    hook = tt.Hook(str(tmp_path), save_config=tt.SaveConfig(save_interval=1))
    a = np.arange(100, dtype=np.float64)
    for s in range(3):
        hook.next_step()
        hook.save_tensor("a", a + s)
        hook.save_tensor("b", a * 2 + s)
    hook.close()
    trial = tt.create_trial(str(tmp_path))
    entries = trial.tensor("a")._part((0, 255))
    victim = entries[entries["step"] == 1][0]
    path = _single_dat(tmp_path)
    with open(path, "r+b") as f:
        f.seek(int(victim["offset"]) + 10)
        byte = f.read(1)
        f.seek(int(victim["offset"]) + 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    trial = tt.create_trial(str(tmp_path))
    with pytest.raises(CorruptData) as ei:
        trial.tensor("a").value(1)
    assert ei.value.path == path and ei.value.offset == int(victim["offset"])
    assert str(victim["offset"]) in str(ei.value) and path in str(ei.value)
    with pytest.raises(CorruptData) as ei:
        trial.tensor("a").stacked()  # the bulk path checks every payload too
    assert ei.value.offset == int(victim["offset"])
    assert np.array_equal(trial.tensor("a").value(0), a)
    assert np.array_equal(trial.tensor("a").value(2), a + 2)
    steps, vals = trial.tensor("b").stacked()
    assert steps.tolist() == [0, 1, 2] and np.array_equal(vals[1], a * 2 + 1)
    assert np.array_equal(trial.tensor("b").value(1), a * 2 + 1)


def test_torn_index_tail_is_ignored_until_complete(tmp_path):
    storage = LocalStorage(str(tmp_path))
    w = ChunkWriter(storage, "worker_0", flush_interval=100)
    w.submit(Record("x", 0, 1, 0, np.arange(10.0)))
    w.flush()
    w.submit(Record("x", 1, 1, 1, np.arange(10.0) + 1))
    w.flush()
    w.close()
    idx_key = layout.chunk_key("worker_0", 0, layout.INDEX_SUFFIX)
    full = storage.read(idx_key)
    src_full = NativeSource(storage)
    n_full = len(src_full.refresh())
    # Cut the file inside its last block: a reader sees the complete blocks only, without error.
    storage.write(idx_key, full[: len(full) - 7])
    src = NativeSource(storage)
    first = src.refresh()
    assert 0 < len(first) < n_full + 1
    assert set(first["step"].tolist()) <= {0, 1}
    # When the rest lands, the next refresh reads only the new bytes and completes the picture.
    storage.write(idx_key, full)
    more = src.refresh()
    assert len(first) + len(more) == n_full
    assert "worker_0" in src.ended_workers


KILL_WRITER = textwrap.dedent(
    """
    import sys, numpy as np, tensortap as tt
    out = sys.argv[1]
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.005)
    step = 0
    while True:
        hook.next_step()
        for i in range(4):
            hook.save_tensor(f"t{i}", np.full((50,), step * 10 + i, dtype=np.int64))
        hook.save_scalar("s", float(step))
        if step % 7 == 0:
            hook.flush()
            print(step, flush=True)  # every step up to here is flushed
        step += 1
    """
)


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_sigkill_mid_write_loses_only_unflushed_data(tmp_path, delay):
    out = str(tmp_path / "job")
    p = subprocess.Popen([sys.executable, "-c", KILL_WRITER, out], stdout=subprocess.PIPE, text=True)
    flushed = -1
    t0 = time.monotonic()
    while time.monotonic() - t0 < delay or flushed < 0:
        line = p.stdout.readline()
        if not line:
            break
        flushed = int(line)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert flushed >= 0
    trial = tt.create_trial(out)
    steps = trial.steps(show_incomplete_steps=True)
    # Everything flushed before the kill is there ...
    assert set(range(flushed + 1)) <= set(steps)
    # ... and every record the reader returns is whole and correct.
    for i in range(4):
        t = trial.tensor(f"t{i}")
        for step in t.steps(show_incomplete_steps=True):
            g_rows = t._rows_at(t._part((0, 255)), step)
            v = trial.source.read_values(g_rows)[0]
            assert v.shape == (50,) and np.all(v == step * 10 + i)
    # (the job never closed: the trial ends it once its index stops growing with its process gone)


TAIL_WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    out, n = sys.argv[1], int(sys.argv[2])
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.1)
    for step in range(n):
        hook.next_step()
        hook.save_tensor("w", np.full((8, 8), step, dtype=np.float32))
        hook.end_step()
        print(step, time.time(), flush=True)
        time.sleep(0.3)
    hook.close()
    """
)


class _CountingStorage(LocalStorage):
    def __init__(self, root):
        super().__init__(root)
        self.bytes_read = 0

    def read_range(self, key, offset, length):
        data = super().read_range(key, offset, length)
        self.bytes_read += len(data)
        return data


def test_reader_tails_a_live_job_incrementally(tmp_path):
    out = str(tmp_path / "live")
    n = 6
    p = subprocess.Popen([sys.executable, "-c", TAIL_WRITER, out, str(n)], stdout=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first
        storage = _CountingStorage(out)
        trial = tt.trials.Trial(NativeSource(storage), "live")
        seen = []
        for step in range(n):
            trial.wait_for_steps([step], timeout=10)
            seen.append(step)
            assert np.all(trial.tensor("w").value(step) == step)
        p.wait(timeout=20)
        trial.refresh_data()
        assert trial.loaded_all_steps
        idx_size = sum(
            storage.size(k) for k in storage.list("tensortap/") if k.endswith(".idx")
        )
        payload = sum(8 * 8 * 4 for _ in range(n))
        # Each index byte is read once: total reads = index file + the payloads we fetched.
        assert storage.bytes_read <= idx_size + payload
        assert seen == list(range(n))
    finally:
        p.kill()
