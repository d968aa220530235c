"""tensortap demo: debug a small numpy training loop end to end.

Trains a linear regression with plain gradient descent, captures weights, gradients and the loss with
the generic tensortap Hook into a local out_dir, then reads them back through a Trial the way a rule
or a notebook would. Run with `make demo`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import tensortap as tt
from tensortap import modes


def train(out_dir: str, steps: int = 200, lr: float = 0.05) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 8)).astype(np.float32)
    true_w = rng.standard_normal(8).astype(np.float32)
    y = x @ true_w + 0.01 * rng.standard_normal(512).astype(np.float32)
    x_val, y_val = x[:64], y[:64]

    hook = tt.Hook(
        out_dir,
        save_config=tt.SaveConfig(save_interval=10),
        include_collections=["weights", "gradients", "losses"],
        reduction_config=tt.ReductionConfig(reductions=["mean", "max"], norms=["l2"], save_raw_tensor=True),
    )
    hook.get_collection("losses").save_config = tt.SaveConfigMode(save_interval=1)
    w = np.zeros(8, dtype=np.float32)
    for step in range(steps):
        hook.set_mode(modes.TRAIN)
        hook.next_step()
        batch = rng.integers(0, len(x), 64)
        err = x[batch] @ w - y[batch]
        grad = 2 * x[batch].T @ err / len(batch)
        w -= lr * grad
        hook.save_tensor("weights/w", w, "weights")
        hook.save_tensor("gradients/w", grad, "gradients")
        hook.save_tensor("loss", np.float32(np.mean(err**2)), "losses")
        if step % 50 == 49:  # a short evaluation pass
            hook.set_mode(modes.EVAL)
            hook.next_step()
            hook.save_tensor("loss", np.float32(np.mean((x_val @ w - y_val) ** 2)), "losses")
    hook.close()


def inspect(out_dir: str) -> None:
    trial = tt.create_trial(out_dir)
    print(f"\nJob in {out_dir}: workers {trial.workers()}, modes {[m.name for m in trial.modes()]}, "
          f"{len(trial.steps())} steps saved, ended: {trial.loaded_all_steps}")
    print("tensors:", trial.tensor_names())
    loss = trial.tensor("loss")
    train_loss = loss.values(modes.TRAIN)
    print(f"train loss: step 0 = {float(train_loss[0]):.4f}, step {max(train_loss)} = "
          f"{float(train_loss[max(train_loss)]):.6f}")
    print("eval loss by eval step:", {s: round(float(v), 6) for s, v in loss.values(modes.EVAL).items()})
    g = trial.tensor("gradients/w")
    norms = g.reductions("l2", mode=modes.TRAIN)
    print("gradient L2 norm (every 10th train step):", {s: round(float(v), 5) for s, v in list(norms.items())[:6]},
          "...")
    last = trial.tensor("weights/w").steps()[-1]
    print(f"final weights (step {last}):", np.round(trial.tensor("weights/w").value(last), 3))
    vanishing = [s for s, v in norms.items() if v < 1e-7]
    print("steps with vanishing gradients (L2 < 1e-7):", vanishing or "none")


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "tensortap-demo")
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"Training a small numpy model with a tensortap Hook; data goes to {out_dir}")
    train(out_dir)
    inspect(out_dir)
    print("\n$ tensortap ls", out_dir)
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    subprocess.run([exe if os.path.exists(exe) else "tensortap", "ls", out_dir], check=True)
    print("\nIn Python:\n  import tensortap as tt\n"
          f"  trial = tt.create_trial({out_dir!r})\n  trial.tensor('loss').values()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
