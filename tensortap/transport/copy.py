"""Copies into the writer process's shared memory: the C helpers of `_streamcopy` (streaming stores, see
_streamcopy.c), with plain Python fallbacks where they could not be built."""

from __future__ import annotations

import ctypes
import struct
import sys

try:  # built at install where a compiler is present
    from tensortap.transport._streamcopy import gather as _c_gather
    from tensortap.transport._streamcopy import put_message as _c_put_message
except ImportError:  # pragma: no cover - no compiler at install time
    _c_gather = _c_put_message = None

#: a ring message's header (see process_writer): message size, meta size, payload offset, step, mode, mode step
MESSAGE_HEADER = struct.Struct("<6q")


def _memmove_gather(address: int, sources: list[tuple[int, int]]) -> int:
    total = 0
    for src, n in sources:
        ctypes.memmove(address, src, n)
        address += n
        total += n
    return total


#: gather_into(address, sources): copy each (source address, byte count) back to back to host memory at
#: `address`; returns the bytes copied (the C function itself where built: this runs in every saving step)
gather_into = _c_gather if _c_gather is not None else _memmove_gather


def _py_put_message(dst: int, meta: bytes, total: int, pay_at: int, step: int, mode: int, mode_step: int,
                    sources: list[tuple[int, int]]) -> int:
    if not isinstance(meta, bytes):
        raise TypeError(f"put_message: meta must be bytes, not {type(meta).__name__}")
    try:  # (checked before anything is written, as the C function does)
        pairs = [(int(a), int(n)) for a, n in sources]
    except (TypeError, ValueError) as e:
        raise TypeError(f"put_message: sources must be (address, nbytes) pairs ({e})") from None
    head = MESSAGE_HEADER.pack(total, len(meta), pay_at, step, mode, mode_step) + meta
    if pay_at < len(head):
        raise ValueError("put_message: pay_at leaves no room for the header and meta")
    ctypes.memmove(dst, head, len(head))
    return gather_into(dst + pay_at, pairs)


#: put_message(dst, meta, total, pay_at, step, mode, mode_step, sources): write a ring message at `dst` (its
#: header, `meta`, and the sources' bytes back to back from `dst + pay_at`); returns the payload bytes copied
put_message = (_c_put_message if _c_put_message is not None and sys.byteorder == "little"  # (the header's order)
               else _py_put_message)
