"""Local-filesystem storage."""

from __future__ import annotations

import errno
import mmap
import os
import uuid
from typing import Any, BinaryIO

from tensortap.storage.base import Storage


class LocalStorage(Storage):
    supports_append = True

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
