"""CPU per step of the MXNet Gluon MLP around its saving steps, per tensortap checkout, alternated between checkouts.

Each checkout (a path to a tensortap tree with its C helpers built) trains the MLP of bench/mxnet_overhead.py
in its own child process, hooked, saving weights, biases, gradients and losses every 10 steps, and records each
step's CPU time: the training thread's (`time.thread_time()`) and the training process's (`time.process_time()`,
MXNet's engine thread included). It prints, per checkout, medians and quartiles by the step's offset from the
saving step (0 = the saving step, +1..+3 the steps after it, "quiet" the others) and "extra(0..3)": what steps
0..3 cost above four quiet steps. Without WAITALL=1, MXNet's engine runs behind the loop, so the process column
mixes steps; the thread column is the training thread's own work. Children run in alternating order per round.

    .venv-mxnet/bin/python bench/mxnet_saving_step.py PATH[,PATH...] [ROUNDS] [SAVING_STEPS]
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

def child(path: str, interval: int, nsave: int) -> None:
    sys.path.insert(0, path)
    import mxnet as mx
    from mxnet import autograd
    sys.path.insert(0, HERE)
    from mxnet_overhead import _build

    import tensortap
    import tensortap.mxnet as tm

    assert tensortap.__file__.startswith(path), tensortap.__file__
    net, loss_fn, trainer, x, y = _build(False)
    out = tempfile.mkdtemp(prefix="ttbench_mxsave_", dir=os.environ.get("TTBENCH_OUT_ROOT"))
    hook = tm.Hook(out_dir=out + "/run", save_config=tm.SaveConfig(save_interval=interval),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_block(net)
    hook.register_block(loss_fn)
    proc: list[float] = []
    thr: list[float] = []
    n = interval * nsave + 50
    for _ in range(n):
        c0 = time.process_time()
        t0 = time.thread_time()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        if os.environ.get("WAITALL"):
            mx.nd.waitall()
        proc.append(time.process_time() - c0)
        thr.append(time.thread_time() - t0)
    hook.close()
    shutil.rmtree(os.path.dirname(out + "/run"), ignore_errors=True)
    print(json.dumps({"proc": proc[50:], "thr": thr[50:]}))


def q(v: list[float]) -> str:
    v = sorted(v)
    n = len(v)
    return f"{statistics.median(v)*1e6:7.0f} [{v[n//4]*1e6:5.0f},{v[3*n//4]*1e6:5.0f}]"


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        sys.exit()
    trees = [os.path.abspath(p) for p in sys.argv[1].split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    nsave = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    interval = 10
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", MXNET_OMP_MAX_THREADS="1")
    res = {t: {k: [] for k in ("proc", "thr")} for t in trees}
    for r in range(rounds):
        for t in (trees if r % 2 == 0 else trees[::-1]):
            o = subprocess.run([sys.executable, __file__, "child", t, str(interval), str(nsave)], cwd=t,
                               env=env, capture_output=True, text=True)
            if o.returncode:
                print(o.stderr[-2000:])
                sys.exit(1)
            d = json.loads(o.stdout.strip().splitlines()[-1])
            for k in d:
                res[t][k].append(d[k])
    print("load", os.getloadavg())
    for k in ("proc", "thr"):
        print(f"== {k} CPU per step, us: median [q1,q3] by step offset from saving step")
        for t in trees:
            by = {}
            for run in res[t][k]:
                # (the first step is step 0, a saving step; the first 50 are dropped as warm-up)
                for i, v in enumerate(run):
                    by.setdefault((i + 50) % interval, []).append(v)
            quiet = [v for o in range(4, interval) for v in by[o]]
            ex = sum(statistics.median(by[o]) for o in range(4)) - 4 * statistics.median(quiet)
            print(f"{t:22s} extra(0..3) {ex * 1e6:6.0f}  save {q(by[0])}  +1 {q(by[1])}  +2 {q(by[2])}"
                  f"  +3 {q(by[3])}  quiet {q(quiet)}")
