"""`smdebug.core.collection` for migration: this name is an alias of `tensortap.collection` (the same module object)."""

import sys

from tensortap import collection as _target

sys.modules[__name__] = _target
