"""The writer ring's layout, shared by its two ends (docs/transport.md): the header's slots, the message header,
how a message's description travels, and the shared memory it lives in."""

from __future__ import annotations

import json
import logging
import mmap
import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np

from tensortap.format import codec
from tensortap.transport import ONE_BLAS_THREAD
from tensortap.transport.copy import MESSAGE_HEADER

logger = logging.getLogger("tensortap")
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+; Python 3.11 lacks the name
_MADV_DONTNEED = 4

# Header slots (int64) at the start of the shared segment.
HEAD = 0  # ring bytes published by the training process (monotonic)
TAIL = 1  # ring bytes freed by the child (monotonic)
STATE = 2  # child state, below
WRITTEN = 3  # records written by the child
OUTAGE = 4  # the child's storage is failing
FLUSHED = 5  # last flush request done
DONE_MSGS = 6  # messages processed by the child
BIG_DONE = 7  # bytes of own-segment messages processed
MARK_SEQ = 8  # the step mark (7 slots, copy.put_mark): seqlock (odd while being written), messages sent
MARK_MODES = 11  # before it, step, mode steps of TRAIN, EVAL, PREDICT, GLOBAL (-1: none)
ERR_LEN = 15
URGENT = 16  # control messages sent: the child processes everything published before one at once
DURABLE = 17  # records in index blocks the child has written (what readers find)
DROPPED = 18  # records the child dropped (its storage is full)
PROMPTED = 19  # the newest step mark the child has adopted and made readable (an index block written)
ASKED = 20  # the newest step mark the training process asked to be made readable at once
# An index write under way: DURABLE once it lands, the chunk whose index it writes, that index's size once it
# lands (a child killed between the write and DURABLE: the training process asks the store whether it landed)
INDEX_RECORDS = 21
INDEX_CHUNK = 22
INDEX_SIZE = 23
SLOTS = 24
ERR_AT = 256  # error text of a failed child
ERR_MAX = 3840
HDR = 4096  # the ring starts here

STARTING, RUNNING, ENDED, FAILED = 0, 1, 2, 3
MODE_NAMES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
WRAP = -1
ALIGN = 64
PAGE = 4096
# Message header: int64 message size, meta size, payload offset, and for batches and statistics step, mode, mode
# step (kept out of the meta so that a layout's meta is built once).
MSG = MESSAGE_HEADER
MSG_HDR = MSG.size


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) & ~(a - 1)


