"""The writer process (Hook(writer="process")): same data as the writer thread, and training survives its death."""

from __future__ import annotations

import logging
import os
import select
import signal
import time

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration
from tensortap.format.records import Record, RecordBatch
from tensortap.storage import open_storage
from tensortap.transport.process_writer import ProcessChunkWriter
from tensortap.trials.state import StepState


def _send_step(w: ProcessChunkWriter, names: tuple[str, ...], shapes: tuple, step: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Reserve a batch of random float32 tensors for `step`, fill it, commit it, mark the step passed."""
    res = w.reserve_batch(names, np.dtype(np.float32), shapes, step, 1, step)
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    res.payload[:] = np.concatenate([v.ravel() for v in vals]).view(np.uint8)
    w.commit(res)
    w.mark_step_passed(step, {"TRAIN": step, "GLOBAL": step})
    return vals


def test_generic_hook_round_trip_bit_exact(tmp_path):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1),
                   reduction_config=tt.ReductionConfig(reductions=["max"], save_raw_tensor=True))
    rng = np.random.default_rng(0)
    saved = {}
    for s in range(6):
        hook.next_step()
        a = rng.standard_normal((7, 5)).astype(np.float32)
        b = (rng.integers(0, 1000, 300_000)).astype(np.int64)  # larger than an inline payload, 2.4 MB
        hook.save_tensor("a", a)
        hook.save_tensor("b", b, "other")
        hook.save_scalar("loss", float(s) / 3)
        saved[s] = (a.copy(), b.copy())
    hook.close()
    assert hook.dropped_records == 0
    t = tt.create_trial(out)
    assert t.steps() == list(range(6))
    for s, (a, b) in saved.items():
        assert np.array_equal(t.tensor("a").value(s), a)
        assert t.tensor("a").value(s).dtype == np.float32
        assert np.array_equal(t.tensor("b").value(s), b)
        assert t.tensor("a").reduction_value(s, "max") == a.max()
        assert t.tensor("scalar/loss").value(s) == s / 3
    assert t.loaded_all_steps


def test_the_writer_process_imports_this_tensortap_whatever_the_working_directory(tmp_path, monkeypatch, caplog):
    """A job started in a directory that holds another tensortap (a checkout of another version) still saves:
    the writer process runs the training process's tensortap."""
    other = tmp_path / "elsewhere"
    (other / "tensortap" / "transport").mkdir(parents=True)
    for module in ("__init__.py", "transport/__init__.py", "transport/writer_process.py"):
        (other / "tensortap" / module).write_text("raise ImportError('another tensortap')\n")
    monkeypatch.chdir(other)
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1))
    for s in range(3):
        hook.next_step()
        hook.save_tensor("a", np.full((4, 3), s, np.float32))
        hook.flush()  # (visible to readers: the writer process has written it)
    hook.close()
    assert hook.dropped_records == 0 and hook.error_count == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text  # (no fallback either)
    t = tt.create_trial(out)
    assert t.steps() == [0, 1, 2]
    assert np.array_equal(t.tensor("a").value(2), np.full((4, 3), 2, np.float32))

def test_writer_value_is_validated(tmp_path):
    with pytest.raises(InvalidConfiguration, match=r"writer='procces'.*'auto'.*'thread'.*'process'"):
        tt.Hook(str(tmp_path), writer="procces")
    import platform
    import sys

    auto = "process" if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") else "thread"
    assert tt.Hook(str(tmp_path / "a")).writer_kind == auto  # the default, "auto"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TENSORTAP_WRITER", "thread")
        assert tt.Hook(str(tmp_path / "b")).writer_kind == "thread"
        assert tt.Hook(str(tmp_path / "c"), writer="process").writer_kind == "process"  # explicit wins
        mp.setenv("TENSORTAP_WRITER", "procss")
        with pytest.raises(InvalidConfiguration, match=r"TENSORTAP_WRITER='procss'.*'auto'.*'thread'.*'process'"):
            tt.Hook(str(tmp_path / "d"))
    from tensortap.hooks.base import default_writer

    assert default_writer("s3://bucket/run") == "thread"  # object stores: the writer thread
    for bad in (-1, "soon", True, float("nan")):
        with pytest.raises(ValueError, match=r"start_after must be a number of seconds >= 0, not"):
            ProcessChunkWriter(open_storage(str(tmp_path / "e")), "worker_0", start_after=bad)


