"""The PyTorch hook's overhead on a `torch.compile`d model beside its overhead on the same model run eagerly (issue
#34: "compiled models within ×1.02 of their uncompiled ratios").

Workloads: `bench/pytorch_overhead.py`'s MLP (64->256->256->10, batch 64) and 4-layer transformer encoder (d_model
64, 4 heads, batch 16 x 32 tokens), SGD, one CPU thread, compiled with inductor (`--backend`) and `fullgraph=True`
(`--no-fullgraph` to drop it). Configurations (`--configs`): `raw10`, `raw1`, `raw100` save weights, biases,
gradients and the loss raw every 10, 1, 100 steps; `stats1` saves only their statistics (l2, max, min, mean; no
raw values) at every step. Registration orders (`--orders`):

* `eager`: no compilation, the uncompiled ratio;
* `register-compile`: `hook.register_module(model)`, then `torch.compile(model)`;
* `compile-register`: `torch.compile(model)`, then `hook.register_module(compiled)`;
* `module-compile` (not in the default set): `model.compile()` after `register_module(model)`.

Every (model, configuration, order) is one child process holding three models built alike (same seed, same
weights): the hooked one, a plain one and a second plain one, each compiled the same way (`eager`: none). Its
blocks of `--steps` steps alternate (the order of the three rotates every round) and each round gives
hooked/plain and plain-again/plain (the A/A control: what two separately built models differ by, the noise under
the hooked ratio); the child reports the medians over `--rounds` rounds. The plain blocks run models the hook never
saw, so whatever the hook changes in the compiled code (graph breaks, guards, recompilation) is charged to it;
the plain models are not the hooked model with its hooks switched off, because the compiled code of a model that
was compiled hooked may keep what the hook put into it. The hook's global optimizer step hooks are taken out
during the plain blocks (the optimizer is not compiled: nothing retraces) so the plain blocks pay nothing of the
hook's. A hooked block is charged until the writer has caught up (`hook.flush()`).

Compilation stays out of the timed blocks: every model runs two warm-up blocks first (saving and non-saving steps,
switching between the models as the timed blocks do). The timed blocks run with
`torch._dynamo.config.error_on_recompile = True`, and the child reports the graph breaks and the graphs compiled
during warm-up and during the timed blocks (`torch._dynamo.utils.counters`): a recompilation or a graph break
caused by the saving cadence or by switching between models shows there.

Clocks: the training thread's CPU time (`time.thread_time()`, blind to the writer's process and to time spent
waiting for the CPU on a loaded machine) and wall time. `--repeats` runs every child that many times, alternating,
and the tables give the median over them.

    .venv/bin/python bench/pytorch_compiled.py [--models mlp,transformer] [--configs raw10,raw1,raw100,stats1]
        [--orders eager,register-compile,compile-register] [--rounds 15] [--steps 100] [--repeats 1]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORDERS = ("eager", "register-compile", "compile-register", "module-compile")
CONFIGS = {"raw10": ("raw", 10), "raw1": ("raw", 1), "raw100": ("raw", 100), "stats1": ("stats", 1)}
COLLECTIONS = ["weights", "biases", "gradients", "losses"]


@functools.cache
def _mean_over_tokens_class():
    from torch import nn

    class MeanOverTokens(nn.Module):
        def forward(self, x):
            return x.mean(dim=1)

    return MeanOverTokens


def _mean_over_tokens():
    """pytorch_overhead's mean over the token axis, of one class in the process: `_build` makes a class per
    model, and dynamo compiles a graph per class and checks their guards in turn, a cost that differs by model."""
    return _mean_over_tokens_class()()


def _block_steps(model_name: str, config: str, steps: int) -> int:
    """Steps per block: `steps` (default 100 for the MLP, 20 for the transformer), a multiple of the interval."""
    interval = CONFIGS[config][1]
    n = steps or (20 if model_name == "transformer" else 100)
    return -(-n // interval) * interval


class _Runner:
    """One model: `block(n)` trains n steps and returns (wall, training-thread CPU) seconds."""

    def __init__(self, model_name: str, order: str, hooked: bool, config: str, out_dir: str,
                 backend: str, fullgraph: bool):
        import torch

        sys.path.insert(0, HERE)
        from pytorch_overhead import _build

        torch.manual_seed(0)
        self.model, self.opt, self.loss_fn, self.x, self.y = _build(model_name)
        self.hook = None
        self.globals: list[tuple[dict, dict]] = []
        compile_kw = {"backend": backend, "fullgraph": fullgraph}
        if hooked:
            from torch.optim import optimizer as o

            import tensortap.pytorch as tp

            kind, interval = CONFIGS[config]
            rc = None
            if kind == "stats":
                rc = tp.ReductionConfig(norms=["l2"], reductions=["max", "min", "mean"], save_raw_tensor=False)
            before = [dict(o._global_optimizer_pre_hooks), dict(o._global_optimizer_post_hooks)]
            self.hook = tp.Hook(out_dir=out_dir, save_config=tp.SaveConfig(save_interval=interval),
                                include_collections=COLLECTIONS, reduction_config=rc)
        if model_name == "transformer":
            self.model[1] = _mean_over_tokens()  # (one class for the three models: they share compiled code)
        run = self.model
        if hooked and order != "compile-register":
            self.hook.register_module(self.model)
        if order in ("register-compile", "compile-register"):
            run = torch.compile(self.model, **compile_kw)
        elif order == "module-compile":
            self.model.compile(**compile_kw)
        if hooked and order == "compile-register":
            self.hook.register_module(run)
        if hooked:
            self.hook.register_loss(self.loss_fn)
            self.hook.register_optimizer(self.opt)
            # the hook's global optimizer step hooks: taken out while the other models train
            for d, old in zip((o._global_optimizer_pre_hooks, o._global_optimizer_post_hooks), before, strict=True):
                self.globals.append((d, {k: v for k, v in d.items() if k not in old}))
        self.run = run

    def _globals(self, on: bool) -> None:
        for d, ours in self.globals:
            if on:
                d.update(ours)
            else:
                for k in ours:
                    d.pop(k, None)

    def block(self, n: int) -> tuple[float, float]:
        run, opt, loss_fn, x, y = self.run, self.opt, self.loss_fn, self.x, self.y
        self._globals(True)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            opt.zero_grad()
            loss = loss_fn(run(x), y)
            loss.backward()
            opt.step()
        if self.hook is not None:
            self.hook.flush()
        took = time.perf_counter() - t0, time.thread_time() - c0
        self._globals(False)
        return took

    def close(self) -> None:
        if self.hook is not None:
            self._globals(True)
            self.hook.close()


def _counts() -> dict:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0}


def child(model_name: str, config: str, order: str, rounds: int, steps: int, backend: str, fullgraph: bool) -> dict:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    steps = _block_steps(model_name, config, steps)
    root = tempfile.mkdtemp(prefix="ttbench_compiled_")
    counters.clear()
    runners = {k: _Runner(model_name, order, k == "hooked", config, os.path.join(root, k), backend, fullgraph)
               for k in ("hooked", "plain", "plain-again")}
    t0 = time.perf_counter()
    for _ in range(2):
        for r in runners.values():
            r.block(steps)
    warmup_s = time.perf_counter() - t0
    warm = _counts()
    counters.clear()
    torch._dynamo.config.error_on_recompile = True
    names = list(runners)
    took: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    error = None
    try:
        for i in range(rounds):
            for k in names[i % 3:] + names[:i % 3]:  # (the order of the three rotates)
                took[k].append(runners[k].block(steps))
    except Exception as e:  # noqa: BLE001 - a recompilation in the timed blocks: reported, not hidden
        error = f"{type(e).__name__}: {str(e)[:300]}"
    timed = _counts()
    torch._dynamo.config.error_on_recompile = False
    saved_steps = None
    hook = runners["hooked"].hook
    for r in runners.values():
        r.close()
    try:
        import tensortap

        saved_steps = len(tensortap.create_trial(os.path.join(root, "hooked")).steps())
    except Exception:  # noqa: BLE001
        pass
    shutil.rmtree(root, ignore_errors=True)
    n = min(len(v) for v in took.values())
    res = {"model": model_name, "config": config, "order": order, "rounds": n, "steps": steps, "warmup_s": warmup_s,
           "warmup": warm, "timed": timed, "error": error, "hook_errors": hook.error_count,
           "saved_steps": saved_steps}
    for c, clock in ((0, "wall"), (1, "cpu")):
        if n:
            res[f"{clock}_plain_us"] = statistics.median(t[c] for t in took["plain"][:n]) / steps * 1e6
            res[f"{clock}_ratio"] = statistics.median(took["hooked"][i][c] / took["plain"][i][c] for i in range(n))
            res[f"{clock}_aa"] = statistics.median(took["plain-again"][i][c] / took["plain"][i][c] for i in range(n))
    return res


def _run_child(args, model: str, config: str, order: str) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, config, order, str(args.rounds),
           str(args.steps), args.backend, "1" if args.fullgraph else "0"]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), OMP_NUM_THREADS="1")
    env.pop("TENSORTAP_DISABLE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(f"  [{model} {config} {order}] failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--orders", default=",".join(ORDERS[:3]))
    ap.add_argument("--rounds", type=int, default=15, help="rounds of alternating blocks per child")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per block, made a multiple of the interval (default: 100 for the MLP, 20 for the "
                         "transformer)")
    ap.add_argument("--repeats", type=int, default=1, help="child processes per configuration, alternating")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--no-fullgraph", dest="fullgraph", action="store_false")
    ap.add_argument("--json", help="also write every child's result here")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        m, c, o, rounds, steps, backend, fg = args.child
        print(json.dumps(child(m, c, o, int(rounds), int(steps), backend, fg == "1")))
        return
    for c in args.configs.split(","):
        if c not in CONFIGS:
            ap.error(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")
    orders = args.orders.split(",")
    for o in orders:
        if o not in ORDERS:
            ap.error(f"--orders: {o!r} is not one of {', '.join(ORDERS)}")
    keys = [(m, c, o) for m in args.models.split(",") for c in args.configs.split(",") for o in orders]
    print(f"load average {os.getloadavg()[0]:.1f} at start; {args.rounds} rounds of "
          f"{args.steps or '100 (MLP) / 20 (transformer)'}-step blocks per "
          f"child, {args.repeats} child(ren) per configuration, 1 thread, backend {args.backend}, "
          f"fullgraph={args.fullgraph}", flush=True)
    results: dict[tuple, list[dict]] = {k: [] for k in keys}
    for _rep in range(args.repeats):
        for k in keys:
            res = _run_child(args, *k)
            if res is None:
                continue
            results[k].append(res)
            print(f"  {k[0]:11s} {k[1]:6s} {k[2]:16s} cpu x{res.get('cpu_ratio', float('nan')):.3f} "
                  f"(A/A x{res.get('cpu_aa', float('nan')):.3f}) wall x{res.get('wall_ratio', float('nan')):.3f} "
                  f"(A/A x{res.get('wall_aa', float('nan')):.3f}) plain {res.get('cpu_plain_us', 0):.0f}us; "
                  f"warm-up {res['warmup_s']:.1f}s graphs {res['warmup']['graphs']} breaks "
                  f"{res['warmup']['graph_breaks']}; timed graphs {res['timed']['graphs']} breaks "
                  f"{res['timed']['graph_breaks']} recompiles {res['timed']['recompiles']}"
                  f"{' ERROR ' + res['error'] if res['error'] else ''}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")

    def med(k, field):
        vs = [r[field] for r in results[k] if field in r]
        return statistics.median(vs) if vs else float("nan")

    comp = [o for o in orders if o != "eager"]
    for clock, title in (("cpu", "training-thread CPU time"), ("wall", "wall time")):
        print(f"\n{title}: hooked / plain (A/A in brackets); compiled ratio / eager ratio after each compiled order")
        print("| model | config | " + " | ".join(orders) + " | " + " | ".join(f"{o} / eager" for o in comp) + " |")
        print("|---|---|" + "---|" * (len(orders) + len(comp)))
        for m in args.models.split(","):
            for c in args.configs.split(","):
                cells = [f"×{med((m, c, o), clock + '_ratio'):.3f} (×{med((m, c, o), clock + '_aa'):.3f})"
                         for o in orders]
                if "eager" in orders:
                    e = med((m, c, "eager"), clock + "_ratio")
                    cells += [f"×{med((m, c, o), clock + '_ratio') / e:.3f}" for o in comp]
                print(f"| {m} | {c} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r for rs in results.values() for r in rs], f, indent=1)


if __name__ == "__main__":
    main()
