"""An s3:// out_dir that cannot be used is refused when the hook is made, in one line saying why: no server at
the endpoint, a bucket name S3 does not allow, credentials the store does not accept (a real moto server on
127.0.0.1 that checks them). Never at the first step, from inside the training loop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

import tensortap as tt
from tensortap.exceptions import InvalidConfiguration

pytest.importorskip("moto")
pytest.importorskip("boto3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return monkeypatch


@pytest.fixture
def checking_server(aws_env):
    """A moto server in its own process that authenticates every request against its (empty) IAM: the
    test's access key is unknown to it."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.1)
    aws_env.setenv("AWS_ENDPOINT_URL", endpoint)
    yield endpoint
    proc.terminate()
    proc.wait(30)


def _hooks():
    yield "generic", lambda out: tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    try:
        import torch  # noqa: F401

        from tensortap.pytorch import Hook as TorchHook
    except ImportError:
        return
    # the PyTorch hook learns its worker at the first step: its out_dir is still checked when it is made
    yield "pytorch", lambda out: TorchHook(out, save_config=tt.SaveConfig(save_interval=1))


def _refused(out: str, *words: str) -> None:
    for kind, make in _hooks():
        with pytest.raises(InvalidConfiguration) as e:
            make(out)
        msg = str(e.value)
        assert "\n" not in msg and all(w in msg for w in words), (kind, msg)


def test_no_server_at_the_endpoint(aws_env):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    aws_env.setenv("AWS_ENDPOINT_URL", endpoint)
    _refused("s3://tt-nobody/job", "cannot reach", endpoint, "s3://tt-nobody/job")


@pytest.mark.parametrize("bucket", ["Bad_Bucket", "ab", "a" * 64, "bucket..name", "-bucket", "192.168.1.1"])
def test_a_bucket_name_s3_does_not_allow(s3_server, bucket):
    _refused(f"s3://{bucket}/job", "not a valid S3 bucket name", repr(bucket))


def test_credentials_the_store_does_not_accept(checking_server):
    _refused("s3://tt-creds/job", "did not accept the credentials", "InvalidAccessKeyId", checking_server)


def test_a_usable_out_dir_is_accepted_and_a_missing_bucket_is_made(s3_server):
    import numpy as np

    bucket = f"tt-{uuid.uuid4().hex[:12]}"
    hook = tt.Hook(f"s3://{bucket}/job", save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_tensor("x", np.arange(4.0))
    hook.close()
    assert tt.create_trial(f"s3://{bucket}/job").tensor("x").steps() == [0]


def test_tensortap_run_refuses_it_before_training(aws_env, tmp_path):
    aws_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    train = tmp_path / "train.py"
    train.write_text("print('training ran')\n")
    exe = os.path.join(os.path.dirname(sys.executable), "tensortap")
    r = subprocess.run([exe, "run", "--out-dir", "s3://tt-nobody/job", "--", sys.executable, str(train)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot reach" in r.stderr and "training ran" not in r.stdout
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
