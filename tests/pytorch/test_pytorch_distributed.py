"""A 2-process gloo DDP job: include_workers="all" saves both workers, "one" only worker_0. The model's first
layer (128 KB) is large enough for the writer process's direct writes and one message per saving step."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import tensortap.pytorch as tp  # noqa: E402

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    import tensortap.pytorch as tp

    out_dir, include_workers, rec_dir = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 3)))
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=1), include_workers=include_workers,
                   include_collections=["weights", "gradients", "losses"])
    loss_fn = nn.CrossEntropyLoss()
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = {}
    for step in range(4):
        x, y = torch.randn(4, 64), torch.randint(0, 3, (4,))
        rec[f"w{step}"] = model.module[0].weight.detach().clone().numpy()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        rec[f"loss{step}"] = loss.detach().clone().numpy()
        rec[f"g{step}"] = model.module[0].weight.grad.clone().numpy()
        opt.step()
    hook.close()
    np.savez(os.path.join(rec_dir, f"rank{rank}.npz"), **rec)
    print(json.dumps({"rank": rank, "worker": hook.worker, "writes": hook.writes, "step": hook.step,
                      "errors": hook.error_count}))
    dist.barrier()  # (ranks leave the group together: gloo may abort a rank whose peer is gone)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(script, args: list[str]) -> list[subprocess.Popen]:
    """`script args...` as ranks 0 and 1 of a 2-process job (torchrun's environment variables)."""
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   OMP_NUM_THREADS="1")
        env.pop("TENSORTAP_DISABLE", None)
        procs.append(subprocess.Popen([sys.executable, str(script), *args],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _launch(tmp_path, include_workers: str) -> tuple[list[subprocess.Popen], str, str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out_dir = str(tmp_path / f"run_{include_workers}")
    rec_dir = tmp_path / f"rec_{include_workers}"
    rec_dir.mkdir()
    return _spawn(script, [out_dir, include_workers, str(rec_dir)]), out_dir, str(rec_dir)


def _wait(procs) -> list[dict]:
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_process_gloo_all_and_one(tmp_path):
    jobs = {iw: _launch(tmp_path, iw) for iw in ("all", "one")}  # both jobs run at once
    results = {iw: _wait(procs) for iw, (procs, _o, _r) in jobs.items()}

    for iw, res in results.items():
        assert [r["worker"] for r in res] == ["worker_0", "worker_1"]
        assert all(r["step"] == 3 and r["errors"] == 0 for r in res)
        assert [r["writes"] for r in res] == ([True, True] if iw == "all" else [True, False])

    # "all": every worker's data, bit-identical to what each rank saw
    _p, out_dir, rec_dir = jobs["all"]
    t = tp.create_trial(out_dir)
    assert t.workers() == ["worker_0", "worker_1"]
    assert t.steps() == [0, 1, 2, 3]
    w_name = "Sequential_0.weight"
    for rank in range(2):
        rec = np.load(os.path.join(rec_dir, f"rank{rank}.npz"))
        worker = f"worker_{rank}"
        for s in range(4):
            assert np.array_equal(t.tensor(w_name).value(s, worker=worker), rec[f"w{s}"])
            assert np.array_equal(t.tensor("CrossEntropyLoss_output_0").value(s, worker=worker), rec[f"loss{s}"])
            assert np.array_equal(t.tensor("gradient/" + w_name).value(s, worker=worker), rec[f"g{s}"])
    assert sorted(t.tensor(w_name).workers(1)) == ["worker_0", "worker_1"]

    # "one": only the chief wrote anything
    _p, out_dir, rec_dir = jobs["one"]
    t = tp.create_trial(out_dir)
    assert t.workers() == ["worker_0"]
    rec = np.load(os.path.join(rec_dir, "rank0.npz"))
    for s in range(4):
        assert np.array_equal(t.tensor(w_name).value(s), rec[f"w{s}"])
    assert not any("worker_1" in f for _d, _s, files in os.walk(out_dir) for f in files)


LATE_GROUP_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    import tensortap.pytorch as tp

    out_dir, rec_dir, interval, steps, group_at = sys.argv[1:3] + [int(a) for a in sys.argv[3:6]]
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 3))
    # Made before the process group exists: the worker's name comes from RANK in the environment.
    collections = ["gradients"] if interval == 1 else ["weights", "biases", "gradients", "losses"]
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=interval),
                   include_collections=collections, include_workers="all")
    hook.register_module(net)
    loss_fn = nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model = net
    gen = torch.Generator().manual_seed(100 + rank)
    rec = {}
    for step in range(steps):
        if step == group_at:  # the group and DDP come after some saving steps
            dist.init_process_group("gloo")
            model = nn.parallel.DistributedDataParallel(net)
        x, y = torch.randn(4, 64, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        opt.zero_grad()
        rec[f"w{step}"] = net[0].weight.detach().clone().numpy()
        out = model(x)
        loss_fn(out, y).backward()
        rec[f"g{step}"] = net[0].weight.grad.clone().numpy()
        opt.step()
    hook.close()
    np.savez(os.path.join(rec_dir, f"rank{rank}.npz"), **rec)
    print(json.dumps({"rank": rank, "worker": hook.worker, "errors": hook.error_count}))
    dist.barrier()  # (ranks leave the group together: gloo may abort a rank whose peer is gone)
    dist.destroy_process_group()
    """
)


def test_process_group_created_after_saving_steps_saves_the_reduced_gradients(tmp_path):
    """DDP averages the gradients in a callback at the end of the backward pass: once a process group exists
    (here only from the third step on) the hook reads them after it, so both ranks save the same averaged
    gradients, as each script saw them; before that, each rank's own."""
    script = tmp_path / "late.py"
    script.write_text(LATE_GROUP_WORKER)
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    res = _wait(_spawn(script, [str(tmp_path / "run"), str(rec_dir), "1", "4", "2"]))
    assert [r["worker"] for r in res] == ["worker_0", "worker_1"] and all(r["errors"] == 0 for r in res)
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.workers() == ["worker_0", "worker_1"] and t.steps() == [0, 1, 2, 3]
    name = "gradient/Sequential_0.weight"
    saved, seen = [], []
    for rank in range(2):
        rec = np.load(os.path.join(rec_dir, f"rank{rank}.npz"))
        saved.append([t.tensor(name).value(s, worker=f"worker_{rank}") for s in range(4)])
        seen.append([rec[f"g{s}"] for s in range(4)])
        for s in range(4):
            assert np.array_equal(saved[rank][s], seen[rank][s]), (rank, s)
    for s in (0, 1):  # each rank's own data, no group yet
        assert not np.array_equal(saved[0][s], saved[1][s])
    for s in (2, 3):  # averaged by DDP
        assert np.array_equal(saved[0][s], saved[1][s])


def test_repeated_saving_steps_read_gradients_after_the_reduction_of_a_group_made_later(tmp_path):
    """Saving every 2 steps, the process group and DDP come at step 8, after the hook's saving steps have settled
    into one message each: the saving steps after it read the gradients once DDP has averaged them, as the
    script saw them."""
    script = tmp_path / "late.py"
    script.write_text(LATE_GROUP_WORKER)
    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    res = _wait(_spawn(script, [str(tmp_path / "run"), str(rec_dir), "2", "16", "8"]))
    assert all(r["errors"] == 0 for r in res)
    saved_steps = list(range(0, 16, 2))
    t = tp.create_trial(str(tmp_path / "run"))
    assert t.workers() == ["worker_0", "worker_1"] and t.steps() == saved_steps
    saved = []
    for rank in range(2):
        rec = np.load(os.path.join(rec_dir, f"rank{rank}.npz"))
        w = f"worker_{rank}"
        saved.append([t.tensor("gradient/Sequential_0.weight").value(s, worker=w) for s in saved_steps])
        for i, s in enumerate(saved_steps):
            assert np.array_equal(saved[rank][i], rec[f"g{s}"]), (rank, s)
            assert np.array_equal(t.tensor("Sequential_0.weight").value(s, worker=w), rec[f"w{s}"]), (rank, s)
        assert sorted(t.tensor("CrossEntropyLoss_output_0").values(worker=w)) == saved_steps
    for i, s in enumerate(saved_steps):  # each rank's own gradients before the group, DDP's average after
        assert np.array_equal(saved[0][i], saved[1][i]) == (s >= 8), s


SPAWNED_WORKERS = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    import tensortap.pytorch as tp

    def work(rank, out_dir, include_workers, rec_dir, port, scalar_first):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 3))
        # Made before the process group, and no launcher variables: the rank is only an argument here.
        hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=1), include_workers=include_workers,
                       include_collections=["weights", "gradients"])
        before = (hook.rank, hook.worker)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        model = nn.parallel.DistributedDataParallel(net)
        hook.register_module(model)
        if scalar_first:  # the first step starts in the script's own call, not in a forward
            hook.save_scalar("started", 1.0)
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        rec = {}
        for step in range(3):
            x, y = torch.randn(4, 64, generator=gen), torch.randint(0, 3, (4,), generator=gen)
            rec[f"w{step}"] = net[0].weight.detach().clone().numpy()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            rec[f"g{step}"] = net[0].weight.grad.clone().numpy()
            opt.step()
        hook.close()
        np.savez(os.path.join(rec_dir, f"rank{rank}.npz"), **rec)
        with open(os.path.join(rec_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"before": before, "rank": hook.rank, "world_size": hook.world_size, "worker": hook.worker,
                       "writes": hook.writes, "errors": hook.error_count,
                       "first_error": None if hook.first_error is None else str(hook.first_error)}, f)
        dist.barrier()  # (ranks leave the group together: gloo may abort a rank whose peer is gone)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=tuple(sys.argv[1:4]) + (int(sys.argv[4]), sys.argv[5:] == ["scalar-first"]), nprocs=2)
    """
)


def _run_spawned(tmp_path, out_dir: str, include_workers: str, tag: str, *extra: str) -> tuple[list[dict], str]:
    """SPAWNED_WORKERS as a torch.multiprocessing.spawn job of two processes without launcher variables:
    each rank's summary and the folder of what each script saw."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_WORKERS)
    rec_dir = tmp_path / f"rec_{tag}"
    rec_dir.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                        "TENSORTAP_DISABLE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, str(script), out_dir, include_workers, str(rec_dir), str(_free_port()), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((rec_dir / f"rank{r}.json").read_text()) for r in range(2)], str(rec_dir)


