"""Training-step overhead of the MXNet Gluon hook: tensortap vs smdebug 1.0.34 vs no hook.

Workload: a Gluon MLP 64->256->256->10 (Dense with activation='relu', batch 64, SGD with momentum), MXNet
1.9.1 on one CPU thread (OMP_NUM_THREADS=1, MXNET_CPU_WORKER_NTHREADS=1), collections
weights+biases+gradients+losses (or `--collections`), saved every 1, 10 or 100 steps (`--intervals`), not
hybridized (`--hybridize` for a hybridized model). By default the loop never reads a value back, so MXNet's
engine runs far behind it; `--sync-every N` makes the loop read its loss every N steps (logging, a metric), as
most jobs do. A hook must wait for the engine once per saving step (the gradients are only known when the
backward has run): without other reads in the loop that one wait is part of what it costs.

Every measurement is a child process that trains one model in alternating blocks of `--steps` steps (default
100) with the hook's block hooks switched on and off (the library never notices; its writer keeps running),
and reports the median over pairs of blocks of hooked/plain step time. Each block ends with mx.nd.waitall()
(MXNet's engine is asynchronous: what a step costs is only known once its work is done), and a hooked
tensortap block also waits until its writer has caught up (its drain()), so work that did not overlap
training counts against the hook. The driver alternates libraries and intervals over `--rounds` rounds in one
run and prints the median of the rounds' ratios. The library `none` is the A/A control: both blocks plain,
the noise floor of the machine. Three more are floors, no hook in them: `read`, the hooked blocks read the
loss once per saving interval (`loss.asnumpy()`: one wait for MXNet's engine); `wait`, they wait once per
saving interval for that step's gradients before the next step begins (what any hook that saves a step's
gradients before the step is marked done must wait for); `copy`, they also read every gradient and weight
to the host once per saving interval (`asnumpy()`), nothing written: the bare cost of getting those bytes.

Step time on a shared, loaded machine swings by more than the effects measured, so each child also reports
the CPU-time ratio: CPU seconds of all the training process's threads (MXNet's engine included) plus those of
tensortap's writer process, hooked blocks over plain ones, summed over all pairs. It is what the hook costs
the machine, and close to what it costs the step time on a machine with a core to spare.

tensortap (and `none`) run in the driver's Python, which needs MXNet 1.9.1 (numpy<1.24): `.venv-mxnet`, built
by `make test-mxnet`. smdebug runs in its own venv (SMDEBUG_MX_PYTHON, default bench/_out/venv-smdebug/bin/python,
gitignored):
    python3 -m venv bench/_out/venv-smdebug
    bench/_out/venv-smdebug/bin/pip install mxnet==1.9.1 "numpy<1.24" smdebug==1.0.34 "pandas<2.1" psutil
It is skipped with a message when absent.

    .venv-mxnet/bin/python bench/mxnet_overhead.py [--rounds 3] [--libs none,tensortap,smdebug]

`tensortap@PATH` (any tensortap library name, e.g. `tensortap-thread@PATH`) runs that library with the tensortap
package of another checkout at PATH (e.g. a `git worktree` of an older commit): alternating A/B runs of two
versions of the hook in one run.

TTBENCH_DRY_RUN=1 makes the tensortap hooks dry runs (everything captured and read, nothing handed to a writer).
`tensortap` is the default writer (writer="auto": the writer process on x86-64 Linux); `tensortap-thread` and
`tensortap-process` choose one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SMDEBUG_PYTHON = os.path.join(HERE, "_out", "venv-smdebug", "bin", "python")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "MXNET_OMP_MAX_THREADS": "1"}


def _build(hybridize: bool):
    import mxnet as mx
    import numpy as np
    from mxnet import gluon

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    rs = np.random.RandomState(0)
    x = mx.nd.array(rs.randn(64, 64).astype(np.float32))
    y = mx.nd.array(rs.randint(0, 10, 64))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9})
    return net, loss_fn, trainer, x, y


class _HookSwitch:
    """Turns every forward (pre-)hook of the given blocks off and on again, in place: plain blocks of steps run
    the very same model and trainer as hooked ones (two separately built models differ in speed by more than
    the effects measured here)."""

    _ATTRS = ("_forward_pre_hooks", "_forward_hooks")

    def __init__(self, roots) -> None:
        self.blocks = []
        stack = list(roots)
        while stack:
            b = stack.pop()
            self.blocks.append(b)
            stack.extend(b._children.values())
        self.saved: list = []

    def off(self) -> None:
        for b in self.blocks:
            for a in self._ATTRS:
                d = getattr(b, a)
                if d:
                    self.saved.append((d, dict(d)))
                    d.clear()

    def on(self) -> None:
        for d, content in self.saved:
            d.update(content)
        self.saved.clear()


def _drain(hook) -> None:
    """Wait until tensortap's writer has handled everything handed to it (not a flush: a job flushes every
    flush_interval, 0.5 s, not every block of steps)."""
    w = getattr(hook, "_writer", None)
    if w is not None and hasattr(w, "drain"):
        w.drain()
    else:
        hook.flush()


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far (Linux /proc; clock-tick resolution)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def child(lib: str, interval: int, pairs: int, steps: int, collections: list[str], hybridize: bool,
          sync_every: int = 0) -> dict:
    import mxnet as mx
    from mxnet import autograd

    net, loss_fn, trainer, x, y = _build(hybridize)
    out_dir = os.path.join(tempfile.mkdtemp(prefix=f"ttbench_mx_{lib}_", dir=os.environ.get("TTBENCH_OUT_ROOT")),
                           "run")
    hook = None
    if lib == "smdebug":
        import smdebug.mxnet as smd

        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=interval),
                        include_collections=collections)
    elif lib.startswith("tensortap"):
        import tensortap.mxnet as tm

        writer = lib.split("-", 1)[1] if "-" in lib else "auto"
        hook = tm.Hook(out_dir=out_dir, save_config=tm.SaveConfig(save_interval=interval),
                       include_collections=collections, writer=writer,
                       dry_run=bool(os.environ.get("TTBENCH_DRY_RUN")))
    if hook is not None:
        hook.register_block(net)
        hook.register_block(loss_fn)
    switch = _HookSwitch([net, loss_fn])
    grads: list = []  # (for `wait` and `copy`, once the first forward has initialised the parameters)
    weights: list = []
    batch = x.shape[0]

    def writer_cpu() -> float:
        proc = getattr(getattr(hook, "_writer", None), "_proc", None)  # (tensortap's writer process, if any)
        return _proc_cpu(proc.pid) if proc is not None else 0.0

    def run(hooked: bool, n: int, role: int = 0) -> tuple[float, float]:
        if hooked:
            switch.on()
        else:
            switch.off()
        c0, w0 = time.process_time(), writer_cpu()
        t0_thread = time.thread_time()
        t0 = time.perf_counter()
        for i in range(n):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(batch)
            if sync_every and i % sync_every == 0:
                loss.asnumpy()  # (the job reads its loss: logging, a metric)
            if hooked and lib == "read" and i % interval == 0:
                loss.asnumpy()  # (one wait for MXNet's engine per saving interval, nothing saved)
            if hooked and lib == "wait" and i % interval == 0:
                for g in grads:  # (the floor: this step's gradients waited for before the next step begins)
                    g.wait_to_read()
            if hooked and lib == "copy" and i % interval == 0:
                for a in grads + weights:  # (... and the bare reads of gradients and weights, nothing written)
                    a.asnumpy()
        mx.nd.waitall()
        if hooked and lib.startswith("tensortap"):
            _drain(hook)
        wall = (time.perf_counter() - t0) / n * 1e6
        thread_cpu[role] += time.thread_time() - t0_thread
        process_cpu[role] += time.process_time() - c0
        writer[role] += writer_cpu() - w0
        return wall, (time.process_time() - c0 + writer_cpu() - w0) / n * 1e6

    # (plain, hooked) seconds: the training thread, the training process (MXNet's engine included), the writer
    thread_cpu, process_cpu, writer = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    run(True, steps)
    run(False, steps)
    thread_cpu[:], process_cpu[:], writer[:] = [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    grads[:] = [p.grad() for p in net.collect_params().values()]
    weights[:] = [p.data() for p in net.collect_params().values()]
    ratios, plain_us, hooked_us, cpu_h, cpu_p = [], [], [], 0.0, 0.0
    for _ in range(pairs):
        h, hc = run(lib not in ("none",), steps, role=1)
        p, pc = run(False, steps, role=0)
        ratios.append(h / p)
        plain_us.append(p)
        hooked_us.append(h)
        cpu_h += hc
        cpu_p += pc
    switch.on()
    if hook is not None:
        if lib == "smdebug":
            hook._cleanup()
        else:
            hook.close()
            assert hook.error_count == 0, hook.first_error
    shutil.rmtree(os.path.dirname(out_dir), ignore_errors=True)
    return {"lib": lib, "interval": interval, "ratio": statistics.median(ratios), "ratios": ratios,
            "cpu_ratio": cpu_h / cpu_p,
            # extra CPU per hooked step: the training thread (the hook's own work), the writer process
            "thread_us": (thread_cpu[1] - thread_cpu[0]) / (pairs * steps) * 1e6,
            "writer_us": (writer[1] - writer[0]) / (pairs * steps) * 1e6,
            "plain_us": statistics.median(plain_us), "hooked_us": statistics.median(hooked_us),
            # absolute CPU per step of each kind of block: the training process, the writer process
            "abs": {role: {"process_us": process_cpu[i] / (pairs * steps) * 1e6,
                           "thread_us": thread_cpu[i] / (pairs * steps) * 1e6,
                           "writer_us": writer[i] / (pairs * steps) * 1e6}
                    for i, role in enumerate(("plain", "hooked"))}}


def _spawn(python: str, lib: str, interval: int, args) -> dict | None:
    lib, _at, tree = lib.partition("@")
    cmd = [python, os.path.abspath(__file__), "--child", lib, "--interval", str(interval),
           "--pairs", str(args.pairs * (3 if interval >= 100 else 1)), "--steps", str(args.steps),
           "--collections", args.collections, "--sync-every", str(args.sync_every)] + (
        ["--hybridize"] if args.hybridize else [])
    env = dict(os.environ, **THREAD_ENV)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)  # (tensortap of another checkout)
    env.setdefault("PYTHONPATH", os.path.dirname(HERE))  # (tensortap from this checkout if not installed)
    # (in the checkout measured: the writer process, `python -c`, imports the tensortap of its working directory
    # when that holds one, whatever PYTHONPATH says, in a tensortap without `-P`)
    cwd = os.path.abspath(tree) if tree else os.path.dirname(HERE)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=cwd)
    if res.returncode != 0:
        print(f"  {lib} every {interval}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if tree:
        out["lib"] = f"{lib}@{tree}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=10, help="pairs of blocks per child (x3 at every 100)")
    ap.add_argument("--steps", type=int, default=100, help="steps per block")
    ap.add_argument("--intervals", default="1,10,100")
    ap.add_argument("--libs", default="none,tensortap,smdebug")
    ap.add_argument("--collections", default="weights,biases,gradients,losses")
    ap.add_argument("--hybridize", action="store_true")
    ap.add_argument("--sync-every", type=int, default=0,
                    help="the training loop reads its loss (loss.asnumpy()) every N steps; 0: never")
    ap.add_argument("--absolute", action="store_true",
                    help="also print each child's absolute CPU per step of its plain and its hooked blocks")
    ap.add_argument("--child")
    ap.add_argument("--interval", type=int)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.interval, args.pairs, args.steps, args.collections.split(","),
                               args.hybridize, args.sync_every)))
        return
    smd_python = os.environ.get("SMDEBUG_MX_PYTHON", DEFAULT_SMDEBUG_PYTHON)
    libs = args.libs.split(",")
    if "smdebug" in libs and not os.path.exists(smd_python):
        print(f"smdebug skipped: no venv at {smd_python} (see this script's docstring)", file=sys.stderr)
        libs.remove("smdebug")
    intervals = [int(i) for i in args.intervals.split(",")]
    results: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for interval in intervals:
            for lib in libs:
                python = smd_python if lib == "smdebug" else sys.executable
                res = _spawn(python, lib, interval, args)
                if res is not None:
                    results.setdefault((lib, interval), []).append(res)
                    print(f"round {r + 1} {lib:>9} every {interval:>3}: x{res['ratio']:.3f} "
                          f"cpu x{res['cpu_ratio']:.3f} (+{res['thread_us']:.0f} us training thread, "
                          f"+{res['writer_us']:.0f} us writer per step) "
                          f"(plain {res['plain_us']:.0f} us, hooked {res['hooked_us']:.0f} us)", flush=True)
                    if args.absolute:
                        ab = res["abs"]
                        print("    CPU us/step, plain / hooked blocks: training process "
                              f"{ab['plain']['process_us']:.0f} / {ab['hooked']['process_us']:.0f}, training thread "
                              f"{ab['plain']['thread_us']:.0f} / {ab['hooked']['thread_us']:.0f}, writer process "
                              f"{ab['plain']['writer_us']:.0f} / {ab['hooked']['writer_us']:.0f}", flush=True)
    import mxnet
    import numpy

    print(f"\nmxnet {mxnet.__version__}, numpy {numpy.__version__}, {args.rounds} rounds, blocks of {args.steps} "
          f"steps, collections {args.collections}{', hybridized' if args.hybridize else ''}"
          f"{f', the loop reads its loss every {args.sync_every} steps' if args.sync_every else ''}")
    print("| interval | lib | step time ratio | rounds (min-max) | CPU ratio | rounds (min-max) | plain us/step "
          "| hooked us/step | + training-thread CPU us/step | + writer CPU us/step |")
    print("|---:|---|---:|---|---:|---|---:|---:|---:|---:|")
    for interval in intervals:
        for lib in libs:
            rs = results.get((lib, interval), [])
            if not rs:
                continue
            ratios = [x["ratio"] for x in rs]
            cpu = [x["cpu_ratio"] for x in rs]
            print(f"| {interval} | {lib} | x{statistics.median(ratios):.3f} | {min(ratios):.3f}-{max(ratios):.3f} | "
                  f"x{statistics.median(cpu):.3f} | {min(cpu):.3f}-{max(cpu):.3f} | "
                  f"{statistics.median(x['plain_us'] for x in rs):.0f} | "
                  f"{statistics.median(x['hooked_us'] for x in rs):.0f} | "
                  f"{statistics.median(x['thread_us'] for x in rs):.0f} | "
                  f"{statistics.median(x['writer_us'] for x in rs):.0f} |")


if __name__ == "__main__":
    main()