def test_flush_makes_steps_visible_and_passed(tmp_path):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1), flush_interval=30)
    for s in range(3):
        hook.next_step()
        hook.save_tensor("x", np.full(10, s, dtype=np.float64))
    hook.next_step()  # ends step 2: marked passed, only once its records are written
    hook.flush()
    t = tt.create_trial(out)
    assert t.tensor("x").steps() == [0, 1, 2]
    assert np.array_equal(t.tensor("x").value(2), np.full(10, 2.0))
    assert t.has_passed_step(2) == StepState.AVAILABLE
    assert not t.loaded_all_steps
    hook.close()


def test_child_killed_training_continues(tmp_path, caplog):
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1))
    for s in range(3):
        hook.next_step()
        hook.save_tensor("x", np.full(1000, s, dtype=np.float32))
    hook.end_step()  # step 2 passed
    hook.flush()
    proc = hook._writer._proc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for s in range(3, 40):
            hook.next_step()
            hook.save_tensor("x", np.full(1000, s, dtype=np.float32))
        hook.flush()
        hook.close()
    assert time.monotonic() - t0 < 5
    assert hook.dropped_records >= 30
    assert hook.error_count == 0  # not an error of the hook: training went on
    died = [r for r in caplog.records if "ended unexpectedly" in r.getMessage()]
    assert len(died) == 1
    t = tt.create_trial(out)
    assert t.tensor("x").steps()[:3] == [0, 1, 2]  # what was flushed before the kill is there
    assert np.array_equal(t.tensor("x").value(1), np.full(1000, 1, dtype=np.float32))


