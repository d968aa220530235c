"""S3 (and S3-compatible: MinIO, Ceph, moto) storage. Imported only when an s3:// URL is used.

Endpoint and credentials follow boto3's own conventions (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3,
profiles, environment credentials). Objects are immutable here: writers publish sealed chunks.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tensortap.storage.base import Storage

logger = logging.getLogger("tensortap")


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix without trailing slash) of s3://bucket/prefix."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    rest = url[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket: use s3://bucket/prefix")
    return bucket, prefix.strip("/")


#: S3's rules for bucket names (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: error codes that mean the store did not accept the credentials
_AUTH_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
               "TokenRefreshRequired", "AuthorizationHeaderMalformed", "InvalidSecurity", "403")


def bucket_name_problem(bucket: str) -> str | None:
    """Why `bucket` is not a valid S3 bucket name, None if it is."""
    if not _BUCKET.fullmatch(bucket):
        return ("3 to 63 characters of lower-case letters, digits, '.' and '-', beginning and ending with a "
                "letter or digit")
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        return "no '..', '.-' or '-.'"
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        return None
    return "not an IP address"


def check_access(url: str, client: Any = None) -> None:
    """One request (a LIST of at most one key under the prefix of s3://bucket/prefix) that shows the endpoint
    answers, the bucket name is valid and the credentials are accepted; InvalidConfiguration with one line saying
    which is not. A bucket that does not exist yet is fine: the first write creates it (as smdebug's did).
    Without `client`, one that tries once (a job's start must not wait out the retries of an endpoint that is
    not there)."""
    from tensortap.exceptions import InvalidConfiguration

    bucket, prefix = parse_s3_url(url)
    where = f"s3://{bucket}/{prefix}"
    bad = bucket_name_problem(bucket)
    if bad is not None:
        raise InvalidConfiguration(f"out_dir {where!r}: {bucket!r} is not a valid S3 bucket name ({bad})")
    if client is None:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 1},
                                                  connect_timeout=10, read_timeout=30))
    endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None) or "the S3 endpoint"
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1)
    except Exception as e:  # noqa: BLE001 - botocore's errors, classified by name and code
        response = getattr(e, "response", None)
        code = str((response or {}).get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            return
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
            raise InvalidConfiguration(f"out_dir {where!r}: no AWS credentials: {first}") from None
        if code in _AUTH_CODES:
            raise InvalidConfiguration(f"out_dir {where!r}: {endpoint} did not accept the credentials ({code}): "
                                       f"{first}") from None
        if code == "InvalidBucketName":
            raise InvalidConfiguration(f"out_dir {where!r}: {endpoint} says {bucket!r} is not a valid bucket "
                                       "name") from None
        if response is None:  # no answer: the endpoint cannot be reached
            raise InvalidConfiguration(f"out_dir {where!r}: cannot reach {endpoint}: {first}") from None
        raise InvalidConfiguration(f"out_dir {where!r}: {endpoint} refused to list it ({code}): {first}") from None


class _RangeCache:
    """A byte-bounded LRU of fetched ranges (objects never change, so entries never go stale)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.size = 0
        self._d: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, k: tuple[str, int, int]) -> bytes | None:
        with self._lock:
            v = self._d.get(k)
            if v is not None:
                self._d.move_to_end(k)
            return v

    def put(self, k: tuple[str, int, int], v: bytes) -> None:
        if len(v) > self.max_bytes // 4:
            return
        with self._lock:
            if k in self._d:
                return
            self._d[k] = v
            self.size += len(v)
            while self.size > self.max_bytes and self._d:
                _, old = self._d.popitem(last=False)
                self.size -= len(old)


class S3Storage(Storage):
    supports_append = False

    def __init__(
        self,
        url: str,
        *,
        client: Any = None,
        max_workers: int = 16,
        cache_bytes: int = 1 << 30,
        coalesce_gap: int = 256 << 10,
        block_bytes: int = 8 << 20,
        max_attempts: int = 5,
    ):
        super().__init__(url.rstrip("/"))
        self.bucket, self.prefix = parse_s3_url(url)
        self._own_client = client is None
        if client is None:
            import boto3
            from botocore.config import Config

            retries: dict[str, Any] = {"mode": "standard"}
            if "AWS_MAX_ATTEMPTS" not in os.environ:  # boto3's own setting wins when given
                retries["max_attempts"] = max_attempts
            client = boto3.client(
                "s3", config=Config(retries=retries, max_pool_connections=max(max_workers, 10))
            )
        self.client = client
        self.max_workers = max_workers
        self.coalesce_gap = coalesce_gap
        self.block_bytes = block_bytes
        self._cache = _RangeCache(cache_bytes)
        self._pool: ThreadPoolExecutor | None = None
        self._bucket_checked = False

    def check_access(self) -> None:
        """See check_access(url): with this storage's client when it was given one."""
        check_access(self.url, None if self._own_client else self.client)

    # --- keys -------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def describe(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    # --- reads ------------------------------------------------------------------------------

    def _not_found(self, e: Exception) -> bool:
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        return code in ("NoSuchKey", "404", "NotFound")

    def read(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except Exception as e:
            if self._not_found(e):
                raise FileNotFoundError(f"{self.describe(key)}: no such object") from None
            raise

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        ck = (key, offset, length)
        hit = self._cache.get(ck)
        if hit is not None:
            return hit
        bb = self.block_bytes
        block = self._cache.get((key, offset // bb * bb, bb))
        if block is not None and offset + length <= offset // bb * bb + len(block):
            lo = offset - offset // bb * bb
            return block[lo : lo + length]
        data = self._get_range(key, offset, length)
        self._cache.put(ck, data)
        return data

    def _get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            resp = self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={offset}-{offset + length - 1}"
            )
        except Exception as e:
            if self._not_found(e):
                raise FileNotFoundError(f"{self.describe(key)}: no such object") from None
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise
        return resp["Body"].read()

    def _read_blocks(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Ranges served from aligned blocks of the object, each block fetched once (in parallel) and kept
        in the LRU cache, so that reading many scattered ranges — one tensor across a chunk, then the next —
        costs a few large GETs instead of one GET per range."""
        bb = self.block_bytes
        needed = sorted({b for off, n in ranges for b in range(off // bb, (off + n - 1) // bb + 1)})
        blocks: dict[int, bytes] = {}
        missing = []
        for b in needed:
            hit = self._cache.get((key, b * bb, bb))
            if hit is None:
                missing.append(b)
            else:
                blocks[b] = hit
        if missing:
            fetched = list(self._executor().map(lambda b: self._get_range(key, b * bb, bb), missing))
            for b, data in zip(missing, fetched, strict=True):
                blocks[b] = data
                self._cache.put((key, b * bb, bb), data)
        out = []
        for off, n in ranges:
            first, last = off // bb, (off + n - 1) // bb
            if first == last:
                lo = off - first * bb
                out.append(blocks[first][lo : lo + n])
            else:
                joined = b"".join(blocks[b] for b in range(first, last + 1))
                lo = off - first * bb
                out.append(joined[lo : lo + n])
        return out

    def read_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Ranges of one object: neighbours coalesced into one GET, GETs issued in parallel; many scattered
        ranges are served from cached aligned blocks instead."""
        if not ranges:
            return []
        if len(ranges) > 8:
            return self._read_blocks(key, ranges)
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        groups: list[list[int]] = []
        spans: list[tuple[int, int]] = []
        for i in order:
            off, n = ranges[i]
            if spans and off <= spans[-1][0] + spans[-1][1] + self.coalesce_gap:
                start = spans[-1][0]
                spans[-1] = (start, max(spans[-1][1], off + n - start))
                groups[-1].append(i)
            else:
                spans.append((off, n))
                groups.append([i])
        if len(spans) == 1:
            bufs = [self.read_range(key, *spans[0])]
        else:
            bufs = list(self._executor().map(lambda s: self.read_range(key, *s), spans))
        out: list[bytes] = [b""] * len(ranges)
        for (start, _), buf, members in zip(spans, bufs, groups, strict=True):
            for i in members:
                off, n = ranges[i]
                out[i] = buf[off - start : off - start + n]
        return out

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="tensortap-s3")
        return self._pool

    def size(self, key: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as e:
            if self._not_found(e) or getattr(e, "response", {}).get("Error", {}).get("Code") in ("403",):
                return None
            raise

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after is not None:
            kwargs["StartAfter"] = self._key(start_after)
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(**kwargs):
                keys.extend(self._rel(o["Key"]) for o in page.get("Contents", []))
        except Exception as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket":
                return []
            raise
        keys.sort()
        return keys

    def has_keys(self, prefix: str) -> bool:
        """One LIST of at most one key."""
        try:
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(prefix), MaxKeys=1)
        except Exception as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket":
                return False
            raise
        return bool(resp.get("Contents"))

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate sub-folders of `prefix` (one LIST with a delimiter)."""
        p = self._key(prefix.rstrip("/") + "/")
        out = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=p, Delimiter="/"):
                out.extend(self._rel(cp["Prefix"]).rstrip("/") for cp in page.get("CommonPrefixes", []))
        except Exception as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchBucket":
                return []
            raise
        return sorted(out)

    # --- writes -----------------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception:  # noqa: BLE001 - missing or not ours: try to create it, as smdebug did
            try:
                self.client.create_bucket(Bucket=self.bucket)
            except Exception as e:  # noqa: BLE001
                code = getattr(e, "response", {}).get("Error", {}).get("Code")
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
        self._bucket_checked = True

    def write(self, key: str, data: bytes) -> None:
        self.ensure_bucket()
        if len(data) > (64 << 20):
            import io

            from boto3.s3.transfer import TransferConfig

            self.client.upload_fileobj(
                io.BytesIO(data), self.bucket, self._key(key),
                Config=TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=32 << 20),
            )
        else:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """A conditional put (If-None-Match: *): the store refuses it with 412 if the key exists."""
        self.ensure_bucket()
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, without importing botocore here
            code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
