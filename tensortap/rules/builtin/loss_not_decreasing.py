"""LossNotDecreasing."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from tensortap import modes as _modes
from tensortap.rules.builtin._stats import MEAN
from tensortap.rules.params import as_bool, as_float, as_int, as_mode, as_regex_list, as_str_list
from tensortap.rules.rule import Rule

__all__ = ["LossNotDecreasing"]


class LossNotDecreasing(Rule):
    """Fires when a loss stops decreasing before it has learnt anything: over `num_steps` steps its median did not
    drop by more than `diff_percent` percent, and it is not `min_drop_percent` percent below where it started.

    Losses: the `losses` collection (if `use_losses_collection`), plus `collection_names` and `tensor_regex`.
    Steps are those of `mode`, counted in that mode's step numbers; the default (None) is TRAIN, plus steps saved
    without a mode (counted in global steps); it never changes while the job runs. EVAL only when asked.

    Method (a trend, not two noisy points): per loss, a judgement at saved step s compares the median of the
    latest `window` saved values (the current window) with the median of the `window` values saved before it,
    at steps <= s - num_steps (the previous window). Judgements are at least `num_steps` steps apart (smdebug's
    anchor) and start once the loss has WARMUP_WINDOWS (4) windows of saved values (two values with `window=1`,
    for losses without mini-batch noise such as boosting metrics). The loss did not decrease
    when current >= previous * (1 - diff_percent/100). That fires unless the loss has clearly fallen since its
    first `window` values (current < first * (1 - min_drop_percent/100)): a loss that fell that much and then
    levels off has converged, which is not this rule's issue (Overtraining's). Fewer than MIN_JUDGED judgements
    give a warning in the report."""

    description = ("The loss stops decreasing before it fell: window medians num_steps apart, and the loss is not "
                   "min_drop_percent % below its start (TRAIN by default).")
    compares = ("the median of the last `window` saved losses with the median of the `window` before it, at least "
                "num_steps steps earlier, and with the median of the first `window`")
    count_empty_steps = False
    #: fewer judgements than this over a whole evaluation give a warning: the verdict rests on too little
    MIN_JUDGED = 3
    #: judgements start once a loss has this many windows of saved values (a warm-up: a loss that has just
    #: started to fall is hidden by mini-batch noise)
    WARMUP_WINDOWS = 4
    needs = ("losses of the judged mode: 4 * `window` saved values, the last `window` num_steps steps after "
             "the `window` before them (no comparison could be made)")

    def __init__(self, base_trial: Any, collection_names: Any = None, tensor_regex: Any = None,
                 use_losses_collection: bool | str = True, num_steps: int | str = 10,
                 diff_percent: float | str = 0.0, mode: Any = None, window: int | str = 5,
                 min_drop_percent: float | str = 10.0, *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.collection_names = as_str_list(collection_names, "collection_names", n)
        self.tensor_regex = as_regex_list(tensor_regex, "tensor_regex", n)
        self.use_losses_collection = as_bool(use_losses_collection, "use_losses_collection", n)
        self.num_steps = as_int(num_steps, "num_steps", n, minimum=1)
        self.diff_percent = as_float(diff_percent, "diff_percent", n, minimum=0.0, maximum=100.0)
        self.mode = as_mode(mode, "mode", n)
        self.window = as_int(window, "window", n, minimum=1)
        self.min_drop_percent = as_float(min_drop_percent, "min_drop_percent", n, minimum=0.0, maximum=100.0)
        self.set_parameters(collection_names=self.collection_names, tensor_regex=self.tensor_regex,
                            use_losses_collection=self.use_losses_collection, num_steps=self.num_steps,
                            diff_percent=self.diff_percent, mode=self.mode, window=self.window,
                            min_drop_percent=self.min_drop_percent, mode_judged=(self.mode or _modes.TRAIN).name)
        self._colls = (["losses"] if self.use_losses_collection else []) + self.collection_names
        # per loss: [anchor (mode step of the last judgement), saved mode steps, values]
        self._state: dict[str, list[Any]] = {}
        self.judged = 0
        self.report.judged = 0

    def _mode_step(self, step: int) -> tuple[Any, int] | None:
        mode = self.mode
        m, ms = self.base_trial.mode_modestep(step)
        if mode is None:  # TRAIN, and steps saved without a mode (by global step)
            if m == _modes.GLOBAL or m is None:
                return _modes.GLOBAL, step
            return (_modes.TRAIN, ms) if m == _modes.TRAIN else None
        if mode == _modes.GLOBAL:
            return mode, step
        return (mode, ms) if m == mode else None

    def invoke_at_step(self, step: int) -> bool:
        found = self._mode_step(step)
        if found is None:
            return False
        mode, ms = found
        w = self.window
        for name in self.select(self._colls, self.tensor_regex):
            cur_v = self.stat(name, step, MEAN)
            if cur_v is None or cur_v != cur_v:
                continue
            st = self._state.setdefault(name, [None, [], []])
            anchor, hsteps, hvals = st
            hsteps.append(ms)
            hvals.append(float(cur_v))
            warm_up = self.WARMUP_WINDOWS * w if w > 1 else 2  # window=1: exact values (e.g. boosting metrics)
            if len(hvals) < warm_up or (anchor is not None and ms - anchor < self.num_steps):
                continue
            end = min(len(hvals) - w, bisect.bisect_right(hsteps, ms - self.num_steps))
            if end < w:
                continue
            st[0] = ms
            self.judged += 1
            self.report.judged = self.judged
            cur = float(np.median(hvals[-w:]))
            prev = float(np.median(hvals[end - w:end]))
            first = float(np.median(hvals[:w]))
            if cur < prev * (1.0 - self.diff_percent / 100.0):
                continue  # it decreased
            if cur < first * (1.0 - self.min_drop_percent / 100.0):
                continue  # it fell since its start and levels off: converged
            change = 100.0 * (cur - first) / abs(first) if first else 0.0
            since = f"{-change:.1f}% below" if change < 0 else f"{change:.1f}% above"
            self.violation(
                step,
                f"the {mode.name} loss stopped decreasing before it fell: its median {cur:.4g} over steps "
                f"{hsteps[-w]}-{ms} is not more than {self.diff_percent:g}% below {prev:.4g}, the median over "
                f"steps {hsteps[end - w]}-{hsteps[end - 1]}, and it is {since} its start ({first:.4g} over steps "
                f"{hsteps[0]}-{hsteps[w - 1]}; a loss that learns falls more than {self.min_drop_percent:g}%)",
                name, cur)
        return bool(self._violations)

    def on_finish(self) -> None:
        if self.judged < self.MIN_JUDGED and self.report.steps_evaluated:
            self.report.warn(f"only {self.judged} comparison(s) of the {self.report.parameters['mode_judged']} loss "
                             f"were judged (fewer than {self.MIN_JUDGED}): the verdict rests on little data; save "
                             f"the loss more often or lower num_steps")
