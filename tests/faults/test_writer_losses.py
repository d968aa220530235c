"""The writers under faults (issue #20, writer side): a killed writer process, a writer that lags behind, a full
disk, two jobs racing for one out_dir, a value too large to hold, bad constructor input, a hostile message in
the writer's ring. Each case asserts what a user sees: what is readable equals what was saved, bit for bit, and
what is not readable is counted exactly in `dropped_records` and reported once."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration

WRITERS = ["thread", "process"]


def _readable(out: str, name: str = "x") -> dict[int, np.ndarray]:
    t = tt.create_trial(out)
    if name not in t.tensor_names():
        return {}
    tensor = t.tensor(name)  # (every value on disk: also a last step that was not marked passed before a kill)
    return {s: tensor.value(s) for s in tensor.steps(show_incomplete_steps=True)}


@pytest.mark.parametrize("kill_after", [3, 70, 130])
def test_a_killed_writer_process_loses_only_what_it_had_not_indexed_and_counts_it_exactly(tmp_path, kill_after,
                                                                                        caplog):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1), flush_interval=0.3)
    n = 200
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for s in range(n):
            hook.next_step()
            hook.save_tensor("x", np.full(20_000, s, dtype=np.float32))  # 80 KB: a backlog builds up
            if s == kill_after:
                os.kill(hook._writer._proc.pid, signal.SIGKILL)
            if s % 50 == 49:
                time.sleep(0.4)  # (an index block in between)
        hook.close()
    values = _readable(out)
    for s, v in values.items():
        assert np.array_equal(v, np.full(20_000, s, dtype=np.float32)), s
    assert len(values) + hook.dropped_records == n  # every record: readable, or counted as lost
    assert len(values) <= kill_after + 1
    died = [r for r in caplog.records if "ended unexpectedly" in r.getMessage()]
    assert len(died) == 1


LAGGING_WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    from tensortap.format import writer as w

    encode = w.ChunkEncoder.encode
    def slow_encode(self, r):  # a slow disk: the writer thread stays a step or more behind the loop
        encode(self, r)
        time.sleep(0.004)
    w.ChunkEncoder.encode = slow_encode
    hook = tt.Hook(sys.argv[1], writer="thread", save_config=tt.SaveConfig(save_interval=1), flush_interval=0.02)
    for step in range(100000):
        hook.next_step()
        for k in range(3):
            hook.save_tensor(f"x{k}", np.full(64, step, dtype=np.float32))
        time.sleep(0.002)
        if step == 5:
            print("running", flush=True)
    """
)


