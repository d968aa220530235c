"""`tensortap export OUT_DIR... --parquet DEST`: jobs into a Parquet dataset DuckDB, Polars and Spark read directly."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the `export` subcommand on the console script's subparsers."""
    p = sub.add_parser(
        "export", help="export jobs into Hive-partitioned Parquet (DuckDB, Polars, Spark read it directly)",
        description="Export the jobs at OUT_DIR... (tensortap or smdebug; local, globs such as 'runs/*', or "
        "s3://) into a Parquet dataset at DEST (local or s3://): scalars/, tensors/ and events/ tables, "
        "partitioned by job, worker and step block (schema: docs/export.md). Exporting again into the same DEST "
        "appends only the steps completed since (the state is kept in DEST/_tensortap/export.json).",
    )
    p.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="a job's out_dir (local path, glob or s3://)")
    p.add_argument("--parquet", required=True, metavar="DEST", help="where the dataset goes (directory or s3://)")
    p.add_argument("--job-name", action="append", default=[], metavar="NAME",
                   help="the job column's value for each OUT_DIR in order (default: the out_dir's last path part)")
    p.add_argument("--table", action="append", choices=["scalars", "tensors", "events"], default=[],
                   help="export only these tables (repeatable; default: all three)")
    p.add_argument("--step-block", type=int, help="global steps per step_block partition (default 10000; fixed "
                   "by the first export into DEST)")
    p.add_argument("--max-elements", type=int, default=4096,
                   help="raw tensors with more elements are exported as a pointer into the store (default 4096)")
    p.add_argument("--full", action="store_true", help="delete what DEST holds of these jobs and export them anew")
    p.add_argument("--all", action="store_true", dest="assume_ended",
                   help="also export steps not every worker finished (a job that was interrupted)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.description = textwrap.fill(p.description or "", 100)  # kept as written under an examples epilog
    p.set_defaults(func=cmd_export)
    return p


def cmd_export(args: argparse.Namespace) -> int:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("tensortap export needs pyarrow: pip install 'tensortap[export]'") from None
    from tensortap.export import export

    summary = export(args.out_dirs, args.parquet, job_names=args.job_name or None,
                     tables=args.table or ("scalars", "tensors", "events"), step_block=args.step_block,
                     max_elements=args.max_elements, full=args.full,
                     assume_ended=args.assume_ended)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for job, d in summary["jobs"].items():
        r = d["rows"]
        rows = ", ".join(f"{n} {t} rows" for t, n in r.items())
        print(f"{job}: {rows or 'nothing new'}; exported up to step {d['exported_upto']}"
              f"{'' if d['ended'] else ' (job still running: run again to add what comes)'}")
    print(f"-> {summary['dest']}")
    return 0
