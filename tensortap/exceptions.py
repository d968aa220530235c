"""Every error tensortap raises derives from TensorTapError (smdebug's names, smdebug's constructor arguments)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "TensorTapError",
    "InvalidConfiguration",
    "InvalidCollectionConfiguration",
    "StepNotYetAvailable",
    "StepUnavailable",
    "TensorUnavailableForStep",
    "ShapeUnavailableForStep",
    "TensorUnavailable",
    "InvalidWorker",
    "NoMoreData",
    "MissingCollectionFiles",
    "IndexReaderException",
    "CorruptData",
    "UnsupportedFormatVersion",
    "RuleEvaluationConditionMet",
    "InsufficientInformationForRuleInvocation",
]


class TensorTapError(Exception):
    """Base of every tensortap error."""


class InvalidConfiguration(TensorTapError, ValueError):
    """A configuration value is not allowed; the message names the value and what is allowed."""


class InvalidCollectionConfiguration(TensorTapError, ValueError):
    def __init__(self, c_name: str, msg: str | None = None):
        self.c_name = c_name
        super().__init__(
            msg or f"collection {c_name!r} has neither include_regex nor tensor_names, so it can match nothing"
        )


def _mode_name(mode: Any) -> str:
    return getattr(mode, "name", str(mode))


class StepNotYetAvailable(TensorTapError):
    def __init__(self, step: int, mode: Any):
        self.step, self.mode = step, mode
        super().__init__(f"step {step} of mode {_mode_name(mode)} is not available yet")


class StepUnavailable(TensorTapError):
    """A step that will never come: not saved, or (`lost`: what happened) lost to damage in the stored data."""

    def __init__(self, step: int, mode: Any, lost: str | None = None):
        self.step, self.mode, self.lost = step, mode, lost
        super().__init__(f"step {step} of mode {_mode_name(mode)} " + (
            f"was lost: {lost}" if lost else "was not saved and never will be"))


class TensorUnavailableForStep(TensorTapError):
    def __init__(self, tname: str, step: int, mode: Any = None, has_reductions: bool = False):
        self.tname, self.step, self.mode, self.has_reductions = tname, step, mode, has_reductions
        msg = f"tensor {tname!r} is not available for step {step} of mode {_mode_name(mode)}"
        if has_reductions:
            msg += " (only reductions were saved for this step: use reduction_value)"
        super().__init__(msg)


class ShapeUnavailableForStep(TensorTapError):
    def __init__(self, tname: str, step: int, mode: Any = None):
        self.tname, self.step, self.mode = tname, step, mode
        super().__init__(f"no shape of tensor {tname!r} for step {step} of mode {_mode_name(mode)}")


class TensorUnavailable(TensorTapError):
    def __init__(self, tname: str, similar: Any = ()):
        self.tname = tname
        self.similar = list(similar)
        hint = f"; saved under a similar name: {', '.join(repr(n) for n in self.similar)}" if self.similar else ""
        super().__init__(f"tensor {tname!r} was not saved by this trial{hint}")


class InvalidWorker(TensorTapError):
    def __init__(self, worker: str, allowed: Any = None):
        self.worker = worker
        extra = f"; workers that wrote it: {sorted(allowed)}" if allowed is not None else ""
        super().__init__(f"invalid worker {worker!r}{extra}")


class NoMoreData(TensorTapError):
    def __init__(self, step: int, mode: Any, last_step: int | None = None):
        self.step, self.mode, self.last_step = step, mode, last_step
        super().__init__(
            f"training has ended: step {step} of mode {_mode_name(mode)} will never be written "
            f"(last step: {last_step})"
        )


class MissingCollectionFiles(TensorTapError):
    def __init__(self, msg: str = "training ended before every worker wrote its collections"):
        super().__init__(msg)


class IndexReaderException(TensorTapError):
    """An index (ours or smdebug's) is corrupt or has a bad name."""


class CorruptData(TensorTapError):
    """A payload failed its checksum or cannot be decoded; names the file and offset."""

    def __init__(self, path: str, offset: int, reason: str):
        self.path, self.offset, self.reason = path, offset, reason
        super().__init__(f"corrupt data in {path} at offset {offset}: {reason}")


class UnsupportedFormatVersion(TensorTapError):
    """The data was written in a format version this tensortap cannot read."""


class RuleEvaluationConditionMet(TensorTapError):
    def __init__(self, rule_name: str, step: int, end_of_rule: bool = False):
        self.rule_name, self.step, self.end_of_rule = rule_name, step, end_of_rule
        super().__init__(f"evaluation of rule {rule_name} at step {step} resulted in the condition being met")


class InsufficientInformationForRuleInvocation(TensorTapError):
    def __init__(self, rule_name: str, message: str):
        self.rule_name = rule_name
        super().__init__(f"insufficient information to invoke rule {rule_name}: {message}")
