"""Copies into the writer process's shared memory, and the atomics of its shared counters: the C helpers of
`_streamcopy` (a step's tensors copied in one call, release/acquire atomics; see _streamcopy.c), with plain
Python fallbacks where they could not be built."""

from __future__ import annotations

import ctypes
import platform
import struct

try:  # built at install where a compiler is present
    from tensortap.transport._streamcopy import gather as _c_gather
    from tensortap.transport._streamcopy import get_mark as _c_get_mark
    from tensortap.transport._streamcopy import load_acquire as _c_load_acquire
    from tensortap.transport._streamcopy import put_mark as _c_put_mark
    from tensortap.transport._streamcopy import store_release as _c_store_release
except ImportError:  # pragma: no cover - no compiler at install time
    _c_gather = _c_get_mark = _c_load_acquire = _c_put_mark = _c_store_release = None
try:  # (a helper built before gather_stream existed keeps the others: rebuild it for the streaming copy)
    from tensortap.transport._streamcopy import gather_stream as _c_gather_stream
except ImportError:  # pragma: no cover
    _c_gather_stream = None

#: a ring message's header (see docs/transport.md): message size, meta size, payload offset, step, mode, mode step
MESSAGE_HEADER = struct.Struct("<6q")

#: the ring's counters are ordered on this machine: C atomics (release/acquire) were built, or the CPU orders
#: plain stores (x86-64), so the Python fallbacks below are correct too. Without it the writer process is not used.
ORDERED = _c_store_release is not None or platform.machine().lower() in ("x86_64", "amd64")


def _memmove_gather(address: int, sources: list[tuple[int, int]]) -> int:
    total = 0
    for src, n in sources:
        ctypes.memmove(address, src, n)
        address += n
        total += n
    return total


def _py_store(address: int, value: int) -> None:
    ctypes.c_int64.from_address(address).value = value


def _py_load(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _py_put_mark(address: int, seq: int, *fields: int) -> None:
    slot = (ctypes.c_int64 * 7).from_address(address)
    slot[0] = seq + 1
    for i, f in enumerate(fields):
        slot[1 + i] = f
    slot[0] = seq + 2


def _py_get_mark(address: int) -> tuple[int, ...] | None:
    slot = (ctypes.c_int64 * 7).from_address(address)
    s1 = slot[0]
    if s1 & 1:
        return None
    fields = tuple(slot[1:7])
    return (s1, *fields) if slot[0] == s1 else None


#: gather_into(address, sources): copy each (source address, byte count) back to back to host memory at
#: `address`; returns the bytes copied (the C function itself where built: this runs in every saving step)
gather_into = _c_gather if _c_gather is not None else _memmove_gather
#: gather_into for memory this process does not read back (the writer process's ring): non-temporal stores where
#: built on x86-64, so the copy leaves the training core's caches to the training step
gather_stream_into = _c_gather_stream if _c_gather_stream is not None else gather_into
#: store_release(address, value) / load_acquire(address): an int64 slot of the ring's header
store_release = _c_store_release if _c_store_release is not None else _py_store
load_acquire = _c_load_acquire if _c_load_acquire is not None else _py_load
#: put_mark(address, seq, msgs, step, train, eval, predict, global) / get_mark(address): the step mark's seqlock
put_mark = _c_put_mark if _c_put_mark is not None else _py_put_mark
get_mark = _c_get_mark if _c_get_mark is not None else _py_get_mark
