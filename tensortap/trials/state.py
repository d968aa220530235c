"""StepState: what has_passed_step answers."""

from enum import Enum


class StepState(Enum):
    UNAVAILABLE = 0  # the step will never be written
    AVAILABLE = 1  # the step is written by every worker
    NOT_YET_AVAILABLE = 2  # the step may still come
