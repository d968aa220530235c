"""`smdebug.rules.action` for migration: this name is an alias of `tensortap.rules.actions` (the same module
object: Actions, StopTraining, Email, Webhook, ...)."""

import sys

from tensortap.rules import actions as _target

sys.modules[__name__] = _target
