"""`tensortap export` / `Trial.to_arrow()`: jobs of every kind exported, read back by DuckDB and Polars (no tensortap
code on the reading side) with the trial's values, bit for bit; incremental export of a live job."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensortap as tt
from tensortap.cli.main import main as cli_main
from tensortap.export import export

from .conftest import FIXTURES, assert_same_values, expected_scalars, numpy_job, torch_job, xgboost_job

pa = pytest.importorskip("pyarrow")
duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")

COLS = "tensor, statistic, worker, step, value"


def duck(dest, table="scalars", where="true", cols=COLS):
    return duckdb.sql(f"SELECT {cols} FROM read_parquet('{dest}/{table}/**/*.parquet', hive_partitioning=true) "
                      f"WHERE {where}").fetchall()


def polars_rows(dest, table="scalars", cols=COLS):
    lf = pl.scan_parquet(f"{dest}/{table}/**/*.parquet", hive_partitioning=True)
    return lf.select([c.strip() for c in cols.split(",")]).collect().rows()


def check_tensors(trial, rows) -> int:
    """Rows (tensor, worker, step, dtype, shape, values) equal the trial's raw values bit for bit."""
    n = 0
    for tensor, worker, step, dtype, shape, values in rows:
        want = np.asarray(trial.tensor(tensor).value(step, worker=worker))
        assert list(want.shape) == list(shape)
        assert dtype == (want.dtype.name if want.dtype.kind == "V" else want.dtype.str)
        n += 1
        if want.dtype.kind not in "biufV":  # strings (XGBoost's trees): dtype and shape only
            assert values is None
            continue
        assert values is not None
        got = np.asarray(values, dtype=np.float64).reshape(shape).astype(want.dtype)
        assert got.tobytes() == want.tobytes() or np.array_equal(got, want, equal_nan=True), (tensor, step)
    return n


def _has_raw(t, step, worker) -> bool:
    try:
        t.value(step, worker=worker)
        return True
    except tt.exceptions.TensorUnavailableForStep:
        return False


def make(kind, path):
    if kind == "pytorch":
        torch_job(path)
    elif kind == "xgboost":
        xgboost_job(path)
    elif kind == "numpy":
        numpy_job(path)
    else:
        return os.path.join(FIXTURES, kind)
    return path


@pytest.mark.parametrize("kind", ["pytorch", "xgboost", "numpy", "pytorch_job", "two_workers"])
def test_exported_job_reads_back_with_the_trials_values(kind, tmp_path):
    path = make(kind, str(tmp_path / "job"))
    dest = tmp_path / "dest"
    assert cli_main([ "export", path, "--parquet", str(dest), "--json"]) == 0
    trial = tt.create_trial(path)
    expected = expected_scalars(trial)
    assert expected, "the job saved no scalars"
    assert_same_values(duck(dest), expected)
    assert_same_values(polars_rows(dest), expected)
    # the job column, and the in-memory table with the same rows
    assert {r[0] for r in duck(dest, cols="job")} == {os.path.basename(path)}
    assert_same_values(trial.to_arrow().select(["tensor", "statistic", "worker", "step", "value"]).to_pylist()
                       and [tuple(r.values()) for r in trial.to_arrow().select(
                           ["tensor", "statistic", "worker", "step", "value"]).to_pylist()], expected)
    # raw tensors: every raw non-scalar value, elements inline (all are small here)
    raw = duck(dest, "tensors", cols="tensor, worker, step, dtype, shape, \"values\"")
    assert len(raw) == sum(np.asarray(trial.tensor(n).value(s, worker=w)).size != 1 for n in trial.tensor_names()
                           for w in trial.workers() for s in trial.tensor(n).steps()
                           if w in trial.tensor(n).workers(s) and _has_raw(trial.tensor(n), s, w))
    if kind in ("pytorch", "numpy", "pytorch_job"):
        assert raw
    assert check_tensors(trial, raw) == len(raw)
    assert check_tensors(trial, polars_rows(dest, "tensors", "tensor, worker, step, dtype, shape, values")) == len(raw)
    # the collections column
    colls = dict(duck(dest, cols="DISTINCT tensor, collections"))
    for c in ("weights", "gradients", "losses"):
        if c in trial.collections() and trial.tensor_names(collection=c):
            assert all(c in colls[n] for n in trial.tensor_names(collection=c) if n in colls)


