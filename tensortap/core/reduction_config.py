"""`smdebug.core.reduction_config` for migration: this name is an alias of `tensortap.config` (the same
module object)."""

import sys

from tensortap import config as _target

sys.modules[__name__] = _target
