"""Every built-in rule at its default parameters over the rules corpus (bench/corpus): a confusion table per rule.

    python bench/rules_corpus.py [--only NAME,...] [--json FILE] [--rebuild] [--verbose]

For each rule: TP (a broken job it must fire on, and it fired), FN (it must fire and did not, NoData included),
FP (it fired on a healthy job, or on a broken job whose defect does not concern it), TN (it did not fire where it
should not), NoData (its data was not saved in the job: it judged nothing, counted in TN or FN as well), and
caught = TP / (TP + FN); "allowed": it fired on a broken job whose defect shows in its data too (a model that
learns nothing also has a loss that does not fall), never counted as a false alarm. Jobs are generated once and
cached under bench/_out/corpus (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.corpus import JOBS, Job, build  # noqa: E402

#: rules that need a parameter only the user can choose, or a second job, or wall-clock time: not in the table
NOT_AT_DEFAULTS = {
    "all_zero": "needs collection_names or tensor_regex",
    "tensor_variance": "needs max_threshold or min_threshold",
    "similar_across_runs": "needs a second job",
    "stalled_training_rule": "judges wall-clock time of a running job (tests/rules/test_builtin_stalled_training.py)",
}


def rules_at_defaults() -> list[type]:
    from tensortap.rules.builtin import BUILTIN_RULES, snake_name

    return [r for r in BUILTIN_RULES if snake_name(r) not in NOT_AT_DEFAULTS]


def judge(job: Job, out_dir: str) -> dict[str, dict[str, Any]]:
    """{rule snake name: {status, message}} of every rule at its defaults over the finished job."""
    from tensortap.rules import invoke_rule
    from tensortap.rules.builtin import snake_name
    from tensortap.trials import create_trial

    trial = create_trial(out_dir)
    out = {}
    for cls in rules_at_defaults():
        rule = cls(trial)
        rep = invoke_rule(rule, stop_at_job_end=True)
        msg = rep.first_violations[0].condition if rep.first_violations else rep.no_data_message()[:160]
        out[snake_name(cls)] = {"status": rep.status, "message": msg, "first_fired_step": rep.first_fired_step}
    return out


def outcome(job: Job, rule: str, status: str) -> str:
    fired = status == "IssuesFound"
    if rule in job.expect:
        return "TP" if fired else "FN"
    if fired:
        return "allowed" if rule in job.allow else "FP"
    return "TN"


def table(verdicts: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for cls in rules_at_defaults():
        from tensortap.rules.builtin import snake_name

        r = snake_name(cls)
        row = {"rule": r, "TP": 0, "FN": 0, "FP": 0, "TN": 0, "allowed": 0, "NoData": 0, "fp_jobs": [],
               "fn_jobs": []}
        for name, v in verdicts.items():
            st = v[r]["status"]
            o = outcome(JOBS[name], r, st)
            row[o] += 1
            row["NoData"] += st == "NoData"
            if o == "FP":
                row["fp_jobs"].append(name)
            elif o == "FN":
                row["fn_jobs"].append(name)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated job names (default: the whole corpus)")
    ap.add_argument("--json", help="write the verdicts of every job and rule to this file")
    ap.add_argument("--rebuild", action="store_true", help="run the jobs again even if cached")
    ap.add_argument("--verbose", action="store_true", help="print every firing with its message")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(JOBS)
    order = sorted(names, key=lambda n: {"torch": 0, "xgboost": 1, "keras": 2}[JOBS[n].framework])
    t0 = time.perf_counter()
    dirs = {}
    for n in order:
        t = time.perf_counter()
        dirs[n] = build(n, force=args.rebuild)
        print(f"built {n:<28} {time.perf_counter() - t:6.1f} s", file=sys.stderr, flush=True)
    t1 = time.perf_counter()
    verdicts = {}
    for n in names:
        verdicts[n] = judge(JOBS[n], dirs[n])
    t2 = time.perf_counter()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(verdicts, f, indent=1)
    healthy = sum(JOBS[n].healthy for n in names)
    print(f"corpus: {healthy} healthy and {len(names) - healthy} broken jobs; built in {t1 - t0:.0f} s, "
          f"judged in {t2 - t1:.0f} s")
    print()
    print("| rule | TP | FN | FP | TN | NoData | caught | also fired on a broken job (allowed) | false alarms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    tp_all = fn_all = fp_all = 0
    for row in table(verdicts):
        tp, fn, fp = row["TP"], row["FN"], row["FP"]
        tp_all, fn_all, fp_all = tp_all + tp, fn_all + fn, fp_all + fp
        caught = f"{100 * tp / (tp + fn):.0f}%" if tp + fn else "-"
        fps = ", ".join(row["fp_jobs"]) or "-"
        print(f"| {row['rule']} | {tp} | {fn} | {fp} | {row['TN']} | {row['NoData']} | {caught} | "
              f"{row['allowed']} | {fps} |")
        if row["fn_jobs"]:
            print(f"|   missed: {', '.join(row['fn_jobs'])} | | | | | | | | |")
    total = tp_all + fn_all
    print()
    print(f"all rules: {tp_all} of {total} expected firings caught ({100 * tp_all / max(1, total):.0f}%), "
          f"{fp_all} false alarms")
    print("not run at defaults: " + "; ".join(f"{k} ({v})" for k, v in NOT_AT_DEFAULTS.items()))
    if args.verbose:
        for n in names:
            for r, v in verdicts[n].items():
                if v["status"] == "IssuesFound":
                    tag = outcome(JOBS[n], r, v["status"])
                    print(f"{tag:>7} {n:<28} {r:<28} step {v['first_fired_step']}: {v['message']}")
    return 0 if fp_all == 0 and tp_all >= 0.9 * total else 1


if __name__ == "__main__":
    sys.exit(main())
