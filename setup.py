"""Build of the optional C helper (everything else is in pyproject.toml).

`tensortap._streamcopy` copies tensors into the writer's shared memory with streaming stores; when it
cannot be built (no compiler), tensortap falls back to memcpy.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tensortap._streamcopy", ["tensortap/_streamcopy.c"], optional=True)])