def encode_meta(meta: tuple | list) -> bytes:
    """A message's description as it travels in the ring: JSON (names, numbers, lists; bytes as hex)."""
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode_meta(buf: bytes) -> list:
    try:
        meta = json.loads(buf.decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        meta = None
    if not isinstance(meta, list) or not meta or not isinstance(meta[0], str):
        raise ValueError(f"not a writer-ring message description: {buf[:80]!r}")
    return meta


def batch_meta(names: tuple[str, ...], dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
               reductions: tuple | None = None) -> tuple[bytes, int]:
    """A batch message's description (with, per tensor, the reductions the child computes) and its number of
    elements."""
    count = 0
    for shape in shapes:
        k = 1
        for d in shape:
            k *= d
        count += k
    return encode_meta(("batch", names, codec.dtype_to_str(dtype), shapes, count, reductions)), count


def payload_bytes(meta: tuple | list) -> int:
    """Bytes of a message's payload that hold its values ("batch": every tensor's; "records": up to the end of
    the last value)."""
    if meta[0] == "batch":
        return meta[4] * codec.dtype_from_str(meta[2]).itemsize
    if meta[0] == "records":
        # (each record: (name, step, mode, mode_step, value (dtype, shape, offset, nbytes) or None, ...))
        return max((r[4][2] + r[4][3] for r in meta[1] if r[4] is not None), default=0)
    return 0


def ring_file(size: int) -> int:
    """A descriptor of a new anonymous shared file of `size` bytes. Without memfd its pages are reserved in
    /dev/shm now: on a full /dev/shm (Docker's default is 64 MB) touching an unbacked page later would kill the
    training process with SIGBUS; here it is an OSError."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tensortap-ring", os.MFD_CLOEXEC)
    else:  # (no memfd: a file in /dev/shm, unlinked at once)
        import tempfile

        fd, path = tempfile.mkstemp(prefix="tensortap-ring-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
        if not hasattr(os, "memfd_create") and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)  # (a memfd is not on /dev/shm, whose size a container may limit)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_segment(name: str, size: int) -> Any:
    """Map a POSIX shared-memory segment without the resource tracker (which would unlink it at our exit)."""
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink_segment(name: str) -> None:
    try:
        import _posixshmem

        _posixshmem.shm_unlink("/" + name)
    except (FileNotFoundError, ImportError, OSError):
        pass


def populate(addr: int, size: int, pages: Any) -> None:
    """Map every page of the ring (at `addr`, `size` bytes) once, rather than taking a page fault per 4 KB inside
    saving steps until the ring has wrapped once (measured: the copy of a saving step that writes fresh ring pages
    takes ~3x as long). Meant for a thread of its own, which does not hold the GIL meanwhile (50 ms for 64 MB on a
    loaded machine): the training thread goes on; a copy that meets a page not mapped yet maps it itself.
    `pages()`: the ring as a uint8 array (None once released), touched page by page where madvise cannot
    populate."""
    try:
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        # 8 MiB at a time: each call holds the process's memory-map lock (~1-2 ms), which the training thread's
        # own allocations (and thread starts) may need meanwhile; and between calls this thread takes the GIL
        # back, which makes the training thread give it up: few calls (1 MiB ones cost the training thread
        # ~20 us a step over the ~200 steps they took: bench/RESULTS.md, "Trainer callbacks")
        step = 8 << 20
        for at in range(0, size, step):
            if madvise(ctypes.c_void_p(addr + at), ctypes.c_size_t(min(step, size - at)), _MADV_POPULATE_WRITE) != 0:
                break
        else:
            return
        if at:
            return  # (the ring was released meanwhile)
    except (AttributeError, OSError):  # not Linux
        pass
    u8 = pages()  # kernel < 5.14: touch each page
    if u8 is not None:
        for at in range(0, len(u8), 1 << 20):
            u8[at:at + (1 << 20):PAGE] = 0


def prefault(addr: int, size: int, pages: Any) -> threading.Thread:
    """`populate` on a thread of its own."""
    thread = threading.Thread(target=populate, args=(addr, size, pages), name="tensortap-ring-pages", daemon=True)
    thread.start()
    return thread


def release_later(mm: mmap.mmap, fd: int, proc: Any, addr: int, size: int, prefaulting: threading.Thread) -> None:
    """Once the child `proc` has gone (it no longer reads the ring): drop this mapping's pages, free the file's and
    close both, on a thread of its own. Unmapping 64 MB takes ~30 ms on a loaded machine, and mmap.close() holds
    the GIL meanwhile: not on the closing thread."""

    def release() -> None:
        try:
            proc.wait(60)
            prefaulting.join()
            import ctypes

            ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), _MADV_DONTNEED)
            os.ftruncate(fd, 0)  # (then the file's pages go)
        except Exception:  # noqa: BLE001 - not Linux, or the child did not end: unmapped as it is
            pass
        try:
            mm.close()
        except BufferError:
            # somebody still holds a view of the ring (e.g. a tensor over it): the mapping goes when they do
            logger.debug("tensortap: the writer's ring is still referenced at close")
        try:
            os.close(fd)
        except OSError:
            pass

    threading.Thread(target=release, name="tensortap-ring-release", daemon=True).start()


# The child imports what it runs (storage, format, transport) and numpy, not the package's front (hooks,
# collections, trials): `tensortap` is entered as a bare namespace over the same folder, which halves the child's
# start-up.
CHILD_BOOT = ("import sys, types\n"
               "import importlib.util as u\n"
               "spec = u.find_spec('tensortap')\n"
               "p = types.ModuleType('tensortap'); p.__path__ = list(spec.submodule_search_locations)\n"
               "p.__spec__ = spec; p.__file__ = spec.origin\n"
               "sys.modules['tensortap'] = p\n"
               "from tensortap.transport.writer_process import _child_main\n"
               "_child_main()\n")


def start_child(cfg: dict[str, Any], pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Start the writer process with its configuration (JSON) and the descriptors it inherits."""
    import tensortap

    root = os.path.dirname(os.path.dirname(os.path.abspath(tensortap.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(ONE_BLAS_THREAD)
    # (-P: the working directory is not put first on sys.path, so that the writer process imports this tensortap,
    # not another one that the directory the job was started in may hold)
    return subprocess.Popen([sys.executable, "-P", "-c", CHILD_BOOT, json.dumps(cfg)], stdin=subprocess.DEVNULL,
                            pass_fds=pass_fds, env=env, close_fds=True)


class Closed:
    """The header after close: every slot reads 0."""

    def __getitem__(self, i: int) -> int:
        return 0

    def __setitem__(self, i: int, v: int) -> None:
        pass


_ENDING: list[subprocess.Popen] = []  # writer processes that have written everything and are exiting


def reap_later(proc: subprocess.Popen) -> None:
    """Collect `proc`'s exit status once it has gone (now, or at a later call), without waiting for it."""
    _ENDING.append(proc)
    _ENDING[:] = [p for p in _ENDING if p.poll() is None]


