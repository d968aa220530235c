"""The one-pass statistics of CPU tensors (tensortap/capture/_moments.c) against an exact float64 reference:
min, max and the non-finite count exactly, Σx, Σx², Σ|x| (hence mean and the norms) within the bound its header
and docs/pytorch.md state."""

from __future__ import annotations

import math

import numpy as np
import pytest

_moments = pytest.importorskip("tensortap.capture._moments", reason="the C helper is not built (setup.py build_ext)")
moments = _moments.moments

KINDS = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
FIELDS = 10
U = 2.0 ** -53


def _bfloat16(a: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 values (truncated), as uint16."""
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _run(kind: int, arrays: list[np.ndarray], with_abs: bool = True) -> np.ndarray:
    out = np.full(len(arrays) * FIELDS, -12345.0)
    moments(kind, [(a.ctypes.data, a.size) for a in arrays], out, with_abs)
    return out.reshape(len(arrays), FIELDS)


def _bound(n: int, terms: np.ndarray) -> float:
    """The stated error bound of a float64 sum of `terms` (8 partial sums over blocks of 1,024)."""
    return (136 + n / 1024) * U * math.fsum(np.abs(terms))


def _check(row: np.ndarray, x: np.ndarray) -> None:
    """`row` (one tensor's 10 values) against the exact values of `x` (float64, the elements as they are)."""
    n = x.size
    finite = np.isfinite(x)
    assert row[5] == n - np.count_nonzero(finite)
    if n:
        if np.isnan(x).any():
            assert np.isnan(row[0]) and np.isnan(row[1]) and np.isnan(row[8])
        else:
            assert row[0] == x.min() and row[1] == x.max()  # exact
            assert row[8] == np.abs(x).max()
    if not finite.all():
        return
    s, s2, sa = math.fsum(x), math.fsum(x * x), math.fsum(np.abs(x))  # (x*x is exact for float32 elements)
    assert abs(row[2] - s) <= _bound(n, x)
    assert abs(row[3] - s2) <= _bound(n, x * x)
    assert abs(row[4] - sa) <= _bound(n, x)
    assert row[7] == pytest.approx(math.sqrt(s2), rel=(136 + n / 1024) * U + 2 * U, abs=0)
    if n:
        assert abs(row[6] - s / n) <= _bound(n, x) / n + 2 * U * abs(s / n)
        assert abs(row[9] - sa / n) <= _bound(n, x) / n + 2 * U * abs(sa / n)


SIZES = [0, 1, 3, 7, 8, 9, 15, 16, 17, 1023, 1024, 1025, 4099, 100_003]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_moments_against_an_exact_reference(dtype):
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4) + rng.standard_normal()).astype(dtype)
              for n in SIZES]
    arrays.append(np.full(5000, 0.1, dtype=dtype))
    arrays.append(np.array([1e30, -1e30, 3.0, -2.5] * 300, dtype=dtype))  # cancellation: Σx is small
    rows = _run(KINDS[np.dtype(dtype)], arrays)
    for row, a in zip(rows, arrays, strict=True):
        _check(row, a.astype(np.float64))
    # without Σ|x| (and mean|x|): the other values the same
    plain = _run(KINDS[np.dtype(dtype)], arrays, with_abs=False)
    same = [0, 1, 2, 3, 5, 6, 7, 8]
    assert np.array_equal(plain[:, same], rows[:, same], equal_nan=True)
    assert np.isnan(plain[:, [4, 9]]).all()


