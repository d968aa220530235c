"""Local-filesystem storage."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import uuid
from typing import Any, BinaryIO

from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")
_STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class _DirectFile:
    """A local file opened with O_DIRECT (see Storage.open_direct)."""

    alignment = 4096

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd
        self.direct = True

    def write_at(self, views: list[memoryview], offset: int) -> None:
        total = sum(len(v) for v in views)
        done = 0
        try:
            done = os.pwritev(self.fd, views, offset)
            while done < total:  # (a short write: the rest one buffer at a time)
                at = 0
                for v in views:
                    if done < at + len(v):
                        done += os.pwrite(self.fd, v[done - at:], offset + done)
                        break
                    at += len(v)
        except OSError as e:
            if e.errno in _STORAGE_FULL or not self.direct:
                raise
            logger.info("tensortap: O_DIRECT writes failed (%s); writing through the page cache", e)
            self._buffered()
            at = 0
            for v in views:  # (what is not written yet, through the page cache)
                end = at + len(v)
                if end > done:
                    w = max(done, at) - at
                    while w < len(v):
                        w += os.pwrite(self.fd, v[w:], offset + at + w)
                at = end

    def _buffered(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        os.close(self.fd)
        self.fd, self.direct = fd, False

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class LocalStorage(Storage):
    supports_append = True
    supports_direct = hasattr(os, "O_DIRECT")

    def __init__(self, root: str):
        root = os.path.abspath(os.path.expanduser(root))
        super().__init__(root)
        self.root = root
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}
        self._fds: dict[str, int] = {}

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/")) if key else self.root

    def read(self, key: str) -> bytes:
        with open(self._path(key), "rb") as f:
            return f.read()

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with open(self._path(key), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def read_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        out = []
        with open(self._path(key), "rb") as f:
            for off, n in ranges:
                f.seek(off)
                out.append(f.read(n))
        return out

    def readinto(self, key: str, offset: int, buf: Any) -> int:
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(self._path(key), os.O_RDONLY)
        return os.preadv(fd, [buf], offset)

    def mapped(self, key: str) -> Any | None:
        """An mmap of the file, re-made when the file has grown; None for an empty or missing file."""
        path = self._path(key)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return None
        cached = self._maps.get(key)
        if cached is not None and cached[0] >= size:
            return cached[1]
        if size == 0:
            return None
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        self._maps[key] = (size, mm)
        return mm

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not os.path.isdir(base):
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for f in files:
                if f.endswith(".partial"):
                    continue  # an atomic write still in progress
                keys.append(rel + f)
        keys.sort()
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        return keys

    def has_keys(self, prefix: str) -> bool:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not os.path.isdir(base):
            return False
        for _dirpath, _dirs, files in os.walk(base):
            if any(not f.endswith(".partial") for f in files):
                return True
        return False

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def create_exclusive(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    def reserve(self, key: str, nbytes: int) -> None:
        """The blocks allocated without writing them (posix_fallocate), where the file system can."""
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.pwrite(fd, bytes(nbytes), 0)
        finally:
            os.close(fd)

    def open_direct(self, key: str) -> _DirectFile | None:
        """O_DIRECT where the file system allows it (not tmpfs, for one): None otherwise."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        path = self._path(key)
        try:
            return _DirectFile(path, os.open(path, os.O_WRONLY | flag))
        except OSError:
            return None

    def truncate(self, key: str, size: int) -> None:
        os.truncate(self._path(key), size)

    def open_append(self, key: str) -> BinaryIO:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "ab", buffering=0)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def describe(self, key: str) -> str:
        return self._path(key)
