"""A chunk's data file (docs/format.md §2): payloads appended at its end."""

from __future__ import annotations

import os
from typing import Any

from tensortap.storage.base import Storage

_DIRECT_WRITE = 1 << 16  # payloads at least this large are written straight from their arrays
_PENDING_WRITE = 1 << 20  # smaller ones are gathered and written once this many bytes are waiting


def write_all(f: Any, buf: Any) -> None:
    """Write all of `buf` (any C-contiguous buffer) to `f`: the write releases the GIL and copies nothing."""
    view = memoryview(buf).cast("B")
    while len(view):
        n = f.write(view)
        if n is None:  # a non-blocking raw stream: nothing written yet
            continue
        view = view[n:]


class DataFile:
    """A chunk's data file on an appendable `Storage`: payloads appended at its end (large ones written at once,
    small ones gathered and written together). `size` counts every byte appended, written or gathered."""

    def __init__(self, storage: Storage, key: str):
        self.storage, self.key = storage, key
        self.f = storage.open_append(key)
        self.size = 0
        self._pend = bytearray()

    def append(self, buf: Any, address: int | None = None) -> int:
        """Append a payload (any C-contiguous buffer; the caller's memory is free once this returns): its offset.
        `address`: of the buffer's first byte where the caller has it (a data file that writes from memory uses
        it)."""
        off = self.size
        view = memoryview(buf).cast("B")
        n = len(view)
        if n >= _DIRECT_WRITE:
            if self._pend:
                self.write_pending()
            write_all(self.f, view)
        else:
            self._pend += view
            if len(self._pend) >= _PENDING_WRITE:
                self.write_pending()
        self.size += n
        return off

    def write_pending(self) -> None:
        write_all(self.f, self._pend)
        self._pend = bytearray()

    def sync(self) -> None:
        """Everything appended is in the file (before an index block points at it)."""
        if self._pend:
            self.write_pending()
        self.f.flush()

    def discard_pending(self) -> None:
        """Forget payload bytes gathered and not written yet (the disk is full: they did not fit)."""
        self._pend = bytearray()

    def on_disk(self, default: int) -> int:
        try:
            return os.fstat(self.f.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            return default

    def truncate(self, size: int) -> None:
        self.size = size
        self.f.flush()
        self.storage.truncate(self.key, size)

    def close(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass
