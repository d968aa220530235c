"""The storage interface: a small key/value store of immutable-or-append-only objects.

Keys are '/'-separated paths relative to the store's root. Everything above this layer (format,
trials, hooks) speaks only this interface; the URL scheme picks the backend in `open_storage`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, BinaryIO, Protocol


class DirectFile(Protocol):
    """A handle of `Storage.open_direct`: positioned writes of page-aligned buffers, past the page cache."""

    #: buffers, their lengths and the offsets written at are multiples of this many bytes
    alignment: int
    #: False once the file system refused a direct write: the handle then writes through the page cache
    direct: bool

    def write_at(self, views: list[memoryview], offset: int) -> None:
        """Write the buffers back to back from `offset` (all of them; a full storage raises its OSError). Where
        the file system refuses direct writes after all, they go through the page cache from then on."""

    def close(self) -> None: ...


class Storage(ABC):
    """A store rooted at `url`."""

    #: True where objects can grow in place (local files); False for object stores (S3), where a
    #: writer publishes sealed objects instead.
    supports_append: bool = False
    #: True where `open_direct` may give a handle that writes past the page cache (local files, where the file
    #: system allows it)
    supports_direct: bool = False

    def __init__(self, url: str):
        self.url = url

    @abstractmethod
    def read(self, key: str) -> bytes:
        """The whole object; FileNotFoundError naming the key if missing."""

    @abstractmethod
    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer only if the object is shorter)."""

    def read_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several (offset, length) ranges of one object, in order. Backends may read them in parallel."""
        return [self.read_range(key, off, n) for off, n in ranges]

    def readinto(self, key: str, offset: int, buf: Any) -> int:
        """Read len(buf) bytes from `offset` into the writable buffer `buf`; returns the bytes read."""
        data = self.read_range(key, offset, len(buf))
        memoryview(buf).cast("B")[: len(data)] = data
        return len(data)

    def mapped(self, key: str) -> Any | None:
        """A zero-copy bytes-like view of the whole object (local files: mmap), or None if the backend has none."""
        return None

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, None if it does not exist."""

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Keys under `prefix` (recursive), sorted, only those > `start_after` when given."""

    def has_keys(self, prefix: str) -> bool:
        """True if any key lies under `prefix`; backends answer without listing them all."""
        return bool(self.list(prefix))

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Create or replace an object; readers see the old or the new content, never a mix."""

    @abstractmethod
    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create `key` with `data` only if it does not exist yet, atomically (of two callers racing, exactly one
        gets True); False if it exists."""

    def open_append(self, key: str) -> BinaryIO:
        """A binary handle appending to `key` (created if missing). Only where `supports_append`."""
        raise NotImplementedError(f"{type(self).__name__} does not support appending")

    def open_direct(self, key: str) -> DirectFile | None:
        """A handle writing the existing object `key` with direct I/O (page-aligned buffers at page-aligned
        offsets, past the page cache), or None where the store or its file system cannot."""
        return None

    def truncate(self, key: str, size: int) -> None:
        """Cut an appendable object to `size` bytes. Only where `supports_append`."""
        raise NotImplementedError(f"{type(self).__name__} does not support truncating")

    def reserve(self, key: str, nbytes: int) -> None:
        """Create `key` holding `nbytes` of space set aside (its content is not read)."""
        self.write(key, bytes(nbytes))

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; no error if it is missing."""

    def describe(self, key: str) -> str:
        """A human-readable location of `key` for error messages."""
        return f"{self.url.rstrip('/')}/{key}"
