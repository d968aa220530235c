"""Build of the optional C helper (everything else is in pyproject.toml).

`tensortap.transport._streamcopy` copies tensors into the writer's shared memory with streaming stores; when it
cannot be built (no compiler), tensortap falls back to memcpy. `tensortap.pytorch._counting` is the PyTorch
step counter's truth test (tensortap/pytorch/_step_counter.py); without it the counter runs in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tensortap.transport._streamcopy", ["tensortap/transport/_streamcopy.c"], optional=True),
    Extension("tensortap.pytorch._counting", ["tensortap/pytorch/_counting.c"], optional=True),
])
