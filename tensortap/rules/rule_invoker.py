"""`smdebug.rules.rule_invoker` for migration: this name is an alias of `tensortap.rules.invoke` (the same
module object; `invoke_rule` lives there)."""

import sys

from tensortap.rules import invoke as _target

sys.modules[__name__] = _target
