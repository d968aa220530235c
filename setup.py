"""Build of the optional C helpers (everything else is in pyproject.toml).

`tensortap.transport._streamcopy` copies a step's tensors into the writer's shared memory in one call and holds
the ring's atomics; when it cannot be built (no compiler), tensortap falls back to one ctypes.memmove per tensor.
`tensortap.capture._moments` takes the statistics of a step's CPU tensors in one pass each (docs/pytorch.md,
"Statistics on the device"); without it they are torch's own reductions.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tensortap.transport._streamcopy", ["tensortap/transport/_streamcopy.c"], optional=True),
    # (-ffp-contract=off: the same sums on every CPU, no fused multiply-add where the CPU has one)
    Extension("tensortap.capture._moments", ["tensortap/capture/_moments.c"], optional=True,
              extra_compile_args=["-ffp-contract=off", "-Wno-psabi"]),
])
