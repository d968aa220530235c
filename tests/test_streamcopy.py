"""The streaming-store gather copy (tensortap._streamcopy) and its memcpy fallback."""

from __future__ import annotations

import numpy as np
import pytest


def test_extension_is_built_here():
    # optional for users without a compiler, but this test environment has one: a silent build failure
    # would cost the PyTorch hook ~100 us per saved step
    import tensortap._streamcopy  # noqa: F401


@pytest.mark.parametrize("dst_offset", [0, 1, 8, 17, 64])
def test_gather_copies_every_size_and_alignment(dst_offset):
    from tensortap._streamcopy import gather

    rng = np.random.default_rng(dst_offset)
    sizes = [0, 1, 15, 16, 63, 64, 65, 1000, 4096, 3 << 20]  # the last one releases the GIL
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    srcs.append(rng.integers(0, 256, 4097, dtype=np.uint8)[3:])  # an unaligned source
    total = sum(s.nbytes for s in srcs)
    dst = np.full(total + dst_offset + 64, 0xAB, dtype=np.uint8)
    n = gather(dst.ctypes.data + dst_offset, [(s.ctypes.data, s.nbytes) for s in srcs])
    assert n == total
    assert np.array_equal(dst[dst_offset:dst_offset + total], np.concatenate(srcs))
    assert (dst[:dst_offset] == 0xAB).all() and (dst[dst_offset + total:] == 0xAB).all()  # nothing else touched


def test_gather_rejects_bad_arguments():
    from tensortap._streamcopy import gather

    with pytest.raises(TypeError):
        gather(0, [(1,)])
    with pytest.raises(TypeError):
        gather(0, 5)


def test_copy_into_without_the_extension(monkeypatch):
    torch = pytest.importorskip("torch")
    from tensortap.pytorch import _tensors

    ts = [torch.arange(10, dtype=torch.float32), torch.ones(3, 4, dtype=torch.float32)]
    for gather in (_tensors._gather, None):
        monkeypatch.setattr(_tensors, "_gather", gather)
        dst = np.zeros(22, dtype=np.float32)
        _tensors.copy_into(dst.ctypes.data, ts)
        assert np.array_equal(dst, np.concatenate([t.numpy().ravel() for t in ts]))
