"""Copies into shared memory (tensortap.transport.copy): the C helpers of _streamcopy and their fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from tensortap.transport import copy as _copy


def test_extension_is_built_here():
    # optional for users without a compiler, but this test environment has one: a silent build failure
    # would cost the PyTorch hook ~100 us per saved step
    import tensortap.transport._streamcopy  # noqa: F401

    assert _copy.gather_into is _copy._c_gather and _copy.store_release is _copy._c_store_release
    assert _copy.gather_stream_into is _copy._c_gather_stream, "rebuild: setup.py build_ext --inplace"
    assert _copy.put_mark is _copy._c_put_mark and _copy.ORDERED


def _sources(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 15, 16, 63, 64, 65, 1000, 4096, 3 << 20]  # the last one releases the GIL
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    srcs.append(rng.integers(0, 256, 4097, dtype=np.uint8)[3:])  # an unaligned source
    return srcs


@pytest.mark.parametrize("gather", ["c", "c_stream", "python"])  # (c_stream: x86-64's non-temporal copy)
@pytest.mark.parametrize("dst_offset", [0, 1, 8, 17, 64])
def test_gather_copies_every_size_and_alignment(gather, dst_offset):
    fn = {"c": _copy._c_gather, "c_stream": _copy._c_gather_stream, "python": _copy._memmove_gather}[gather]
    srcs = _sources(dst_offset)
    total = sum(s.nbytes for s in srcs)
    dst = np.full(total + dst_offset + 64, 0xAB, dtype=np.uint8)
    n = fn(dst.ctypes.data + dst_offset, [(s.ctypes.data, s.nbytes) for s in srcs])
    assert n == total
    assert np.array_equal(dst[dst_offset:dst_offset + total], np.concatenate(srcs))
    assert (dst[:dst_offset] == 0xAB).all() and (dst[dst_offset + total:] == 0xAB).all()  # nothing else touched


def test_gather_rejects_bad_arguments():
    with pytest.raises(TypeError):
        _copy._c_gather(0, [(1,)])
    with pytest.raises(TypeError):
        _copy._c_gather(0, 5)
    with pytest.raises(TypeError):
        _copy._c_gather_stream(0, [(1,)])


@pytest.mark.parametrize("impl", ["c", "python"])
def test_atomic_slots_and_the_step_mark(impl):
    store, load, put, get = ((_copy._c_store_release, _copy._c_load_acquire, _copy._c_put_mark, _copy._c_get_mark)
                             if impl == "c" else (_copy._py_store, _copy._py_load, _copy._py_put_mark,
                                                  _copy._py_get_mark))
    slots = np.zeros(16, dtype=np.int64)
    addr = slots.ctypes.data
    store(addr + 8, -123456789012)
    assert load(addr + 8) == -123456789012 == slots[1]
    put(addr + 16, 0, 7, 42, 40, -1, -1, 42)
    assert get(addr + 16) == (2, 7, 42, 40, -1, -1, 42)
    assert list(slots[2:9]) == [2, 7, 42, 40, -1, -1, 42]
    slots[2] = 3  # odd: a writer is in the middle of it
    assert get(addr + 16) is None
    put(addr + 16, 2, 8, 43, 41, 0, -1, 43)
    assert get(addr + 16) == (4, 8, 43, 41, 0, -1, 43)
    assert slots[0] == 0 and not slots[9:].any()  # nothing else touched
