"""The export through s3:// on moto's S3 server (127.0.0.1): jobs read from S3 and written to S3, read back by
Polars (its own S3 client) and by DuckDB over pyarrow's S3 filesystem. DuckDB's own S3 support (the httpfs
extension) is downloaded by DuckDB at first use, which this test machine cannot: it is not tested here."""

from __future__ import annotations

import os
import uuid

import pytest

import tensortap as tt
from tensortap.export import export

from .conftest import FIXTURES, assert_same_values, expected_scalars, torch_job, xgboost_job

pa = pytest.importorskip("pyarrow")
duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")
pytest.importorskip("boto3")

COLS = ["tensor", "statistic", "worker", "step", "value"]


def _split(url):
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return bucket, prefix


@pytest.mark.parametrize("kind", ["pytorch", "xgboost", "smdebug"])
def test_export_to_s3_reads_back_with_the_trials_values(kind, tmp_path, s3_server, s3_url):
    if kind == "pytorch":
        src = s3_url + "/job"  # the job itself writes to S3
        torch_job(src)
    elif kind == "xgboost":
        src = str(tmp_path / "job")
        xgboost_job(src)
    else:
        src = os.path.join(FIXTURES, "two_workers")
    dest = f"{s3_url}/export-{uuid.uuid4().hex[:6]}"
    summary = export(src, dest)
    job = next(iter(summary["jobs"]))
    expected = expected_scalars(tt.create_trial(src))
    assert expected

    opts = {"aws_endpoint_url": s3_server, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "aws_region": "us-east-1", "aws_allow_http": "true"}
    lf = pl.scan_parquet(f"{dest}/scalars/**/*.parquet", hive_partitioning=True, storage_options=opts)
    got = lf.select([*COLS, "job"]).collect()
    assert set(got["job"].to_list()) == {job}
    assert_same_values(got.select(COLS).rows(), expected)

    import pyarrow.dataset as ds
    from pyarrow import fs

    s3 = fs.S3FileSystem(endpoint_override=s3_server, access_key="testing", secret_key="testing",
                         region="us-east-1", scheme="http")
    bucket, prefix = _split(dest)
    scalars = ds.dataset(f"{bucket}/{prefix}/scalars", filesystem=s3, format="parquet", partitioning="hive")
    con = duckdb.connect()
    con.register("scalars", scalars)
    rows = con.sql(f"SELECT {', '.join(COLS)} FROM scalars").fetchall()
    assert_same_values(rows, expected)
    # exporting again appends nothing
    again = export(src, dest)
    assert again["jobs"][job]["rows"]["scalars"] == 0
    assert pl.scan_parquet(f"{dest}/scalars/**/*.parquet", hive_partitioning=True,
                           storage_options=opts).select(pl.len()).collect().item() == len(expected)