def test_writer_direct_batches_big_messages_and_drop_policy(tmp_path):
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", max_pending_bytes=1 << 20, backpressure="drop", flush_interval=0.1)
    flat = np.arange(3000, dtype=np.float32)
    arrays = [flat[:1000].reshape(10, 100), flat[1000:]]
    assert w.submit_batch(RecordBatch(("p", "q"), arrays, flat, 0, 1, 0)) == 2
    big = np.arange(200_000, dtype=np.float64)  # 1.6 MB: more than the ring, through its own segment
    assert w.submit(Record(name="big", step=0, mode=1, mode_step=0, value=big))
    w.mark_step_passed(0, {"TRAIN": 0, "GLOBAL": 0})
    assert w.flush(10)
    # a stalled writer process with the drop policy: hand-offs are dropped at once, nothing blocks
    os.kill(w._proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        n = sum(w.submit(Record(name="r", step=1, mode=1, mode_step=1, value=np.zeros(60_000, np.uint8)))
                for _ in range(40))
        assert time.monotonic() - t0 < 2
        assert n < 40 and w.dropped_records == 40 - n
    finally:
        os.kill(w._proc.pid, signal.SIGCONT)
    w.close()
    assert w.error is None and w.written_records == 3 + n
    t = tt.create_trial(str(tmp_path / "run"))
    assert np.array_equal(t.tensor("p").value(0), arrays[0])
    assert np.array_equal(t.tensor("q").value(0), arrays[1])
    assert np.array_equal(t.tensor("big").value(0), big)
    assert t.has_passed_step(0) == StepState.AVAILABLE


def test_pytorch_hook_round_trip_bit_exact(tmp_path):
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer="process", save_config=tp.SaveConfig(save_interval=2),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    rec = []
    try:
        for _ in range(5):
            x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
            w = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            rec.append((w, {n: p.grad.clone() for n, p in model.named_parameters()}, loss.detach().clone()))
            opt.step()
        hook.close()
    finally:
        tp.del_hook()
    t = tt.create_trial(out)
    assert t.steps() == [0, 2, 4]
    for s in (0, 2, 4):
        w, g, loss = rec[s]
        for n in ("0.weight", "0.bias", "2.weight", "2.bias"):
            assert np.array_equal(t.tensor(f"Sequential_{n}").value(s), w[n].numpy())
            assert np.array_equal(t.tensor(f"gradient/Sequential_{n}").value(s), g[n].numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), loss.numpy())
    assert t.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    assert set(t.tensor_names(collection="gradients")) == {f"gradient/Sequential_{n}" for n in
                                                          ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert hook.dropped_records == 0


def test_child_entry_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys; from tensortap.transport.writer_process import _child_main; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_reservations_mixed_with_small_records_and_cancel(tmp_path):
    """Payloads copied straight into the ring (written with O_DIRECT where the filesystem allows it),
    interleaved with small buffered records, a reservation left open while other messages are sent, and
    a cancelled one: every value reads back exactly and step marks wait for their records."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.1)
    rng = np.random.default_rng(1)
    expect = {}
    for step in range(6):
        shapes = ((300, 70), (70,), (1000,))  # 86 KB: above the direct-write threshold
        res = w.reserve_batch(("w", "b", "g"), np.dtype(np.float32), shapes, step, 1, step)
        assert res.payload.ctypes.data % 4096 == 0
        vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        small = np.full(3 + step, step, dtype=np.int16)  # a small record sent while the batch is open
        assert w.submit(Record(name="small", step=step, mode=1, mode_step=step, value=small))
        res.payload[:] = np.concatenate([v.ravel() for v in vals]).view(np.uint8)
        if step == 3:
            w.cancel(res)
        else:
            w.commit(res)
            expect[step] = vals
        w.mark_step_passed(step, {"TRAIN": step, "GLOBAL": step})
        expect.setdefault("small", {})[step] = small
    assert w.flush(10)
    w.close()
    assert w.error is None and w.dropped_records == 0
    assert w.written_records == 5 * 3 + 6
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.tensor("w").steps() == [0, 1, 2, 4, 5]  # step 3's batch was cancelled
    for step in (0, 1, 2, 4, 5):
        for name, v in zip(("w", "b", "g"), expect[step], strict=True):
            assert np.array_equal(t.tensor(name).value(step), v)
    for step, v in expect["small"].items():
        assert np.array_equal(t.tensor("small").value(step), v)
    assert t.has_passed_step(5) == StepState.AVAILABLE


def test_forked_copy_of_the_training_process_leaves_the_writer_alone(tmp_path):
    """A fork (e.g. a DataLoader worker) inherits the writer object: it must not send into the parent's
    ring, move its step marks, stop its writer process or unlink the ring."""
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("a", np.full(3, 0.0))
    w = hook._writer
    pid = os.fork()
    if pid == 0:  # the forked copy
        ok = False
        try:
            ok = (not w.submit(Record(name="a", step=99, mode=1, mode_step=99, value=np.ones(3)))
                  and w._forked)
            w.mark_step_passed(99, {"GLOBAL": 99})
            w.close()
            del w
        finally:
            os._exit(0 if ok else 1)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for s in range(1, 4):  # the parent goes on writing through the same ring
        hook.next_step()
        hook.save_tensor("a", np.full(3, float(s)))
    hook.close()
    assert hook.dropped_records == 0
    t = tt.create_trial(out)
    assert t.tensor("a").steps() == [0, 1, 2, 3]
    assert [t.tensor("a").value(s)[0] for s in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert t.loaded_all_steps


def test_no_room_for_the_ring_falls_back_to_the_writer_thread(tmp_path, monkeypatch, caplog):
    """A ring that cannot be made (no memory for it, no file descriptor left) must not stop training: the hook
    writes from a thread instead. (The ring is a memfd, not a file in /dev/shm, whose size a container may
    limit: touching its pages cannot meet a full file system.)"""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(os, "memfd_create", full)
    out = str(tmp_path / "run")
    hook = tt.Hook(out, writer="process", save_config=tt.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        for s in range(3):
            hook.next_step()
            hook.save_tensor("a", np.full(4, float(s)))
    hook.close()
    assert hook.writer_kind == "thread" and not hook.disabled
    assert any("cannot start the writer process" in r.getMessage() for r in caplog.records)
    t = tt.create_trial(out)
    assert [t.tensor("a").value(s)[0] for s in range(3)] == [0.0, 1.0, 2.0]


def test_pytorch_batches_larger_than_half_the_ring(tmp_path):
    """Weights and gradients that do not fit in the ring go through segments of their own, bit-exact."""
    torch = pytest.importorskip("torch")
    import tensortap.pytorch as tp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 800), torch.nn.ReLU(), torch.nn.Linear(800, 4))  # 830 KB
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = str(tmp_path / "run")
    hook = tp.Hook(out_dir=out, writer="process", max_pending_bytes=1 << 20,  # a 1 MB ring
                   save_config=tp.SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    rec = []
    try:
        for _ in range(4):
            x, y = torch.randn(8, 256), torch.randint(0, 4, (8,))
            w = model[0].weight.detach().clone()
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            rec.append((w, model[0].weight.grad.clone(), loss.detach().clone()))
            opt.step()
        hook.close()
    finally:
        tp.del_hook()
    assert hook.dropped_records == 0
    t = tt.create_trial(out)
    for s, (w, g, loss) in enumerate(rec):
        assert np.array_equal(t.tensor("Sequential_0.weight").value(s), w.numpy())
        assert np.array_equal(t.tensor("gradient/Sequential_0.weight").value(s), g.numpy())
        assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s), loss.numpy())


def _wakeups(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


def test_idle_writer_process_backs_off_and_still_answers_at_once(tmp_path):
    # With nothing to do the child looks at the ring less and less often (down to every 50 ms instead
    # of every 5): an idle child used to wake ~200 times a second. A flush still gets through at once.
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=10.0)
    try:
        assert w.submit(Record(name="x", step=0, mode=1, mode_step=0, value=np.arange(4.0)))
        assert w.flush(timeout=10)
        time.sleep(0.5)  # (backing off)
        before = _wakeups(w._proc.pid)
        time.sleep(1.0)
        assert _wakeups(w._proc.pid) - before < 60
        assert w.submit(Record(name="x", step=1, mode=1, mode_step=1, value=np.arange(5.0)))
        assert w.flush(timeout=10)
    finally:
        w.close()
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.tensor("x").steps() == [0, 1] and t.tensor("x").value(1).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the writer process's threads from /proc")
def test_the_writer_process_runs_one_thread_whatever_blas_threads_the_job_asks_for(tmp_path, monkeypatch):
    # numpy's BLAS would start a pool of its own in the child (one thread per core, spinning at start-up beside the
    # training thread); the child does no linear algebra. The job's own setting is for the job.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0")
    try:
        assert w.submit(Record(name="x", step=0, mode=1, mode_step=0, value=np.arange(4.0)))
        assert w.flush(timeout=30)  # (the child has imported everything and written)
        assert sorted(os.listdir(f"/proc/{w._proc.pid}/task")) == [str(w._proc.pid)]
    finally:
        w.close()
    assert tt.create_trial(str(tmp_path / "run")).tensor("x").value(0).tolist() == [0, 1, 2, 3]


def test_the_child_answers_a_control_message_once_everything_before_it_is_handled(tmp_path):
    """drain() and flush() sleep until the child answers on a pipe (one wake-up), not in a loop of sleeps."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=10.0)
    try:
        assert w.drain(timeout=10)
        while select.select([w._answer], [], [], 0)[0]:  # (answers to earlier requests)
            os.read(w._answer, 4096)
        for step in range(50):
            assert w.submit(Record(name="x", step=step, mode=1, mode_step=step, value=np.full(4096, float(step))))
        w.mark_step_passed(49, {"TRAIN": 49})
        with w._lock:
            w._publish(urgent=True)
        assert select.select([w._answer], [], [], 30)[0], "the child did not answer"
        assert w.pending_bytes == 0  # (everything published before the request was handled first)
        assert w.flush(timeout=10)
    finally:
        w.close()
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.tensor("x").steps() == list(range(50))


def test_drain_waits_for_the_child_and_wakes_it_only_when_it_has_work(tmp_path):
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=10.0)
    try:
        for step in range(3):  # (the child handles them at its next look, or when told to drain)
            assert w.submit(Record(name="x", step=step, mode=1, mode_step=step, value=np.full(8, float(step))))
        assert w.drain(timeout=10) and w.pending_bytes == 0
        time.sleep(0.5)  # (the child backs off)
        before = _wakeups(w._proc.pid)
        for _ in range(100):
            assert w.drain(timeout=10)
            time.sleep(0.002)
        assert _wakeups(w._proc.pid) - before < 30  # a few polls in this time; a bell per drain would add 100
        assert w.flush(timeout=10)
    finally:
        w.close()
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.tensor("x").steps() == [0, 1, 2] and t.tensor("x").value(2).tolist() == [2.0] * 8