def test_moments_of_float32_round_to_the_exact_value():
    """float32 tensors: the saved mean and l2 norm (float64, rounded once to float32) are the float32 rounding of
    the exact value, or next to it."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(300_000) * 3 + 0.01).astype(np.float32)
    row = _run(0, [a])[0]
    x = a.astype(np.float64)
    for got, exact in ((row[6], math.fsum(x) / x.size), (row[7], math.sqrt(math.fsum(x * x)))):
        assert abs(np.float32(got) - np.float32(exact)) <= np.spacing(np.float32(exact))


def test_nonfinite_elements_are_counted_and_nan_gives_nan_extrema():
    inf, nan = float("inf"), float("nan")
    arrays = [np.array([1.0, inf, -2.0], np.float32), np.array([-inf, 0.5] * 20, np.float32),
              np.array([3.0] * 30 + [nan] + [4.0] * 30, np.float32), np.array([nan, inf, -inf, 1.0], np.float64),
              np.array([1e200, -1e200, 2.0], np.float64)]  # (float64: Σx² overflows, every element is finite)
    rows = _run(0, arrays[:3])
    assert list(rows[:, 5]) == [1, 20, 1]
    assert rows[0][1] == inf and rows[0][0] == -2.0 and rows[0][8] == inf
    assert rows[1][0] == -inf and rows[1][1] == 0.5
    assert np.isnan(rows[2][0]) and np.isnan(rows[2][1])
    rows = _run(1, arrays[3:])
    assert list(rows[:, 5]) == [3, 0]
    assert np.isnan(rows[0][0]) and np.isnan(rows[0][1])
    assert rows[1][0] == -1e200 and rows[1][1] == 1e200 and rows[1][3] == inf


def test_unaligned_tensors_and_bfloat16():
    rng = np.random.default_rng(2)
    base = rng.standard_normal(4103).astype(np.float32)
    views = [base[1:], base[3:2050], base[5:6]]  # (addresses not on a vector boundary)
    for row, v in zip(_run(0, views), views, strict=True):
        _check(row, v.astype(np.float64))
    bits = _bfloat16(rng.standard_normal(3001) * 4)
    bits[17] = 0x7FC0  # NaN
    parts = [bits[:17], bits[18:], bits[1:40]]
    for row, p in zip(_run(2, parts), parts, strict=True):
        _check(row, _from_bfloat16(p))


def test_bad_arguments_raise():
    out = np.empty(FIELDS)
    with pytest.raises(ValueError, match="kind 7"):
        moments(7, [], out)
    a = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="need"):
        moments(0, [(a.ctypes.data, 3)] * 2, out)
    with pytest.raises(TypeError):
        moments(0, [(a.ctypes.data,)], out)


#: `squares` (the flight recorder's pass); a helper built from an older checkout lacks it
needs_squares = pytest.mark.skipif(not hasattr(_moments, "squares"), reason="the C helper was built before "
                                   "squares() existed: rebuild it (setup.py build_ext --inplace)")


def _squares(kind: int, arrays: list[np.ndarray]) -> tuple[np.ndarray, int]:
    out = np.full(len(arrays) * 2, -12345.0)
    bad = _moments.squares(kind, [(a.ctypes.data, a.size) for a in arrays], out)
    return out.reshape(len(arrays), 2), bad


@needs_squares
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_squares_against_an_exact_reference(dtype):
    """`squares` (the flight recorder's pass): Σx² within the bound of `moments` and its exact non-finite count,
    on every length around the vector and block sizes, unaligned addresses included."""
    rng = np.random.default_rng(3)
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)).astype(dtype) for n in SIZES]
    base = rng.standard_normal(4103).astype(dtype)
    arrays += [base[1:], base[3:2050], np.full(5000, 0.1, dtype=dtype)]
    rows, bad = _squares(KINDS[np.dtype(dtype)], arrays)
    assert bad == 0
    for (s2, nf), a in zip(rows, arrays, strict=True):
        x = a.astype(np.float64)
        assert nf == 0
        assert abs(s2 - math.fsum(x * x)) <= _bound(x.size, x * x)
    # the same sums as `moments` gives, to its bound
    full = _run(KINDS[np.dtype(dtype)], arrays)
    for (s2, _nf), row, a in zip(rows, full, arrays, strict=True):
        x = a.astype(np.float64)
        assert abs(s2 - row[3]) <= 2 * _bound(x.size, x * x)


@needs_squares
def test_squares_count_nonfinite_elements_and_tensors():
    inf, nan = float("inf"), float("nan")
    f32 = [np.array([1.0, inf, -2.0], np.float32), np.array([-inf, 0.5] * 20, np.float32),
           np.array([3.0] * 30 + [nan] + [4.0] * 30, np.float32), np.ones(17, np.float32)]
    rows, bad = _squares(0, f32)
    assert bad == 3
    assert list(rows[:, 1]) == [1, 20, 1, 0]
    assert rows[0, 0] == inf and np.isnan(rows[2, 0]) and rows[3, 0] == 17.0
    # float64: Σx² past the range with every element finite: not finite, no element counted
    rows, bad = _squares(1, [np.array([1e200, -1e200, 2.0]), np.array([nan, inf, -inf, 1.0])])
    assert bad == 2
    assert rows[0, 0] == inf and rows[0, 1] == 0 and rows[1, 1] == 3


@needs_squares
def test_squares_of_bfloat16():
    rng = np.random.default_rng(4)
    bits = _bfloat16(rng.standard_normal(3001) * 4)
    parts = [bits[:17], bits[18:], bits[1:40]]
    rows, bad = _squares(2, parts)
    assert bad == 0
    for (s2, nf), p in zip(rows, parts, strict=True):
        x = _from_bfloat16(p)
        assert nf == 0 and abs(s2 - math.fsum(x * x)) <= _bound(x.size, x * x)
    bits[5] = 0x7F80  # +inf
    rows, bad = _squares(2, [bits[:17]])
    assert bad == 1 and rows[0, 1] == 1


@needs_squares
def test_squares_bad_arguments_raise():
    out = np.empty(2)
    with pytest.raises(ValueError, match="squares: kind 3"):
        _moments.squares(3, [], out)
    a = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="need"):
        _moments.squares(0, [(a.ctypes.data, 3)] * 2, out)
    assert _moments.squares(0, [], out) == 0
