"""`tensortap` console script: subcommands over saved jobs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from tensortap.trials.trial import Trial


def _summarize(trial: Trial) -> dict[str, Any]:
    steps = trial.steps(show_incomplete_steps=True)
    modes = {}
    for m in trial.modes():
        ms = trial.steps(m, show_incomplete_steps=True)
        modes[m.name] = {"count": len(ms), "first": ms[0] if ms else None, "last": ms[-1] if ms else None}
    tensors = {}
    for name in trial.tensor_names():
        ts = trial.tensor(name).steps(show_incomplete_steps=True)
        tensors[name] = {"count": len(ts), "steps": ts}
    return {
        "path": trial.path,
        "format": type(trial.source).__name__.replace("Source", "").lower(),
        "workers": trial.workers(),
        "num_workers": trial.num_workers,
        "ended": trial.loaded_all_steps,
        "steps": {"count": len(steps), "first": steps[0] if steps else None, "last": steps[-1] if steps else None},
        "modes": modes,
        "collections": {
            name: sorted(trial.tensor_names(collection=name)) for name in sorted(trial.collections())
        },
        "tensors": tensors,
    }


def _compact_steps(steps: list[int]) -> str:
    """1,2,3,5,7,9 -> '1-3, 5-9/2' style ranges, short for long step lists."""
    if not steps:
        return "-"
    out = []
    i = 0
    while i < len(steps):
        j = i
        if i + 1 < len(steps):
            d = steps[i + 1] - steps[i]
            while j + 1 < len(steps) and steps[j + 1] - steps[j] == d:
                j += 1
            if j - i >= 2:
                out.append(f"{steps[i]}-{steps[j]}" + (f"/{d}" if d != 1 else ""))
                i = j + 1
                continue
        out.append(str(steps[i]))
        i += 1
    return ", ".join(out)


def cmd_ls(args: argparse.Namespace) -> int:
    import os

    from tensortap.trials import create_trial

    if "://" not in args.out_dir and not os.path.isdir(args.out_dir):
        raise FileNotFoundError(f"{args.out_dir}: no such directory")
    trial = create_trial(args.out_dir)
    info = _summarize(trial)
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    p = print
    s = info["steps"]
    p(f"{info['path']}  ({info['format']} format, {'ended' if info['ended'] else 'running or interrupted'})")
    p(f"workers: {', '.join(info['workers']) or '-'}  (expected: {info['num_workers']})")
    p(f"steps:   {s['count']} saved, global {s['first']}..{s['last']}")
    for m, d in info["modes"].items():
        p(f"  {m:<8} {d['count']} steps, {d['first']}..{d['last']}")
    p("collections:")
    for c, names in info["collections"].items():
        p(f"  {c:<20} {len(names)} tensors")
    p("tensors:")
    width = max((len(n) for n in info["tensors"]), default=10)
    for n, d in info["tensors"].items():
        p(f"  {n:<{width}}  {d['count']:>6} steps  {_compact_steps(d['steps'])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensortap", description="Inspect and debug training jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list what a job saved: workers, modes, steps, collections, tensors")
    ls.add_argument("out_dir", help="the job's out_dir (local path or s3://bucket/prefix)")
    ls.add_argument("--json", action="store_true", help="print one JSON document")
    ls.set_defaults(func=cmd_ls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from tensortap.exceptions import TensorTapError

    try:
        return int(args.func(args) or 0)
    except (TensorTapError, ValueError, FileNotFoundError) as e:
        print(f"tensortap: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