def test_a_lagging_thread_writer_publishes_step_marks_before_it_is_killed(tmp_path):
    """The training loop stays ahead of the writer thread; killed after ~1 s, the steps the writer had written
    are seen as passed (the marks of earlier steps were kept, not only the newest)."""
    out = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-c", LAGGING_WRITER, out], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "running"
        time.sleep(1.0)
    finally:
        p.kill()
        p.wait(10)
    t = tt.create_trial(out)
    steps = t.steps()
    assert len(steps) >= 5, steps  # (before: no mark at all while the writer lagged)
    assert steps == list(range(len(steps)))
    for s in steps:
        for k in range(3):
            assert np.array_equal(t.tensor(f"x{k}").value(s), np.full(64, s, dtype=np.float32))
    assert t.has_passed_step(steps[-1]) == tt.StepState.AVAILABLE


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MB tmpfs (needs root and a kernel that lets us mount)."""
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 4 MB tmpfs here ({r.stderr.strip() or r.returncode}): the disk-full cases "
                    "need root and mount permission")
    yield str(d)
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("size", [4_000, 60_000])  # many small values; a fast fill with large ones
def test_a_full_disk_keeps_what_was_indexed_readable_and_counts_every_loss(tiny_disk, writer, size, caplog,
                                                                          capfd):
    out = os.path.join(tiny_disk, "run")
    hook = tt.Hook(out, writer=writer, save_config=tt.SaveConfig(save_interval=1), flush_interval=0.05)
    n = 8_000_000 // size  # twice the disk
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for s in range(n):
            hook.next_step()
            hook.save_tensor("x", np.full(size // 4, s, dtype=np.float32))
        hook.close()
    assert hook.error_count == 0
    values = _readable(out)
    for s, v in values.items():
        assert np.array_equal(v, np.full(size // 4, s, dtype=np.float32)), s
    assert hook.dropped_records > 0
    assert len(values) + hook.dropped_records == n
    t = tt.create_trial(out)
    assert t.loaded_all_steps  # the end of the job was still written
    logged = [r.getMessage() for r in caplog.records] + capfd.readouterr().err.splitlines()
    full = [m for m in logged if "no space left" in m]
    assert len(full) == 1, logged
    assert not [m for m in logged if "Traceback" in m]


def test_two_jobs_given_one_out_dir_the_second_is_refused_at_construction(tmp_path):
    out = str(tmp_path / "run")
    first = tt.Hook(out)
    with pytest.raises(InvalidConfiguration, match="already used by another job writing worker_0"):
        tt.Hook(out)
    first.close()
    assert tt.Hook(out, worker="other") is not None  # another worker of the same job may write beside it


RACER = textwrap.dedent(
    """
    import sys, time, numpy as np, tensortap as tt
    from tensortap.exceptions import InvalidConfiguration
    start = float(sys.argv[2])
    while time.time() < start:
        pass
    try:
        hook = tt.Hook(sys.argv[1], save_config=tt.SaveConfig(save_interval=1))
    except InvalidConfiguration as e:
        print("refused", e, flush=True)
        sys.exit(0)
    for step in range(20):
        hook.next_step()
        hook.save_tensor("x", np.full(8, float(sys.argv[3]), dtype=np.float32))
    hook.close()
    print("wrote", flush=True)
    """
)


def test_two_jobs_racing_for_one_out_dir_exactly_one_writes(tmp_path):
    for attempt in range(3):
        out = str(tmp_path / f"run{attempt}")
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", RACER, out, str(start), str(k)], stdout=subprocess.PIPE,
                                  text=True) for k in (1, 2)]
        results = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert sorted(r.split()[0] for r in results) == ["refused", "wrote"], results
        winner = 1 + [r.startswith("wrote") for r in results].index(True)
        t = tt.create_trial(out)
        assert t.steps() == list(range(20))
        for s in t.steps():
            assert np.array_equal(t.tensor("x").value(s), np.full(8, float(winner), dtype=np.float32))


def test_two_jobs_given_one_s3_out_dir_the_second_is_refused(s3_url):
    url = f"{s3_url}/{uuid.uuid4().hex}"
    first = tt.Hook(url)
    with pytest.raises(InvalidConfiguration, match="already used by another job"):
        tt.Hook(url)
    first.close()


def test_a_value_larger_than_the_writer_may_hold_is_dropped_before_any_copy(tmp_path, caplog):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1), max_pending_bytes=64 << 20)
    huge = np.broadcast_to(np.float32(1), (1 << 32,))  # a 16 GiB view of 4 bytes: a copy would be OOM-killed
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for _ in range(3):
            hook.next_step()
            hook.save_tensor("huge", huge)
            hook.save_tensor("small", np.arange(4, dtype=np.float32))
    hook.close()
    assert hook.dropped_records == 3 and hook.error_count == 0
    assert len([r for r in caplog.records if "huge" in r.getMessage()]) == 1
    t = tt.create_trial(out)
    assert "huge" not in t.tensor_names() and t.tensor("small").steps() == [0, 1, 2]


@pytest.mark.parametrize("out_dir, expected", [
    ("/proc/x", "system folder"),
    (123, "give a local directory"),
    ("with\0nul", "NUL"),
    (None, "give a local directory"),
])
def test_bad_out_dirs_are_refused_at_construction(out_dir, expected):
    with pytest.raises(InvalidConfiguration, match=expected):
        tt.Hook(out_dir)


def test_an_out_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InvalidConfiguration, match="is a file"):
        tt.Hook(str(f))
    with pytest.raises(InvalidConfiguration, match="is under a file"):
        tt.Hook(str(f / "sub"))


@pytest.mark.parametrize("kw", [{"chunk_bytes": 0}, {"max_pending_bytes": -5}, {"chunk_bytes": 1.5},
                                {"max_pending_bytes": "1"}])
def test_bad_sizes_are_refused_at_construction(tmp_path, kw):
    name = next(iter(kw))
    with pytest.raises(InvalidConfiguration, match=f"{name}=.*positive whole number"):
        tt.Hook(str(tmp_path / "run"), **kw)


class _Opens:
    """Unpickled, this would create a file: the writer must never unpickle what it finds in its ring."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_writer_process_never_unpickles_what_is_in_its_ring(tmp_path):
    from tensortap.transport import process_writer as pw
    from tensortap.transport import ring

    target = tmp_path / "pwned"
    w = pw.ProcessChunkWriter(str(tmp_path / "run"), "worker_0")
    try:
        evil = pickle.dumps(("records", [_Opens(str(target))]))
        with w._lock:  # a message whose description is a pickle, where a JSON one belongs
            need = ring.align(ring.align(ring.MSG_HDR + len(evil)))
            pos = w._room(need, 0, True)
            w._write_header(pos, need, evil, ring.align(ring.MSG_HDR + len(evil)))
            w._head += need
            w._sent += 1
            w._publish(urgent=True)
        deadline = time.monotonic() + 10
        while w.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        w.close(timeout=10)
    assert not target.exists()
    assert w.error is not None and "description" in str(w.error)


