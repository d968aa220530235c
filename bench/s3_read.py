"""Full read of job (a) (1,000 steps x 50 tensors) from an S3-compatible server: tensortap vs smdebug 1.0.34.

Starts moto's S3 server on 127.0.0.1, writes job (a) with tensortap straight to S3 and with smdebug
locally (then uploads it), and reads both back through each library's own S3 trial in the same run.
smdebug's S3 trial lists the whole events/ prefix for every value it fetches, so a full read of
50,000 values would take hours; it reads a random sample of --smdebug-sample values and the
values/s rate is compared. smdebug runs in its own venv ($SMDEBUG_PYTHON, default /work/smdebug-venv).

Usage: .venv/bin/python bench/s3_read.py [--smdebug-sample 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(__file__))
from read_trial import JOBS, SMDEBUG_SCRIPT, write_job  # noqa: E402

SMDEBUG_S3_READ = textwrap.dedent(
    """
    import json, random, sys, time
    from smdebug.trials import create_trial
    url, sample = sys.argv[1], int(sys.argv[2])
    t0 = time.perf_counter()
    trial = create_trial(url)
    steps = trial.steps()
    names = trial.tensor_names()
    open_s = time.perf_counter() - t0
    rng = random.Random(0)
    pairs = [(rng.choice(names), rng.choice(steps)) for _ in range(sample)]
    t0 = time.perf_counter()
    for name, step in pairs:
        trial.tensor(name).value(step)
    read_s = time.perf_counter() - t0
    print(json.dumps({"open_s": open_s, "read_s": read_s, "values": sample, "steps": len(steps)}))
    """
)


def upload_dir(local: str, url: str) -> None:
    from tensortap.storage import open_storage

    st = open_storage(url)
    for root, _, files in os.walk(local):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), local).replace(os.sep, "/")
            with open(os.path.join(root, f), "rb") as fh:
                st.write(rel, fh.read())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smdebug-sample", type=int, default=300)
    args = ap.parse_args()
    import socket

    import boto3

    import tensortap as tt

    # moto's server in its own process, so that it does not share this process's GIL
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    boto3.client("s3").create_bucket(Bucket="bench")
    job = JOBS["a"]
    url = "s3://bench/tensortap-a"

    print("tensortap: writing job (a) to S3 ...", flush=True)
    write_s = write_job(job, url)
    from tensortap.storage import open_storage

    n_objects = len(open_storage(url).list("tensortap/"))

    t0 = time.perf_counter()
    trial = tt.create_trial(url)
    names = trial.tensor_names()
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = 0
    for name in names:
        steps, _ = trial.tensor(name).stacked()
        n += len(steps)
    read_s = time.perf_counter() - t0
    tt_rate = n / read_s
    print(f"tensortap: wrote job (a) to S3 in {write_s:.2f} s as {n_objects} objects; open {open_s:.3f} s; "
          f"full read of {n} values in {read_s:.2f} s = {tt_rate:,.0f} values/s")

    smd_python = os.environ.get("SMDEBUG_PYTHON", "/work/smdebug-venv/bin/python")
    if not os.path.exists(smd_python):
        print(f"smdebug column skipped: no smdebug venv at {smd_python}")
        server.terminate()
        return 0
    local = tempfile.mkdtemp(prefix="smd-a-")
    r = subprocess.run([smd_python, "-c", SMDEBUG_SCRIPT, local, str(job["steps"]), str(job["scalars"]),
                        str(job["matrices"])], capture_output=True, text=True)
    if r.returncode != 0:
        print("smdebug write failed:", r.stderr[-1500:])
        return 1
    upload_dir(local, "s3://bench/smdebug-a")
    r = subprocess.run([smd_python, "-c", SMDEBUG_S3_READ, "s3://bench/smdebug-a", str(args.smdebug_sample)],
                       capture_output=True, text=True, env=dict(os.environ))
    if r.returncode != 0:
        print("smdebug S3 read failed:", r.stderr[-1500:])
        return 1
    s = json.loads(r.stdout.strip().splitlines()[-1])
    smd_rate = s["values"] / s["read_s"]
    print(f"smdebug:   open {s['open_s']:.2f} s; {s['values']} sampled values in {s['read_s']:.2f} s = "
          f"{smd_rate:,.1f} values/s (a full read of {n} values would take ~{n / smd_rate / 60:.0f} min)")
    print(f"tensortap reads {tt_rate / smd_rate:,.0f}x faster than smdebug's S3 trial "
          f"(open {s['open_s'] / open_s:.0f}x faster)")
    server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
