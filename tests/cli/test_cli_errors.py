"""Every CLI error is one line that names the bad value and what is allowed, with exit status 2.

S3 errors are met for real: moto's S3 server on 127.0.0.1 (tests/conftest.py), with its authentication
switched on for the tests that need wrong credentials or a user without permissions.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

import tensortap as tt


def _tensortap(*args, env=None, timeout=120):
    exe = shutil.which("tensortap", path=os.path.dirname(sys.executable)) or "tensortap"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _one_line_error(r) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def _aws_env(endpoint: str, **creds: str) -> dict[str, str]:
    """The environment with no AWS setting but `creds` and the endpoint: nothing read from ~/.aws."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1",
               **creds)
    return env


@pytest.fixture
def job(tmp_path):
    out = str(tmp_path / "job")
    hook = tt.Hook(out, save_config=tt.SaveConfig(save_interval=1))
    for _ in range(2):
        hook.next_step()
        hook.save_scalar("loss", 1.0)
    hook.close()
    return out


S3_COMMANDS = {
    "ls": lambda url, tmp: ["ls", url],
    "report": lambda url, tmp: ["report", url, "-o", str(tmp / "r.html")],
    "run": lambda url, tmp: ["run", "--out-dir", url, "--rule", "vanishing_gradient", "--",
                             sys.executable, "-c", "pass"],
    "rules run": lambda url, tmp: ["rules", "run", url, "--rule", "vanishing_gradient"],
}


@pytest.mark.parametrize("command", list(S3_COMMANDS))
def test_s3_without_credentials(s3_server, tmp_path, command):
    url = f"s3://tt-{uuid.uuid4().hex[:10]}/jobs/j1"
    line = _one_line_error(_tensortap(*S3_COMMANDS[command](url, tmp_path), env=_aws_env(s3_server)))
    assert line.startswith(f"tensortap: error: {url}: no AWS credentials found"), line
    assert "AWS_ACCESS_KEY_ID" in line


@pytest.mark.parametrize("command", ["ls", "run"])
def test_s3_without_the_bucket(s3_server, tmp_path, command):
    bucket = f"tt-missing-{uuid.uuid4().hex[:8]}"
    url = f"s3://{bucket}/jobs/j1"
    env = _aws_env(s3_server, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    line = _one_line_error(_tensortap(*S3_COMMANDS[command](url, tmp_path), env=env))
    assert f"no such bucket {bucket!r}" in line and url in line, line


@pytest.mark.parametrize("url", ["s3://", "s3:///jobs/j1"])
def test_s3_url_without_a_bucket(url):
    line = _one_line_error(_tensortap("ls", url))
    assert repr(url) in line and "s3://bucket/prefix" in line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["ls", "run"])
def test_s3_endpoint_unreachable(tmp_path, command):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    url = "s3://bucket/jobs/j1"
    env = _aws_env(endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    line = _one_line_error(_tensortap(*S3_COMMANDS[command](url, tmp_path), env=env))
    assert f"{url}: cannot reach the S3 endpoint {endpoint}" in line and "AWS_ENDPOINT_URL" in line, line


@pytest.fixture
def s3_with_auth(s3_server, s3_url):
    """moto with authentication on: a bucket holding a job, and an IAM user that may do nothing."""
    import boto3
    from moto import settings

    storage_url = s3_url
    hook = tt.Hook(storage_url, save_config=tt.SaveConfig(save_interval=1))
    hook.next_step()
    hook.save_scalar("loss", 1.0)
    hook.close()
    iam = boto3.client("iam")
    user = f"nobody-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    saved = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # every request from now on is authenticated
    try:
        yield s3_server, storage_url, key
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = saved


@pytest.mark.parametrize("command", ["ls", "report", "run"])
def test_s3_permission_denied(s3_with_auth, tmp_path, command):
    endpoint, url, key = s3_with_auth
    env = _aws_env(endpoint, AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
    if command == "run":
        url = url + "-new"
    line = _one_line_error(_tensortap(*S3_COMMANDS[command](url, tmp_path), env=env))
    assert f"{url}: access denied" in line and "s3:ListBucket" in line, line
    assert key["AccessKeyId"] not in line  # a credential is never printed whole


def test_s3_wrong_credentials(s3_with_auth, tmp_path):
    endpoint, url, _ = s3_with_auth
    env = _aws_env(endpoint, AWS_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG1", AWS_SECRET_ACCESS_KEY="wrong")
    line = _one_line_error(_tensortap("ls", url, env=env))
    assert f"{url}: {endpoint} rejected the credentials (InvalidAccessKeyId)" in line, line


def test_missing_double_dash_before_the_training_command(tmp_path):
    out = str(tmp_path / "job")
    line = _one_line_error(_tensortap("run", "--out-dir", out, "--rule", "vanishing_gradient", "python",
                                      "train.py", "--epochs", "3"))
    assert "'python train.py --epochs 3' is not an option of tensortap run" in line
    assert f"tensortap run --out-dir {out} --rule vanishing_gradient -- python train.py --epochs 3" in line
    assert not os.path.exists(out)


def test_run_without_a_command_or_out_dir():
    line = _one_line_error(_tensortap("run", "--out-dir", "x"))
    assert "no training command: write it after --" in line
    line = _one_line_error(_tensortap("run", "--", sys.executable, "-c", "pass"))
    assert "--out-dir is required" in line


@pytest.mark.parametrize("output", ["/proc/x.html", "/nonexistent-dir/x.html", "DIR"])
def test_report_to_a_place_that_cannot_be_written(job, tmp_path, output):
    output = str(tmp_path) if output == "DIR" else output
    line = _one_line_error(_tensortap("report", job, "-o", output))
    assert f"-o {output!r}" in line and ".partial" not in line, line
    assert "directory" in line


def test_tensorboard_logdir_that_is_a_file(job, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    line = _one_line_error(_tensortap("tensorboard", job, "--logdir", str(f)))
    assert f"--logdir {str(f)!r} is a file: name a directory" in line


def test_argument_errors_are_one_line():
    line = _one_line_error(_tensortap("ui", "x", "--port", "many"))
    assert "argument --port: invalid int value: 'many'" in line and "(see tensortap ui --help)" in line
    line = _one_line_error(_tensortap("nosuch"))
    assert "invalid choice: 'nosuch'" in line and "ls" in line


def test_version_and_help_with_an_example_per_subcommand():
    r = _tensortap("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tensortap {tt.__version__}"
    r = _tensortap("--help")
    assert r.returncode == 0
    for sub in ("ls", "run", "rules", "ui", "report", "tensorboard", "export", "compare"):
        assert f"\n  tensortap {sub} " in r.stdout, sub  # an example of each in the overview
        h = _tensortap(*sub.split(), "--help")
        assert h.returncode == 0 and "example" in h.stdout and f"tensortap {sub} " in h.stdout.split("example")[-1]


def test_run_checks_its_arguments_before_starting_anything(tmp_path):
    out = str(tmp_path / "job")
    line = _one_line_error(_tensortap("run", "--out-dir", out, "--save-interval", "0", "--", sys.executable,
                                      "-c", "pass"))
    assert "--save-interval 0" in line
    assert not os.path.exists(out)
