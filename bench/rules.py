"""Benchmark: every built-in rule that applies, evaluated over a 10,000-step trial of a small model.

The job (written with tensortap's generic Hook, every step saved): an MLP 16-32-3 with weights, biases and
gradients of both layers, the ReLU input and output (batch 64 x 32), labels and logits (batch 64), a loss,
and an EVAL phase of 5 steps after every 45 TRAIN steps. A second identical job is written for
SimilarAcrossRuns. Then each rule runs with invoke_rule(..., stop_at_job_end=True) on a freshly opened trial
(so the first rule pays for reading the data; the others share the per-trial cache).

Usage: .venv/bin/python bench/rules.py [--steps N] [--out DIR] [--md FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time

import numpy as np


def write_job(out: str, steps: int, seed: int = 0) -> float:
    import tensortap as tt

    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((32, 16)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((3, 32)).astype(np.float32) * 0.3
    b1, b2 = np.zeros(32, np.float32), np.zeros(3, np.float32)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    t0 = time.perf_counter()
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1),
                   include_collections=["weights", "biases", "gradients", "losses", "relu_input", "relu_output",
                                        "labels", "predictions"])
    for s in range(steps):
        train = s % 50 < 45
        hook.set_mode(tt.modes.TRAIN if train else tt.modes.EVAL)
        hook.next_step()
        pre = x @ w1.T + b1
        act = np.maximum(pre, 0)
        logits = act @ w2.T + b2
        hook.save_tensor("Net_fc1.weight", w1, "weights")
        hook.save_tensor("Net_fc2.weight", w2, "weights")
        hook.save_tensor("Net_fc1.bias", b1, "biases")
        hook.save_tensor("Net_fc2.bias", b2, "biases")
        hook.save_tensor("relu_input_0", pre, "relu_input")
        hook.save_tensor("relu_output_0", act, "relu_output")
        hook.save_tensor("labels", y, "labels")
        hook.save_tensor("predictions", logits, "predictions")
        hook.save_tensor("CrossEntropyLoss_output_0", np.float32(1.0 / (1 + s / 100) + 0.01 * (not train)), "losses")
        if train:
            g1 = rng.standard_normal(w1.shape).astype(np.float32) * 0.01
            g2 = rng.standard_normal(w2.shape).astype(np.float32) * 0.01
            hook.save_tensor("gradient/Net_fc1.weight", g1, "gradients")
            hook.save_tensor("gradient/Net_fc2.weight", g2, "gradients")
            hook.save_tensor("gradient/Net_fc1.bias", g1[:, 0].copy(), "gradients")
            hook.save_tensor("gradient/Net_fc2.bias", g2[:, 0].copy(), "gradients")
            w1 = w1 - 0.1 * g1
            w2 = w2 - 0.1 * g2
    hook.close()
    return time.perf_counter() - t0


def rules_for(trial, other) -> list:  # type: ignore[no-untyped-def]
    from tensortap.rules import builtin as b

    return [
        b.VanishingGradient(trial),
        b.ExplodingTensor(trial),
        b.SimilarAcrossRuns(trial, other, collection_names="weights"),
        b.WeightUpdateRatio(trial),
        b.AllZero(trial, collection_names="relu_output"),
        b.UnchangedTensor(trial, collection_names="weights"),
        b.LossNotDecreasing(trial),
        b.Confusion(trial),
        b.ClassImbalance(trial, argmax=True),
        b.DeadRelu(trial, tensor_regex="relu_output"),
        b.Overfit(trial),
        b.Overtraining(trial),
        b.TensorVariance(trial, collection_names="weights,gradients", max_threshold=10, min_threshold=1e-12),
        b.PoorWeightInitialization(trial, activation_inputs_regex="relu_input"),
        b.SaturatedActivation(trial, tensor_regex="relu_input"),  # no tanh/sigmoid: judged as not applicable
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None, help="write the results as markdown to this file")
    args = ap.parse_args()

    import tensortap as tt
    from tensortap.rules import invoke_rule

    base = args.out or tempfile.mkdtemp(prefix="tt-bench-rules-")
    a, b = os.path.join(base, "a"), os.path.join(base, "b")
    for p in (a, b):
        shutil.rmtree(p, ignore_errors=True)
    wa = write_job(a, args.steps)
    write_job(b, args.steps)

    trial, other = tt.create_trial(a), tt.create_trial(b)
    n_tensors = len(trial.tensor_names())
    rows = []
    t_all = time.perf_counter()
    for rule in rules_for(trial, other):
        t0 = time.perf_counter()
        rep = invoke_rule(rule, stop_at_job_end=True)
        dt = time.perf_counter() - t0
        rows.append((rule.rule_name, dt, rep.steps_evaluated, rep.datapoints, rep.violations))
    total = time.perf_counter() - t_all

    lines = [
        "# Rule benchmark (bench/rules.py)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}, load average at the start {os.getloadavg()[0]:.1f} (shared machine).",
        f"Job: {args.steps:,} steps, {n_tensors} tensors (MLP 16-32-3: weights, biases, gradients, ReLU in/out "
        "batch 64x32, labels, logits, loss; TRAIN 45 / EVAL 5 steps), every step saved; written in "
        f"{wa:.1f} s.",
        "",
        "| rule | seconds | steps evaluated | datapoints | firing steps |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {dt:.2f} | {st:,} | {dp:,} | {v:,} |" for n, dt, st, dp, v in rows]
    lines += ["", f"**All {len(rows)} rules: {total:.1f} s** (fresh trial; the first rule reads the data in bulk, "
              "the others share the per-trial cache).", ""]
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if not args.out:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
