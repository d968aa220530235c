"""tensortap.dask on a dask.distributed LocalCluster of two processes on 127.0.0.1: read_jobs equal to the trials'
values (native jobs with several workers and chunks, an smdebug out_dir, a job on S3), and rules over many jobs
writing the same statuses as `tensortap rules run` job by job."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import tensortap as tt
from tensortap.cli.main import main as cli_main

from ..export.conftest import FIXTURES, assert_same_values, expected_scalars, numpy_job

distributed = pytest.importorskip("distributed")
pytest.importorskip("dask.dataframe")
pytest.importorskip("pandas")

import tensortap.dask as ttd  # noqa: E402


@pytest.fixture(scope="module")
def client(s3_server):
    # after s3_server: the workers' processes inherit its endpoint and credentials
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, worker_dashboard_address=None)
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def two_worker_job(out_dir: str, steps: int = 12) -> None:
    """A native job of two workers, each over several chunk files (a small chunk size)."""
    hooks = [tt.Hook(out_dir, save_config=tt.SaveConfig(save_interval=1), include_workers="all", rank=r,
                     world_size=2, chunk_bytes=2048, include_collections=["weights"]) for r in range(2)]
    for s in range(steps):
        for r, h in enumerate(hooks):
            h.next_step()
            h.save_tensor("w", np.full((16, 16), s + r, dtype=np.float32), collections_to_write="weights")
            h.save_scalar("loss", 1.0 / (s + 1 + r))
            if s % 3 == 2:
                h.flush()  # a chunk ends at an index block past chunk_bytes
    for h in hooks:
        h.close()


def rows_of(pdf):
    return list(pdf[["tensor", "statistic", "worker", "step", "value"]].itertuples(index=False, name=None))


def test_read_jobs_on_the_cluster_equals_the_trials(tmp_path, client, s3_url):
    two_worker_job(str(tmp_path / "multi"))
    numpy_job(str(tmp_path / "single"))
    s3_job = s3_url + "/ons3"
    numpy_job(s3_job, steps=range(5))
    smdebug = os.path.join(FIXTURES, "two_workers")
    jobs = [str(tmp_path / "*"), smdebug, s3_job]
    parts = ttd.partitions(jobs)
    multi = [p for p in parts if p.job == "multi"]
    assert {p.worker for p in multi} == {"worker_0", "worker_1"} and len(multi) > 2  # several chunks per worker
    df = ttd.read_jobs(jobs)
    assert df.npartitions == len(parts)
    pdf = client.compute(df).result()
    for job, path in (("multi", str(tmp_path / "multi")), ("single", str(tmp_path / "single")),
                      ("two_workers", smdebug), ("ons3", s3_job)):
        got = pdf[pdf["job"] == job]
        assert_same_values(rows_of(got), expected_scalars(tt.create_trial(path)))
    # a query runs on the cluster too: the last loss of each job
    last = df[df.tensor == "scalar/loss"].groupby("job")["step"].max().compute()
    assert last["multi"] == 11 and last["single"] == 9 and last["ons3"] == 4


def test_a_long_chunk_is_read_as_ranges_of_blocks_equal_to_the_trial(tmp_path, monkeypatch):
    """A chunk larger than a partition's share is read as byte ranges of whole index blocks, each by the columnar
    reader (statistics and scalars) or through a trial of its range (raw values): together, the trial's rows."""
    from ..trials.test_native_columns import _stats_job

    _stats_job(str(tmp_path / "stats"), workers=2)
    hook = tt.Hook(str(tmp_path / "raw"), save_config=tt.SaveConfig(save_interval=1))
    for s in range(30):
        hook.next_step()
        hook.save_tensor("w", np.full((8, 8), s, dtype=np.float32))  # statistics computed from the payload
        hook.save_scalar("loss", 1.0 / (s + 1))
        if s % 3 == 2:
            hook.flush()
    hook.close()
    monkeypatch.setattr(ttd, "NATIVE_ENTRIES_PER_PARTITION", 20)
    for job in ("stats", "raw"):
        path = str(tmp_path / job)
        parts = ttd.partitions([path])
        assert any(p.hi for p in parts) and len(parts) >= 3  # ranges, not whole chunks
        pdf = ttd.read_jobs([path]).compute(scheduler="sync")
        assert_same_values(rows_of(pdf), expected_scalars(tt.create_trial(path)))


def test_a_job_of_packed_statistics_is_read_in_ranges_sized_by_its_values(tmp_path, monkeypatch):
    """Packed statistics (one index entry a step for many values) are partitioned by the values they hold, not by
    their few index entries: ranges whose rows together are the trial's."""
    from ..trials.test_packed_statistics import _job

    path = str(tmp_path / "packed")
    _job(path, True)
    monkeypatch.setattr(ttd, "NATIVE_ENTRIES_PER_PARTITION", 20)
    parts = ttd.partitions([path])
    assert len(parts) >= 6 and all(p.hi for p in parts)  # (2 workers × ≥ 3 ranges of whole blocks)
    pdf = ttd.read_jobs([path]).compute(scheduler="sync")
    assert_same_values(rows_of(pdf), expected_scalars(tt.create_trial(path)))


def _statuses(path):
    out = {}
    rules = os.path.join(path, "rules")
    for rule in sorted(os.listdir(rules)):
        with open(os.path.join(rules, rule, "offline", "status.json")) as f:
            st = json.load(f)
        with open(os.path.join(rules, rule, "offline", "report.json")) as f:
            report = json.load(f)
        st.pop("updated_at")
        report.pop("generated_at", None)
        out[rule] = (st, report)
    return out


def _strip_times(x):
    if isinstance(x, dict):
        return {k: _strip_times(v) for k, v in x.items() if "time" not in k and not k.endswith("_at")}
    if isinstance(x, list | tuple):
        return [_strip_times(v) for v in x]
    return x


def test_rules_over_many_jobs_on_the_cluster_write_what_rules_run_writes(tmp_path, client, capsys):
    runs = tmp_path / "runs"
    numpy_job(str(runs / "a"))  # NaN at step 5: exploding_tensor fires
    numpy_job(str(runs / "b"), steps=range(5))  # no NaN
    shutil.copytree(os.path.join(FIXTURES, "pytorch_job"), runs / "c")
    rules = ["--rule", "exploding_tensor", "--rule", "loss_not_decreasing:num_steps=2"]
    by_job = {}
    codes = {}
    for job in ("a", "b", "c"):
        codes[job] = cli_main(["rules", "run", str(runs / job), *rules, "--json"])
        by_job[job] = _strip_times(_statuses(runs / job))
        shutil.rmtree(runs / job / "rules")
    capsys.readouterr()
    address = client.scheduler.address
    code = cli_main(["rules", "run", str(runs / "*"), *rules, "--dask", address, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["jobs"]) == {str(runs / j) for j in "abc"}
    for job in ("a", "b", "c"):
        assert _strip_times(_statuses(runs / job)) == by_job[job]
    assert code == max(codes.values(), key=lambda c: {2: 3, 1: 2, 3: 1, 0: 0}[c])
    assert by_job["a"]["exploding_tensor"][0]["status"] == "IssuesFound"


def test_bad_input_is_a_clear_error(tmp_path):
    from tensortap.exceptions import InvalidConfiguration

    with pytest.raises(InvalidConfiguration, match="matches no job"):
        ttd.read_jobs(str(tmp_path / "none-*"))
    with pytest.raises(InvalidConfiguration, match="steps_per_partition"):
        ttd.read_jobs(str(tmp_path), steps_per_partition=0)
