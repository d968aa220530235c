"""The step clock: the global step, each mode's own step, the current mode, and whether a step is open.

A framework may count steps known to save nothing outside the engine (e.g. Keras's batch callbacks): it hands
the clock that `tally` (any object with an int `skipped`), and the clock adds the tally to its counters before
anything reads them (`sync()`); reading `step` or `mode_steps` through a hook does that.
"""

from __future__ import annotations

from typing import Any

from tensortap.modes import EVAL, GLOBAL, PREDICT, TRAIN, ModeKeys

_MODE_NAMES = {m: m.name for m in ModeKeys}  # (Enum.name is a slow property, and this runs every step)


class StepClock:
    def __init__(self) -> None:
        self.mode: ModeKeys = GLOBAL
        self.step = -1  # the global step; -1 before the first
        self.mode_steps: dict[ModeKeys, int] = {m: -1 for m in ModeKeys}  # GLOBAL's is the global step
        self.in_step = False  # a step has begun and not ended
        self.tally: Any = None  # steps counted elsewhere, not yet added (see the module's docstring)

    def sync(self) -> None:
        """Add the steps counted elsewhere (all of them in the current mode)."""
        tally = self.tally
        if tally is not None and tally.skipped:
            n = tally.skipped
            tally.skipped = 0
            self.step += n
            self.mode_steps[self.mode] += n
            self.mode_steps[GLOBAL] = self.step

    def advance(self) -> int:
        """Begin the next step in the current mode; the new global step."""
        self.sync()
        self.step = step = self.step + 1
        steps = self.mode_steps
        steps[self.mode] += 1
        steps[GLOBAL] = step
        self.in_step = True
        return step

    @property
    def mode_step(self) -> int:
        return self.mode_steps[self.mode]

    def passed(self) -> dict[str, int]:
        """{mode name: its last step} of every mode that has begun, for the writer's step mark."""
        self.sync()
        passed = {}
        for m, s in self.mode_steps.items():
            if s >= 0:
                passed[_MODE_NAMES[m]] = s
        return passed

    def mark_fields(self) -> tuple[int, int, int, int, int]:
        """`passed()` as the numbers of a step mark: (global step, TRAIN, EVAL, PREDICT, GLOBAL mode step), -1 for
        a mode that has not begun (see `Writer.mark_steps`)."""
        self.sync()
        steps = self.mode_steps
        return self.step, steps[TRAIN], steps[EVAL], steps[PREDICT], steps[GLOBAL]
