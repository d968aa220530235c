"""The tensortap demo (`make demo`): a debugged PyTorch training job, end to end, on this machine.

1. `tensortap run` starts examples/train_saturating.py — plain PyTorch with a real bug (saturated
   sigmoids, so the gradients vanish and the loss never falls) and no tensortap code in it — with three
   rules watching in real time. VanishingGradient fires at step 0 (LossNotDecreasing would judge the TRAIN
   loss's trend once it has 20 saved values); the first verdict stops the job early.
2. The same script with its bug fixed (--healthy) runs to the end; every rule judges its data and reports
   NoIssuesFound.
3. Where the data is, and how to look at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = ["--rule", "vanishing_gradient", "--rule", "exploding_tensor",
         "--rule", "loss_not_decreasing:num_steps=50,diff_percent=1"]


def tensortap(*args: str) -> int:
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    cmd = [exe if os.path.exists(exe) else "tensortap", *args]
    print("\n$ " + " ".join(a if " " not in a else repr(a) for a in cmd), flush=True)
    return subprocess.run(cmd).returncode


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "tensortap-demo")
    shutil.rmtree(base, ignore_errors=True)
    broken, healthy = os.path.join(base, "broken"), os.path.join(base, "healthy")
    script = os.path.join(HERE, "train_saturating.py")

    print("== 1. A training job with a bug, watched by three rules (stopped when one fires) ==")
    rc1 = tensortap("run", "--out-dir", broken, "--save-interval", "10", *RULES, "--stop-on-issue",
                    "--", sys.executable, script)
    print(f"(exit status {rc1}: 1 means a rule found an issue)")

    print("\n== 2. The same job with the bug fixed ==")
    rc2 = tensortap("run", "--out-dir", healthy, "--save-interval", "10", *RULES, "--stop-on-issue",
                    "--", sys.executable, script, "--healthy", "--steps", "300")
    print(f"(exit status {rc2}: 0 means every rule judged data and reported NoIssuesFound)")

    print("\n== 3. What was saved ==")
    tensortap("ls", broken)
    print(f"""
Rule statuses and reports: {broken}/rules/<rule>/status.json and report.json

Look at it in Python:
    import tensortap as tt
    trial = tt.create_trial({broken!r})
    g = trial.tensor("gradient/Sequential_0.weight")
    g.reduction_value(0, "mean", abs=True)   # mean |gradient| at step 0: vanishingly small
    trial.tensor("CrossEntropyLoss_output_0").values()
""")
    ok = rc1 == 1 and rc2 == 0
    print("demo", "finished as expected" if ok else "did NOT behave as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