def test_direct_written_batches_across_data_chunks(tmp_path):
    # Small chunks: the payloads written straight from the ring land in several data files, and every
    # value reads back exactly.
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.05, chunk_bytes=300_000)
    rng = np.random.default_rng(2)
    expect = {}
    for step in range(12):
        expect[step] = _send_step(w, ("w", "g"), ((300, 70), (1000,)), step, rng)
        if step % 4 == 3:
            assert w.flush(10)
    w.close()
    assert w.error is None and w.dropped_records == 0
    assert len(list((tmp_path / "run").rglob("*.dat"))) >= 3
    t = tt.create_trial(str(tmp_path / "run"))
    for step, (wv, gv) in expect.items():
        assert np.array_equal(t.tensor("w").value(step), wv) and np.array_equal(t.tensor("g").value(step), gv)


def test_a_reservation_shrunk_to_its_first_tensors(tmp_path):
    """`shrink` sends only the leading tensors of an open reservation (what a step whose gradients did not come
    sends of its weights-and-gradients message); the records counted are those sent."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.1)
    rng = np.random.default_rng(2)
    shapes = ((300, 70), (70,), (1000,), ())
    expect = {}
    for step in range(4):
        res = w.reserve_batch(("w", "b", "g", "loss"), np.dtype(np.float32), shapes, step, 1, step)
        vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        res.payload[:] = np.concatenate([v.ravel() for v in vals]).view(np.uint8)
        if step % 2:
            w.shrink(res, ("w", "b"), np.dtype(np.float32), shapes[:2])
            assert res.n == 2 and res.nbytes == (300 * 70 + 70) * 4
        w.commit(res)
        w.shrink(res, ("w",), np.dtype(np.float32), shapes[:1])  # committed: nothing changes any more
        w.mark_step_passed(step, {"TRAIN": step, "GLOBAL": step})
        expect[step] = vals
    assert w.flush(10)
    w.close()
    assert w.error is None and w.written_records == 4 + 2 + 4 + 2
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.tensor("w").steps() == [0, 1, 2, 3] and t.tensor("g").steps() == [0, 2]
    assert t.tensor("loss").steps() == [0, 2]
    for step, vals in expect.items():
        for name, v in zip(("w", "b", "g", "loss"), vals, strict=True):
            if step % 2 == 0 or name in ("w", "b"):
                assert np.array_equal(t.tensor(name).value(step), v)


def test_small_values_after_a_direct_written_one_in_the_same_message(tmp_path):
    """A message whose first value is written straight from the ring (O_DIRECT, whole pages) keeps the values
    after it: a batch's small tensors, which the index holds, and a records message's later values."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.1)
    rng = np.random.default_rng(3)
    big = rng.standard_normal(30_001).astype(np.float32)  # 120 KB, an odd number of floats
    loss = np.float32(2.25)
    res = w.reserve_batch(("grad", "loss"), np.dtype(np.float32), (big.shape, ()), 0, 1, 0)
    res.payload[:] = np.concatenate([big, [loss]]).view(np.uint8)
    w.commit(res)
    later = [rng.standard_normal(n).astype(np.float64) for n in (3, 500, 1)]
    assert w.submit_many([Record(name="first", step=1, mode=1, mode_step=1, value=big)]
                         + [Record(name=f"v{i}", step=1, mode=1, mode_step=1, value=v) for i, v in enumerate(later)])
    w.mark_step_passed(1, {"TRAIN": 1, "GLOBAL": 1})
    assert w.flush(10)
    w.close()
    assert w.error is None
    t = tt.create_trial(str(tmp_path / "run"))
    assert np.array_equal(t.tensor("grad").value(0), big) and t.tensor("loss").value(0) == loss
    assert np.array_equal(t.tensor("first").value(1), big)
    for i, v in enumerate(later):
        assert np.array_equal(t.tensor(f"v{i}").value(1), v)


