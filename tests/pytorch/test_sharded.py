"""FSDP2 (`fully_shard`) and DTensor parameters (`distribute_module`) on CPU/gloo, one process and two, either
writer: training never crashes, and the trial's values are the full tensors the script reads
(`full_tensor()`), assembled from the workers' shards; the total gradient norm is `get_total_norm`'s."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import tensortap.pytorch as tp  # noqa: E402
from tensortap.exceptions import TensorUnavailableForStep  # noqa: E402

WORKER = Path(__file__).with_name("_sharded_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, world: int, writer: str, kind: str, include_workers: str = "all",
         device: str = "cpu") -> tuple[str, dict]:
    out, rec = str(tmp_path / "run"), str(tmp_path / "rec.npz")
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), OMP_NUM_THREADS="1", TT_TEST_DEVICE=device)
        env.pop("TENSORTAP_DISABLE", None)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), out, writer, kind, include_workers, rec],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    reports = []
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=600)
        (tmp_path / f"stderr_{rank}.txt").write_text(stderr)
        assert p.returncode == 0, f"worker died ({p.returncode}): {stderr[-3000:]}"
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(r["errors"] == 0 for r in reports), reports
    return out, dict(np.load(rec))


def _check(out: str, rec: dict) -> None:
    t = tp.create_trial(out)
    assert t.steps() == [0, 1, 2]
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for s in range(3):
        for n in names:
            w, g = t.tensor(f"Sequential_{n}").value(s), t.tensor(f"gradient/Sequential_{n}").value(s)
            assert w.shape == rec[f"w{s}/{n}"].shape and w.tobytes() == rec[f"w{s}/{n}"].tobytes(), (s, n)
            assert g.tobytes() == rec[f"g{s}/{n}"].tobytes(), (s, n)
            l2 = t.tensor(f"gradient/Sequential_{n}").reduction_value(s, "l2")
            assert np.isclose(l2, np.linalg.norm(rec[f"g{s}/{n}"].astype(np.float64)), rtol=1e-6)
        assert t.tensor("CrossEntropyLoss_output_0").value(s).tobytes() == rec[f"loss{s}"].tobytes()
        assert np.isclose(t.total_norm(s), float(rec[f"total{s}"]), rtol=1e-6)


@pytest.mark.parametrize("kind", ["fsdp", "dtensor"])
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_one_process(tmp_path, kind, writer):
    _check(*_run(tmp_path, 1, writer, kind))


@pytest.mark.parametrize("kind,writer", [("fsdp", "thread"), ("fsdp", "process"), ("dtensor", "thread")])
def test_two_processes_assemble_the_full_tensors(tmp_path, kind, writer):
    out, rec = _run(tmp_path, 2, writer, kind)
    _check(out, rec)
    t = tp.create_trial(out)
    # each worker saved its own shard: the first layer's weight (10 x 6) is split by rows
    w0 = t.tensor("Sequential_0.weight").value(0, worker="worker_0")
    w1 = t.tensor("Sequential_0.weight").value(0, worker="worker_1")
    assert w0.shape == (5, 6) and w1.shape == (5, 6)
    assert t.tensor("Sequential_0.weight").shape(0) == (10, 6)


def test_one_worker_with_shards_says_the_tensors_cannot_be_read_whole(tmp_path):
    """include_workers="one" under FSDP2: worker_0 alone saves, holding only its shards. Training goes on, the
    unsharded loss is saved whole, worker_0 says once why the sharded tensors cannot be read whole, and the trial
    refuses to pass a shard off as the tensor."""
    out, rec = _run(tmp_path, 2, "thread", "fsdp", "one")
    t = tp.create_trial(out)
    assert t.workers() == ["worker_0"]
    assert t.tensor("CrossEntropyLoss_output_0").value(0).tobytes() == rec["loss0"].tobytes()
    with pytest.raises(TensorUnavailableForStep):
        t.tensor("Sequential_0.weight").value(0)
    logs = (tmp_path / "stderr_0.txt").read_text()
    assert logs.count("include_workers='one' with sharded parameters") == 1, logs[-3000:]
