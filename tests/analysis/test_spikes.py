"""Spike detection and attribution (tensortap.analysis.spikes) and diverging workers (tensortap.analysis.ranks) on
curves whose answer is known: noisy curves without a spike stay quiet, a planted one is found at its step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensortap.analysis.ranks import DivergenceTracker
from tensortap.analysis.spikes import SpikeDetector, attribute, find_spikes, spike_events


def _noisy(n: int, seed: int, sigma: float = 0.3, trend: float = -1.0) -> np.ndarray:
    """A falling loss with multiplicative mini-batch noise (log-normal, sigma in log)."""
    rng = np.random.default_rng(seed)
    return np.exp(trend * np.linspace(0, 1, n) + rng.normal(0, sigma, n))


@pytest.mark.parametrize("seed", range(20))
def test_noisy_falling_curves_have_no_spike(seed):
    v = _noisy(2000, seed)
    assert find_spikes(np.arange(2000), v) == []


def test_a_planted_spike_is_found_at_its_step_and_merged_with_its_tail():
    v = _noisy(300, 0, sigma=0.1)
    v[200] *= 8
    v[201] *= 5
    spikes = find_spikes(np.arange(300), v)
    assert [s.step for s in spikes] == [200, 201]
    assert spikes[0].reason == "z-score" and spikes[0].ratio > 6 and spikes[0].previous_step == 199
    (ev,) = spike_events(spikes, np.arange(300))
    assert (ev.step, ev.end_step, ev.peak_step) == (200, 201, 200)


def test_twice_the_median_is_not_a_spike_on_a_noisy_curve_but_on_a_smooth_one():
    smooth = np.full(100, 2.0) * np.exp(np.random.default_rng(0).normal(0, 0.01, 100))
    smooth[80] *= 2.5
    assert [s.step for s in find_spikes(np.arange(100), smooth)] == [80]
    noisy = _noisy(100, 1, sigma=0.6, trend=0.0)
    noisy[80] = np.median(noisy[30:80]) * 2.5
    assert find_spikes(np.arange(100), noisy) == []  # within the curve's own noise


def test_the_running_maximum_check_and_the_warm_up():
    det = SpikeDetector(min_history=10)
    assert all(det.add(s, 1.0 + 0.5 * (s % 2)) is None for s in range(5))
    assert det.add(5, 1e6) is None  # 5 values: not judged yet
    assert det.judged == 0
    for s in range(6, 20):
        det.add(s, 1.0 + 0.5 * (s % 2))
    sp = det.add(20, 1e8)
    assert sp is not None and sp.step == 20 and sp.value == 1e8


def test_non_finite_values_are_neither_judged_nor_kept():
    v = _noisy(100, 2, sigma=0.05)
    v[50] = np.nan
    v[51] = np.inf
    assert find_spikes(np.arange(100), v) == []


def test_curves_with_negative_values_are_judged_on_the_values():
    rng = np.random.default_rng(3)
    v = -5.0 + rng.normal(0, 0.1, 200)
    assert find_spikes(np.arange(200), v) == []
    v[150] = 10.0
    assert [s.step for s in find_spikes(np.arange(200), v)] == [150]


def test_attribution_names_the_layer_that_moved_first():
    steps = np.arange(100)
    rng = np.random.default_rng(4)
    layers = {f"gradient/l{i}": (steps, np.exp(rng.normal(0, 0.05, 100))) for i in range(4)}
    layers["gradient/l2"][1][90:] *= 50  # moves at step 90
    layers["gradient/l0"][1][95:] *= 8  # moves later
    layers["gradient/l3"][1][97] = np.nan  # non-finite later still
    movers = attribute(97, layers, since=96, lookback=10)
    assert [(m.tensor, m.step) for m in movers] == [("gradient/l2", 90), ("gradient/l0", 95), ("gradient/l3", 97)]
    assert movers[0].ratio == pytest.approx(50, rel=0.2) and math.isinf(movers[2].ratio)
    assert attribute(97, layers, since=96, lookback=0)[0].tensor == "gradient/l3"  # only step 97 examined


def test_three_workers_one_diverges():
    tr = DivergenceTracker(ratio_threshold=2.0, window=5)
    rng = np.random.default_rng(5)
    found = []
    for s in range(60):
        vals = {f"worker_{w}": float(np.exp(rng.normal(0, 0.2))) for w in range(3)}
        if s >= 30:
            vals["worker_2"] *= 10
        d = tr.add(s, vals)
        if d is not None:
            found.append(d)
    assert found and found[0].step in range(30, 35) and all(d.workers == ["worker_2"] for d in found)


def test_two_workers_the_one_that_moved_is_named():
    tr = DivergenceTracker(ratio_threshold=2.0, window=5)
    rng = np.random.default_rng(6)
    found = []
    for s in range(60):
        vals = {"worker_0": float(np.exp(rng.normal(0, 0.2))), "worker_1": float(np.exp(rng.normal(0, 0.2)))}
        if s >= 30:
            vals["worker_0"] *= 20
        d = tr.add(s, vals)
        if d is not None:
            found.append(d)
    assert found and all(d.workers == ["worker_0"] for d in found)
    assert "worker_0" in found[0].describe("the loss")


def test_non_finite_on_one_worker_only_diverges_at_once():
    tr = DivergenceTracker()
    assert tr.add(0, {"worker_0": 1.0, "worker_1": math.nan}).workers == ["worker_1"]
    assert tr.add(1, {"worker_0": math.inf, "worker_1": math.nan}) is None  # all non-finite: no divergence


def test_noisy_workers_agree():
    tr = DivergenceTracker()
    rng = np.random.default_rng(7)
    for s in range(500):
        assert tr.add(s, {f"worker_{w}": float(np.exp(rng.normal(0, 0.3))) for w in range(2)}) is None