def test_a_batch_with_small_tensors_between_large_ones_after_an_odd_sized_write(tmp_path):
    """Runs of large tensors between small ones (which the index holds) land wherever the writer puts
    them (a direct write starts on a page), and the index points at each: here the data file's end is
    not on a page when the batch comes (a 1000-byte record before it)."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.1)
    rng = np.random.default_rng(4)
    odd = rng.standard_normal(125)  # 1000 bytes, written through the page cache
    shapes = ((300, 70), (2,), (20_000,), (1,), (700,))
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for step in range(3):
        assert w.submit(Record(name="odd", step=step, mode=1, mode_step=step, value=odd))
        res = w.reserve_batch(("a", "b", "c", "d", "e"), np.dtype(np.float32), shapes, step, 1, step)
        res.payload[:] = np.concatenate([v.ravel() for v in vals]).view(np.uint8)
        w.commit(res)
        w.mark_step_passed(step, {"TRAIN": step, "GLOBAL": step})
    assert w.flush(10)
    w.close()
    assert w.error is None
    t = tt.create_trial(str(tmp_path / "run"))
    for step in range(3):
        assert np.array_equal(t.tensor("odd").value(step), odd)
        for name, v in zip("abcde", vals, strict=True):
            assert np.array_equal(t.tensor(name).value(step), v), (step, name)


def test_payloads_that_come_slowly_and_then_fast_read_back(tmp_path):
    """A job whose large payloads come slowly for over a second and then in a burst of several MB reads
    back whole (a writer that chose between the page cache and direct writes by the payloads' rate, tried
    and not kept, went through both here)."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.1)
    rng = np.random.default_rng(5)
    shapes = ((200, 100), (3,), (5000,))
    expect = {}
    for step in range(80):  # then 72 x 100 KB at once: several MB wait in the ring
        expect[step] = _send_step(w, ("a", "b", "c"), shapes, step, rng)
        if step < 8:
            time.sleep(0.2)  # ~0.5 MB/s for 1.6 s
    assert w.flush(10)
    w.close()
    assert w.error is None
    t = tt.create_trial(str(tmp_path / "run"))
    for step, vals in expect.items():
        for name, v in zip("abc", vals, strict=True):
            assert np.array_equal(t.tensor(name).value(step), v), (step, name)


