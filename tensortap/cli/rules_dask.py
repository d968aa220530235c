"""`tensortap rules run 'runs/*' --rule ... --dask ADDRESS`: rules over many jobs at once on a Dask cluster."""

from __future__ import annotations

import argparse
import json
import sys


def run_on_cluster(args: argparse.Namespace) -> int:
    import os

    from tensortap.dask import run_rules
    from tensortap.runner.spec import parse_rule, parse_rule_file

    specs = [parse_rule(r) for r in args.rule] + [parse_rule_file(r) for r in args.rule_file]
    for s in specs:
        if s.file:  # the cluster's workers load it by path
            s.file = os.path.abspath(s.file)
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ValueError("--dask needs dask.distributed: pip install 'dask[distributed]'") from None
    result = run_rules(args.out_dir, specs, client=args.dask)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return result["exit_status"]
    for out_dir, rules in result["jobs"].items():
        for r in rules:
            print(f"[tensortap] {out_dir}: {r['name']}: {r['status']}"
                  + (f" (first at step {r['first_step']})" if r["first_step"] is not None else "")
                  + (f": {r['message']}" if r["status"] in ("IssuesFound", "Error", "NoData") and r["message"]
                     else ""), file=sys.stderr)
    return result["exit_status"]