def test_a_writer_process_catching_up_on_a_backlog_writes_index_blocks_as_it_goes(tmp_path):
    """The child is stopped while 37 MB pile up in its ring, then let go and killed half-way through the
    backlog: what it wrote before the kill is indexed (an index block per flush interval also while catching up),
    not megabytes of data with an empty index."""
    from tensortap.storage import open_storage
    from tensortap.transport import process_writer as pw
    from tensortap.transport import ring

    out = str(tmp_path / "run")
    w = pw.ProcessChunkWriter(open_storage(out), "worker_0", flush_interval=0.003, ring_bytes=256 << 20,
                              max_pending_bytes=1 << 30)
    shape = (1 << 16,)  # 256 KB of float32
    try:
        os.kill(w._proc.pid, signal.SIGSTOP)
        for step in range(150):
            res = w.reserve_batch(("x",), np.dtype(np.float32), (shape,), step, 1, step)
            res.payload[:] = np.full(shape, step, dtype=np.float32).view(np.uint8)
            w.commit(res)
            w.mark_steps(step, step, -1, -1, step)
        w._publish(urgent=True)
        os.kill(w._proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while w._h[ring.DONE_MSGS] < 75 and time.monotonic() < deadline:
            time.sleep(0.0005)
        os.kill(w._proc.pid, signal.SIGKILL)
        w._proc.wait(10)
    finally:
        w.close(timeout=10)
    values = _readable(out)
    assert len(values) >= 3, len(values)  # (before: the backlog's data with no index block: nothing readable)
    for s, v in values.items():
        assert np.array_equal(v, np.full(shape, s, dtype=np.float32)), s
    assert len(values) + w.dropped_records == 150


@pytest.mark.parametrize("index_write", ["landed", "cut short"])
def test_a_writer_process_killed_between_an_index_write_and_saying_so_counts_its_losses_exactly(tmp_path,
                                                                                                 index_write):
    """The child says what is indexed (DURABLE) after each index write; killed in between, what that write indexed
    is readable and counts as saved ("landed": the training process asks the store), and an index write cut short
    leaves its records counted as lost ("cut short")."""
    from tensortap.storage import open_storage
    from tensortap.transport import process_writer as pw
    from tensortap.transport import ring

    out = str(tmp_path / "run")
    w = pw.ProcessChunkWriter(open_storage(out), "worker_0", flush_interval=0.003)
    shape = (256,)

    def hand_over(steps: range) -> None:
        for step in steps:
            res = w.reserve_batch(("x",), np.dtype(np.float32), (shape,), step, 1, step)
            res.payload[:] = np.full(shape, step, dtype=np.float32).view(np.uint8)
            w.commit(res)
            w.mark_steps(step, step, -1, -1, step)

    try:
        hand_over(range(40))
        assert w.flush(timeout=30)
        os.kill(w._proc.pid, signal.SIGSTOP)
        h = w._h
        assert h[ring.INDEX_RECORDS] == h[ring.DURABLE] == 40
        if index_write == "landed":  # (its last index write done, DURABLE not yet told)
            h[ring.DURABLE] = 30
        else:  # (five more records handed over; the index write of them began and never landed)
            hand_over(range(40, 45))
            h[ring.INDEX_RECORDS] = 45
            h[ring.INDEX_SIZE] += 1 << 20
        os.kill(w._proc.pid, signal.SIGKILL)
        w._proc.wait(10)
    finally:
        w.close(timeout=10)
    values = _readable(out)
    assert sorted(values) == list(range(40))
    for s, v in values.items():
        assert np.array_equal(v, np.full(shape, s, dtype=np.float32)), s
    assert w.dropped_records == (0 if index_write == "landed" else 5)
