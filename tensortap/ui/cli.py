"""The `tensortap ui` and `tensortap report` subcommands (wired into tensortap.cli.main)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tensortap.ui.server import DEFAULT_HOST, DEFAULT_PORT


def add_ui_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("ui", help="a live local dashboard of one or more jobs (http://127.0.0.1:6007/)")
    p.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="jobs' out_dirs (local paths or s3:// URLs)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to listen on (default 127.0.0.1; anything else exposes the data, with a warning)")
    return p


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="write a self-contained offline HTML report of one or more jobs")
    p.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="jobs' out_dirs (local paths or s3:// URLs)")
    p.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    p.add_argument("--distribution", action="append", default=None, metavar="REGEX",
                   help="draw the distributions of the tensors whose names match REGEX (repeatable; default: "
                        "the tensors the rules named where they fired, then the largest gradient norms, 3 per job)")
    return p


def _check(paths: list[str]) -> None:
    for p in paths:
        if "://" not in p and not os.path.isdir(p):
            raise FileNotFoundError(f"{p}: no such directory")


def _need_flask() -> None:
    """The dashboard's web stack (the report needs none: plotly.js is vendored in tensortap/ui/static/)."""
    try:
        import flask  # noqa: F401
    except ImportError:
        raise ValueError("flask not installed: pip install 'tensortap[ui]'") from None


def run_ui(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be 0..65535")
    _check(args.out_dirs)
    _need_flask()
    from tensortap.ui.server import serve

    return serve(args.out_dirs, args.host, args.port)


def run_report(args: argparse.Namespace) -> int:
    from tensortap.ui.report import check_distributions, write_report

    check_distributions(getattr(args, "distribution", None))
    _check(args.out_dirs)
    size = write_report(args.out_dirs, args.output, getattr(args, "distribution", None))
    print(f"tensortap report: wrote {args.output} ({size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
