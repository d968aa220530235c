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


def chunk_key(worker: str, seq: int, suffix: str) -> str:
    return f"{worker_dir(worker)}/{seq:08d}{suffix}"


def parse_chunk_key(key: str) -> tuple[str, int, str] | None:
    """(worker, seq, 'idx'|'dat') of a chunk key, None for anything else."""
    m = _CHUNK_RE.match(key)
    if not m:
        return None
    return unquote(m.group(1)), int(m.group(2)), m.group(3)
