"""`smdebug.core.modes` for migration: this name is an alias of `tensortap.modes` (the same module object)."""

import sys

from tensortap import modes as _target

sys.modules[__name__] = _target
