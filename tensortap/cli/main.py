"""`tensortap` console script: subcommands over saved jobs."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from tensortap.cli.errors import storage_error_line
from tensortap.trials.trial import Trial


def _summarize(trial: Trial) -> dict[str, Any]:
    steps = trial.steps(show_incomplete_steps=True)
    modes = {}
    for m in trial.modes():
        ms = trial.steps(m, show_incomplete_steps=True)
        modes[m.name] = {"count": len(ms), "first": ms[0] if ms else None, "last": ms[-1] if ms else None}
    tensors = {}
    for name in trial.tensor_names():
        t = trial.tensor(name)
        tensors[name] = _step_summary(t.steps(show_incomplete_steps=True))
        # each mode counts its own steps (smdebug's mode steps): a TRAIN step every 10 and an EVAL pass
        # per epoch read as two regular series, where their global steps interleave irregularly
        tensors[name]["modes"] = {
            m.name: _step_summary(ms) for m in trial.modes() if (ms := t.steps(m, show_incomplete_steps=True))
        }
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


def _step_summary(steps: list[int]) -> dict[str, Any]:
    """{count, first, last, interval}: interval is the gap between consecutive steps when they are evenly
    spaced, else None (and `gaps` gives the smallest and largest gap)."""
    out: dict[str, Any] = {"count": len(steps), "first": steps[0] if steps else None,
                           "last": steps[-1] if steps else None, "interval": None}
    if len(steps) >= 2:
        gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
        if len(gaps) == 1:
            out["interval"] = gaps.pop()
        else:
            out["gaps"] = [min(gaps), max(gaps)]
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _steps_text(d: dict[str, Any]) -> str:
    if not d["count"]:
        return "-"
    if d["count"] == 1:
        return f"1 step   {d['first']}"
    if d["interval"] is not None:
        every = f"every {d['interval']}"
    else:
        every = f"irregular (gaps {d['gaps'][0]}..{d['gaps'][1]})"
    return f"{_plural(d['count'], 'step')}  {d['first']}..{d['last']}, {every}"


def cmd_ls(args: argparse.Namespace) -> int:

    from tensortap.trials import create_trial

    _check_job_dir(args.out_dir)
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
    p(f"steps:   {s['count']} saved (global steps {s['first']}..{s['last']}); each mode counts its own:"
      if s["count"] != 1 else f"steps:   1 saved (global step {s['first']})")
    for m, d in info["modes"].items():
        span = f"{d['first']}" if d["count"] == 1 else f"{d['first']}..{d['last']}"
        p(f"  {m:<8} {_plural(d['count'], 'step')}, {span}")
    shown = {c: names for c, names in info["collections"].items() if names or args.all}
    hidden = len(info["collections"]) - len(shown)
    p("collections:" + (f"  ({hidden} without tensors not shown: --all lists them)" if hidden else ""))
    for c, names in shown.items():
        p(f"  {c:<20} {_plural(len(names), 'tensor')}")
    modes = list(info["modes"])
    if not info["tensors"]:
        p("tensors: none")
        return 0
    # one column per mode, each in that mode's own steps (smdebug's mode steps)
    width = max(len(n) for n in info["tensors"])
    cells = {n: [_steps_text(d["modes"][m]) if m in d["modes"] else "-" for m in modes]
             for n, d in info["tensors"].items()}
    widths = [max([len(m + " steps")] + [len(c[i]) for c in cells.values()]) for i, m in enumerate(modes)]
    p(f"{'tensors:':<{width + 2}}  " + "   ".join(f"{m + ' steps':<{w}}" for m, w in zip(modes, widths, strict=True))
      .rstrip())
    for n, row in cells.items():
        p(f"  {n:<{width}}  " + "   ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _check_job_dir(out_dir: str) -> None:
    """`out_dir` must hold a job's data (tensortap's or smdebug's); a one-line error otherwise."""
    import os

    from tensortap.exceptions import InvalidConfiguration
    from tensortap.format.native import is_native_out_dir
    from tensortap.format.smdebug import is_smdebug_out_dir
    from tensortap.storage import open_storage

    if "://" not in out_dir:
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise InvalidConfiguration(f"{out_dir}: not a directory")
        if not os.path.isdir(out_dir):
            raise InvalidConfiguration(f"{out_dir}: no such directory")
    from tensortap.runner.run import check_bucket

    storage = open_storage(out_dir)
    if not (is_native_out_dir(storage) or is_smdebug_out_dir(storage)):
        check_bucket(storage)  # a missing bucket is said as such
        raise InvalidConfiguration(f"{out_dir}: not a job's out_dir (it holds no tensortap or smdebug data)")