def test_exporting_again_adds_only_new_steps_of_a_live_job(tmp_path):
    out, dest = str(tmp_path / "job"), str(tmp_path / "dest")
    hook = numpy_job(out, steps=range(6), close=False)
    hook.flush()
    trial = tt.create_trial(out)
    trial.wait_for_steps([4], timeout=30)
    first = export(out, dest)["jobs"]["job"]
    done = first["exported_upto"]
    assert not first["ended"] and 4 <= done <= 5
    steps = sorted({r[0] for r in duck(dest, cols="step")})
    assert steps == list(range(done + 1))  # complete steps only
    numpy_job(out, steps=range(6, 12), hook=hook)  # the job goes on and ends
    second = export(out, dest)["jobs"]["job"]
    assert second["ended"] and second["exported_upto"] == 11
    rows = duck(dest)
    assert_same_values(rows, expected_scalars(tt.create_trial(out)))  # every value exactly once
    files = sorted(f for _, _, fs in os.walk(dest) for f in fs if f.endswith(".parquet"))
    assert [f for f in files if f.startswith("part-000001")] and [f for f in files if f.startswith("part-000002")]
    third = export(out, dest)["jobs"]["job"]
    assert third["rows"]["scalars"] == 0 and len(duck(dest)) == len(rows)


def test_an_interrupted_export_leaves_no_rows_behind(tmp_path):
    out, dest = str(tmp_path / "job"), tmp_path / "dest"
    numpy_job(out)
    export(out, str(dest))
    n = len(duck(dest))
    # files of a generation that never committed (an export killed before writing its state)
    stray = dest / "scalars" / "job=job" / "worker=worker_0" / "step_block=0" / "part-000002-0000.parquet"
    stray.write_bytes((dest / "scalars" / "job=job" / "worker=worker_0" / "step_block=0" /
                       "part-000001-0000.parquet").read_bytes())
    assert len(duck(dest)) == 2 * n
    export(out, str(dest))  # nothing new, and the stray generation is gone
    assert len(duck(dest)) == n and not stray.exists()
    state = json.loads((dest / "_tensortap" / "export.json").read_text())
    assert state["schema_version"] == 1 and state["generation"] == 2


def test_events_hold_rule_statuses_the_stop_and_the_first_nonfinite_step(tmp_path):
    out, dest = str(tmp_path / "job"), str(tmp_path / "dest")
    numpy_job(out)
    assert cli_main(["rules", "run", out, "--rule", "exploding_tensor", "--json"]) == 1
    assert cli_main(["export", out, "--parquet", dest]) == 0
    ev = duckdb.sql(f"SELECT event, rule, origin, status, step, tensor FROM read_parquet('{dest}/events/**/*.parquet', "
                    "hive_partitioning=true) ORDER BY event").fetchall()
    assert ("fired", "exploding_tensor", "offline", "IssuesFound", 5, None) in ev
    assert ("first_nonfinite", None, None, None, 5, "dense/weight") in ev
    assert any(e[0] == "status" and e[3] == "IssuesFound" for e in ev)


