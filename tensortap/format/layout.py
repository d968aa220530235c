"""Where the native store puts its files inside an out_dir (see docs/format.md)."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

ROOT = "tensortap"
INDEX_SUFFIX = ".idx"
DATA_SUFFIX = ".dat"
_CHUNK_RE = re.compile(r"^tensortap/([^/]+)/(\d{8})\.(idx|dat)$")


def worker_dir(worker: str) -> str:
    """The folder of one worker; the name is percent-encoded so any worker name is a safe file name."""
    return f"{ROOT}/{quote(worker, safe='')}"


def claim_key(worker: str) -> str:
    """The file a hook creates, exclusively, before it writes a worker: a second job given the same out_dir and
    worker finds it and is refused at construction (docs/format.md §1)."""
    return f"{worker_dir(worker)}/claim.json"


def reserve_key(worker: str) -> str:
    """Space a local writer sets aside when it starts and frees when the disk fills, so that it can still write
    the index blocks that make its data readable (docs/format.md §4)."""
    return f"{worker_dir(worker)}/reserve.bin"


def chunk_key(worker: str, seq: int, suffix: str) -> str:
    return f"{worker_dir(worker)}/{seq:08d}{suffix}"


def parse_chunk_key(key: str) -> tuple[str, int, str] | None:
    """(worker, seq, 'idx'|'dat') of a chunk key, None for anything else."""
    m = _CHUNK_RE.match(key)
    if not m:
        return None
    return unquote(m.group(1)), int(m.group(2)), m.group(3)
