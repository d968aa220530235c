"""Storage backends behind one small interface; `open_storage(url)` picks one by URL scheme."""

from __future__ import annotations

from tensortap.storage.base import Storage
from tensortap.storage.local import LocalStorage

__all__ = ["Storage", "LocalStorage", "open_storage", "is_remote", "check_access"]


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def open_storage(url: str) -> Storage:
    """The backend for `url`: a local path (or file://), or s3://bucket/prefix when the S3 backend is present."""
    url = str(url).strip()
    if not url:
        raise ValueError("empty path: give a local directory or an s3://bucket/prefix URL")
    if url.startswith("file://"):
        return LocalStorage(url[len("file://") :])
    if url.startswith("s3://"):
        try:
            from tensortap.storage.s3 import S3Storage  # lazily: imports boto3
        except ImportError as e:  # pragma: no cover - until the S3 backend lands
            raise ValueError(f"{url}: S3 storage is not available ({e}); install tensortap[s3]") from e
        return S3Storage(url)
    if "://" in url:
        raise ValueError(f"unsupported URL scheme in {url!r}: use a local path, file:// or s3://")
    return LocalStorage(url)


def check_access(url: str) -> None:
    """For an object-store URL, one request that shows it can be used (tensortap.storage.s3.check_access):
    InvalidConfiguration in one line otherwise. Local paths are checked where they are written."""
    if str(url).strip().startswith("s3://"):
        from tensortap.storage.s3 import check_access as check_s3

        check_s3(str(url).strip())