def test_large_tensors_are_pointers_into_the_native_store(tmp_path):
    out, dest = str(tmp_path / "job"), str(tmp_path / "dest")
    numpy_job(out, steps=range(3))
    export(out, dest, max_elements=10)
    rows = duck(dest, "tensors", cols="tensor, step, dtype, shape, \"values\", store_path, store_offset, store_length")
    assert rows and all(r[4] is None for r in rows)
    trial = tt.create_trial(out)
    for tensor, step, dtype, shape, _, path, off, n in rows:
        with open(path, "rb") as f:
            f.seek(off)
            got = np.frombuffer(f.read(n), dtype=np.dtype(dtype)).reshape(shape)
        assert got.tobytes() == trial.tensor(tensor).value(step).tobytes()


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert cli_main(["export", str(tmp_path / "nope"), "--parquet", str(tmp_path / "d")]) == 2
    assert "nope" in capsys.readouterr().err
    numpy_job(str(tmp_path / "a" / "job"), steps=range(2))
    numpy_job(str(tmp_path / "b" / "job"), steps=range(2))
    assert cli_main(["export", str(tmp_path / "a" / "job"), str(tmp_path / "b" / "job"),
                     "--parquet", str(tmp_path / "d")]) == 2
    assert "--job-name" in capsys.readouterr().err
    assert cli_main(["export", str(tmp_path / "a" / "job"), "--parquet", str(tmp_path / "d"), "--step-block", "0"]) == 2


def test_import_tensortap_does_not_import_pyarrow():
    import subprocess
    import sys

    code = ("import sys, tensortap, tensortap.trials, tensortap.export, tensortap.compare, tensortap.cli.main;"
            "print([m for m in ('pyarrow', 'dask', 'duckdb', 'polars', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_an_interrupted_job_is_exported_whole_with_all(tmp_path):
    src = os.path.join(FIXTURES, "dtypes")  # written without an end marker: its last steps are not complete
    dest = str(tmp_path / "dest")
    before = export(src, dest)["jobs"]["dtypes"]
    assert not before["ended"]
    assert cli_main(["export", src, "--parquet", dest, "--all"]) == 0
    trial = tt.create_trial(src)
    trial.assume_ended()
    assert_same_values(duck(dest), expected_scalars(trial))


def test_a_statistics_only_pytorch_job_exports_step_block_by_step_block_with_the_trials_values(tmp_path):
    """The PyTorch hook's statistics land packed (docs/format.md §3.3); an export in several step blocks (each read
    through a trial of that range) holds every value once, bit for bit; read_statistics gives Trial.statistics."""
    torch = pytest.importorskip("torch")
    import glob

    import tensortap.pytorch as tp
    from tensortap.format import codec
    from tensortap.format.entries import PACKED
    from tensortap.trials import read_statistics

    out, dest = str(tmp_path / "job"), str(tmp_path / "dest")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tp.Hook(out, save_config=tp.SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
                   reduction_config=tp.ReductionConfig(reductions=["min", "max"], norms=["l2"]))
    hook.register_module(model)
    for _ in range(7):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(4, 6)), torch.randint(0, 3, (4,))).backward()
        opt.step()
    hook.close()
    kinds = set()
    for idx in glob.glob(f"{out}/tensortap/*/*.idx"):
        with open(idx, "rb") as f:
            kinds |= {int(k) for _, d, _ in codec.decode_blocks(f.read(), 0, idx, final=True).blocks for k in d["kind"]}
    assert PACKED in kinds
    summary = export(out, dest, step_block=2)
    assert summary["jobs"]["job"]["exported_upto"] == 6
    trial = tt.create_trial(out)
    expected = expected_scalars(trial)
    assert len(expected) > 100
    assert_same_values(duck(dest), expected)
    assert_same_values(polars_rows(dest), expected)
    assert sorted({r[0] for r in duck(dest, cols="step_block")}) == [0, 2, 4, 6]
    got = read_statistics(out, ["min", "max", "l2"])
    want = {n: d for n, d in trial.statistics(stats=["min", "max", "l2"]).items() if d}
    assert got.keys() == want.keys()
    for n in want:
        for s in want[n]:
            assert got[n][s][0].tolist() == want[n][s][0].tolist()
            assert got[n][s][1].dtype == np.float32  # (as saved: the model's dtype)
            assert got[n][s][1].astype(np.float64).tobytes() == want[n][s][1].tobytes()
