"""One contract every storage backend passes: local files and S3 (against a real S3 server on 127.0.0.1)."""

from __future__ import annotations

import pytest

from tensortap.storage import LocalStorage, open_storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return LocalStorage(str(tmp_path / "store"))
    url = request.getfixturevalue("s3_url")
    return open_storage(url)


def test_write_read_size_exists(storage):
    assert storage.size("a/b.bin") is None and not storage.exists("a/b.bin")
    storage.write("a/b.bin", b"hello world")
    assert storage.read("a/b.bin") == b"hello world"
    assert storage.size("a/b.bin") == 11 and storage.exists("a/b.bin")
    storage.write("a/b.bin", b"replaced")
    assert storage.read("a/b.bin") == b"replaced"
    with pytest.raises(FileNotFoundError, match="missing"):
        storage.read("missing")


def test_ranges(storage):
    data = bytes(range(256)) * 40
    storage.write("r.bin", data)
    assert storage.read_range("r.bin", 10, 5) == data[10:15]
    assert storage.read_range("r.bin", len(data) - 3, 10) == data[-3:]
    ranges = [(5000, 100), (0, 10), (20, 30), (9000, 240), (100, 1)]
    assert storage.read_ranges("r.bin", ranges) == [data[o : o + n] for o, n in ranges]


def test_list_sorted_recursive_and_start_after(storage):
    for k in ["x/2", "x/1", "x/sub/3", "y/4", "x0"]:
        storage.write(k, b"-")
    assert storage.list("x/") == ["x/1", "x/2", "x/sub/3"]
    assert storage.list("x/", start_after="x/1") == ["x/2", "x/sub/3"]
    assert storage.list("nothing/") == []
    assert "y/4" in storage.list()
    storage.delete("x/1")
    storage.delete("x/never-existed")
    assert storage.list("x/") == ["x/2", "x/sub/3"]


def test_has_keys(storage):
    assert not storage.has_keys("p/")
    storage.write("p/q/r.json", b"{}")
    assert storage.has_keys("p/") and storage.has_keys("p/q/") and not storage.has_keys("p/z/")
    assert not storage.has_keys("pp/")  # a prefix is a folder here: p/ is not pp/
    storage.delete("p/q/r.json")
    assert not storage.has_keys("p/")


def test_open_storage_picks_backend_by_scheme(tmp_path):
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        open_storage("gs://bucket/x")
    with pytest.raises(ValueError):
        open_storage("")


def test_many_scattered_ranges_across_blocks(storage):
    import random

    if hasattr(storage, "block_bytes"):
        storage.block_bytes = 1000  # make ranges cross block boundaries
    data = bytes(random.Random(1).randbytes(10_000))
    storage.write("scattered.bin", data)
    rng = random.Random(2)
    ranges = [(o, rng.randint(1, 2500)) for o in (rng.randint(0, 9_000) for _ in range(40))]
    ranges = [(o, min(n, len(data) - o)) for o, n in ranges]
    assert storage.read_ranges("scattered.bin", ranges) == [data[o : o + n] for o, n in ranges]
    # and again, now from the block cache
    assert storage.read_ranges("scattered.bin", ranges[::-1]) == [data[o : o + n] for o, n in ranges[::-1]]
    assert storage.read_range("scattered.bin", 1500, 700) == data[1500:2200]


def test_direct_writes_and_truncation_where_the_store_appends(storage):
    """A store that appends can cut an object short and, where its file system takes them, write page-aligned
    buffers past the page cache (`open_direct`); one that cannot says so (None, NotImplementedError)."""
    if not storage.supports_append:
        assert not storage.supports_direct and storage.open_direct("d.bin") is None
        with pytest.raises(NotImplementedError):
            storage.truncate("d.bin", 0)
        return
    with storage.open_append("d.bin") as f:
        f.write(b"x" * 100)
    storage.truncate("d.bin", 10)
    assert storage.read("d.bin") == b"x" * 10
    d = storage.open_direct("d.bin")
    if d is None:
        pytest.skip("this file system takes no direct writes (e.g. tmpfs)")
    import mmap

    page = d.alignment
    bufs = [mmap.mmap(-1, page), mmap.mmap(-1, 2 * page)]  # (page-aligned memory)
    bufs[0][:] = b"a" * page
    bufs[1][:] = b"b" * (2 * page)
    try:
        d.write_at([memoryview(b) for b in bufs], page)
    finally:
        d.close()
    assert storage.read("d.bin") == b"x" * 10 + b"\0" * (page - 10) + b"a" * page + b"b" * (2 * page)