@pytest.mark.parametrize("include_workers", ["all", "one"])
def test_hook_made_before_the_group_of_spawned_processes_takes_the_group_rank(tmp_path, include_workers):
    """torch.multiprocessing.spawn gives each process its rank as an argument (no RANK variable): a hook made
    before init_process_group takes the group's rank at the first step, so the two processes save as
    worker_0 and worker_1 (with "one" only worker_0) instead of both saving as worker_0."""
    out_dir = str(tmp_path / "run")
    res, rec_dir = _run_spawned(tmp_path, out_dir, include_workers, "job")
    assert [r["before"] for r in res] == [[0, "worker_0"], [0, "worker_0"]]  # (nothing to tell them apart yet)
    assert [(r["rank"], r["world_size"], r["worker"]) for r in res] == [(0, 2, "worker_0"), (1, 2, "worker_1")]
    assert [r["writes"] for r in res] == ([True, True] if include_workers == "all" else [True, False])
    assert all(r["errors"] == 0 for r in res)
    t = tp.create_trial(out_dir)
    workers = ["worker_0", "worker_1"] if include_workers == "all" else ["worker_0"]
    assert t.workers() == workers and t.steps() == [0, 1, 2]
    for rank, worker in enumerate(workers):
        rec = np.load(os.path.join(rec_dir, f"rank{rank}.npz"))
        name = "Sequential_0.weight"
        w, g = t.tensor(name), t.tensor("gradient/" + name)
        for s in range(3):
            assert np.array_equal(w.value(s, worker=worker), rec[f"w{s}"])
            assert np.array_equal(g.value(s, worker=worker), rec[f"g{s}"])


