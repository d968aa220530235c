"""CheckInputImages."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.rules.params import as_float, as_int, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["CheckInputImages", "DEFAULT_INPUT_REGEX", "input_regex"]

#: the model's input in each framework's naming: MXNet's first block (smdebug's default), PyTorch's root module
#: (named by its class, CamelCase by convention, submodules being named by attribute path; a registered loss
#: module, `<...>Loss_input_0`, is a root too and is left out), Keras's `inputs` log
DEFAULT_INPUT_REGEX = (r".*hybridsequential0_input_0", r"^(?![A-Za-z0-9]*Loss_input_0$)[A-Z][A-Za-z0-9]*_input_0$",
                       r"^inputs(_0)?$")


def input_regex(regex: Any) -> list[str]:
    """The regexes `regex` means: smdebug's default (or none) stands for DEFAULT_INPUT_REGEX."""
    out = as_regex_list(regex, "regex", "CheckInputImages")
    return list(DEFAULT_INPUT_REGEX) if out in ([], [DEFAULT_INPUT_REGEX[0]]) else out


class CheckInputImages(Rule):
    """Fires once at least `threshold_samples` images have been seen (accumulated over the evaluated steps,
    axis 0 of each input is the batch) and the mean of some colour channel (axis `channel`) over all those
    images differs from 0 by more than `threshold_mean`: the inputs are not normalised. Tensors: the
    `input_image` collection plus names matching `regex`; smdebug's default regex (MXNet's name) stands for
    DEFAULT_INPUT_REGEX, the model's input as MXNet, PyTorch and Keras jobs name it."""

    description = "Input images are not normalised: a channel mean differs from 0 by more than threshold_mean."
    compares = "each channel's mean over all input images seen (once threshold_samples) with 0 +- threshold_mean"

    count_empty_steps = False

    def __init__(self, base_trial: Any, threshold_mean: float | str = 0.2, threshold_samples: int | str = 500,
                 regex: Any = ".*hybridsequential0_input_0", channel: int | str = 1, *, action_str: str = "",
                 actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.threshold_mean = as_float(threshold_mean, "threshold_mean", n, minimum=0.0)
        self.threshold_samples = as_int(threshold_samples, "threshold_samples", n, minimum=1)
        self.regex = input_regex(regex)
        self.channel = as_int(channel, "channel", n, minimum=0)
        self.set_parameters(threshold_mean=self.threshold_mean, threshold_samples=self.threshold_samples,
                            regex=self.regex, channel=self.channel)
        self.sums: dict[str, np.ndarray] = {}
        self.elems: dict[str, np.ndarray] = {}
        self.images: dict[str, int] = {}

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(["input_image"], self.regex):
            x = self.raw(name, step)
            if x is None:
                continue
            x = np.asarray(x, dtype=np.float64)
            if x.ndim <= self.channel or x.ndim < 2:
                self.report.warn(f"{name}: shape {x.shape} has no channel axis {self.channel}")
                continue
            axes = tuple(a for a in range(x.ndim) if a != self.channel)
            s = x.sum(axis=axes)
            cnt = np.full(s.shape, x.size // x.shape[self.channel], dtype=np.float64)
            if name in self.sums and self.sums[name].shape == s.shape:
                self.sums[name] += s
                self.elems[name] += cnt
            else:
                self.sums[name], self.elems[name] = s, cnt
            self.images[name] = self.images.get(name, 0) + int(x.shape[0])
            if self.images[name] >= self.threshold_samples:
                means = self.sums[name] / self.elems[name]
                for c in np.flatnonzero(np.abs(means) > self.threshold_mean):
                    self.violation(step, f"channel {int(c)} mean {means[c]:.3g} over {self.images[name]} images "
                                   f"differs from 0 by more than {self.threshold_mean:g}", name, float(means[c]))
        return bool(self._violations)
