"""EventExporter read back with TensorBoard's own EventAccumulator (which checks every record's CRC)."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.tensorboard.export import EventExporter
from tensortap.tensorboard.histogram import default_edges, make_histogram

COLLECTIONS = {
    "collections": {
        "weights": {"name": "weights", "include_regex": ["^(?!gradient).*weight"], "tensor_names": [],
                    "save_histogram": True},
        "gradients": {"name": "gradients", "include_regex": ["^gradient"], "tensor_names": [],
                      "save_histogram": False},
        "losses": {"name": "losses", "include_regex": [], "tensor_names": ["loss"], "save_histogram": True},
        "all": {"name": "all", "include_regex": [], "tensor_names": [], "save_histogram": True},
    },
    "_meta": {"num_workers": 1},
}


def _job(rng, steps=12):
    """(step, mode, mode_step, weight, gradient, loss) of a small job, EVAL every third step."""
    out = []
    counts = {"TRAIN": 0, "EVAL": 0}
    for s in range(steps):
        mode = "EVAL" if s % 3 == 2 else "TRAIN"
        w = rng.normal(size=(40, 25)).astype(np.float32)
        if s == 4:
            w[0, :3] = np.nan
            w[1, 0] = np.inf
            w[2, 0] = -np.inf
        g = rng.normal(size=(40, 25)).astype(np.float32)
        out.append((s, mode, counts[mode], w, g, np.float32(1.0 / (s + 1))))
        counts[mode] += 1
    return out


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_scalars_reductions_histograms_and_nonfinite_per_mode(tmp_path, read_run, tb):
    rng = np.random.default_rng(0)
    job = _job(rng)
    ex = EventExporter(str(tmp_path), "worker_0")
    ex.set_collections(COLLECTIONS)
    for s, mode, ms, w, g, loss in job:
        ex.add("fc.weight", s, mode, ms, w, {"mean": float(np.mean(w)), "abs_max": 2.5})
        ex.add("gradient/fc.weight", s, mode, ms, g, {"l2": float(np.linalg.norm(g))})
        ex.add("loss", s, mode, ms, np.asarray(loss), {})
        ex.add("scalar/lr", s, mode, ms, np.asarray(0.1 * s), {})
    ex.close()
    assert ex.errors == 0 and ex.records == 4 * len(job)
    # one file per mode, whatever the number of steps
    files = sorted(os.path.relpath(p, tmp_path) for p in glob.glob(str(tmp_path / "**" / "*tfevents*"),
                                                                    recursive=True))
    assert [os.path.dirname(f) for f in files] == ["worker_0/eval", "worker_0/train"]

    for mode in ("TRAIN", "EVAL"):
        ea = read_run(tmp_path / "worker_0" / mode.lower())
        rows = [r for r in job if r[1] == mode]
        steps = [r[0] for r in rows]
        assert sorted(tb.scalars(ea, "1_losses/loss")) == steps  # losses lead TensorBoard's page
        nonfinite = tb.scalars(ea, "nonfinite/fc.weight") if "nonfinite/fc.weight" in ea.Tags()["scalars"] else {}
        for s, _, _, w, g, loss in rows:
            assert tb.scalars(ea, "1_losses/loss")[s] == np.float32(loss)
            assert tb.scalars(ea, "scalar/lr")[s] == np.float32(0.1 * s)
            # a NaN reduction is written as NaN, not dropped
            assert np.array_equal(tb.scalars(ea, "fc.weight/mean")[s], np.float32(np.mean(w)), equal_nan=True)
            assert tb.scalars(ea, "fc.weight/abs_max")[s] == 2.5
            assert tb.scalars(ea, "gradient/fc.weight/l2")[s] == np.float32(np.linalg.norm(g))
            assert nonfinite.get(s, 0) == np.count_nonzero(~np.isfinite(w))
        hist = {h.step: h.histogram_value for h in ea.Histograms("weights/fc.weight")}
        assert sorted(hist) == steps
        for s, _, _, w, _, _ in rows:
            h = hist[s]
            finite = w[np.isfinite(w)].astype(np.float64)
            assert h.num == finite.size
            assert (h.min, h.max) == (finite.min(), finite.max())
            assert h.sum == pytest.approx(finite.sum())
            assert h.sum_squares == pytest.approx(np.dot(finite, finite))
            np.testing.assert_array_equal(np.asarray(h.bucket), tb.numpy_counts(w))
        tags = ea.Tags()
        # gradients: save_histogram False; losses: a scalar collection, never a histogram (smdebug's rule)
        assert tags["histograms"] == ["weights/fc.weight"]
    # the NaN/inf step is a TRAIN step: 3 NaN + 2 inf left out of that histogram
    train = read_run(tmp_path / "worker_0" / "train")
    assert tb.scalars(train, "nonfinite/fc.weight")[4] == 5
    # counted from the first histogram that left something out, then beside every one (back to 0 after)
    assert min(tb.scalars(train, "nonfinite/fc.weight")) == 4
    assert min(tb.scalars(read_run(tmp_path / "worker_0" / "eval"), "nonfinite/fc.weight")) > 4
    assert {h.step: h.histogram_value.num for h in train.Histograms("weights/fc.weight")}[4] == 1000 - 5


def test_flush_makes_records_readable_while_files_stay_open(tmp_path, read_run, tb):
    ex = EventExporter(str(tmp_path), "w")
    ex.set_collections(COLLECTIONS)
    ex.add("loss", 0, "TRAIN", 0, np.asarray(1.0), {})
    ex.flush()
    run = tmp_path / "w" / "train"
    assert tb.scalars(read_run(run), "1_losses/loss") == {0: 1.0}
    for s in range(1, 50):
        ex.add("loss", s, "TRAIN", s, np.asarray(float(s)), {})
    ex.flush()
    assert tb.scalars(read_run(run), "1_losses/loss") == {s: float(max(s, 1)) if s else 1.0 for s in range(50)}
    assert len(os.listdir(run)) == 1  # appended, not one file per step
    ex.close()


def test_histogram_waits_for_collections_that_name_the_tensor(tmp_path, read_run):
    ex = EventExporter(str(tmp_path), "w")
    ex.set_collections({"collections": {"custom": {"name": "custom", "tensor_names": [], "save_histogram": True},
                                        "quiet": {"name": "quiet", "tensor_names": [], "save_histogram": False}}})
    x = np.arange(10.0)
    ex.add("x", 0, "TRAIN", 0, x, {})  # no collection names x yet: its histogram waits
    ex.add("y", 0, "TRAIN", 0, x, {})
    ex.flush()
    assert not os.path.exists(tmp_path / "w")  # nothing decided, nothing written
    # the hook sends the collections at the end of the step: x is in custom, y only in quiet
    ex.set_collections({"collections": {"custom": {"name": "custom", "tensor_names": ["x"], "save_histogram": True},
                                        "quiet": {"name": "quiet", "tensor_names": ["y"], "save_histogram": False}}})
    ex.add("x", 1, "TRAIN", 1, x, {})
    ex.add("y", 1, "TRAIN", 1, x, {})
    ex.close()
    ea = read_run(tmp_path / "w" / "train")
    assert ea.Tags()["histograms"] == ["custom/x"]
    assert [h.step for h in ea.Histograms("custom/x")] == [0, 1]


def test_collections_given_by_the_caller(tmp_path, read_run):
    ex = EventExporter(str(tmp_path), "w")
    x = np.linspace(-1, 1, 7)
    ex.add("a", 0, "EVAL", 0, x, {}, collections=["all", "biases"])
    ex.add("b", 0, "EVAL", 0, x, {}, collections=["losses"])
    ex.add("c", 0, "EVAL", 0, x, {}, collections=["default"])
    ex.close()
    assert sorted(read_run(tmp_path / "w" / "eval").Tags()["histograms"]) == ["biases/a", "default/c"]


def test_without_any_collections_a_tensor_gets_default(tmp_path, read_run):
    ex = EventExporter(str(tmp_path), "w")
    ex.add("t/x y", 3, "PREDICT", 0, np.ones((2, 2), dtype=np.int32), {"max": 1.0})
    ex.close()
    ea = read_run(tmp_path / "w" / "predict")
    assert ea.Tags()["histograms"] == ["default/t/x_y"]  # tags cleaned as smdebug does
    assert [(s.step, s.value) for s in ea.Scalars("t/x_y/max")] == [(3, 1.0)]


def test_errors_are_counted_and_never_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ex = EventExporter(str(blocker), "w")
    ex.set_collections({"collections": {}})
    ex.add("x", 0, "TRAIN", 0, np.float32(1), {})  # cannot create the run directory
    ex.add("x", 1, "TRAIN", 1, np.float32(1), {})
    ex.close()
    assert ex.errors == 1 and ex.disabled and ex.skipped == 2 and ex.records == 0
    # scalars added before any collections dict wait for it (their tag depends on it): lost and counted too
    ex = EventExporter(str(blocker), "w")
    ex.add("x", 0, "TRAIN", 0, np.float32(1), {})
    ex.close()
    assert ex.errors == 1 and ex.disabled and ex.skipped == 1

    ex = EventExporter(str(tmp_path / "tb"), "w")
    ex.add("y", 0, "TRAIN", 0, np.arange(4.0), {})  # waits for collections
    ex.add("y", 1, "TRAINING", 1, np.arange(4.0), {})
    ex.close()
    assert ex.errors == 1 and ex.disabled and ex.records == 1 and ex.skipped == 2  # the waiting one is lost too


@pytest.mark.parametrize("logdir, worker", [("", "w"), ("s3://bucket/tb", "w"), ("/tmp/x", ""), (None, "w")])
def test_bad_arguments_are_refused_at_construction(logdir, worker):
    with pytest.raises(InvalidConfiguration):
        EventExporter(logdir, worker)


def test_histogram_counts_equal_numpy_including_edges_and_extremes():
    edges = default_edges()
    assert edges[0] < -1e19 and edges[-1] > 1e19 and 0.0 in edges and len(edges) > 1000
    v = np.concatenate([edges[700:720], [0.0, -0.0, 1e-13, 3.0, -3.0], np.random.default_rng(1).normal(size=500)])
    h = make_histogram(v)
    counts, _ = np.histogram(v, bins=edges)
    nz = np.flatnonzero(counts)
    np.testing.assert_array_equal(h.bucket, np.concatenate([[0], counts[nz[0] : nz[-1] + 1]]))
    np.testing.assert_array_equal(h.bucket_limit, edges[nz[0] : nz[-1] + 2])
    # finite values beyond numpy's range are counted in the outermost buckets, not dropped
    big = make_histogram(np.array([1e30, -1e30, 1.0]))
    assert big.num == 3 and big.bucket.sum() == 3 and (big.min, big.max) == (-1e30, 1e30)
    nan = make_histogram(np.array([np.nan, np.inf], dtype=np.float16))
    assert nan.num == 0 and nan.nonfinite == 2
    assert make_histogram(np.array([True, False])) is None and make_histogram(np.zeros(0)) is None
    ints = make_histogram(np.arange(5, dtype=np.uint8))
    assert ints.num == 5 and ints.bucket.sum() == 5
    # big tensors take another path to the same counts
    v = np.concatenate([np.random.default_rng(2).standard_cauchy(size=300_000), edges[::7], [1e30, -1e25]])
    h = make_histogram(v)
    counts, _ = np.histogram(v, bins=edges)
    counts[0] += 1  # -1e25 and 1e30, beyond numpy's range
    counts[-1] += 1
    np.testing.assert_array_equal(h.bucket, np.concatenate([[0], counts]))  # both ends non-empty
    np.testing.assert_array_equal(h.bucket_limit, edges)
    assert (h.min, h.max, h.num) == (-1e25, 1e30, v.size)
    small = make_histogram(v[:50_000])
    counts, _ = np.histogram(v[:50_000], bins=edges)
    nz = np.flatnonzero(counts)
    np.testing.assert_array_equal(small.bucket, counts[nz[0] - 1 : nz[-1] + 1])


def test_bfloat16_is_histogrammed():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    h = make_histogram(np.array([1.0, 2.0, np.nan], dtype=ml_dtypes.bfloat16))
    assert h.num == 2 and h.nonfinite == 1 and h.max == 2.0


def test_values_without_a_real_number_are_left_out_and_export_goes_on(tmp_path, read_run, tb):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ex = EventExporter(str(tmp_path), "w")
    ex.add("c", 0, "TRAIN", 0, np.array([1 + 2j, 3j]), {"mean": np.complex64(1 + 1.5j), "l2": 2.0})
    ex.add("s", 0, "TRAIN", 0, np.array(["text"]), {})
    ex.add("b", 0, "TRAIN", 0, np.array([True]), {})
    ex.add("h", 0, "TRAIN", 0, np.array([1.5], dtype=ml_dtypes.bfloat16), {})
    ex.add("x", 1, "TRAIN", 1, np.float64(2.0), {})
    ex.close()
    assert ex.errors == 0 and not ex.disabled
    ea = read_run(tmp_path / "w" / "train")
    assert sorted(ea.Tags()["scalars"]) == ["b", "c/l2", "h", "x"]
    assert tb.scalars(ea, "h") == {0: 1.5} and tb.scalars(ea, "b") == {0: 1.0} and tb.scalars(ea, "x") == {1: 2.0}
    assert ea.Tags()["histograms"] == []  # complex: no histogram


def _expected(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket counts, bucket limits) as numpy counts the finite values in float64, values beyond the edges in the
    outermost buckets, trimmed as the exporter trims them."""
    edges = default_edges()
    v = values.astype(np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    counts, _ = np.histogram(v, bins=edges)
    counts[0] += np.count_nonzero(v < edges[0])
    counts[-1] += np.count_nonzero(v > edges[-1])
    nz = np.flatnonzero(counts)
    start, end = int(nz[0]), int(nz[-1]) + 1
    kept = counts[start - 1 : end] if start else np.concatenate([[0], counts[:end]])
    return kept, edges[start : end + 1]


def test_float32_and_float16_counts_equal_numpy_at_every_edge():
    edges = default_edges()
    f = edges.astype(np.float32)
    down, up = np.nextafter(f, np.float32(-np.inf)), np.nextafter(f, np.float32(np.inf))
    tiny, big = np.float32(1e-45), np.finfo(np.float32).max
    extremes = np.array([0.0, -0.0, tiny, -tiny, 1e-38, -1e-38, big, -big, 3e20, -3e20], dtype=np.float32)
    rng = np.random.default_rng(5)
    cases = [
        np.concatenate([f, down, up, np.nextafter(down, np.float32(-np.inf)), np.nextafter(up, np.float32(np.inf)),
                        extremes]),
        (rng.normal(size=(300, 70)) * 0.05).astype(np.float32),
        (rng.standard_cauchy(size=50_000) * 1e4).astype(np.float32),
        np.array([-0.0, -0.0, 0.0], dtype=np.float32),
        np.array([1.5, 1.5], dtype=np.float32),
        np.concatenate([f[700:760], down[700:760]]).astype(np.float16),
        rng.normal(size=1000).astype(np.float16),
    ]
    for v in cases:
        h = make_histogram(v)
        kept, limits = _expected(v)
        np.testing.assert_array_equal(h.bucket, kept)
        np.testing.assert_array_equal(h.bucket_limit, limits)
        finite = v.astype(np.float64)
        assert (h.num, h.min, h.max) == (v.size, finite.min(), finite.max())
        assert h.sum == pytest.approx(finite.sum(), rel=1e-9, abs=1e-30 + 1e-12 * np.abs(finite).sum())
        assert h.sum_squares == pytest.approx(np.square(finite).sum(), rel=1e-6)
    v = np.array([np.nan, 1.0, -np.inf, 2.0, np.inf], dtype=np.float32)
    h = make_histogram(v)
    assert (h.num, h.nonfinite, h.min, h.max, h.sum) == (2, 3, 1.0, 2.0, 3.0)


def test_histograms_over_the_budget_are_skipped_counted_and_reported(tmp_path, read_run, tb, caplog):
    job = _job(np.random.default_rng(0))
    # a budget of 1e-9 of the elapsed time (and 1e-9 s saved at the start): the first step's histogram, no other
    ex = EventExporter(str(tmp_path), "worker_0", histogram_budget=1e-9)
    ex.set_collections(COLLECTIONS)
    with caplog.at_level("WARNING", logger="tensortap"):
        for s, mode, ms, w, g, loss in job:
            ex.add("fc.weight", s, mode, ms, w, {"mean": 1.0})
            ex.add("gradient/fc.weight", s, mode, ms, g, {})  # no histogram (save_histogram False): never skipped
            ex.add("loss", s, mode, ms, np.asarray(loss), {})
        ex.close()
    assert ex.errors == 0
    written, skipped_tags = {}, []
    for mode in ("train", "eval"):
        ea = read_run(tmp_path / "worker_0" / mode)
        rows = [r for r in job if r[1].lower() == mode]
        hist = {h.step: h.histogram_value for h in ea.Histograms("weights/fc.weight")} \
            if "weights/fc.weight" in ea.Tags()["histograms"] else {}
        written.update(hist)
        nonfinite = tb.scalars(ea, "nonfinite/fc.weight") if "nonfinite/fc.weight" in ea.Tags()["scalars"] else {}
        assert set(nonfinite) <= set(hist)  # the count of what a histogram leaves out: beside one
        for s, _, _, w, _, loss in rows:
            # scalars and reductions at every step, histogram or not
            assert tb.scalars(ea, "1_losses/loss")[s] == np.float32(loss) and tb.scalars(ea, "fc.weight/mean")[s] == 1.0
            if s in hist:
                np.testing.assert_array_equal(np.asarray(hist[s].bucket), tb.numpy_counts(w))
                assert nonfinite.get(s, 0) == np.count_nonzero(~np.isfinite(w))
        if "tensortap/skipped_histograms" in ea.Tags()["scalars"]:
            skipped_tags += [e.value for e in ea.Scalars("tensortap/skipped_histograms")]
    assert sorted(written) == [0]
    assert ex.histograms == 1 and ex.skipped_histograms == len(job) - 1
    assert max(skipped_tags) == ex.skipped_histograms  # the count, in the event files
    warnings = [r for r in caplog.records if "cannot keep up" in r.getMessage()]
    assert len(warnings) == 1 and "tensortap/skipped_histograms" in warnings[0].getMessage()


def test_without_a_budget_or_within_it_every_histogram_is_written(tmp_path, read_run):
    job = _job(np.random.default_rng(0))
    for budget, d in [(None, tmp_path / "none"), (1.0, tmp_path / "all")]:
        ex = EventExporter(str(d), "w", histogram_budget=budget)
        ex.set_collections(COLLECTIONS)
        for s, mode, ms, w, _, _ in job:
            ex.add("fc.weight", s, mode, ms, w, {})
        ex.close()
        # (budget 1.0: 1 s of histograms may run in a row, far more than these take)
        assert ex.skipped_histograms == 0 and ex.histograms == len(job)
        assert "tensortap/skipped_histograms" not in read_run(d / "w" / "train").Tags()["scalars"]


def test_no_histograms_while_the_writer_is_behind(tmp_path, read_run, tb):
    job = _job(np.random.default_rng(0))
    ex = EventExporter(str(tmp_path), "w", histogram_budget=None)
    ex.set_collections(COLLECTIONS)
    backlog = {"steps": {3, 4, 5, 9}}
    ex.behind = lambda: current in backlog["steps"]  # the writer's queue has a backlog at these steps
    for s, mode, ms, w, _, loss in job:
        current = s
        ex.add("fc.weight", s, mode, ms, w, {})
        ex.add("loss", s, mode, ms, np.asarray(loss), {})
    ex.close()
    steps = set()
    for mode in ("train", "eval"):
        ea = read_run(tmp_path / "w" / mode)
        steps |= {h.step for h in ea.Histograms("weights/fc.weight")}
        assert sorted(tb.scalars(ea, "1_losses/loss")) == [r[0] for r in job if r[1].lower() == mode]
    assert steps == set(range(len(job))) - backlog["steps"]
    assert ex.skipped_histograms == len(backlog["steps"]) and ex.histograms == len(job) - len(backlog["steps"])


@pytest.mark.parametrize("budget", [0, 0.0, -0.5, 1.5, "0.5", float("nan"), True])
def test_bad_budget_is_refused_at_construction(tmp_path, budget):
    with pytest.raises(InvalidConfiguration, match="histogram_budget"):
        EventExporter(str(tmp_path), "w", histogram_budget=budget)


def test_budget_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORTAP_TENSORBOARD_BUDGET", "0.1")
    assert EventExporter(str(tmp_path), "w").histogram_budget == 0.1
    monkeypatch.setenv("TENSORTAP_TENSORBOARD_BUDGET", "none")
    assert EventExporter(str(tmp_path), "w").histogram_budget is None
    monkeypatch.delenv("TENSORTAP_TENSORBOARD_BUDGET")
    assert EventExporter(str(tmp_path), "w").histogram_budget == 0.25
    for bad in ("2", "fast", "0"):
        monkeypatch.setenv("TENSORTAP_TENSORBOARD_BUDGET", bad)
        with pytest.raises(InvalidConfiguration, match=f"TENSORTAP_TENSORBOARD_BUDGET='{bad}'"):
            EventExporter(str(tmp_path), "w")


def test_scalars_beyond_float32_become_infinite_and_export_goes_on(tmp_path, read_run, tb):
    ex = EventExporter(str(tmp_path), "w")
    ex.add("x", 0, "TRAIN", 0, np.array([1e300]), {"max": 1e300, "min": -1e39})
    ex.add("x", 1, "TRAIN", 1, np.array([2.0]), {})
    ex.close()
    assert ex.errors == 0
    ea = read_run(tmp_path / "w" / "train")
    assert tb.scalars(ea, "x") == {0: np.inf, 1: 2.0}
    assert tb.scalars(ea, "x/max") == {0: np.inf} and tb.scalars(ea, "x/min") == {0: -np.inf}


def test_tags_lead_with_losses_and_metrics_and_never_repeat_a_prefix(tmp_path, read_run):
    """TensorBoard sorts tag groups by its tag order (a digit before any letter): losses, then metrics, open the
    page; a job without NaN or inf has no non-finite charts; a histogram tag does not repeat a prefix its
    tensor's name has."""
    ex = EventExporter(str(tmp_path), "w", histogram_budget=None)
    ex.set_collections({"collections": {
        "gradients": {"include_regex": ["^gradient"], "tensor_names": [], "save_histogram": True},
        "weights": {"include_regex": [], "tensor_names": ["Net_conv1.weight"], "save_histogram": True},
        "losses": {"include_regex": ["[Ll]oss_(?!input).*output"], "tensor_names": [], "save_histogram": False},
        "metrics": {"include_regex": [], "tensor_names": ["metrics/accuracy"], "save_histogram": False},
    }})
    w = np.linspace(-1, 1, 20)
    for s in range(3):
        ex.add("gradient/Net_conv1.weight", s, "TRAIN", s, w, {"l2": 1.0})
        ex.add("Net_conv1.weight", s, "TRAIN", s, w, {})
        ex.add("CrossEntropyLoss_output_0", s, "TRAIN", s, np.asarray(0.5), {})
        ex.add("metrics/accuracy", s, "TRAIN", s, np.asarray(0.9), {})
    ex.close()
    tags = read_run(tmp_path / "w" / "train").Tags()
    assert sorted(tags["histograms"]) == ["gradient/Net_conv1.weight", "weights/Net_conv1.weight"]
    assert sorted(tags["scalars"]) == ["1_losses/CrossEntropyLoss_output_0", "2_metrics/accuracy",
                                       "gradient/Net_conv1.weight/l2"]