# Injected into the writer process (a separate interpreter) through sitecustomize: its os.pwritev fails
# or writes short the first time, as a disk, a filesystem or a signal can make it do; the rest is real.
_PWRITEV_FAULT = '''
import os
_real, _log, _mode = os.pwritev, os.environ["TT_TEST_PWRITEV_LOG"], os.environ["TT_TEST_PWRITEV"]
_calls = [0]
def pwritev(fd, buffers, offset, *a):
    _calls[0] += 1
    with open(_log, "a") as f:
        f.write(f"{_calls[0]} {sum(len(b) for b in buffers)}\\n")
    if _calls[0] > 1:
        return _real(fd, buffers, offset, *a)
    if _mode == "none":
        return _real(fd, buffers, offset, *a)
    if _mode == "fail":
        raise OSError(22, "Invalid argument (injected)")
    return _real(fd, [memoryview(buffers[0])[:8192]], offset)  # (O_DIRECT writes whole blocks)
os.pwritev = pwritev
'''


def _log_pwritev(tmp_path, monkeypatch) -> object:
    """The writer process's os.pwritev calls (its direct writes), logged as "<call> <bytes>" lines."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_PWRITEV_FAULT)
    log = tmp_path / "pwritev.log"
    monkeypatch.setenv("PYTHONPATH", str(inject))
    monkeypatch.setenv("TT_TEST_PWRITEV", "none")
    monkeypatch.setenv("TT_TEST_PWRITEV_LOG", str(log))
    return log


def test_a_trainers_steps_go_to_disk_in_few_direct_writes_and_read_back_whole(tmp_path, monkeypatch):
    """A trainer's saving steps: a batch of tensors straight from the ring, then the step's loss (a small
    payload). The direct writes are held and made several steps at a time (fewer disk requests beside
    training), the losses joining them in whole pages; a flush writes what is held, and every value reads
    back exactly, before and after it."""
    log = _log_pwritev(tmp_path, monkeypatch)
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=30.0)
    rng = np.random.default_rng(11)
    shapes = ((256, 64), (256,), (10, 256))  # 76 KB a step
    expect, losses = {}, {}

    def step(k: int) -> None:
        expect[k] = _send_step(w, ("w", "b", "g"), shapes, k, rng)
        losses[k] = rng.standard_normal(1)[0]
        assert w.submit(Record(name="loss", step=k, mode=1, mode_step=k, value=np.float64(losses[k])))
        w.mark_step_passed(k, {"TRAIN": k, "GLOBAL": k})
        time.sleep(0.003)  # (the writer process looks at the ring between steps, as beside training)

    for k in range(40):
        step(k)
    assert w.flush(10)
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.steps() == list(range(40))
    for k in range(40):
        assert t.tensor("loss").value(k) == losses[k]
        assert np.array_equal(t.tensor("g").value(k), expect[k][2])
    for k in range(40, 100):
        step(k)
    w.close()
    assert w.error is None and w.dropped_records == 0
    if not log.exists():
        pytest.skip(f"no O_DIRECT writes here ({tmp_path} does not take them, e.g. tmpfs)")
    writes = log.read_text().splitlines()
    assert len(writes) <= 100 // 4, writes  # several steps a write (one a step without holding)
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.steps() == list(range(100))
    for k in range(100):
        assert t.tensor("loss").value(k) == losses[k], k
        for name, v in zip(("w", "b", "g"), expect[k], strict=True):
            assert np.array_equal(t.tensor(name).value(k), v), (name, k)


def test_a_small_ring_holds_back_at_most_an_eighth_of_itself(tmp_path):
    """With a ring of 2 MiB the held direct writes never keep the training process waiting for room that only
    a flush would free (30 s away here, as long as backpressure waits before it drops): 40 steps of 300 KB go
    through, nothing dropped, all read back."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=30.0, ring_bytes=2 << 20)
    rng = np.random.default_rng(12)
    expect = {k: _send_step(w, ("w", "g"), ((300, 128), (300, 128)), k, rng) for k in range(40)}
    w.close()
    assert w.error is None and w.dropped_records == 0
    t = tt.create_trial(str(tmp_path / "run"))
    for k, vals in expect.items():
        for name, v in zip(("w", "g"), vals, strict=True):
            assert np.array_equal(t.tensor(name).value(k), v), (name, k)


