"""LossNotDecreasing."""

from __future__ import annotations

import bisect
from typing import Any

from tensortap import modes as _modes
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_bool, as_float, as_int, as_mode, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["LossNotDecreasing"]


class LossNotDecreasing(Rule):
    """Fires when a loss did not drop by more than `diff_percent` percent over `num_steps` steps.

    Losses: the `losses` collection (if `use_losses_collection`), plus `collection_names` and `tensor_regex`.
    Steps are those of `mode`, counted in that mode's step numbers. The default (None) is TRAIN, plus steps
    saved without a mode (counted in global steps); it never changes while the job runs (smdebug's default
    tried EVAL first, which judged one or two points per epoch and switched mode in mid-run). EVAL only when
    asked. The mode judged is the report's `mode_judged` parameter; fewer than MIN_JUDGED comparisons
    over the whole job give a warning in the report. Per loss, the first saved step is the anchor; a saved
    step s at least `num_steps` after the anchor is evaluated against prev, the newest saved value at a step
    <= s - num_steps: it fires iff cur >= prev * (1 - diff_percent/100); s becomes the anchor (spec 7.6)."""

    description = "The loss does not decrease (by diff_percent %) over num_steps steps (TRAIN by default)."
    count_empty_steps = False
    #: fewer comparisons than this over a whole evaluation give a warning: the verdict rests on too little
    MIN_JUDGED = 5
    needs = "losses of the judged mode at least num_steps steps apart (no comparison could be made)"

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: bool | str = True, num_steps: int | str = 10,
                 diff_percent: float | str = 0.0, mode: Any = None, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.use_losses_collection = as_bool(use_losses_collection, "use_losses_collection", n)
        self.num_steps = as_int(num_steps, "num_steps", n, minimum=1)
        self.diff_percent = as_float(diff_percent, "diff_percent", n, minimum=0.0, maximum=100.0)
        self.mode = as_mode(mode, "mode", n)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            use_losses_collection=self.use_losses_collection, num_steps=self.num_steps,
                            diff_percent=self.diff_percent, mode=self.mode,
                            mode_judged=(self.mode or _modes.TRAIN).name)
        self._colls = (["losses"] if self.use_losses_collection else []) + self.collection_names
        self._state: dict[str, tuple[int | None, list[int], list[float]]] = {}
        self.judged = 0
        self.report.judged = 0

    def invoke_at_step(self, step: int) -> bool:
        mode = self.mode
        m, ms = self.base_trial.mode_modestep(step)
        if mode is None:  # TRAIN, and steps saved without a mode (by global step)
            if m == _modes.GLOBAL or m is None:
                mode, ms = _modes.GLOBAL, step
            elif m == _modes.TRAIN:
                mode = _modes.TRAIN
            else:
                return False
        elif mode == _modes.GLOBAL:
            ms = step
        elif m != mode:
            return False
        factor = 1.0 - self.diff_percent / 100.0
        for name in self.select(self._colls, self.tensor_regex):
            cur = self.stat(name, step, MEAN)
            if cur is None:
                continue
            anchor, hsteps, hvals = self._state.get(name, (None, [], []))
            evaluate = anchor is not None and ms - anchor >= self.num_steps
            if evaluate:
                i = bisect.bisect_right(hsteps, ms - self.num_steps)
                if i:
                    self.judged += 1
                    self.report.judged = self.judged
                    prev, prev_step = hvals[i - 1], hsteps[i - 1]
                    if cur >= prev * factor:
                        self.violation(step, f"loss {cur:.6g} at {mode.name} step {ms} did not decrease by more "
                                       f"than {self.diff_percent:g}% from {prev:.6g} at step {prev_step}",
                                       name, cur)
                anchor = ms
            elif anchor is None:
                anchor = ms
            hsteps.append(ms)
            hvals.append(cur)
            self._state[name] = (anchor, hsteps, hvals)
        return bool(self._violations)

    def on_finish(self) -> None:
        if self.judged < self.MIN_JUDGED and self.report.steps_evaluated:
            self.report.warn(f"only {self.judged} comparison(s) of the {self.report.parameters['mode_judged']} loss "
                             f"were judged (fewer than {self.MIN_JUDGED}): the verdict rests on little data; save "
                             f"the loss more often or lower num_steps")