def _add_rule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rule", action="append", default=[], metavar="NAME[:k=v,...]",
                   help="a built-in rule by snake_case or class name, with parameters (repeatable)")
    p.add_argument("--rule-file", action="append", default=[], metavar="FILE.py:Class[:k=v,...]",
                   help="a rule class from your own file (repeatable)")
    p.add_argument("--json", action="store_true", help="print one final JSON document")


def _spec_from_args(args: argparse.Namespace, command: list[str]) -> Any:
    from tensortap.runner.spec import (
        JobSpec,
        load_job_file,
        merge_job_file,
        parse_collection,
        parse_rule,
        parse_rule_file,
    )

    spec = JobSpec(out_dir=getattr(args, "out_dir", None) or "", command=command)
    spec.json_output = args.json
    if getattr(args, "save_interval", None) is not None:
        if args.save_interval <= 0:
            raise ValueError(f"--save-interval {args.save_interval}: must be a positive integer")
        spec.save_interval = args.save_interval
    for c in getattr(args, "collection", []):
        name, params = parse_collection(c)
        spec.collections[name] = params
    spec.rules = [parse_rule(r) for r in args.rule] + [parse_rule_file(r) for r in args.rule_file]
    if getattr(args, "stop_on_issue", False):
        spec.stop_on_issue = True
    if getattr(args, "grace_period", None) is not None:
        spec.grace_period = args.grace_period
    if getattr(args, "tensorboard_dir", None):
        spec.tensorboard_dir = os.path.abspath(args.tensorboard_dir)
    if getattr(args, "no_flight_recorder", False):
        spec.flight_recorder = False
    if getattr(args, "config", None):
        merge_job_file(spec, load_job_file(args.config))
    return spec


def cmd_run(args: argparse.Namespace) -> int:
    from tensortap.runner.run import run_job

    return run_job(_spec_from_args(args, args.training_command))


