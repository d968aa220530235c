"""Overhead of the XGBoost hook: tensortap vs smdebug 1.0.34 vs no hook.

The job: `xgb.train` of binary:logistic on 2,000×10 data (max_depth 6), 50 rounds, 1 thread, evaluating
logloss on the training data and on 500 validation rows. A job is charged everything a user waits for: making
the hook, training, and `hook.close()` (the data on disk).

Configurations, each saved every 1 and every 10 rounds:
  metrics   include_collections=["metrics"]
  fi        metrics + feature_importance
  shap      metrics + feature_importance + average_shap + full_shap (SHAP values of the 2,000 training rows)
and `contribs`: no hook, a bare callback that only calls `model.predict(dtrain, pred_contribs=True)` at the same
rounds: what XGBoost's own SHAP call costs. The SHAP target compares shap − fi (what SHAP adds to the hook)
with contribs − none.

Every measurement is a child process that runs the jobs of one library in rotating order, `--reps` times
each, and reports per job the median over repetitions of (job time / the same repetition's no-hook job time),
for the wall time and for the CPU time of the process (all its threads: tensortap's writer thread included).
On a shared machine the CPU time is the steadier measure; on a quiet one both agree.
The driver alternates the tensortap child and the smdebug child over `--rounds` rounds and prints medians.
smdebug runs in its own venv (SMDEBUG_PYTHON, default bench/_out/smdebug-venv/bin/python):

    python -m venv bench/_out/smdebug-venv
    bench/_out/smdebug-venv/bin/pip install --no-deps xgboost==3.2.0
    bench/_out/smdebug-venv/bin/pip install smdebug==1.0.34 "numpy<2" "pandas<3" "setuptools<81" requests psutil scipy

    .venv/bin/python bench/xgboost_overhead.py [--rounds 3] [--reps 7] [--libs tensortap,smdebug]
        [--configs metrics,fi,shap]   (SHAP every round is slow: 50 pred_contribs calls per job)

`tensortap@PATH` as a library runs the tensortap of another checkout at PATH (in it): two versions alternated,
e.g. `--libs tensortap@../base,tensortap@.`. `none-again`, a second no-hook job, is the A/A control.
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
DEFAULT_SMDEBUG_PYTHON = os.path.join(HERE, "_out", "smdebug-venv", "bin", "python")
CONFIGS = {
    "metrics": ["metrics"],
    "fi": ["metrics", "feature_importance"],
    "shap": ["metrics", "feature_importance", "average_shap", "full_shap"],
}
INTERVALS = (1, 10)
ROUNDS = 50


def _variants(lib: str, configs: list[str]) -> list[str]:
    out = ["none", "none-again"]  # (the second no-hook job: the A/A control)
    if lib == "tensortap" and "shap" in configs:
        out += [f"contribs-{i}" for i in INTERVALS]
    out += [f"{c}-{i}" for c in configs for i in INTERVALS]
    return out


# --- child ------------------------------------------------------------------------------------------

def _child(lib: str, reps: int, configs: list[str]) -> None:
    import atexit

    import numpy as np
    import xgboost as xgb

    made: list[str] = []
    # (registered before smdebug is imported, so it runs after smdebug's exit handler, which writes
    # training_job_end.ts into every out_dir its hooks had, long removed)
    atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in made])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2500, 10)).astype(np.float32)
    logits = x @ rng.normal(size=10) + 0.5 * rng.normal(size=2500)
    y = (logits > 0).astype(np.float32)
    dtrain, dval = xgb.DMatrix(x[:2000], label=y[:2000]), xgb.DMatrix(x[2000:], label=y[2000:])
    params = {"objective": "binary:logistic", "max_depth": 6, "nthread": 1, "eval_metric": "logloss"}
    evals = [(dtrain, "train"), (dval, "validation")]

    class Contribs(xgb.callback.TrainingCallback):
        def __init__(self, every: int):
            self.every = every

        def after_iteration(self, model, epoch, evals_log):  # noqa: ANN001
            if epoch % self.every == 0:
                model.predict(dtrain, pred_contribs=True)
            return False

    def make_hook(config: str, interval: int, out_dir: str):  # noqa: ANN202
        kw = dict(out_dir=out_dir, include_collections=CONFIGS[config], train_data=dtrain)
        if lib == "tensortap":
            import tensortap.xgboost as txgb

            return txgb.Hook(save_config=txgb.SaveConfig(save_interval=interval), **kw)
        import smdebug.xgboost as sxgb

        return sxgb.Hook(save_config=sxgb.SaveConfig(save_interval=interval), **kw)

    def job(variant: str) -> tuple[float, float]:
        """(wall seconds, CPU seconds of the whole process: the writer's threads included)."""
        tmp = tempfile.mkdtemp(prefix="ttbench-xgb-")
        made.append(tmp)
        out_dir = os.path.join(tmp, "run")
        try:
            c0 = time.process_time()
            t0 = time.perf_counter()
            hook = None
            callbacks = []
            if variant == "none-again":
                pass
            elif variant.startswith("contribs-"):
                callbacks = [Contribs(int(variant.split("-")[1]))]
            elif variant != "none":
                config, interval = variant.split("-")
                hook = make_hook(config, int(interval), out_dir)
                callbacks = [hook]
            xgb.train(params, dtrain, num_boost_round=ROUNDS, evals=evals, callbacks=callbacks, verbose_eval=False)
            if hook is not None:
                hook.close()
            return time.perf_counter() - t0, time.process_time() - c0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    variants = _variants(lib, configs)
    for v in ("none", f"{configs[0]}-10"):  # warm-up: imports, the first writer, caches
        job(v)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(reps):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            times[v].append(job(v))
    out: dict = {"lib": lib}
    for k, what in enumerate(("wall", "cpu")):
        out[what] = {
            "ms": {v: 1000 * statistics.median(t[k] for t in ts) for v, ts in times.items()},
            "ratios": {v: statistics.median(t[k] / n[k] for t, n in zip(times[v], times["none"], strict=True))
                       for v in variants},
        }
    print(json.dumps(out))


# --- driver -----------------------------------------------------------------------------------------

def _run_child(lib: str, reps: int, configs: list[str], smdebug_python: str) -> dict | None:
    """`lib`: tensortap, smdebug, or tensortap@PATH (the tensortap of the checkout at PATH, run in it)."""
    lib, _at, tree = lib.partition("@")
    python = sys.executable if lib == "tensortap" else smdebug_python
    env = dict(os.environ, SMDEBUG_LOG_LEVEL="error", OMP_NUM_THREADS="1")
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    r = subprocess.run([python, os.path.abspath(__file__), "--child", lib, "--reps", str(reps),
                        "--configs", ",".join(configs)], capture_output=True, text=True, env=env,
                       cwd=os.path.abspath(tree) if tree else None)
    if r.returncode != 0:
        print(f"{lib} child failed:\n{r.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _table(results: dict[str, list[dict]], what: str, configs: list[str]) -> None:
    med = {lib: {v: statistics.median(r[what]["ratios"][v] for r in rs) for v in rs[0][what]["ratios"]}
           for lib, rs in results.items() if rs}
    ms = {lib: {v: statistics.median(r[what]["ms"][v] for r in rs) for v in rs[0][what]["ms"]}
          for lib, rs in results.items() if rs}
    both = set(med) == {"tensortap", "smdebug"}
    print(f"\n{what}: median job time / no-hook job time (no-hook job: "
          + ", ".join(f"{lib} {ms[lib]['none']:.1f} ms" for lib in ms) + ")")
    # Overheads compared as ratios (each library against its own venv's no-hook job) and in milliseconds (the
    # venvs' no-hook jobs differ: different numpy and xgboost builds).
    print("| configuration | " + " | ".join(f"{lib} (overhead ms)" for lib in med)
          + (" | smdebug / tensortap: overhead ratio, ms |" if both else ""))
    print("|---|" + "---|" * (len(med) + both))
    for c in configs:
        for i in INTERVALS:
            v = f"{c}-{i}"
            row = [f"×{med[lib][v]:.3f} ({ms[lib][v] - ms[lib]['none']:.1f})" for lib in med]
            if both:
                tt, sm = med["tensortap"][v] - 1, med["smdebug"][v] - 1
                tt_ms = ms["tensortap"][v] - ms["tensortap"]["none"]
                sm_ms = ms["smdebug"][v] - ms["smdebug"]["none"]
                by_ratio = f"{sm / tt:.1f}×" if tt > 0 else "∞"
                row.append(by_ratio + ", " + (f"{sm_ms / tt_ms:.1f}×" if tt_ms > 0 else "∞"))
            print(f"| {c}, every {i} | " + " | ".join(row) + " |")
    for lib in med:
        print(f"{what}, A/A (a second no-hook job / the first), {lib}: ×{med[lib]['none-again']:.3f}")
    if "tensortap" in ms and "shap" in configs:
        t = ms["tensortap"]
        for i in INTERVALS:
            shap_cost = t[f"shap-{i}"] - t[f"fi-{i}"]
            own = t[f"contribs-{i}"] - t["none"]
            print(f"{what}, every {i}: SHAP adds {shap_cost:.0f} ms to the hook; XGBoost's own pred_contribs calls "
                  f"take {own:.0f} ms (×{shap_cost / own:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--libs", default="tensortap,smdebug")
    ap.add_argument("--configs", default="metrics,fi,shap", help="of " + ",".join(CONFIGS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    configs = args.configs.split(",")
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"--configs: {bad[0]!r} is not one of {', '.join(CONFIGS)}")
    if "shap" in configs and "fi" not in configs:
        configs.insert(0, "fi")  # the SHAP cost is shap - fi
    if args.child:
        _child(args.child, args.reps, configs)
        return
    smdebug_python = os.environ.get("SMDEBUG_PYTHON", DEFAULT_SMDEBUG_PYTHON)
    libs = args.libs.split(",")
    if "smdebug" in libs and not os.path.exists(smdebug_python):
        print(f"smdebug skipped: no {smdebug_python} (see the module docstring)", file=sys.stderr)
        libs.remove("smdebug")
    results: dict[str, list[dict]] = {lib: [] for lib in libs}
    for rnd in range(args.rounds):
        for lib in libs if rnd % 2 == 0 else libs[::-1]:
            res = _run_child(lib, args.reps, configs, smdebug_python)
            if res is not None:
                results[lib].append(res)
                for what in ("cpu", "wall"):
                    print(f"round {rnd} {lib} {what}: none {res[what]['ms']['none']:.1f} ms; "
                          + ", ".join(f"{v} ×{q:.3f}" for v, q in res[what]["ratios"].items() if v != "none"),
                          flush=True)
    for what in ("cpu", "wall"):
        _table(results, what, configs)


if __name__ == "__main__":
    main()
