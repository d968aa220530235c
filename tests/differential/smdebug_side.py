"""The smdebug 1.0.34 side of the differential test; runs in the smdebug venv (`make smdebug-venv`), never in .venv.

It writes out_dirs with smdebug's own writers (its PyTorch hook and its FileWriter / CollectionManager, as a
distributed job's workers would) and answers questions (questions.py) with smdebug's own trial. It serves
JSON lines: one request on stdin, one answer on stdout (smdebug's own logging goes to stderr). No pickle.

    {"op": "write", "scenario": ..., "phase": n, "out": dir}   write phase n of a scenario into dir (or s3://)
    {"op": "open", "id": ..., "path": ..., "env": {...}}         create_trial (with env set), kept under id
    {"op": "ask", "id": ..., "q": {...}}                         questions.ask on trial id
    {"op": "wait_start", "id": ..., "step": s, "mode": m}        wait_for_steps([s], m) in a thread
    {"op": "wait_result", "timeout": t}                          the thread's result (or {"running": true})
    {"op": "quit"}
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

os.environ.setdefault("SMDEBUG_TRAINING_END_DELAY_REFRESH", "0")

import numpy as np  # noqa: E402
import questions  # noqa: E402
from smdebug.core.collection_manager import CollectionManager  # noqa: E402
from smdebug.core.modes import ModeKeys  # noqa: E402
from smdebug.core.writer import FileWriter  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

TF_DEVICE = "_job-worker_replica-0_task-0_device-GPU-0"  # a TF MirroredStrategy device, serialized (spec 1.2)


# ------------------------------------------------------------------------------------------ FileWriter jobs
def fw_step(out: str, step: int, worker: str, mode: str = "TRAIN", mode_step: int | None = None,
            scale: float = 1.0) -> None:
    """One step of one worker, as a framework hook writes it: a weight, its reductions, a loss."""
    rng = np.random.default_rng(step * 100 + len(worker))
    w = (rng.standard_normal((3, 2)) * scale).astype(np.float32)
    ms = step if mode_step is None else mode_step
    with FileWriter(trial_dir=out, step=step, worker=worker) as fw:
        fw.write_tensor(tdata=w, tname="dense.weight", mode=ModeKeys[mode], mode_step=ms)
        fw.write_tensor(tdata=np.array([float(np.abs(w).mean())], dtype=np.float32),
                        tname="smdebug/reductions/abs_mean/dense.weight", mode=ModeKeys[mode], mode_step=ms)
        fw.write_tensor(tdata=np.float32(step * 0.5 + 1), tname="loss_output_0", mode=ModeKeys[mode], mode_step=ms)
        if step % 2 == 0:
            fw.write_tensor(tdata=np.arange(4, dtype=np.int64) + step, tname="even.only",
                            mode=ModeKeys[mode], mode_step=ms)


def export_collections(out: str, worker: str, num_workers: int) -> None:
    cm = CollectionManager()
    cm.add("weights")
    cm.get("weights").include(".*weight")
    cm.add("losses")
    cm.get("losses").tensor_names = ["loss_output_0"]
    cm.add("default")
    cm.get("default").include("even.*")
    cm.set_num_workers(num_workers)
    cm.export(out, f"{worker}_collections.json")


def end_job(out: str) -> None:
    from smdebug.core.access_layer.utils import training_has_ended

    training_has_ended(out)


def dummy_step(out: str, step: int, worker: str, mode: str, mode_step: int) -> None:
    """An index file as smdebug's own test helper (tests/analysis/trials: dummy_step_creator) writes it: a
    tensor at start_idx 0, length 1, with an empty event file name (a step that carries only metadata)."""
    from smdebug.core.access_layer.file import TSAccessFile
    from smdebug.core.locations import IndexFileLocationUtils

    doc = {"meta": {"mode": mode, "mode_step": mode_step, "event_file_name": ""},
           "tensor_payload": [{"tensorname": "gradients/dummy:0", "start_idx": 0, "length": 1}]}
    key = IndexFileLocationUtils.get_index_key_for_step(out, step, worker)
    if out.startswith("s3://"):
        from smdebug.core.access_layer.s3 import TSAccessS3
        from smdebug.core.utils import is_s3

        _, bucket, k = is_s3(key)
        f = TSAccessS3(bucket, k)
        f.write(json.dumps(doc).encode())
    else:
        f = TSAccessFile(key, "w")
        f.write(json.dumps(doc))
    f.close()


def dummy_collections(out: str, num_workers: int) -> None:
    """Collection files as smdebug's test helper dummy_trial_creator writes them (one per worker), announcing
    `num_workers` (the helper leaves the default 1, which would make every step complete at once)."""
    cm = CollectionManager()
    cm.set_num_workers(num_workers)
    for i in range(num_workers):
        cm.export(out, f"worker_{i}_collections.json")


# ------------------------------------------------------------------------------------------ scenarios
def sc_workers(out: str, phase: int) -> None:
    """include_workers="all" with two workers writing at their own pace; TRAIN then EVAL; live, then ended."""
    if phase == 0:
        export_collections(out, "worker_0", 2)
        export_collections(out, "worker_1", 2)
        for s in range(4):
            fw_step(out, s, "worker_0")
        for s in range(2):
            fw_step(out, s, "worker_1")
    elif phase == 1:  # worker_1 catches up on 2, skips 3; both write EVAL steps 5, 6 (mode steps 0, 1)
        fw_step(out, 2, "worker_1")
        for w in ("worker_0", "worker_1"):
            fw_step(out, 5, w, "EVAL", 0)
        fw_step(out, 6, "worker_0", "EVAL", 1)
    elif phase == 2:
        fw_step(out, 6, "worker_1", "EVAL", 1)
        fw_step(out, 8, "worker_0", "TRAIN", 4)
    elif phase == 3:
        end_job(out)


def sc_other_name(out: str, phase: int) -> None:
    """Events written under the host name while the collection file names worker_0 (num_workers 1)."""
    if phase == 0:
        export_collections(out, "worker_0", 1)
        for s in range(3):
            fw_step(out, s, "algo-1")
    elif phase == 1:
        fw_step(out, 3, "algo-1", "EVAL", 0)
    elif phase == 2:
        end_job(out)


def sc_odd_names(out: str, phase: int) -> None:
    """Odd worker names: a serialized TF device and a dotted host name, GLOBAL mode; two workers."""
    if phase == 0:
        export_collections(out, TF_DEVICE, 2)
        export_collections(out, "host-1.example", 2)
        for s in (0, 3, 6):
            fw_step(out, s, TF_DEVICE, "GLOBAL")
        for s in (0, 3):
            fw_step(out, s, "host-1.example", "GLOBAL")
    elif phase == 1:
        fw_step(out, 6, "host-1.example", "GLOBAL")
        end_job(out)


def sc_dummy(out: str, phase: int) -> None:
    """smdebug's own has_passed_step scenarios (dummy steps): 2 workers, a lagging one, steps skipped."""
    if phase == 0:
        dummy_collections(out, 2)
        for s in (0, 1, 2, 4, 5):
            dummy_step(out, s, "worker_0", "TRAIN", s)
        for s in (0, 1, 4):
            dummy_step(out, s, "worker_1", "TRAIN", s)
        dummy_step(out, 6, "worker_0", "EVAL", 0)
    elif phase == 1:
        end_job(out)


