"""What a PyTorch hook costs before its first step and after its last (issue #43): import, construction, the first
saving step, close(), and the first tenth of a 1,000-step job plus close() against the same steps with no hook;
peak RSS of the training process and of the writer process.

Hooks: `nothing` (a hook that never saves: saving starts past the job's end), `every10` and `every1` (weights,
biases, gradients and losses saved every 10 steps / every step), each with the writer thread and the writer
process. Workload: the MLP of `bench/pytorch_overhead.py` (64->256->256->10, batch 64, SGD), one CPU thread.

Every measurement is a fresh child process (import and first-time costs are real): it imports torch and
tensortap.pytorch, builds the model, trains 20 steps without a hook (warm-up), then times: the hook's construction
(with `register_module` and `register_loss`), 100 steps (the first one separately), close(). The control `none`
trains the same 100 steps with no hook; `extra` is a configuration's total (construct + 100 steps + close) minus
the median `none` total of the same round. Configurations alternate within each round; medians over rounds. The
A/A line compares two `none` runs of each round (the machine's noise on this measure).

Peak RSS: the training process's peak after close minus its peak before the hook was made (ru_maxrss), and the
writer process's peak before close (VmHWM), with the part of it that is ring pages it has read (RssShmem: memory
shared with the training process, counted in both). Writer CPU: the writer process's CPU time (all its threads)
from its start to just before close: as much of its start-up (interpreter, imports) as it did by then, and what it
wrote, on the other core, beside the training thread.

    .venv/bin/python bench/fixed_cost.py [--rounds 7] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ["nothing-thread", "nothing-process", "every10-thread", "every10-process", "every1-thread",
           "every1-process"]


def child(config: str, steps: int) -> dict:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import tensortap.pytorch as tp

    t2 = time.perf_counter()
    sys.path.insert(0, HERE)
    from pytorch_overhead import _build

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, opt, loss_fn, x, y = _build("mlp")

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = tempfile.mkdtemp(prefix="tt-fixed-")
    result = {"import_torch": t1 - t0, "import_tensortap": t2 - t1}
    hook = None
    a = time.perf_counter()
    if config != "none":
        what, writer = config.split("-")
        save = (tp.SaveConfig(save_interval=1, start_step=10 ** 9) if what == "nothing"
                else tp.SaveConfig(save_interval=10 if what == "every10" else 1))
        hook = tp.Hook(out_dir=os.path.join(out, "run"), save_config=save, writer=writer,
                       include_collections=["weights", "biases", "gradients", "losses"])
        hook.register_module(model)
        hook.register_loss(loss_fn)
    b = time.perf_counter()
    step()
    c = time.perf_counter()
    for _ in range(steps - 1):
        step()
    d = time.perf_counter()
    proc = getattr(getattr(hook, "_writer", None), "_proc", None)
    if proc is not None:  # the writer process's peak so far, and what of it is the ring (shared with this process)
        status = _status(proc.pid)
        result["rss_writer_kb"] = status.get("VmHWM", 0)
        result["rss_writer_ring_kb"] = status.get("RssShmem", 0)
        from writer_process import cpu_ns  # bench/ is the script's directory

        result["cpu_writer"] = cpu_ns(proc.pid) / 1e9
    if hook is not None:
        hook.close()
    e = time.perf_counter()
    result.update(construct=b - a, first_step=c - b, steps=d - b, close=e - d, total=e - a,
                  rss_train_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0)
    if hook is not None:
        from tensortap.trials import create_trial

        result["saved_steps"] = len(create_trial(os.path.join(out, "run")).steps())
    return result


def _status(pid: int) -> dict[str, int]:
    """The kB figures of /proc/<pid>/status."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if value.strip().endswith("kB"):
                    found[key] = int(value.split()[0])
    except OSError:
        pass
    return found


def run(config: str, steps: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", config, "--steps", str(steps)],
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{config} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows: dict[str, list[dict]] = {c: [] for c in ["none", "none-b", *CONFIGS]}
    for r in range(args.rounds):
        order = ["none", *CONFIGS, "none-b"] if r % 2 == 0 else ["none-b", *reversed(CONFIGS), "none"]
        for c in order:
            res = run("none" if c == "none-b" else c, args.steps)
            rows[c].append(res)
        base = statistics.median([rows["none"][-1]["total"], rows["none-b"][-1]["total"]])
        for c in CONFIGS:
            rows[c][-1]["extra"] = rows[c][-1]["total"] - base
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    def med(c: str, k: str) -> float:
        vals = [x[k] for x in rows[c] if k in x]
        return statistics.median(vals) if vals else float("nan")

    ms = 1e3
    print(f"\nload average at end: {os.getloadavg()}")
    print(f"import torch {med('none', 'import_torch') * ms:.0f} ms, import tensortap.pytorch "
          f"{med('none', 'import_tensortap') * ms:.0f} ms (medians, in the child)")
    aa = statistics.median([b["total"] - a["total"] for a, b in zip(rows["none"], rows["none-b"], strict=True)])
    print(f"none: {args.steps} steps + nothing: {med('none', 'total') * ms:.1f} ms; A/A (none-b − none) "
          f"{aa * ms:+.1f} ms")
    print("\n| hook | construct | first step | close | construct + close | "
          f"{args.steps} steps + construct + close, over no hook | peak RSS training | peak RSS writer | "
          "writer CPU | saved steps |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first_none = med("none", "first_step")
    for c in CONFIGS:
        writer_rss, ring = med(c, "rss_writer_kb"), med(c, "rss_writer_ring_kb")
        writer = "-" if writer_rss != writer_rss else f"{writer_rss / 1024:.0f} MB ({ring / 1024:.0f} MB ring)"
        cpu = med(c, "cpu_writer")
        writer += " | -" if cpu != cpu else f" | {cpu * ms:.0f} ms"
        print(f"| {c} | {med(c, 'construct') * ms:.1f} ms | {med(c, 'first_step') * ms:.1f} ms "
              f"(none {first_none * ms:.1f}) | {med(c, 'close') * ms:.1f} ms | "
              f"{(med(c, 'construct') + med(c, 'close')) * ms:.1f} ms | {med(c, 'extra') * ms:+.1f} ms | "
              f"+{med(c, 'rss_train_kb') / 1024:.0f} MB | {writer} | {med(c, 'saved_steps'):.0f} |")

if __name__ == "__main__":
    main()
