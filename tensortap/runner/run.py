"""`tensortap run`: start the training command with capture configured, run each rule in its own process
beside it, show their status live, stop the job when a rule fires (if asked), and report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.runner import status as st
from tensortap.runner.spec import JobSpec, RuleSpec
from tensortap.transport import ONE_BLAS_THREAD

BOOTSTRAP_DIR = os.path.join(os.path.dirname(__file__), "bootstrap")
KILL_WAIT = 10.0  # seconds between SIGTERM and SIGKILL
RULES_STOP_WAIT = 2.0  # seconds the rules may take to write Stopped and exit before training is interrupted
INTERRUPT_WAIT = 10.0  # seconds training may take to unwind after SIGINT before it gets SIGTERM
PROGRESS_INTERVAL = 5.0  # seconds between progress lines when stdout is not a terminal
#: signals that stop a run as Ctrl-C does (`timeout`, `docker stop`, Kubernetes and SLURM send SIGTERM; a
#: closed terminal SIGHUP)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RULES_READY_WAIT = 60.0  # seconds training waits for the rule processes to be ready
RULES_SETTLE = 120.0  # seconds rules may take to finish after training ended

#: exit statuses of `tensortap run` / `tensortap rules run`, most serious first
EXIT_FAILED = 2  # training failed, a rule errored, the run was interrupted, or the command line was wrong
EXIT_ISSUES = 1  # a rule found an issue
EXIT_NO_DATA = 3  # no rule found an issue, but some rule saw no data (NoData): not a clean bill of health
EXIT_CLEAR = 0  # every rule evaluated data and found no issue


@dataclass
class RuleProc:
    label: str
    spec: RuleSpec
    proc: subprocess.Popen | None = None
    status: dict[str, Any] = field(default_factory=lambda: {"status": st.IN_PROGRESS})
    final_at: float | None = None  # when the runner first saw the rule's final status (monotonic)


def _labels(rules: list[RuleSpec]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for r in rules:
        base = r.label
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return out


def validate(spec: JobSpec) -> None:
    """Fail before anything starts: unknown rules, bad parameters, an out_dir that already holds a job."""
    from tensortap.runner.rule_worker import build_rule
    from tensortap.storage import check_access, open_storage
    from tensortap.trials import create_trial

    if not spec.command:
        raise InvalidConfiguration("no training command: write it after --, e.g. tensortap run ... -- python train.py")
    if not spec.out_dir:
        raise InvalidConfiguration("--out-dir is required (a local directory or s3://bucket/prefix)")
    check_command(spec.command)
    if spec.include_workers not in ("one", "all"):
        raise InvalidConfiguration(f"include_workers={spec.include_workers!r}: allowed are 'one' and 'all'")
    local = "://" not in spec.out_dir
    if local:
        check_local_out_dir(spec.out_dir, create=False)
    check_access(spec.out_dir)  # an object store: reachable, a valid bucket, credentials accepted
    storage = open_storage(spec.out_dir)
    if not local:
        check_bucket(storage)  # the bucket exists and is ours: the rules read it from their first step
    if storage.list("tensortap/") or storage.list("rules/"):
        raise InvalidConfiguration(f"--out-dir {spec.out_dir!r} already holds a job: use a new directory")
    check_collections(spec)
    with tempfile.TemporaryDirectory() as empty:
        # A local out_dir the job has not created yet: check the rules against an empty job (nothing is
        # created before validation passes).
        missing = storage.supports_append and not os.path.isdir(storage.url)
        trial = create_trial(empty if missing else spec.out_dir)
        for r in spec.rules:
            build_rule(r, trial)  # parses the parameters: errors name the rule, parameter and value
    if local:
        check_local_out_dir(spec.out_dir, create=True)  # a refused job leaves no directory behind
    # Last: a run started at the same time on this out_dir passed the checks above too; the claim lets exactly
    # one go on, and a refused run starts nothing and writes nothing here.
    st.claim_run(storage, spec.out_dir)


def check_bucket(storage: Any) -> None:
    """An object store's bucket exists and these credentials may use it (botocore's error otherwise, which the
    CLI says in one line); nothing for a local directory."""
    client, bucket = getattr(storage, "client", None), getattr(storage, "bucket", None)
    if client is not None and bucket:
        client.head_bucket(Bucket=bucket)


def check_command(command: list[str]) -> None:
    """The training command's program exists and may be executed (nothing has started yet)."""
    import shutil

    prog = command[0]
    if os.sep in prog:
        if not os.path.isfile(prog):
            raise InvalidConfiguration(f"training command {prog!r}: no such file")
        if not os.access(prog, os.X_OK):
            raise InvalidConfiguration(f"training command {prog!r}: not executable (chmod +x it, or run it "
                                       f"with its interpreter, e.g. -- python {prog})")
    elif shutil.which(prog) is None:
        raise InvalidConfiguration(f"training command {prog!r}: not found on PATH (write the program to run, "
                                   f"e.g. -- python train.py)")


