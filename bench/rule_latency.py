"""Benchmark: real-time rule latency, from a problem written to training stopped, through `tensortap run`.

Each round runs `tensortap run --stop-on-issue --rule exploding_tensor` on a plain PyTorch training script (an
MLP, a few ms per step, every step saved) that writes NaN into a weight at a chosen step. The rule processes
start before training (the runner waits for them), so a problem at step 0 pays no rule start-up. Measured:

* write -> verdict: from the moment the script poisons the weight (the hook saves it at that step) to the
  time in the stop request the rule wrote (`tensortap/control/stop.json`, `requested_at`);
* verdict -> stopped: from then to the moment the training loop ended (TrainingStopped caught in the script);
* total, in seconds and in training steps (the step at which training stopped minus the poisoned step).

Rounds alternate the poisoned step between the first steps (0..5: training has just started, the hook's
writer is starting) and later ones (500..1100: the job is running); the figures are given for both groups.
With `--s3` the out_dir is on moto's S3 server on 127.0.0.1 (needs moto[server] and boto3); `--writer`
sets TENSORTAP_WRITER for the training (the hook's writer process or thread).

Usage: .venv/bin/python bench/rule_latency.py [--rounds 16] [--save-interval 1] [--s3] [--writer thread]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

TRAIN = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch import nn

    poison_step, steps, marks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
    out = {"poison_step": poison_step}
    step = -1
    try:
        for step in range(steps):
            if step == poison_step:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
                out["poison_time"] = time.time()
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    except SystemExit:  # TrainingStopped: the rule stopped us
        out["stop_time"] = time.time()
        out["stop_step"] = step
        raise
    finally:
        out["last_step"] = step
        with open(marks, "w") as f:
            json.dump(out, f)
    """
)


def _moto_server() -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import boto3

    for _ in range(100):
        try:
            boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x",
                         aws_secret_access_key="x").create_bucket(Bucket="bench")
            break
        except Exception:  # noqa: BLE001 - the server is starting
            time.sleep(0.1)
    return proc, url


def one_round(tmp: str, i: int, poison: int, save_interval: int, s3_url: str | None, writer: str | None) -> dict:
    script = os.path.join(tmp, "train.py")
    marks = os.path.join(tmp, f"marks_{i}.json")
    out = f"s3://bench/run{i}" if s3_url else os.path.join(tmp, f"run{i}")
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    env = dict(os.environ)
    if writer:
        env["TENSORTAP_WRITER"] = writer
    if s3_url:
        env.update(AWS_ENDPOINT_URL=s3_url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                   AWS_DEFAULT_REGION="us-east-1")
    t0 = time.time()
    r = subprocess.run([exe, "run", "--out-dir", out, "--save-interval", str(save_interval),
                        "--rule", "exploding_tensor", "--stop-on-issue", "--json",
                        "--", sys.executable, script, str(poison), "100000", marks],
                       capture_output=True, text=True, env=env, timeout=600)
    wall = time.time() - t0
    with open(marks) as f:
        m = json.load(f)
    if "stop_time" not in m:
        raise RuntimeError(f"round {i}: training was not stopped: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    from tensortap.rules.actions.stop import STOP_KEY
    from tensortap.storage import open_storage

    req = json.loads(open_storage(out).read(STOP_KEY))
    return {"poison_step": poison, "stop_step": m["stop_step"], "steps": m["stop_step"] - poison,
            "write_to_verdict": req["requested_at"] - m["poison_time"],
            "verdict_to_stopped": m["stop_time"] - req["requested_at"],
            "total": m["stop_time"] - m["poison_time"], "wall": wall, "rc": r.returncode}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--writer", choices=("process", "thread"), help="TENSORTAP_WRITER for the training")
    ap.add_argument("--save-interval", type=int, default=1)
    ap.add_argument("--s3", action="store_true", help="out_dir on moto's S3 server on 127.0.0.1")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tensortap-latency-")
    with open(os.path.join(tmp, "train.py"), "w") as f:
        f.write(TRAIN)
    server, url = _moto_server() if args.s3 else (None, None)
    if url:  # this process reads the stop request from the server too
        os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                          AWS_DEFAULT_REGION="us-east-1")
    rows = []
    try:
        for i in range(args.rounds):
            poison = (i // 2) % 6 if i % 2 == 0 else 500 + 150 * (i % 5)
            poison -= poison % args.save_interval
            row = one_round(tmp, i, poison, args.save_interval, url, args.writer)
            rows.append(row)
            print(f"round {i:2d}: poisoned step {poison:4d}, stopped at {row['stop_step']:5d} "
                  f"(+{row['steps']} steps): write->verdict {row['write_to_verdict']:.3f} s, "
                  f"verdict->stopped {row['verdict_to_stopped']:.3f} s, total {row['total']:.3f} s", flush=True)
    finally:
        if server is not None:
            server.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"out_dir {'s3 (moto, 127.0.0.1)' if args.s3 else 'local disk'}, save_interval {args.save_interval}, "
          f"writer {args.writer or 'default'}, {len(rows)} rounds")
    print("| problem at | rounds | write->verdict s median / p95 | verdict->stopped s median / p95 | "
          "total s median / p95 / max | steps median / p95 |\n|---|---:|---:|---:|---:|---:|")
    for label, sel in (("steps 500..1100 (running job)", [r for r in rows if r["poison_step"] >= 10]),
                       ("steps 0..5 (first steps)", [r for r in rows if r["poison_step"] < 10]),
                       ("all", rows)):
        if not sel:
            continue

        def mp(key: str, sel: list = sel) -> str:
            xs = [r[key] for r in sel]
            f = "{:.0f}" if key == "steps" else "{:.2f}"
            return f"{f.format(statistics.median(xs))} / {f.format(pct(xs, 0.95))}"

        print(f"| {label} | {len(sel)} | {mp('write_to_verdict')} | {mp('verdict_to_stopped')} | {mp('total')} / "
              f"{max(r['total'] for r in sel):.2f} | {mp('steps')} |")


if __name__ == "__main__":
    main()
