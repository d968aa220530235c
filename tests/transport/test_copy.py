"""Copies into shared memory (tensortap.transport.copy): the C helpers of _streamcopy and their fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from tensortap.transport import copy as _copy


def test_extension_is_built_here():
    # optional for users without a compiler, but this test environment has one: a silent build failure
    # would cost the PyTorch hook ~100 us per saved step
    import tensortap.transport._streamcopy  # noqa: F401

    assert _copy.gather_into is _copy._c_gather and _copy.put_message is _copy._c_put_message


def _sources(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 15, 16, 63, 64, 65, 1000, 4096, 3 << 20]  # the last one releases the GIL
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    srcs.append(rng.integers(0, 256, 4097, dtype=np.uint8)[3:])  # an unaligned source
    return srcs


@pytest.mark.parametrize("gather", ["c", "python"])
@pytest.mark.parametrize("dst_offset", [0, 1, 8, 17, 64])
def test_gather_copies_every_size_and_alignment(gather, dst_offset):
    fn = _copy._c_gather if gather == "c" else _copy._memmove_gather
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


@pytest.mark.parametrize("put", ["c", "python"])
def test_put_message_writes_the_header_the_meta_and_the_payload(put):
    fn = _copy._c_put_message if put == "c" else _copy._py_put_message
    srcs = _sources(3)
    total = sum(s.nbytes for s in srcs)
    meta = b"a pickled description"
    pay_at = 4096
    dst = np.full(pay_at + total + 64, 0xAB, dtype=np.uint8)
    n = fn(dst.ctypes.data, meta, pay_at + total, pay_at, 12345, 2, -1, [(s.ctypes.data, s.nbytes) for s in srcs])
    assert n == total
    hdr = _copy.MESSAGE_HEADER
    assert hdr.unpack_from(dst, 0) == (pay_at + total, len(meta), pay_at, 12345, 2, -1)
    assert dst[hdr.size:hdr.size + len(meta)].tobytes() == meta
    assert (dst[hdr.size + len(meta):pay_at] == 0xAB).all()  # the gap before the payload is left alone
    assert np.array_equal(dst[pay_at:pay_at + total], np.concatenate(srcs))
    assert (dst[pay_at + total:] == 0xAB).all()


@pytest.mark.parametrize("put", ["c", "python"])
def test_put_message_refuses_a_payload_over_its_header(put):
    fn = _copy._c_put_message if put == "c" else _copy._py_put_message
    dst = np.zeros(256, dtype=np.uint8)
    with pytest.raises(ValueError, match="pay_at"):
        fn(dst.ctypes.data, b"x" * 40, 200, 64, 0, 0, 0, [])  # 48 + 40 bytes do not fit before 64
    with pytest.raises(TypeError):
        fn(dst.ctypes.data, "not bytes", 200, 128, 0, 0, 0, [])
    with pytest.raises(TypeError):
        fn(dst.ctypes.data, b"x", 200, 128, 0, 0, 0, [(1,)])  # a source without its byte count
    assert not dst.any()


def test_copy_into_copies_tensors_back_to_back():
    torch = pytest.importorskip("torch")
    from tensortap.pytorch import _tensors

    ts = [torch.arange(10, dtype=torch.float32), torch.ones(3, 4, dtype=torch.float32)]
    dst = np.zeros(22, dtype=np.float32)
    _tensors.copy_into(dst.ctypes.data, ts)
    assert np.array_equal(dst, np.concatenate([t.numpy().ravel() for t in ts]))