@pytest.mark.parametrize("first_step", ["forward", "scalar-first"])
def test_a_rank_found_late_does_not_write_over_an_earlier_jobs_data(tmp_path, first_step):
    """The constructor refuses an out_dir that already holds its worker's data; a hook that learns its rank
    at the first step checks again for its new name: rank 1 finds an earlier job's worker_1 there, turns
    itself off with that error, and its training goes on — whether the first step starts in the model's
    forward or in the script's own save_scalar; the earlier data stays as it was."""
    first = tmp_path / "first"
    _run_spawned(tmp_path, str(first), "all", "first")
    second = tmp_path / "second"
    shutil.copytree(first / "tensortap" / "worker_1", second / "tensortap" / "worker_1")
    before = tp.create_trial(str(second)).tensor("gradient/Sequential_0.weight").value(2)
    extra = () if first_step == "forward" else ("scalar-first",)
    res, _rec = _run_spawned(tmp_path, str(second), "all", "second", *extra)
    assert [(r["worker"], r["errors"]) for r in res] == [("worker_0", 0), ("worker_1", 1)]
    assert "worker_1" in res[1]["first_error"] and "new out_dir" in res[1]["first_error"]
    t = tp.create_trial(str(second))
    assert t.workers() == ["worker_0", "worker_1"]
    after = t.tensor("gradient/Sequential_0.weight").value(2, worker="worker_1")
    assert np.array_equal(after, before)
