"""Spark reads the export with no tensortap code: partition discovery gives job, worker and step_block, and the
values are the trial's, bit for bit. `make test` installs pyspark (requirements/spark.txt) and a Java runtime
(`make spark`); where either is missing the test skips, saying which."""

from __future__ import annotations

import shutil

import pytest

import tensortap as tt
from tensortap.export import export

from .conftest import assert_same_values, expected_scalars, numpy_job

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (`make spark` installs it)")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (`make spark` installs one with root apt-get)", allow_module_level=True)


def test_spark_reads_the_export(tmp_path):
    from pyspark.sql import SparkSession

    out, dest = str(tmp_path / "job"), str(tmp_path / "dest")
    numpy_job(out)
    export(out, dest)
    spark = (SparkSession.builder.master("local[1]").appName("tensortap-export-test")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    try:
        df = spark.read.parquet(f"{dest}/scalars")
        assert {"job", "worker", "step_block", "tensor", "statistic", "value", "collections"} <= set(df.columns)
        rows = [tuple(r) for r in df.select("tensor", "statistic", "worker", "step", "value").collect()]
        assert {r.job for r in df.select("job").distinct().collect()} == {"job"}
        tensors = spark.read.parquet(f"{dest}/tensors").select("tensor", "shape", "values").limit(1).collect()
    finally:
        spark.stop()
    assert_same_values(rows, expected_scalars(tt.create_trial(out)))
    assert tensors and tensors[0].shape == [6, 5] and len(tensors[0]["values"]) == 30