@pytest.mark.parametrize("fault", ["fail", "short"])
def test_direct_writes_that_fail_or_come_back_short_lose_nothing(tmp_path, monkeypatch, fault):
    # fail: the writer goes on through the page cache, from the first byte of the failed write;
    # short: the rest of the write follows with O_DIRECT. Every value reads back exactly.
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_PWRITEV_FAULT)
    log = tmp_path / "pwritev.log"
    monkeypatch.setenv("PYTHONPATH", str(inject))
    monkeypatch.setenv("TT_TEST_PWRITEV", fault)
    monkeypatch.setenv("TT_TEST_PWRITEV_LOG", str(log))
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.05)
    rng = np.random.default_rng(3)
    expect = {}
    for step in range(6):
        expect[step] = _send_step(w, ("w", "g", "h"), ((300, 70), (1000,), (50, 400)), step, rng)
        assert w.flush(10)
    w.close()
    if not log.exists():
        pytest.skip(f"no O_DIRECT writes here ({tmp_path} does not take them, e.g. tmpfs)")
    calls = [line.split() for line in log.read_text().splitlines()]
    assert int(calls[0][1]) > 8192  # the first direct write was one that the fault cut short or failed
    assert len(calls) == (1 if fault == "fail" else 6)  # after a failure, no more O_DIRECT in this file
    assert w.error is None and w.dropped_records == 0
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.steps() == list(range(6))
    for step, vals in expect.items():
        for name, v in zip(("w", "g", "h"), vals, strict=True):
            assert np.array_equal(t.tensor(name).value(step), v), (name, step)


def test_steps_reserved_and_filled_in_two_parts_over_many_wraps(tmp_path):
    """reserve_batch(), Reservation.copy_in() in two parts (as a saving step fills its weights, then its gradients
    at the end of the backward pass), commit() and mark_steps() (the step mark with numbers). A ring of 1 MB
    wraps every few messages; small records sent while a step's reservation is open; every value and every passed
    step reads back."""
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", flush_interval=0.05, ring_bytes=1 << 20)
    rng = np.random.default_rng(5)
    names, shapes = ("w", "b", "g", "loss"), ((120, 300), (300,), (120, 300), ())
    layout = w.batch_layout(names, np.dtype(np.float32), shapes)
    expect = {}
    for step in range(40):
        vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        res = w.reserve_batch(names, np.dtype(np.float32), shapes, step, 1, step, layout)
        assert res
        head = vals[:2]
        res.copy_in([(v.ctypes.data, v.nbytes) for v in head])
        if step % 3 == 0:
            assert w.submit(Record(name="lr", step=step, mode=1, mode_step=step, value=np.float32(step)))
        res.copy_in([(v.ctypes.data, v.nbytes) for v in vals[2:]], at=sum(v.nbytes for v in head))
        res.commit()
        w.mark_steps(step, step, -1, -1, step)
        expect[step] = vals
        if step == 20:
            # a reader meanwhile: the steps marked so far have passed
            assert w.flush(10)
            t = tt.create_trial(str(tmp_path / "run"))
            assert t.last_complete_step == 20
            assert t.has_passed_step(20, "TRAIN") == StepState.AVAILABLE
            assert t.has_passed_step(21, "TRAIN") == StepState.NOT_YET_AVAILABLE
        with pytest.raises(ValueError, match="do not fit"):
            res.copy_in([(vals[0].ctypes.data, vals[0].nbytes)], at=res.nbytes - 4)
    w.close()
    assert w.error is None and w.dropped_records == 0
    t = tt.create_trial(str(tmp_path / "run"))
    assert t.steps() == list(range(40))
    for step, vals in expect.items():
        for n, v in zip(names, vals, strict=True):
            assert np.array_equal(t.tensor(n).value(step), v), (n, step)
    assert t.tensor("lr").steps() == list(range(0, 40, 3))


