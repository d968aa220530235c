"""Training-step overhead of the PyTorch hook: tensortap vs smdebug 1.0.34 vs no hook.

Workloads: an MLP 64->256->256->10 (batch 64, SGD), a small CNN (batch 32, 3x32x32) and a 4-layer transformer
encoder (`--models transformer`: d_model 64, 4 heads, batch 16 x 32 tokens), one CPU thread,
collections weights+biases+gradients+losses (or `--collections`), saved every 1, 10, 100 steps or never.

Every measurement is a child process that trains one model in alternating blocks of steps with the
hook's module and parameter hooks switched on and off (the library keeps running and never notices), and
reports the median over pairs of blocks of hooked/plain step time. A hooked block is charged until
tensortap's writer has caught up. A block is 100 steps: at every 100 that is one save interval, and the
catch-up at the block's end (which a long training run pays once) is charged to its one saving step, which
is conservative. Longer blocks let this VM's slow drifts in speed (about ±1% over a second) into the
ratios: with 1000-step blocks the A/A control at every 100 spread ×0.948–1.028 over 30 rounds, with 100-step
blocks ×0.993–1.004 over 15. Every 100 runs three times as many pairs, to see as many saving steps per run as every
10 does in ten; `--steps N` fixes the length of every block. The driver alternates
configurations over several rounds and prints the median ratio. The library `none` is the A/A control:
both blocks plain, which shows the noise floor of the machine. smdebug runs in its own venv
(SMDEBUG_PYTHON, default /work/smdebug-venv/bin/python): `pip install torch==2.13.0 smdebug==1.0.34
"numpy<2" "pandas<3" requests psutil`; it is skipped with a message when absent. `tensortap` is the
default (writer="auto": the writer process on x86-64 Linux); `--writer thread,process` measures
`tensortap-thread` (writer thread in the training process) and `tensortap-process` (writer process fed
through shared memory) side by side.

    .venv/bin/python bench/pytorch_overhead.py [--rounds 3] [--models mlp,cnn] [--libs tensortap,smdebug]
    .venv/bin/python bench/pytorch_overhead.py --models mlp --libs none,tensortap --writer thread,process
    .venv/bin/python bench/pytorch_overhead.py --models mlp --libs tensortap,tensortap-tb --intervals 10

`tensortap@PATH` (any tensortap library name, e.g. `tensortap-thread@PATH`) runs that library with the tensortap
of the checkout at PATH (imported from there, run from there): before/after comparisons in one run.

`tensortap-tb` is the default hook with `export_tensorboard=True` (issue #24: the export costs the step nothing).
`tensortap-flight` is a hook with its flight recorder on (statistics of every weight, gradient and module output at
every step, docs/pytorch.md), `tensortap-flight-full` the same with `statistics="full"`,
`tensortap-flight-parameterized` / `tensortap-flight-nooutputs` with `outputs="parameterized"` / `"none"`, and
`tensortap-noflight` the same hook with the recorder off, measured the same way (its global optimizer hooks
switched off in the plain blocks too: what the hook itself costs, beside the recorder's share); with
`--intervals never` nothing else is saved. `anomaly` is `torch.autograd.set_detect_anomaly(True)` in the hooked
blocks (no hook). `floor` is the least work of the same kind, no hook: one `torch._foreach_norm` over the weights
and gradients in a global optimizer pre-hook and one host transfer; `floor-outputs` adds a forward hook on every
module that takes its output's norm (`vector_norm(...).item()`):

    .venv/bin/python bench/pytorch_overhead.py --models mlp,cnn,transformer --intervals never \
        --libs none,tensortap-flight,anomaly
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
from collections import OrderedDict

INTERVALS = ("1", "10", "100", "never")
# What the hooks save (`--collections`; children get it through the environment).
COLLECTIONS = os.environ.get("TTBENCH_COLLECTIONS", "weights,biases,gradients,losses").split(",")
HERE = os.path.dirname(os.path.abspath(__file__))
#: the flight recorder's `outputs` setting of each tensortap-flight configuration (default "all")
FLIGHT_OUTPUTS = {"tensortap-flight-parameterized": "parameterized", "tensortap-flight-nooutputs": "none"}
DEFAULT_SMDEBUG_PYTHON = "/work/smdebug-venv/bin/python"


def _build(model_name: str):
    import torch
    from torch import nn

    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    elif model_name == "transformer":
        # a 4-layer transformer encoder (d_model 64, 4 heads), sequences of 32 tokens, a classifier on the mean
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False),
                              _MeanOverTokens(), nn.Linear(64, 10))
        x, y = torch.randn(16, 32, 64), torch.randint(0, 10, (16,))
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
        )
        x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), nn.CrossEntropyLoss(), x, y


class _MeanOverTokens:
    """nn.Module taking the mean over the token axis (built lazily: torch is imported in children only)."""

    def __new__(cls):
        from torch import nn

        class MeanOverTokens(nn.Module):
            def forward(self, x):
                return x.mean(dim=1)

        return MeanOverTokens()


def _hooked_mlp(interval: int, out_dir: str, **hook_kwargs):
    """The MLP workload with a tensortap hook saving COLLECTIONS every `interval` steps (1 thread, seeded):
    (model, optimizer, loss module, x, y, hook). For the phase and A/B scripts."""
    import torch

    import tensortap.pytorch as tp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, opt, loss_fn, x, y = _build("mlp")
    hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=interval),
                   include_collections=COLLECTIONS, **hook_kwargs)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    return model, opt, loss_fn, x, y, hook


class _HookSwitch:
    """Turns every module and parameter hook of a model off and on again, in place.

    Plain blocks run the very same model and optimizer as hooked blocks with the hooks' dicts emptied
    (the library never notices; its writer keeps running). Two separately built models differ by up to
    ±9% in step time on this VM from memory placement alone, which hides the effects we measure.
    """

    _MODULE = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    _PARAM = ("_backward_hooks", "_post_accumulate_grad_hooks")

    def __init__(self, roots):
        from torch.optim import optimizer as o

        self.modules = [m for r in roots for m in r.modules()]
        self.params = [p for r in roots for p in r.parameters()]
        self.saved: list = []
        self.swapped: list = []
        # (tensortap follows the optimizer's step, and the floor computes, in global optimizer step hooks: off too)
        self.globals = [o._global_optimizer_pre_hooks, o._global_optimizer_post_hooks]

    def off(self) -> None:
        for objs, attrs in ((self.modules, self._MODULE), (self.params, self._PARAM)):
            for o in objs:
                for a in attrs:
                    d = getattr(o, a, None)
                    if d is not None and type(d) not in (dict, OrderedDict):
                        # a dict that does work of its own (tensortap's step counter, holding the hook's
                        # pre-hook): swapped out whole for an empty one
                        self.swapped.append((o, a, d))
                        setattr(o, a, OrderedDict())
                    elif d:
                        self.saved.append((d, dict(d)))
                        d.clear()
        for d in self.globals:
            if d:
                self.saved.append((d, dict(d)))
                d.clear()

    def on(self) -> None:
        for d, content in self.saved:
            d.update(content)
        self.saved.clear()
        for o, a, d in self.swapped:
            setattr(o, a, d)
        self.swapped.clear()


def _drain(hook) -> None:
    w = getattr(hook, "_writer", None)
    if w is not None and hasattr(w, "drain"):
        w.drain()


def _pin(cpu: int, hook) -> None:
    """The training thread on `cpu`, tensortap's writer process (if any) on the other CPUs."""
    others = os.sched_getaffinity(0) - {cpu}
    os.sched_setaffinity(0, {cpu})
    proc = getattr(getattr(hook, "_writer", None), "_proc", None)
    if proc is not None and others:
        os.sched_setaffinity(proc.pid, others)


