"""Shared fixtures: a real S3-compatible server (moto's) on 127.0.0.1, started by the tests."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1; yields its endpoint URL and points boto3 at it."""
    pytest.importorskip("moto")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_url(s3_server):
    """A fresh s3://bucket/prefix on the test server."""
    import boto3

    bucket = f"tt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/jobs/{uuid.uuid4().hex[:6]}"


@pytest.fixture
def writer_processes():
    """A function giving the pids of this process's children that run a tensortap writer process (read through
    /proc: the test is skipped where there is none)."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("finds writer processes through /proc")

    def find() -> list[int]:
        me, found = str(os.getpid()), []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = f.read().rsplit(")", 1)[1].split()[1]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if ppid == me and b"_child_main" in cmd:
                found.append(int(pid))
        return found

    return find