def _is_job_dir(p: str) -> bool:
    """`p` holds a job's data: tensortap's store (a worker folder with an index file under tensortap/; a folder
    merely named tensortap, such as this package's source, is not one), or an smdebug out_dir (events/ beside
    collections/ or index/)."""
    j = os.path.join
    if os.path.isdir(j(p, "events")) and (os.path.isdir(j(p, "collections")) or os.path.isdir(j(p, "index"))):
        return True
    root = j(p, "tensortap")
    try:
        workers = [j(root, w) for w in os.listdir(root)] if os.path.isdir(root) else []
        return any(os.path.isdir(w) and any(f.endswith(".idx") for f in os.listdir(w)) for w in workers)
    except OSError:
        return False


def check_local_out_dir(out_dir: str, create: bool = True) -> None:
    """A local out_dir must be a directory we can create and write (tried with `create`), and not lie inside
    another job's data."""
    p = os.path.abspath(out_dir)
    if os.path.exists(p) and not os.path.isdir(p):
        raise InvalidConfiguration(f"--out-dir {out_dir!r} is a file, not a directory")
    anc = os.path.dirname(p)
    while anc != os.path.dirname(anc):
        if os.path.exists(anc) and not os.path.isdir(anc):
            raise InvalidConfiguration(f"--out-dir {out_dir!r}: {anc!r} is a file, not a directory")
        if _is_job_dir(anc):
            raise InvalidConfiguration(f"--out-dir {out_dir!r} lies inside the data of another job ({anc}): "
                                       f"choose a directory outside it")
        anc = os.path.dirname(anc)
    if not create:
        return
    try:
        os.makedirs(p, exist_ok=True)
        probe = os.path.join(p, f".tensortap-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.remove(probe)
    except OSError as e:
        raise InvalidConfiguration(f"--out-dir {out_dir!r} is not writable: {e.strerror or e}") from None


def check_collections(spec: JobSpec) -> None:
    """Every --collection is a built-in collection, one a rule of the job reads, or defined by include_regex."""
    from tensortap.collection import CollectionKeys
    from tensortap.runner.hook_config import rule_collections

    known = {v for k, v in vars(CollectionKeys).items() if k.isupper() and isinstance(v, str)}
    known |= set(rule_collections(spec))
    for name, params in spec.collections.items():
        if name not in known and not params.get("include_regex"):
            raise InvalidConfiguration(
                f"--collection {name!r}: no such collection; built-in ones are {', '.join(sorted(known))}; "
                f"define a new one with --collection {name}:include_regex=REGEX")


def _rich_console() -> Any | None:
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def _table(rules: list[RuleProc], training: str) -> Any:
    from rich.table import Table

    t = Table(title=f"tensortap rules — training: {training}", expand=False)
    for col in ("rule", "status", "last step", "first step fired", "message"):
        t.add_column(col)
    colours = {st.ISSUES_FOUND: "red", st.NO_ISSUES_FOUND: "green", st.ERROR: "magenta", st.IN_PROGRESS: "cyan",
               st.NO_DATA: "yellow"}
    def cell(v: Any) -> str:
        return "-" if v is None else str(v)

    for r in rules:
        s = r.status
        status = s.get("status", st.IN_PROGRESS)
        t.add_row(r.label, f"[{colours.get(status, 'white')}]{status}[/]", cell(s.get("last_step")),
                  cell(s.get("first_step")), str(s.get("message", ""))[:70])
    return t


class Runner:
    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.labels = _labels(spec.rules)
        self.rules = [RuleProc(label, r) for label, r in zip(self.labels, spec.rules, strict=True)]
        self.training: subprocess.Popen | None = None
        self.training_exit: int | None = None
        self.stopped_by: str | None = None
        self.stop_requested_at: float | None = None
        self.interrupted = False
        self.signal_name: str | None = None  # the signal that interrupted the run
        self._stopping = False  # the run is being stopped: a second signal kills at once
        self._starting_child = False
        self.console = None if spec.json_output else _rich_console()
        self.tmp = tempfile.mkdtemp(prefix="tensortap-run-")
        self.offline = False
        self.started_at = time.monotonic()
        self.rules_started_at: float | None = None
        self.training_started_at: float | None = None
        self.training_ended_at: float | None = None
        self._last_progress = time.monotonic()
        self._progress_trial: Any = None

    # --- output ---------------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        stream = sys.stderr if self.spec.json_output else sys.stdout
        try:
            if self.console is not None:
                self.console.print(msg, markup=False, highlight=False)
            else:
                print(msg, file=stream, flush=True)
        except OSError:  # the terminal went away (SIGHUP) or the reader closed the pipe: stopping matters more
            pass

    def _pump(self, pipe: Any) -> None:
        """Training output, passed through (above the live table on a terminal)."""
        for line in iter(pipe.readline, ""):
            line = line.rstrip("\n")
            if self.console is not None:
                self.console.print(line, markup=False, highlight=False)
            else:
                print(line, file=sys.stderr if self.spec.json_output else sys.stdout, flush=True)
        pipe.close()

    # --- processes ------------------------------------------------------------------------------

    def _child_env(self, config_path: str) -> dict[str, str]:
        env = dict(os.environ)
        env["TENSORTAP_CONFIG"] = config_path
        env["TENSORTAP_AUTO"] = "1"
        if not self.spec.flight_recorder:
            env["TENSORTAP_FLIGHT"] = "0"
        if self.spec.rules:  # rules watch live: the hook makes its data visible sooner (docs/format.md §4)
            env.setdefault("TENSORTAP_FLUSH_INTERVAL", "0.1")
            env.setdefault("TENSORTAP_STOP_CHECK_INTERVAL", "0.05")
        env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self, offline: bool = False) -> None:
        """Start the rule processes, wait until each is ready (imports done, rule built, watching the
        out_dir), then start training: a problem at the first step is judged as soon as it is written."""
        self.offline = offline
        if offline:
            self.training_exit = 0
        self._start_rules(offline)
        if not offline:
            self._wait_rules_ready()
            self._start_training()

    def _start_training(self) -> None:
        from tensortap.runner.hook_config import build_hook_config

        config_path = os.path.join(self.tmp, "hook_config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(build_hook_config(self.spec), f, indent=2)
        try:
            with self._signals_deferred():  # a signal between fork and assignment would leave the child unknown
                self.training = subprocess.Popen(
                    self.spec.command, env=self._child_env(config_path), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                )
        except OSError as e:
            raise InvalidConfiguration(f"cannot start the training command {self.spec.command[0]!r}: "
                                       f"{e.strerror or e}") from None
        self.training_started_at = time.monotonic()
        threading.Thread(target=self._pump, args=(self.training.stdout,), daemon=True).start()

    def _wait_rules_ready(self) -> None:
        from tensortap.storage import open_storage

        storage = open_storage(self.spec.out_dir)
        deadline = time.monotonic() + RULES_READY_WAIT
        waiting = list(self.rules)
        while waiting and time.monotonic() < deadline:
            still = []
            for r in waiting:
                s = st.read_status(storage, r.label)
                if r.proc is not None and r.proc.poll() is None and not (s and (s.get("ready") or
                                                                                s.get("status") in st.FINAL)):
                    still.append(r)
            waiting = still
            if waiting:
                time.sleep(0.02)
        if waiting:
            self.say(f"[tensortap] rules not ready after {RULES_READY_WAIT:g} s: "
                     f"{', '.join(r.label for r in waiting)}; starting training anyway")

    def _start_rules(self, offline: bool) -> None:
        self.rules_started_at = time.monotonic()
        for r in self.rules:
            job = {"out_dir": self.spec.out_dir, "label": r.label, "rule": r.spec.to_json(),
                   "stop_on_issue": self.spec.stop_on_issue, "offline": offline}
            path = os.path.join(self.tmp, f"rule_{r.label}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(job, f)
            with self._signals_deferred():
                r.proc = subprocess.Popen([sys.executable, "-m", "tensortap.runner.rule_worker", path],
                                          env={**os.environ, **ONE_BLAS_THREAD}, start_new_session=True)

    def _terminate(self, proc: subprocess.Popen | None, wait: float = KILL_WAIT) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            proc.terminate()
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()

    def _poll_statuses(self, storage: Any) -> None:
        for r in self.rules:
            if r.status.get("status") in st.FINAL and r.proc is not None and r.proc.poll() is not None:
                continue
            s = st.read_status(storage, r.label, self.offline)
            if s is not None:
                before = r.status.get("status")
                r.status = s
                if s.get("status") in st.FINAL and r.final_at is None:
                    r.final_at = time.monotonic()
                if s.get("status") != before and self.console is None:
                    self.say(f"[tensortap] {r.label}: {s.get('status')}"
                             + (f" at step {s['first_step']}" if s.get("first_step") is not None else "")
                             + (f" ({s['message']})" if s.get("message") and s.get("status") in st.FINAL else ""))
            if r.proc is not None and r.proc.poll() is not None and r.status.get("status") not in st.FINAL:
                r.status = {"status": st.ERROR, "message": f"rule process exited with status {r.proc.returncode}",
                            "last_step": r.status.get("last_step"), "first_step": None}

    def monitor(self) -> None:
        from tensortap.storage import open_storage

        storage = open_storage(self.spec.out_dir)
        live = None
        if self.console is not None:
            from rich.live import Live

            live = Live(_table(self.rules, "running"), console=self.console, refresh_per_second=4, transient=False)
            live.start()
        try:
            ended_at = None
            while True:
                self._poll_statuses(storage)
                if self.training_exit is None and self.training is not None and self.training.poll() is not None:
                    self.training_exit = self.training.returncode
                    self.training_ended_at = time.monotonic()
                    st.write_training_ended(storage, self.training_exit)
                    ended_at = time.monotonic()
                fired = [r for r in self.rules if r.status.get("status") == st.ISSUES_FOUND]
                if fired and self.spec.stop_on_issue and self.training_exit is None:
                    if self.stop_requested_at is None:
                        self.stop_requested_at = time.monotonic()
                        self._ensure_stop_request(fired[0])
                        self.stopped_by = self._stop_requester() or fired[0].label
                        first = next((r for r in fired if r.label == self.stopped_by), fired[0])
                        self.say(f"[tensortap] {first.label} found an issue at step "
                                 f"{first.status.get('first_step')}: stopping training")
                    elif time.monotonic() - self.stop_requested_at > self.spec.grace_period:
                        self.say(f"[tensortap] training did not stop within {self.spec.grace_period:g} s: terminating")
                        self._terminate(self.training)
                if live is not None:
                    state = "running" if self.training_exit is None else f"exited ({self.training_exit})"
                    if self.training is None:
                        state = "offline"
                    live.update(_table(self.rules, state))
                rules_done = all(r.proc is None or r.proc.poll() is not None for r in self.rules)
                if self.training_exit is not None and rules_done:
                    self._poll_statuses(storage)
                    break
                if ended_at is not None and time.monotonic() - ended_at > RULES_SETTLE:
                    for r in self.rules:
                        if r.proc is not None and r.proc.poll() is None:
                            self._terminate(r.proc)
                    continue
                if self.console is None and time.monotonic() - self._last_progress >= PROGRESS_INTERVAL:
                    self._progress()
                time.sleep(0.2)
        finally:
            if live is not None:
                live.update(_table(self.rules, f"exited ({self.training_exit})"))
                live.stop()

    def _progress(self) -> None:
        """One line for logs (stdout not a terminal): the step the job has saved and each rule's state."""
        self._last_progress = time.monotonic()
        parts = [f"[tensortap] {self._last_progress - self.started_at:.0f} s"]
        step = self._saved_step()
        if self.training is not None:
            parts.append("training " + ("running" if self.training_exit is None else f"exited ({self.training_exit})")
                         + (f", step {step} saved" if step is not None else ", no step saved yet"))
        for r in self.rules:
            s = r.status
            at = s.get("first_step") if s.get("status") == st.ISSUES_FOUND else s.get("last_step")
            parts.append(f"{r.label} {s.get('status', st.IN_PROGRESS)}" + (f" (step {at})" if at is not None else ""))
        self.say(" | ".join(parts))

    def _saved_step(self) -> int | None:
        """The last step the job has saved so far (None when none is, or it cannot be read)."""
        try:
            if self._progress_trial is None:
                from tensortap.trials import create_trial

                self._progress_trial = create_trial(self.spec.out_dir)
            steps = self._progress_trial.steps(show_incomplete_steps=True)
            return steps[-1] if steps else None
        except Exception:  # noqa: BLE001 - a progress line never stops a run
            return None

    # --- stopping -------------------------------------------------------------------------------

    def on_signal(self, signum: int, frame: Any) -> None:
        """SIGINT, SIGTERM and SIGHUP stop the run alike; a second one while stopping kills at once."""
        if self._stopping:
            self._kill_all()
            return
        self.signal_name = signal.Signals(signum).name
        if self._starting_child:
            return  # raised once the child's Popen is known (and can be stopped), not in the middle of a fork
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def _signals_deferred(self) -> Iterator[None]:
        self._starting_child = True
        try:
            yield
        finally:
            self._starting_child = False
        if self.signal_name is not None and not self._stopping:
            raise KeyboardInterrupt

    def interrupt(self) -> None:
        """Stop the rules (they write Stopped), then training as Ctrl-C would (SIGINT to its process group, so
        the script unwinds and its hook closes and frees its shared memory; SIGTERM, then SIGKILL, if it does
        not), and read the rules' last statuses. The rules go first, for at most RULES_STOP_WAIT: a rule that
        still ran when training's hook marked the job ended would judge the steps left and finish as if the job
        had ended by itself."""
        self._stopping = True
        self.interrupted = True
        self.say(f"[tensortap] {self.signal_name or 'interrupted'}: stopping training and rules")
        running = [r.proc for r in self.rules if r.proc is not None and r.proc.poll() is None]
        for proc in running:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + RULES_STOP_WAIT
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break  # (stopped below, after training)
        if self.training is not None and self.training.poll() is None:
            _signal_group(self.training, signal.SIGINT)
        if self.training is not None:
            try:
                self.training.wait(INTERRUPT_WAIT)
            except subprocess.TimeoutExpired:
                self._terminate(self.training)
            if self.training_exit is None:
                self.training_exit = self.training.returncode
                self.training_ended_at = time.monotonic()
        for r in self.rules:
            self._terminate(r.proc)
        from tensortap.storage import open_storage

        try:
            self._poll_statuses(open_storage(self.spec.out_dir))
        except Exception:  # noqa: BLE001 - the summary says what was seen last
            pass

    def _kill_all(self) -> None:
        for p in [self.training, *(r.proc for r in self.rules)]:
            if p is not None and p.poll() is None:
                _signal_group(p, signal.SIGKILL)

    def shutdown(self) -> None:
        """Whatever happened, no process of the run outlives it, and its temporary files go."""
        self._stopping = True
        self._terminate(self.training)
        for r in self.rules:
            self._terminate(r.proc)
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)

    def _ensure_stop_request(self, rule: RuleProc) -> None:
        """With --stop-on-issue the rule's own StopTraining action writes the request; write it here too in
        case the rule is a user rule built without actions."""
        from tensortap.format.control import request_stop, stop_requested

        if stop_requested(self.spec.out_dir, min_interval=0) is None:
            request_stop(self.spec.out_dir, rule=rule.label, step=rule.status.get("first_step"),
                         reason=str(rule.status.get("message", "")), report=rule.status.get("report"))

    def _stop_requester(self) -> str | None:
        """The label of the rule whose stop request the job honoured (the first one written), if any."""
        if self.training is None:
            return None
        from tensortap.rules.actions.stop import stop_requested
        from tensortap.rules.builtin import snake_name

        try:
            req = stop_requested(self.spec.out_dir, min_interval=0)
        except Exception:  # noqa: BLE001 - the summary falls back to the first rule seen firing
            return None
        if not req or not req.get("rule"):
            return None
        name = snake_name(str(req["rule"]))
        return next((r.label for r in self.rules if r.label == req["rule"] or snake_name(r.spec.name) == name),
                    str(req["rule"]))

    # --- result ---------------------------------------------------------------------------------

    def result(self) -> tuple[int, dict[str, Any]]:
        from tensortap.format.control import STOP_EXIT_CODE

        rules = [self._rule_result(r) for r in self.rules]
        code = self.training_exit if self.training_exit is not None else -1
        stopped_by = self._stop_requester() or self.stopped_by
        if stopped_by is None and code == STOP_EXIT_CODE:
            stopped_by = next((r["name"] for r in rules if r["status"] == st.ISSUES_FOUND), "stop request")
        if self.interrupted:
            stopped_by = self.signal_name or "interrupt"
        training_failed = code != 0 and not (stopped_by and not self.interrupted)
        if self.interrupted or training_failed or any(r["status"] in (st.ERROR, st.STOPPED) for r in rules):
            exit_status = EXIT_FAILED
        elif any(r["status"] == st.ISSUES_FOUND for r in rules):
            exit_status = EXIT_ISSUES
        elif any(r["status"] == st.NO_DATA for r in rules):
            exit_status = EXIT_NO_DATA
        else:
            exit_status = EXIT_CLEAR
        training: dict[str, Any] = {"exit_code": code, "stopped_by": stopped_by,
                                    "duration_s": _seconds(self.training_started_at, self.training_ended_at)}
        return exit_status, {"out_dir": self.spec.out_dir, "command": self.spec.command, "rules": rules,
                             "training": training, "interrupted_by": self.signal_name if self.interrupted else None,
                             "duration_s": _seconds(self.started_at, time.monotonic())}

    def _rule_result(self, r: RuleProc) -> dict[str, Any]:
        """A rule's verdict with what it is based on: the steps it judged and the data points it read."""
        s = r.status
        rep = s.get("report") or {}
        return {"name": r.label, "status": s.get("status", st.ERROR), "first_step": s.get("first_step"),
                "message": s.get("message", ""), "steps_judged": rep.get("steps_evaluated"),
                "first_step_judged": rep.get("first_step_evaluated"),
                "last_step_judged": rep.get("last_step_evaluated", s.get("last_step")),
                "data_points": rep.get("datapoints"),
                "duration_s": _seconds(self.rules_started_at, r.final_at)}


def _seconds(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 3)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `proc` leads (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        try:
            proc.send_signal(sig)
        except OSError:
            pass


class _stop_signals_handled:
    """SIGINT, SIGTERM and SIGHUP call `runner.on_signal` while the run lasts (main thread only)."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self.saved[sig] = signal.signal(sig, self.runner.on_signal)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _drive(runner: Runner, offline: bool = False) -> tuple[int, dict[str, Any]]:
    """Start and watch the run; a stop signal stops it cleanly; no process of it outlives this call."""
    with _stop_signals_handled(runner):
        try:
            try:
                runner.start(offline=offline)
                runner.monitor()
            except KeyboardInterrupt:
                runner.interrupt()
            return runner.result()
        finally:
            runner.shutdown()


def _report(runner: Runner, spec: JobSpec, doc: dict[str, Any], offline: bool = False) -> None:
    if spec.json_output:
        print(json.dumps(doc, indent=2))
        return
    t = doc["training"]
    if not offline:
        runner.say(f"[tensortap] training exit code {t['exit_code']}"
                   + (f" after {t['duration_s']:.1f} s" if t.get("duration_s") is not None else "")
                   + (f", stopped by {t['stopped_by']}" if t["stopped_by"] else ""))
    for r in doc["rules"]:
        judged = r.get("steps_judged")
        basis = ""
        if judged:
            basis = (f", {judged} step{'s' if judged != 1 else ''} judged ({r['first_step_judged']}.."
                     f"{r['last_step_judged']}), {r['data_points']} data point{'s' if r['data_points'] != 1 else ''}")
        runner.say(f"[tensortap] {r['name']}: {r['status']}"
                   + (f" (first at step {r['first_step']})" if r["first_step"] is not None else "") + basis
                   + (f": {r['message']}" if r["status"] in (st.ISSUES_FOUND, st.ERROR, st.NO_DATA) and r["message"]
                      else ""))
    runner.say(f"[tensortap] data: {spec.out_dir}   inspect: tensortap ls {spec.out_dir}")


def run_rules_offline(spec: JobSpec) -> int:
    """`tensortap rules run`: evaluate rules on a saved (finished or running) job; same output and exit codes."""
    from tensortap.runner.rule_worker import build_rule
    from tensortap.trials import create_trial

    if not spec.rules:
        raise InvalidConfiguration("give at least one --rule")
    trial = create_trial(spec.out_dir)
    if not trial.steps(show_incomplete_steps=True):
        raise InvalidConfiguration(f"{spec.out_dir}: no saved data found")
    for r in spec.rules:
        build_rule(r, trial)
    runner = Runner(spec)
    exit_status, doc = _drive(runner, offline=True)
    doc.pop("training", None)
    _report(runner, spec, {**doc, "training": {"exit_code": None, "stopped_by": None, "duration_s": None}},
            offline=True)
    return exit_status


def run_job(spec: JobSpec) -> int:
    validate(spec)
    runner = Runner(spec)
    runner.say(f"[tensortap] out_dir {spec.out_dir}; rules: {', '.join(runner.labels) or 'none'}; "
               f"training: {' '.join(spec.command)}")
    exit_status, doc = _drive(runner)
    _report(runner, spec, doc)
    return exit_status