def _current_cpu() -> int | None:
    """The CPU this thread last ran on (Linux: field 39 of /proc/thread-self/stat; Python has no sched_getcpu)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def child(lib: str, interval: str, model_name: str, pairs: int, steps: int) -> dict:
    """Alternate blocks of `steps` steps with the hook on and off on one model; per-pair step-time ratios.

    A hooked block is charged until its writer has caught up (tensortap), so writer work that did
    not overlap training counts against the hook and never slows the next plain block down.
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, opt, loss_fn, x, y = _build(model_name)
    out_dir = os.path.join(tempfile.mkdtemp(prefix=f"ttbench_{lib}_", dir=os.environ.get("TTBENCH_OUT_ROOT")), "run")
    if interval == "never":
        cfg_kwargs = dict(start_step=0, end_step=0)
    else:
        cfg_kwargs = dict(save_interval=int(interval))
    hook = None
    if lib == "smdebug":
        import smdebug.pytorch as smd

        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(**cfg_kwargs), include_collections=COLLECTIONS)
    elif lib not in ("none", "anomaly") and not lib.startswith("floor"):
        import tensortap.pytorch as tp

        export = lib == "tensortap-tb"  # the same hook exporting TensorBoard event files (written by the writer)
        flight = lib.startswith("tensortap-flight")
        writer = lib.split("-", 1)[1] if "-" in lib and not export and not flight and lib != "tensortap-noflight" \
            else "auto"
        kw = {}
        if flight:
            from tensortap.capture.flight import FlightConfig

            kw["flight_recorder"] = FlightConfig(statistics="full" if lib.endswith("-full") else "norms",
                                                 outputs=FLIGHT_OUTPUTS.get(lib, "all"))
        hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(**cfg_kwargs), include_collections=COLLECTIONS,
                       writer=writer, export_tensorboard=export, **kw)
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
    if lib.startswith("floor"):
        _floor(model, loss_fn, outputs=lib == "floor-outputs")
    switch = _HookSwitch([model, loss_fn])
    anomaly = lib == "anomaly"  # hooked blocks: torch's anomaly mode, no hook
    on_cpu: dict[int, int] = {}  # the CPU the training thread ran on at the end of each block

    def run(hooked: bool, n: int) -> tuple[float, float]:
        if hooked:
            switch.on()
        else:
            switch.off()
        if anomaly:
            torch.autograd.set_detect_anomaly(hooked)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if hooked:
            _drain(hook)
        took = (time.perf_counter() - t0) / n * 1e6, (time.thread_time() - c0) / n * 1e6
        cpu_now = _current_cpu()
        if cpu_now is not None:
            on_cpu[cpu_now] = on_cpu.get(cpu_now, 0) + 1
        return took

    run(True, steps)
    run(False, steps)
    if os.environ.get("TTBENCH_PIN"):  # (after the first hooked block: the writer process exists)
        _pin(int(os.environ["TTBENCH_PIN"]), hook)
    on_cpu.clear()  # (count the measured blocks only)
    wall, cpu, plain_w, hooked_w = [], [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            h, p = run(True, steps), run(False, steps)
        else:
            p, h = run(False, steps), run(True, steps)
        wall.append(h[0] / p[0])
        cpu.append(h[1] / p[1])
        plain_w.append(p[0])
        hooked_w.append(h[0])
    switch.on()
    if hook is not None:
        hook.close()
    shutil.rmtree(os.path.dirname(out_dir), ignore_errors=True)
    # ratio: step time; cpu_ratio: CPU time of the training thread alone (robust to other load on the
    # machine, blind to work done by a writer thread or process on another core)
    return {"lib": lib, "interval": interval, "model": model_name, "plain_us": statistics.median(plain_w),
            "hooked_us": statistics.median(hooked_w), "ratio": statistics.median(wall),
            "cpu_ratio": statistics.median(cpu), "out_root": os.path.dirname(out_dir),
            "on_cpu": {str(c): n / sum(on_cpu.values()) for c, n in sorted(on_cpu.items())}}


def _floor(model, loss_fn, outputs: bool) -> None:
    """The least work of the flight recorder's kind: the norms of all weights and gradients in one foreach pass
    and one host transfer at the optimizer's step; with `outputs`, each module output's norm in a forward hook."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    params = list(model.parameters())

    def norms(optimizer, args, kwargs):
        ts = [p.detach() for p in params] + [p.grad.detach() for p in params]
        torch.stack(torch._foreach_norm(ts)).numpy()

    register_optimizer_step_pre_hook(norms)
    if outputs:
        def out_norm(module, args, output):
            for t in (output,) if isinstance(output, torch.Tensor) else output:
                if isinstance(t, torch.Tensor):
                    torch.linalg.vector_norm(t.detach()).item()

        for m in [*model.modules(), loss_fn]:
            m.register_forward_hook(out_norm)


def _run_child(python: str, lib: str, interval: str, model: str, pairs: int, steps: int) -> dict | None:
    lib, _at, tree = lib.partition("@")  # `tensortap@PATH`: the tensortap of another checkout, run from there
    tree = os.path.abspath(tree) if tree else os.path.dirname(HERE)
    cmd = [python, os.path.abspath(__file__), "--child", lib, interval, model, str(pairs), str(steps)]
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("TENSORTAP_DISABLE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=tree)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            res = json.loads(line)
            shutil.rmtree(res["out_root"], ignore_errors=True)  # smdebug may write its end marker at exit
            return res
    print(f"  [{lib} {interval} {model}] failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return None


def _placement(res: dict) -> str:
    """Where the training thread ran (on a VM the CPU that takes the disk's interrupts is slower to train on
    while a writer writes): e.g. " on CPU 1 (97%)"."""
    shares = res.get("on_cpu") or {}
    if not shares:
        return ""
    cpu, share = max(shares.items(), key=lambda kv: kv[1])
    return f" on CPU {cpu} ({share:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=30,
                    help="pairs of blocks (hooked, plain) per child run (every 100: three times as many)")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per block (a multiple of every interval); default: 100")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--libs", default="tensortap,smdebug")
    ap.add_argument("--writer", default="auto",
                    help="tensortap writers to measure, alternating: auto (the default), thread, process, "
                         "or a list such as thread,process")
    ap.add_argument("--intervals", default=",".join(INTERVALS))
    ap.add_argument("--collections", default=",".join(COLLECTIONS),
                    help="collections the hooks save (default: %(default)s; e.g. losses, tensortap's default)")
    ap.add_argument("--pin", type=int, metavar="CPU",
                    help="run the training thread on this CPU and tensortap's writer process on the others: "
                         "less variance between runs for A/B comparisons (where the scheduler puts the "
                         "training thread moves every 10 by up to 2%% here); not what an unpinned job sees")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--out-root", help="where the hooks write (default: the system temp dir); e.g. /dev/shm to "
                    "measure the hooks without the disk")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        lib, interval, model, pairs, steps = args.child
        print(json.dumps(child(lib, interval, model, int(pairs), int(steps))))
        return

    if args.out_root:
        os.environ["TTBENCH_OUT_ROOT"] = args.out_root
    os.environ["TTBENCH_COLLECTIONS"] = args.collections
    if args.pin is not None:
        if not hasattr(os, "sched_setaffinity") or args.pin not in os.sched_getaffinity(0):
            ap.error(f"--pin {args.pin}: not a CPU this process may run on "
                     f"({sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else 'no affinity'})")
        os.environ["TTBENCH_PIN"] = str(args.pin)
    smdebug_python = os.environ.get("SMDEBUG_PYTHON", DEFAULT_SMDEBUG_PYTHON)
    libs = [s for s in args.libs.split(",") if s]
    if "tensortap" in libs:
        writers = [w for w in args.writer.split(",") if w]
        at = libs.index("tensortap")
        libs[at:at + 1] = ["tensortap" if w == "auto" else f"tensortap-{w}" for w in writers]
    if "smdebug" in libs and not os.path.exists(smdebug_python):
        print(f"smdebug venv not found at {smdebug_python}: skipping smdebug (set SMDEBUG_PYTHON)")
        libs.remove("smdebug")
    pythons = {"tensortap": sys.executable, "tensortap-thread": sys.executable,
               "tensortap-process": sys.executable, "tensortap-tb": sys.executable, "smdebug": smdebug_python,
               "none": sys.executable, "tensortap-flight": sys.executable, "tensortap-flight-full": sys.executable,
               "tensortap-flight-parameterized": sys.executable, "tensortap-flight-nooutputs": sys.executable,
               "anomaly": sys.executable, "floor": sys.executable, "floor-outputs": sys.executable,
               "tensortap-noflight": sys.executable}
    configs = [(m, lib, iv) for m in args.models.split(",") for iv in args.intervals.split(",") for lib in libs]
    results: dict[tuple[str, str, str], list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for m, lib, iv in configs:  # alternate every configuration within each round
            steps = args.steps or 100
            pairs = args.pairs * 3 if iv == "100" and not args.steps else args.pairs
            res = _run_child(pythons[lib.partition("@")[0]], lib, iv, m, pairs, steps)
            if res is not None:
                results[(m, lib, iv)].append(res)
                print(f"round {r} {m:4s} {lib:17s} interval={iv:5s} plain={res['plain_us']:8.1f}us "
                      f"hooked={res['hooked_us']:8.1f}us x{res['ratio']:.3f} (training-thread CPU "
                      f"x{res['cpu_ratio']:.3f}){_placement(res)}", flush=True)

    intervals = args.intervals.split(",")
    summary = []
    for key, title in (("ratio", "step time"), ("cpu_ratio", "training-thread CPU time")):
        print(f"\nmedian over rounds: {title}, hooked / no hook, same process")
        print(f"{'model':5s} {'library':17s} " + " ".join(f"{'every ' + iv if iv != 'never' else 'never':>11s}"
                                                       for iv in intervals))
        for m in args.models.split(","):
            for lib in libs:
                cells = []
                for iv in intervals:
                    rs = [x for x in results[(m, lib, iv)] if key in x]
                    if rs:
                        ratio = statistics.median(x[key] for x in rs)
                        cells.append(f"x{ratio:10.3f}")
                        summary.append({"metric": key, "model": m, "lib": lib, "interval": iv, "ratio": ratio,
                                        "plain_us": statistics.median(x["plain_us"] for x in rs),
                                        "runs": [x[key] for x in rs]})
                    else:
                        cells.append(f"{'n/a':>11s}")
                print(f"{m:5s} {lib:17s} " + " ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