def sc_window(out: str, phase: int) -> None:
    """A worker that stopped writing (worker_1 after step 0): smdebug's incomplete-step window moves on."""
    if phase == 0:
        export_collections(out, "worker_0", 2)
        export_collections(out, "worker_1", 2)
        fw_step(out, 0, "worker_1")
        for s in range(7):
            fw_step(out, s, "worker_0")


def sc_only_collections(out: str, phase: int) -> None:
    """A job that has exported its collections but not yet written its first step, then writes steps."""
    if phase == 0:
        export_collections(out, "worker_0", 1)
    elif phase == 1:
        for s in range(3):
            fw_step(out, s, "worker_0")
    elif phase == 2:
        fw_step(out, 3, "worker_0")
        end_job(out)


class HookJob:
    """A PyTorch job with smdebug's own hook: GLOBAL, TRAIN (every 2nd step saved), EVAL and PREDICT steps,
    weights with reductions and the raw value, biases as reductions only, gradients, losses, a scalar."""

    def __init__(self, out: str):
        import smdebug.pytorch as smd
        import torch
        import torch.nn as nn

        self.smd, self.torch = smd, torch
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        cfg = smd.SaveConfig(mode_save_configs={
            smd.modes.TRAIN: smd.SaveConfigMode(save_interval=2),
            smd.modes.EVAL: smd.SaveConfigMode(save_interval=1),
            smd.modes.PREDICT: smd.SaveConfigMode(save_interval=1),
            smd.modes.GLOBAL: smd.SaveConfigMode(save_interval=1),
        })
        self.hook = smd.Hook(out_dir=out, save_config=cfg,
                             include_collections=["weights", "biases", "gradients", "losses"])
        self.hook.get_collection("weights").reduction_config = smd.ReductionConfig(
            reductions=["min", "max", "mean"], abs_reductions=["mean"], norms=["l2"], save_raw_tensor=True)
        self.hook.get_collection("biases").reduction_config = smd.ReductionConfig(reductions=["max"])
        self.hook.register_module(self.model)
        self.hook.register_loss(self.loss_fn)
        self.x = torch.randn(16, 4)
        self.y = torch.randint(0, 2, (16,))

    def run(self, mode: str, n: int) -> None:
        torch = self.torch
        if mode != "GLOBAL":
            self.hook.set_mode(getattr(self.smd.modes, mode))
        for i in range(n):
            xb, yb = self.x[i % 12: i % 12 + 4], self.y[i % 12: i % 12 + 4]
            if mode in ("TRAIN", "GLOBAL"):
                self.model.train()
                self.opt.zero_grad()
                loss = self.loss_fn(self.model(xb), yb)
                loss.backward()
                self.opt.step()
                self.hook.save_scalar("lr", 0.1 / (i + 1))
            else:
                self.model.eval()
                with torch.no_grad():
                    self.loss_fn(self.model(xb), yb)


