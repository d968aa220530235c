"""`tensortap tensorboard OUT_DIR --logdir DIR [--follow] [--serve]`: a saved or live job in TensorBoard."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

DEFAULT_PORT = 6006


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the `tensorboard` subcommand on the console script's subparsers."""
    p = sub.add_parser(
        "tensorboard",
        help="convert a saved job (tensortap or smdebug, local or s3://) into TensorBoard event files",
        description="Convert the job at OUT_DIR into TensorBoard event files under --logdir. Only steps not "
        "converted before are added (the state is kept in the logdir), so running it again, or --follow on a "
        "live job, appends new steps without rewriting anything.",
    )
    p.add_argument("out_dir", help="the job's out_dir (local path or s3://bucket/prefix)")
    p.add_argument("--logdir", help="where the event files go (a local directory; with --serve, a temporary "
                   "directory by default)")
    p.add_argument("--follow", action="store_true",
                   help="keep converting new steps of a live job until it ends (Ctrl-C stops)")
    p.add_argument("--all", action="store_true", dest="assume_ended",
                   help="also convert steps not every worker has finished (a job that was interrupted)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between looks at a live job (--follow)")
    p.add_argument("--serve", action="store_true",
                   help="also start TensorBoard on 127.0.0.1 (needs: pip install 'tensortap[tensorboard]')")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TensorBoard's port (default {DEFAULT_PORT})")
    p.set_defaults(func=cmd_tensorboard)
    return p


def tensorboard_command(logdir: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command that starts TensorBoard on `logdir`; ValueError naming the extra when it is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError("--serve needs TensorBoard: pip install 'tensortap[tensorboard]'")
    return [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", host, "--port", str(port),
            "--reload_interval", "1"]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def cmd_tensorboard(args: argparse.Namespace) -> int:
    from tensortap.tensorboard.convert import ConvertResult, convert

    if args.interval <= 0:
        raise ValueError(f"--interval {args.interval}: must be a positive number of seconds")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be in 0..65535")
    logdir = args.logdir
    if logdir is not None and os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ValueError(f"--logdir {logdir!r} is a file: name a directory (it is created if missing)")
    temporary = logdir is None
    if temporary:
        if not args.serve:
            raise ValueError("give --logdir DIR (where the event files go), or --serve")
        logdir = tempfile.mkdtemp(prefix="tensortap-tensorboard-")
    out_dir = args.out_dir if "://" in args.out_dir else os.path.abspath(args.out_dir)

    def report(r: ConvertResult) -> None:
        if r.steps:
            print(f"converted {r.steps} steps ({r.records} tensors) up to step {r.converted_upto} "
                  f"in {r.seconds:.2f}s -> {logdir}", flush=True)
        if r.ended:
            print("the job has ended: everything is converted", flush=True)

    server = None
    try:
        if args.serve:
            cmd = tensorboard_command(logdir, args.port)
            total = convert(out_dir, logdir, assume_ended=args.assume_ended, on_progress=report)
            signal.signal(signal.SIGTERM, _interrupt)  # stop TensorBoard too when this command is stopped
            server = subprocess.Popen(cmd)
            print(f"TensorBoard: http://127.0.0.1:{args.port}/ (Ctrl-C stops)", flush=True)
            if args.follow and not total.ended:
                convert(out_dir, logdir, follow=True, poll_interval=args.interval, on_progress=report,
                        should_stop=lambda: server.poll() is not None)
            while server.poll() is None:
                time.sleep(0.5)
            return 0 if server.returncode in (0, None) else 2
        total = convert(out_dir, logdir, follow=args.follow, assume_ended=args.assume_ended,
                        poll_interval=args.interval, on_progress=report)
        if not total.steps:
            print(f"nothing new to convert (converted up to step {total.converted_upto}) -> {logdir}")
        if total.skipped_values or total.damaged_index:
            print(f"skipped damaged data (each place listed above): {total.skipped_values} value(s), "
                  f"{total.damaged_index} place(s) in index files; everything else readable is converted",
                  file=sys.stderr, flush=True)
        if total.waiting and not total.ended:
            print(f"{total.waiting} saved steps are not complete yet (the job is running, or was interrupted): "
                  "--follow converts them as they complete, --all converts them now")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        if temporary:
            shutil.rmtree(logdir, ignore_errors=True)
