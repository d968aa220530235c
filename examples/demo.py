"""The tensortap demo (`make demo`): a debugged PyTorch training job, end to end, on this machine.

1. `tensortap run` starts examples/train_saturating.py — plain PyTorch with a real bug (saturated
   sigmoids, so the gradients vanish and the loss never falls) and no tensortap code in it — with three
   rules watching in real time. VanishingGradient fires at step 0 (LossNotDecreasing would judge the TRAIN
   loss's trend once it has 20 saved values); the first verdict stops the job early.
2. The same script with its bug fixed (--healthy) runs to the end, alongside job 1 (its output is shown
   when job 1 is done); every rule judges its data and reports NoIssuesFound.
3. `tensortap report` writes one HTML page comparing the two jobs (the gradients dying from the last layer to
   the first in job 1); the demo says how to open it and how to start the live dashboard, `tensortap ui`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = ["--rule", "vanishing_gradient", "--rule", "exploding_tensor",
         "--rule", "loss_not_decreasing:num_steps=50,diff_percent=1"]


def _exe() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    return exe if os.path.exists(exe) else "tensortap"


def _shown(cmd: list[str]) -> str:
    """The command as a person would type it: the venv's tensortap by its path relative to here."""
    words = [os.path.relpath(w) if w == _exe() and os.path.isabs(w) else w for w in cmd]
    return " ".join(w if " " not in w else repr(w) for w in words)


def tensortap(*args: str) -> int:
    cmd = [_exe(), *args]
    print("\n$ " + _shown(cmd), flush=True)
    return subprocess.run(cmd).returncode


def prepare() -> None:
    """Import what the demo's processes import, so that Python compiles those modules once, here (pip installs
    PyTorch without compiling its ~10,000 modules: the demo imports under a tenth of them)."""
    import flask  # noqa: F401 - tensortap ui
    import rich.live  # noqa: F401
    import rich.table  # noqa: F401
    import torch  # noqa: F401

    import tensortap.cli.main  # noqa: F401
    import tensortap.format.writer  # noqa: F401
    import tensortap.pytorch.auto  # noqa: F401
    import tensortap.rules.builtin  # noqa: F401
    import tensortap.runner.autohook  # noqa: F401
    import tensortap.runner.rule_worker  # noqa: F401
    import tensortap.runner.run  # noqa: F401
    import tensortap.transport.process_writer  # noqa: F401
    import tensortap.trials  # noqa: F401
    import tensortap.ui.report  # noqa: F401


def main() -> int:
    if sys.argv[1:] == ["--prepare"]:
        prepare()
        return 0
    t0 = time.monotonic()
    base = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "tensortap-demo")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    broken, healthy = os.path.join(base, "broken"), os.path.join(base, "healthy")
    report = os.path.join(base, "report.html")
    script = os.path.join(HERE, "train_saturating.py")

    # Job 2 runs alongside job 1 (this machine has the cores; the demo takes half the time); its output is
    # kept and shown once job 1 is done.
    healthy_cmd = [_exe(), "run", "--out-dir", healthy, "--save-interval", "10", *RULES, "--stop-on-issue",
                   "--", sys.executable, script, "--healthy", "--steps", "300"]
    healthy_log = open(os.path.join(base, "healthy.log"), "w+")
    job2 = subprocess.Popen(healthy_cmd, stdout=healthy_log, stderr=subprocess.STDOUT)

    print("== 1. A training job with a bug, watched by three rules (stopped when one fires) ==")
    rc1 = tensortap("run", "--out-dir", broken, "--save-interval", "10", *RULES, "--stop-on-issue",
                    "--", sys.executable, script)
    print(f"(exit status {rc1}: 1 means a rule found an issue)")

    print("\n== 2. The same job with the bug fixed (it ran alongside job 1) ==")
    print("\n$ " + _shown(healthy_cmd), flush=True)
    rc2 = job2.wait()
    healthy_log.seek(0)
    sys.stdout.write(healthy_log.read())
    healthy_log.close()
    print(f"(exit status {rc2}: 0 means every rule judged data and reported NoIssuesFound)")

    print("\n== 3. What was saved, and a report of both jobs ==")
    tensortap("ls", broken)
    rc3 = tensortap("report", broken, healthy, "-o", report)
    ui = _shown([_exe(), "ui", broken, healthy])
    print(f"""
Open the report (one self-contained HTML file; job 1's gradient heatmap shows them dying from the last layer
to the first, job 2's stay alive):
    xdg-open {report}        # macOS: open {report}; or file://{report} in any browser

The live dashboard of the same jobs (it also follows jobs while they run):
    {ui}
    then open http://127.0.0.1:6007/

Rule statuses and reports: {broken}/rules/<rule>/status.json and report.json

In Python:
    import tensortap as tt
    trial = tt.create_trial({broken!r})
    g = trial.tensor("gradient/Sequential_0.weight")
    g.reduction_value(0, "mean", abs=True)   # mean |gradient| at step 0: vanishingly small
    trial.tensor("CrossEntropyLoss_output_0").values()
""")
    ok = rc1 == 1 and rc2 == 0 and rc3 == 0
    print(f"demo {'finished as expected' if ok else 'did NOT behave as expected'} in {time.monotonic() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