JOBS: dict[str, HookJob] = {}


def sc_hook(out: str, phase: int) -> None:
    """The PyTorch hook, tailed: 0 made (nothing on disk), 1 GLOBAL+TRAIN steps, 2 EVAL+PREDICT, 3 closed."""
    if phase == 0:
        JOBS[out] = HookJob(out)
    elif phase == 1:
        JOBS[out].run("GLOBAL", 2)
        JOBS[out].run("TRAIN", 5)
    elif phase == 2:
        JOBS[out].run("EVAL", 3)
        JOBS[out].run("PREDICT", 2)
    elif phase == 3:
        JOBS.pop(out).hook.close()


SCENARIOS = {
    "workers": sc_workers,
    "other_name": sc_other_name,
    "odd_names": sc_odd_names,
    "dummy": sc_dummy,
    "only_collections": sc_only_collections,
    "window": sc_window,
    "hook": sc_hook,
}


def distributed_rank(rank: int, port: int, out_one: str, out_all: str) -> None:
    """One rank of a two-process torch.distributed (gloo) job with two smdebug hooks: include_workers "one"
    into out_one and "all" into out_all."""
    import smdebug.pytorch as smd
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    hooks = []
    for out, inc in ((out_one, "one"), (out_all, "all")):
        model = nn.Linear(3, 2)
        loss_fn = nn.MSELoss()
        hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=2),
                        include_collections=["weights", "losses"], include_workers=inc)
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.set_mode(smd.modes.TRAIN)
        hooks.append((hook, model, loss_fn))
    for _ in range(5):
        for _hook, model, loss_fn in hooks:
            loss_fn(model(torch.randn(2, 3)), torch.zeros(2, 2)).backward()
    for hook, _m, _l in hooks:
        hook.close()
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ server
def serve() -> None:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything smdebug prints goes to stderr, never into the answers
    trials: dict[str, object] = {}
    waiter: dict[str, object] = {}

    def reply(obj: object) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "quit":
                reply({"ok": True})
                return
            if op == "write":
                SCENARIOS[req["scenario"]](req["out"], req["phase"])
                reply({"ok": True})
            elif op == "open":
                saved = {k: os.environ.get(k) for k in req.get("env", {})}
                os.environ.update(req.get("env", {}))  # read by smdebug's Trial constructor
                try:
                    trials[req["id"]] = create_trial(req["path"])
                    reply({"ok": True})
                except Exception as e:  # noqa: BLE001 - the exception class is the answer
                    reply({"error": type(e).__name__})
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
            elif op == "ask":
                reply({"ok": questions.ask(trials[req["id"]], ModeKeys, req["q"])})
            elif op == "wait_start":
                t = trials[req["id"]]
                res: dict[str, object] = {}

                def run(t=t, res=res, step=req["step"], mode=req["mode"]) -> None:
                    try:
                        t.wait_for_steps([step], ModeKeys[mode])
                        res["ok"] = None
                    except Exception as e:  # noqa: BLE001
                        res["error"] = type(e).__name__

                th = threading.Thread(target=run, daemon=True)
                th.start()
                waiter.update(thread=th, res=res)
                reply({"ok": True})
            elif op == "wait_result":
                th = waiter["thread"]
                th.join(req.get("timeout", 0))
                reply({"running": True} if th.is_alive() else waiter["res"])
            else:
                reply({"fail": f"unknown op {op!r}"})
        except Exception:  # noqa: BLE001 - a failure of the harness itself, shown by the test
            reply({"fail": traceback.format_exc()})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        distributed_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        serve()
