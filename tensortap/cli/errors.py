"""Errors of the storage layer's clients, said in one line at the command line.

boto3 raises its own exceptions (no credentials, an unreachable endpoint, a missing bucket, access denied) from
deep inside a listing or a read; the CLI names the URL, the endpoint and what to change instead of printing
botocore's traceback. botocore is only looked at when it is already imported (an s3:// URL was used).
"""

from __future__ import annotations

import os
import sys
from typing import Any

_CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"


def _where(urls: list[str]) -> str:
    s3 = [u for u in urls if u.startswith("s3://")]
    return ", ".join(s3) if s3 else "s3"


def _bucket(urls: list[str]) -> str:
    s3 = [u for u in urls if u.startswith("s3://")]
    return s3[0][len("s3://"):].split("/", 1)[0] if s3 else "?"


def storage_error_line(e: BaseException, urls: list[str]) -> str | None:
    """One line for a boto3/botocore error `e` met while reading or writing `urls`; None for anything else."""
    exc = sys.modules.get("botocore.exceptions")
    if exc is None:
        return None
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, exc.BotoCoreError | exc.ClientError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    where = _where(urls)
    if isinstance(cause, exc.NoCredentialsError | exc.PartialCredentialsError):
        return f"{where}: no AWS credentials found: set {_CREDENTIALS}, as boto3 reads them"
    if isinstance(cause, exc.ProfileNotFound):
        return f"{where}: AWS_PROFILE={os.environ.get('AWS_PROFILE')!r}: no such profile in ~/.aws/config"
    if isinstance(cause, exc.EndpointConnectionError | exc.ConnectTimeoutError | exc.ReadTimeoutError):
        ep = getattr(cause, "kwargs", {}).get("endpoint_url", "")
        ep = ep.split("/", 3)[:3] if ep else []
        return (f"{where}: cannot reach the S3 endpoint {'/'.join(ep) or _endpoint()}: set AWS_ENDPOINT_URL to "
                f"a reachable S3-compatible server (or leave it unset for AWS)")
    if isinstance(cause, exc.ClientError):
        return _client_error_line(cause, urls, where)
    return f"{where}: {type(cause).__name__}: {cause}"


def _client_error_line(e: Any, urls: list[str], where: str) -> str:
    err = e.response.get("Error", {}) if hasattr(e, "response") else {}
    code = str(err.get("Code", ""))
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") if hasattr(e, "response") else None
    bucket = _bucket(urls)
    if code in ("NoSuchBucket",) or (code == "404" and "HeadBucket" in str(e)):
        return f"{where}: no such bucket {bucket!r} at {_endpoint()}: create it, or name an existing bucket"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "ExpiredToken",
                "InvalidToken", "AuthFailure"):
        return (f"{where}: {_endpoint()} rejected the credentials ({code}): check {_CREDENTIALS}")
    if code in ("AccessDenied", "Forbidden", "AllAccessDisabled") or status == 403:
        key = os.environ.get("AWS_ACCESS_KEY_ID")
        who = f"access key {key[:4]}…{key[-2:]}" if key and len(key) > 8 else "these credentials"
        return (f"{where}: access denied ({code or 403}) for {who}: they need s3:ListBucket on bucket {bucket!r} "
                f"and s3:GetObject (s3:PutObject to write) on the prefix")
    msg = err.get("Message") or str(e)
    return f"{where}: S3 error {code or status}: {msg}"
