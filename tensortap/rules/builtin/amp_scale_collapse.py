"""AmpScaleCollapse."""

from __future__ import annotations

from typing import Any

from tensortap.rules.builtin._stats import scalar
from tensortap.rules.params import as_float, as_int
from tensortap.rules.rule import Rule

__all__ = ["AmpScaleCollapse"]

SCALE = "grad_scaler/scale"
SKIPPED = "grad_scaler/skipped"


class AmpScaleCollapse(Rule):
    """Fires when mixed-precision training stops training: the GradScaler skipped `consecutive_skips` optimizer
    steps in a row (their gradients were not finite), or its scale fell below `min_scale`. Reads
    `grad_scaler/scale` and `grad_scaler/skipped` (the `grad_scaler` collection, which the PyTorch hook saves
    when a scaler is registered: every skipped step, and the scale with the gradients of every saving step).
    A GradScaler starting at 2**16 halves its scale at each skip: a few skips in a row at the start are its
    normal search for a scale; `consecutive_skips` in a row mean the scale fell 2**consecutive_skips-fold
    without one step taken."""

    description = ("Mixed precision collapses: the GradScaler skipped consecutive_skips steps in a row, or its "
                   "scale fell below min_scale.")
    compares = "the run of consecutive skipped steps with consecutive_skips, and the GradScaler's scale with min_scale"
    count_empty_steps = False
    needs = "the grad_scaler collection (hook.register_scaler(scaler))"

    def __init__(self, base_trial: Any, consecutive_skips: int | str = 10, min_scale: float | str = 1.0, *,
                 action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.consecutive_skips = as_int(consecutive_skips, "consecutive_skips", n, minimum=1)
        self.min_scale = as_float(min_scale, "min_scale", n, minimum=0.0)
        self.set_parameters(consecutive_skips=self.consecutive_skips, min_scale=self.min_scale)
        self._run_start: int | None = None
        self._last_skip: int | None = None

    def invoke_at_step(self, step: int) -> bool:
        names = set(self.select(["grad_scaler"], [f"^{SCALE}$", f"^{SKIPPED}$"]))
        skipped = self.raw(SKIPPED, step) if SKIPPED in names else None
        scale = self.raw(SCALE, step) if SCALE in names else None
        if skipped is not None and scalar(skipped) > 0:
            if self._last_skip is None or step != self._last_skip + 1:
                self._run_start = step
            self._last_skip = step
            run = step - (self._run_start or step) + 1
            if run >= self.consecutive_skips:
                self.violation(step, f"the GradScaler skipped {run} optimizer steps in a row (steps "
                                     f"{self._run_start}-{step}): their gradients were not finite at any scale it "
                                     f"tried" + ("" if scale is None else f" (scale now {scalar(scale):.4g})"),
                               SKIPPED, run)
        if scale is not None:
            s = scalar(scale)
            if s < self.min_scale:
                self.violation(step, f"the GradScaler's scale collapsed to {s:.4g} (below min_scale "
                                     f"{self.min_scale:g})", SCALE, s)
        return bool(self._violations)
