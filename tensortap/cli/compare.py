"""`tensortap compare A B [C...]`: where runs diverge, per tensor and statistic."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the `compare` subcommand on the console script's subparsers."""
    p = sub.add_parser(
        "compare", help="where runs diverge: per tensor and statistic, the first step that differs",
        description="Compare runs B, C... to the reference run A: per tensor and statistic (scalars, saved "
        "reductions, statistics of raw values), matched by worker, mode and mode step, the first step at which "
        "|other - ref| > atol + rtol*|ref| (NaN against a number differs). Exit status 0: no divergence, "
        "1: a run diverges, 2: error.",
    )
    p.add_argument("runs", nargs="+", metavar="OUT_DIR", help="the reference run, then the runs compared to it")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
    p.add_argument("--tensor", action="append", default=[], metavar="REGEX",
                   help="compare only tensors matching (repeatable)")
    p.add_argument("--mode", choices=["TRAIN", "EVAL", "PREDICT", "GLOBAL"], help="compare only this mode")
    p.add_argument("--limit", type=int, default=20, help="divergences shown per run in text output (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.description = textwrap.fill(p.description or "", 100)  # kept as written under an examples epilog
    p.set_defaults(func=cmd_compare)
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    import re

    from tensortap.compare import compare_trials
    from tensortap.modes import ModeKeys
    from tensortap.trials import create_trial

    if len(args.runs) < 2:
        raise ValueError("compare needs at least two runs: the reference, then the others")
    try:
        pats = [re.compile(r) for r in args.tensor]
    except re.error as e:
        raise ValueError(f"--tensor: {e}") from None
    trials = [create_trial(p, name=p) for p in args.runs]
    names = None
    if pats:
        names = sorted({n for t in trials for n in t.tensor_names() if any(p.search(n) for p in pats)})
    mode = ModeKeys[args.mode].value if args.mode else None
    results = [compare_trials(trials[0], t, rtol=args.rtol, atol=args.atol, names=names, mode=mode)
               for t in trials[1:]]
    diverged = any(r.divergences for r in results)
    if args.json:
        json.dump({"rtol": args.rtol, "atol": args.atol, "comparisons": [r.to_dict() for r in results]},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 1 if diverged else 0
    for r in results:
        print(f"{r.other} vs {r.reference}: {r.compared} values compared"
              + (f", {r.only_reference} only in {r.reference}" if r.only_reference else "")
              + (f", {r.only_other} only in {r.other}" if r.only_other else ""))
        if not r.divergences:
            print(f"  no divergence (rtol {args.rtol:g}, atol {args.atol:g})")
            continue
        print(f"  first divergence at step {r.first.step}; per tensor and statistic:")
        width = max(len(d.tensor) for d in r.divergences[: args.limit])
        for d in r.divergences[: args.limit]:
            print(f"  step {d.step:>8}  {d.mode:<7} {d.mode_step:>8}  {d.tensor:<{width}}  {d.statistic:<12} "
                  f"{d.worker}  {d.reference:.9g} -> {d.other:.9g}  ({d.differing} of {d.compared} differ)")
        if len(r.divergences) > args.limit:
            print(f"  ... and {len(r.divergences) - args.limit} more (--limit, --json)")
    return 1 if diverged else 0