def cmd_rules_list(args: argparse.Namespace) -> int:
    from tensortap.rules.builtin import describe_rules

    rules = describe_rules()
    if args.json:
        json.dump(rules, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    for r in rules:
        params = ", ".join(
            p["name"] + ("" if p["required"] else f"={p['default']!r}") for p in r["parameters"]
        )
        print(f"{r['snake_name']:<32} {r['description']}")
        if r.get("compares"):
            print(f"{'':<32} compares: {r['compares']}")
        print(f"{'':<32} parameters: {params or '-'}")
        print(f"{'':<32} reads: {', '.join(r['collections']) or 'the collections you name'}")
    return 0


def cmd_rules_run(args: argparse.Namespace) -> int:

    from tensortap.runner.run import run_rules_offline

    if args.dask:
        from tensortap.cli.rules_dask import run_on_cluster

        return run_on_cluster(args)
    _check_job_dir(args.out_dir)
    return run_rules_offline(_spec_from_args(args, []))


def cmd_diagnose(args: argparse.Namespace) -> int:
    """What went wrong in a job, on one screen; also written to OUT_DIR/diagnosis.md. Exit status 0 when
    nothing was found, 1 when something was, 2 on error."""
    from tensortap.analysis.diagnose import DIAGNOSIS_KEY, diagnose
    from tensortap.storage import open_storage
    from tensortap.trials import create_trial

    _check_job_dir(args.out_dir)
    d = diagnose(create_trial(args.out_dir), rules=not args.no_rules)
    text = d.to_text()
    open_storage(args.out_dir).write(DIAGNOSIS_KEY, text.encode("utf-8"))
    if args.json:
        sys.stdout.write(d.to_json() + "\n")
    else:
        sys.stdout.write(text)
    return 1 if d.findings else 0


def cmd_ui(args: argparse.Namespace) -> int:
    from tensortap.ui.cli import run_ui

    return run_ui(args)


def cmd_report(args: argparse.Namespace) -> int:
    from tensortap.ui.cli import run_report

    _check_output_file(args.output, "-o")
    for out_dir in args.out_dirs:
        _check_job_dir(out_dir)
    try:
        return run_report(args)
    except OSError as e:
        if str(e.filename or "").startswith(args.output):  # the report or its temporary file beside it
            raise InvalidOutput(f"-o {args.output!r}: cannot write it ({e.strerror}): name a file in a "
                                f"writable directory") from None
        raise


class InvalidOutput(ValueError):
    """A file the command was asked to write cannot be written."""


def _check_output_file(path: str, option: str) -> None:
    """`path` can be created: its directory exists and is writable, and it is not a directory."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidOutput(f"{option} {path!r} is a directory: name the file to write, e.g. {option} report.html")
    if not os.path.isdir(d):
        raise InvalidOutput(f"{option} {path!r}: no such directory {d!r}: create it, or name a file in an "
                            f"existing directory")
    if not os.access(d, os.W_OK):
        raise InvalidOutput(f"{option} {path!r}: directory {d!r} is not writable: name a file in a writable "
                            f"directory")


class _Parser(argparse.ArgumentParser):
    """Errors in one line that names the bad value (argparse's own message) and where the usage is."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: one example per subcommand, shown by `tensortap --help` and by the subcommand's --help
EXAMPLES = {
    "ls": ["tensortap ls runs/job1", "tensortap ls s3://bucket/jobs/job1 --json"],
    "run": ["tensortap run --out-dir runs/job1 --rule vanishing_gradient \\\n"
            "      --rule loss_not_decreasing:num_steps=20 --stop-on-issue -- python train.py --epochs 3"],
    "rules": ["tensortap rules list", "tensortap rules run runs/job1 --rule exploding_tensor"],
    "diagnose": ["tensortap diagnose runs/job1            # also writes runs/job1/diagnosis.md"],
    "ui": ["tensortap ui runs/job1 runs/job2        # then open http://127.0.0.1:6007/"],
    "report": ["tensortap report runs/job1 runs/job2 -o report.html"],
    "tensorboard": ["tensortap tensorboard runs/job1 --logdir tb/job1   # then: tensorboard --logdir tb",
                    "tensortap tensorboard runs/job1 --serve --follow"],
    "export": ["tensortap export 'runs/*' --parquet lake/   # then: read_parquet('lake/scalars/**/*.parquet', ...)"],
    "compare": ["tensortap compare runs/baseline runs/candidate --tensor loss"],
}


def _examples(*names: str) -> str:
    lines = [e for n in names for e in EXAMPLES[n]]
    return ("example:\n" if len(lines) == 1 else "examples:\n") + "\n".join("  " + x for x in lines)


def _with_examples(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    p.epilog = _examples(name)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def build_parser() -> argparse.ArgumentParser:
    from tensortap import __version__

    parser = _Parser(prog="tensortap", description="Inspect and debug training jobs.",
                     epilog=_examples(*EXAMPLES), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tensortap {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ls = sub.add_parser("ls", help="list what a job saved: workers, modes, steps, collections, tensors")
    ls.add_argument("out_dir", help="the job's out_dir (local path or s3://bucket/prefix)")
    ls.add_argument("--json", action="store_true", help="print one JSON document")
    ls.add_argument("--all", action="store_true", help="also list collections that hold no tensor")
    ls.set_defaults(func=cmd_ls)
    _with_examples(ls, "ls")

    run = sub.add_parser(
        "run", help="run a training command with tensortap capture and real-time rules",
        usage="tensortap run --out-dir DIR [options] -- COMMAND [ARGS...]",
    )
    run.add_argument("--out-dir", help="where the job's data goes (local directory or s3://bucket/prefix)")
    run.add_argument("--collection", action="append", default=[], metavar="NAME[:k=v,...]",
                     help="a collection to save, with settings such as save_interval=5 (repeatable)")
    run.add_argument("--save-interval", type=int, help="default save interval of every collection")
    run.add_argument("--stop-on-issue", action="store_true", help="stop training when a rule finds an issue")
    run.add_argument("--grace-period", type=float, help="seconds training may take to stop before it is killed")
    run.add_argument("--config", help="a YAML or JSON job file with the same settings")
    run.add_argument("--tensorboard-dir", help="also write TensorBoard event files there, live")
    run.add_argument("--no-flight-recorder", action="store_true",
                     help="turn the flight recorder off (the last 256 steps' statistics of every tensor, written "
                          "with an incident when training goes wrong; also TENSORTAP_FLIGHT=0)")
    _add_rule_args(run)
    run.set_defaults(func=cmd_run)
    _with_examples(run, "run")

    rules = _with_examples(sub.add_parser("rules", help="built-in rules: list them, or run them on a saved job"),
                           "rules")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    rl = rsub.add_parser("list", help="every built-in rule with its parameters and defaults")
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(func=cmd_rules_list)
    rr = rsub.add_parser("run", help="evaluate rules on a finished or running job")
    rr.add_argument("out_dir", help="the job's out_dir; with --dask also a glob of jobs ('runs/*')")
    rr.add_argument("--dask", metavar="ADDRESS", help="evaluate on every job matched at once, on this Dask cluster")
    _add_rule_args(rr)
    rr.set_defaults(func=cmd_rules_run)

    dg = sub.add_parser("diagnose", help="what went wrong: rules that fired, the first non-finite value, spikes, "
                                         "plateaus, diverging workers, and what to try (writes OUT_DIR/diagnosis.md)")
    dg.add_argument("out_dir", help="the job's out_dir (local path or s3://bucket/prefix)")
    dg.add_argument("--json", action="store_true", help="print one JSON document")
    dg.add_argument("--no-rules", action="store_true",
                    help="do not run the built-in rules the job does not record (faster on a large job)")
    dg.set_defaults(func=cmd_diagnose)
    _with_examples(dg, "diagnose")

    from tensortap.ui.cli import add_report_parser, add_ui_parser

    _with_examples(add_ui_parser(sub), "ui").set_defaults(func=cmd_ui)
    _with_examples(add_report_parser(sub), "report").set_defaults(func=cmd_report)
    from tensortap.tensorboard.cli import add_parser as add_tensorboard_parser

    _with_examples(add_tensorboard_parser(sub), "tensorboard")
    from tensortap.cli import compare, export

    _with_examples(export.add_parser(sub), "export")
    _with_examples(compare.add_parser(sub), "compare")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argparse, with the commonest slip said plainly: a training command without the `--` before it."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        words = [w for w in extra if not w.startswith("-")]
        if args.command == "run" and words:
            first = argv.index(words[0])  # the training command starts at its first word
            rest = argv[first:]
            given = " ".join(shlex.quote(a) for a in argv[:first])
            parser.exit(2, f"tensortap run: error: {' '.join(rest)!r} is not an option of tensortap run: write the "
                           f"training command after --: tensortap {given} -- {' '.join(rest)}\n")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _urls(args: argparse.Namespace) -> list[str]:
    out = [getattr(args, "out_dir", None), *(getattr(args, "out_dirs", None) or [])]
    return [u for u in out if isinstance(u, str)]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # everything after -- is the training command, untouched
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args = _parse(parser, argv)
    args.training_command = command
    from tensortap.exceptions import TensorTapError

    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # the reader of our output went away (`tensortap ls --json | head`): end quietly
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (TensorTapError, ValueError, OSError) as e:
        msg = str(e) if not isinstance(e, OSError) or not e.strerror else f"{e.filename or ''}: {e.strerror}"
        return _fail(args, storage_error_line(e, _urls(args)) or msg)
    except Exception as e:
        line = storage_error_line(e, _urls(args))
        if line is None:
            raise  # a defect: its traceback is what a bug report needs
        return _fail(args, line)


def _fail(args: argparse.Namespace, msg: str) -> int:
    print(f"tensortap: error: {msg}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": msg}))
    return 2


if __name__ == "__main__":
    sys.exit(main())
