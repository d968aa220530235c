"""NLPSequenceRatio."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules._data import Stat
from tensortap.rules.params import as_float_list, as_int_list, as_regex_list
from tensortap.rules.rule import Rule

__all__ = ["NLPSequenceRatio", "DEFAULT_SEQUENCE_REGEX", "sequence_regex"]

#: the input of the embedding layer in each framework's naming: MXNet (smdebug's default), PyTorch (a module
#: whose attribute path names an embedding: `embedding_input_0`, `encoder.embed_tokens_input_0`) and Keras
#: (`embedding/inputs`)
DEFAULT_SEQUENCE_REGEX = (r".*embedding0_input_0", r"(^|\.)[A-Za-z0-9_]*embed[A-Za-z0-9_]*_input_0$",
                          r"(^|/)embedding[^/]*/inputs$")


def sequence_regex(regex: Any) -> list[str]:
    """The regexes `regex` means: smdebug's default (or none) stands for DEFAULT_SEQUENCE_REGEX."""
    out = as_regex_list(regex, "tensor_regex", "NLPSequenceRatio")
    return list(DEFAULT_SEQUENCE_REGEX) if out in ([], [DEFAULT_SEQUENCE_REGEX[0]]) else out


def _pct_of(token: int):  # type: ignore[no-untyped-def]
    def fn(rows: np.ndarray) -> np.ndarray:
        r = np.asarray(rows)
        x = r.reshape(r.shape[0], -1)
        if x.shape[1] == 0:
            return np.full(r.shape[0], np.nan)
        return (x == token).mean(axis=1) * 100.0

    return fn


class NLPSequenceRatio(Rule):
    """Fires at a step where, in an input sequence tensor (the `input_sequence` collection and names matching
    `tensor_regex`; smdebug's default regex, MXNet's name, stands for DEFAULT_SEQUENCE_REGEX: the
    embedding's input as MXNet, PyTorch and Keras jobs name it), the percentage of
    elements equal to token_values[i] exceeds token_thresholds_percent[i] (e.g. too much padding).
    Both are comma lists of equal length; a single threshold applies to every token."""

    description = "Input sequences hold too many of some tokens (e.g. padding)."
    compares = 'the % of each token in token_values in the input sequences with token_thresholds_percent'
    count_empty_steps = False

    def __init__(self, base_trial: Any, tensor_regex: Any = ".*embedding0_input_0", token_values: Any = "0",
                 token_thresholds_percent: Any = "50", *, action_str: str = "", actions: Any = None):
        super().__init__(base_trial, action_str, actions=actions)
        n = self.rule_name
        self.tensor_regex = sequence_regex(tensor_regex)
        self.token_values = as_int_list(token_values, "token_values", n)
        self.token_thresholds_percent = as_float_list(token_thresholds_percent, "token_thresholds_percent", n)
        if not self.token_values:
            raise InvalidConfiguration(f"{n}: token_values must name at least one token id")
        if len(self.token_thresholds_percent) == 1:
            self.token_thresholds_percent = self.token_thresholds_percent * len(self.token_values)
        if len(self.token_thresholds_percent) != len(self.token_values):
            raise InvalidConfiguration(f"{n}: token_thresholds_percent={token_thresholds_percent!r} must have one "
                                       f"value per token in token_values={token_values!r}")
        self.set_parameters(tensor_regex=self.tensor_regex, token_values=self.token_values,
                            token_thresholds_percent=self.token_thresholds_percent)
        self._stats = [Stat(f"token_pct:{t}", _pct_of(t)) for t in self.token_values]

    def invoke_at_step(self, step: int) -> bool:
        for name in self.select(["input_sequence"], self.tensor_regex):
            for tok, thr, st in zip(self.token_values, self.token_thresholds_percent, self._stats, strict=True):
                pct = self.stat(name, step, st)
                if pct is not None and pct == pct and pct > thr:
                    self.violation(step, f"token {tok} is {pct:.3g}% of the sequence (> {thr:g}%)", name, pct)
        return bool(self._violations)