def test_a_step_larger_than_half_the_ring_is_not_reserved_in_it(tmp_path):
    # as reserve_batch: None, for the caller to hand the batch off another way
    storage = open_storage(str(tmp_path / "run"))
    w = ProcessChunkWriter(storage, "worker_0", ring_bytes=1 << 20)
    try:
        big = np.zeros(150_000, dtype=np.float32)  # 600 KB of a 1 MB ring
        assert w.reserve_batch(("big",), np.dtype(np.float32), (big.shape,), 0, 1, 0) is None
    finally:
        w.close()
    assert w.error is None


def _late_job(w: ProcessChunkWriter, steps: range, rng: np.random.Generator) -> dict[int, list[np.ndarray]]:
    """Steps of 80 KB each."""
    return {s: _send_step(w, ("a", "b"), ((256, 64), (4096,)), s, rng) for s in steps}


def _check_job(out: str, saved: dict[int, list[np.ndarray]]) -> None:
    t = tt.create_trial(out)
    assert t.steps() == sorted(saved)
    for s, (a, b) in saved.items():
        assert t.tensor("a").value(s).tobytes() == a.tobytes()
        assert t.tensor("b").value(s).tobytes() == b.tobytes()


def test_a_late_writer_closed_before_its_start_starts_no_process_and_loses_nothing(tmp_path, writer_processes):
    """start_after: a job that ends before the writer process was due starts none; close() writes the ring."""
    out = str(tmp_path / "run")
    before = writer_processes()
    w = ProcessChunkWriter(open_storage(out), "worker_0", start_after=60.0)
    saved = _late_job(w, range(5), np.random.default_rng(0))
    assert not set(writer_processes()) - set(before)
    w.close()
    assert not set(writer_processes()) - set(before)
    assert w.dropped_records == 0
    _check_job(out, saved)


def test_a_flush_before_the_late_start_writes_from_this_process_and_everything_after_it_too(tmp_path,
                                                                                          writer_processes):
    """A flush (a trainer's end of training) before the writer process was due does not wait for a process to
    start: this process reads the ring from then on. Steps before and after the flush are all readable."""
    out = str(tmp_path / "run")
    before = writer_processes()
    w = ProcessChunkWriter(open_storage(out), "worker_0", start_after=60.0)
    rng = np.random.default_rng(1)
    saved = _late_job(w, range(3), rng)
    assert w.flush(timeout=30)
    _check_job(out, saved)  # (readable after the flush, before close)
    saved.update(_late_job(w, range(3, 6), rng))
    assert w.drain(timeout=30)
    w.close()
    assert not set(writer_processes()) - set(before)  # (only new ones: an earlier test's may still be exiting)
    assert w.dropped_records == 0
    _check_job(out, saved)


@pytest.mark.parametrize("why", ["its time came", "a quarter of the ring waits"])
def test_a_late_writer_process_starts_when_due_and_loses_nothing(tmp_path, why, writer_processes):
    """The writer process starts `start_after` seconds after the writer was made, or at once when a quarter of the
    ring waits (a heavy job does not fill its ring before a process reads it)."""
    out = str(tmp_path / "run")
    before = writer_processes()
    start_after = 0.05 if why == "its time came" else 60.0
    w = ProcessChunkWriter(open_storage(out), "worker_0", start_after=start_after, ring_bytes=1 << 20)
    rng = np.random.default_rng(2)
    saved = _late_job(w, range(2), rng)  # (160 KB: under a quarter of the 1 MiB ring)
    if why == "its time came":
        time.sleep(0.3)
        saved.update(_late_job(w, range(2, 3), rng))  # (240 KB: still under)
    else:
        saved.update(_late_job(w, range(2, 6), rng))  # (480 KB: past a quarter)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not [p for p in writer_processes() if p not in before]:
        time.sleep(0.01)
    assert [p for p in writer_processes() if p not in before], "no writer process started"
    w.close()
    assert w.dropped_records == 0
    _check_job(out, saved)
