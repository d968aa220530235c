"""Build of the optional C helper (everything else is in pyproject.toml).

`tensortap.transport._streamcopy` copies a step's tensors into the writer's shared memory in one call and holds
the ring's atomics; when it cannot be built (no compiler), tensortap falls back to one ctypes.memmove per tensor.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tensortap.transport._streamcopy", ["tensortap/transport/_streamcopy.c"], optional=True),
])
