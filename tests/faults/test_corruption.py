"""Bit flips, truncations and trailing garbage in every file kind of a finished job (docs/format.md §5.1).

Each case damages one file of a reference job in place, reads the whole job back with a fresh trial, and
checks the reader's promise: every value it returns equals the reference bit for bit; exactly the records
of the damaged index block (or the damaged payload) are lost; the damage is reported once with file and
offset; a finished job still ends (wait_for_steps past the end raises NoMoreData, never hangs).
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import CorruptData, NoMoreData, StepNotYetAvailable
from tensortap.format import codec
from tensortap.format.native import NativeSource
from tensortap.storage import LocalStorage
from tensortap.trials import Trial

STEPS = 10
SETTLE_S = 0.2
Key = tuple[str, int]  # (tensor name, global step)


@dataclass
class Block:
    path: str
    start: int
    end: int
    keys: set[Key]
    header: dict


@dataclass
class Reference:
    root: str
    values: dict[Key, bytes]
    blocks: list[Block]
    payloads: list[tuple[str, int, int, Key]] = field(default_factory=list)  # (dat path, offset, length, key)
    collections: set[str] = field(default_factory=set)

    def files(self, suffix: str) -> list[str]:
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(self.root) for f in fs if f.endswith(suffix))


def _read_all(trial: Trial) -> tuple[dict[Key, bytes], dict[Key, CorruptData]]:
    """Every raw value the trial shows: its bytes, or the CorruptData reading it raised."""
    got: dict[Key, bytes] = {}
    errors: dict[Key, CorruptData] = {}
    for name in trial.tensor_names():
        t = trial.tensor(name)
        for step in t.steps(show_incomplete_steps=True):
            try:
                got[(name, step)] = t.value(step).tobytes()
            except CorruptData as e:
                errors[(name, step)] = e
            except tt.exceptions.TensorUnavailableForStep:
                pass  # reduction only
    return got, errors


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Reference:
    root = str(tmp_path_factory.mktemp("faults") / "job")
    hook = tt.Hook(root, save_config=tt.SaveConfig(save_interval=1), flush_interval=60, chunk_bytes=4096,
                   writer="thread")
    for s in range(STEPS):
        hook.next_step()
        hook.save_tensor("w", np.full((16, 16), s, dtype=np.float32), "weights")
        hook.save_tensor("b", np.arange(5, dtype=np.int64) + s)
        hook.save_scalar("loss", 1.0 / (s + 1))
        if s < STEPS - 1:
            hook.flush()  # one index block per step
    hook.close()
    trial = tt.create_trial(root)
    values, errors = _read_all(trial)
    assert not errors and len(values) == 3 * STEPS
    r = Reference(root, values, [], collections=set(trial.collections()))
    names = trial.source.names
    for idx in r.files(".idx"):
        with open(idx, "rb") as f:
            data = f.read()
        dec = codec.decode_blocks(data, 0, idx, final=True)
        assert not dec.damage
        ends = [at for _, _, at in dec.blocks[1:]] + [len(data)]
        for (h, e, at), end in zip(dec.blocks, ends, strict=True):
            keys = {(h["names"][int(i)], int(st)) for i, st in zip(e["name"], e["step"], strict=True)}
            r.blocks.append(Block(idx, at, end, keys, h))
    for name in trial.tensor_names():
        part = trial.tensor(name)._part((0, 255))
        for row in part:
            if row["chunk"] != 0xFFFFFFFF:
                dat = trial.source.storage.describe(trial.source._chunks[int(row["chunk"])].dat_key)
                r.payloads.append((dat, int(row["offset"]), int(row["length"]), (name, int(row["step"]))))
    assert names and r.payloads  # the trial saw the job
    return r


class _Damaged:
    """Damage one file in place for the duration of a case, then restore it."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> bytes:
        with open(self.path, "rb") as f:
            self.original = f.read()
        return self.original

    def write(self, data: bytes) -> None:
        with open(self.path, "wb") as f:
            f.write(data)

    def __exit__(self, *exc: object) -> None:
        self.write(self.original)


def _trial(ref: Reference) -> Trial:
    return Trial(NativeSource(LocalStorage(ref.root), settle_s=SETTLE_S), "faults")


def _settle(trial: Trial) -> bool:
    """Refresh until the reader has decided about every tail; True if the job is seen as ended."""
    try:
        trial.wait_for_steps([STEPS + 1], timeout=SETTLE_S * 10)
    except NoMoreData:
        return True
    except StepNotYetAvailable:
        return False
    raise AssertionError("step past the end of the job reported available")


def _check(ref: Reference, lost: set[Key], damage_at: list[tuple[str, int]], must_end: bool) -> str:
    trial = _trial(ref)
    ended = _settle(trial)
    got, errors = _read_all(trial)
    assert not errors, errors
    for k, v in got.items():
        assert v == ref.values[k], f"{k}: a value differs from the reference"
    assert set(got) == set(ref.values) - lost, (sorted(set(ref.values) - lost - set(got)), sorted(set(got) & lost))
    assert [(d.path, d.offset) for d in trial.damage] == damage_at, trial.damage
    if must_end:
        assert ended, "a finished job must still be seen as ended"
    colls = set(trial.collections())
    assert colls <= ref.collections and ("weights" in colls or not ended or any(
        "collections" in b.header and b.keys <= lost for b in ref.blocks))
    return f"lost {len(lost)} of {len(ref.values)} values" if lost else "nothing lost"


def _block_at(ref: Reference, path: str, offset: int) -> Block:
    return next(b for b in ref.blocks if b.path == path and b.start <= offset < b.end)


def _summary(kind: str, outcomes: collections.Counter) -> None:
    print(f"\n[faults] {kind}: {sum(outcomes.values())} cases: {dict(outcomes)}")


def test_bit_flips_in_index_blocks(ref):
    rng = np.random.default_rng(1)
    idx_files = ref.files(".idx")
    outcomes: collections.Counter = collections.Counter()
    for _ in range(60):
        path = idx_files[rng.integers(len(idx_files))]
        with _Damaged(path) as data:
            off = int(rng.integers(len(data)))
            bit = int(rng.integers(8))
            b = bytearray(data)
            b[off] ^= 1 << bit
            with open(path, "wb") as f:
                f.write(bytes(b))
            blk = _block_at(ref, path, off)
            outcomes[_check(ref, blk.keys, [(path, blk.start)], must_end=True)] += 1
    _summary("bit flip in an index block", outcomes)


def _flip_in(ref: Reference, blk: Block, rng: np.random.Generator, lo: int, hi: int) -> None:
    with _Damaged(blk.path) as data:
        off = int(rng.integers(lo, hi))
        b = bytearray(data)
        b[off] ^= 1 << int(rng.integers(8))
        with open(blk.path, "wb") as f:
            f.write(bytes(b))
        _check(ref, blk.keys, [(blk.path, blk.start)], must_end=True)


def test_bit_flips_in_the_end_marker_block(ref):
    rng = np.random.default_rng(2)
    last = ref.blocks[-1]
    assert last.header.get("end") is True
    for _ in range(15):
        _flip_in(ref, last, rng, last.start, last.end)
    _summary("bit flip in the last block (end marker)", collections.Counter({"job ended, rest readable": 15}))


def test_bit_flips_in_collections_json(ref):
    rng = np.random.default_rng(3)
    with_colls = [b for b in ref.blocks if "collections" in b.header]
    assert len(with_colls) >= 1
    n = 0
    for blk in with_colls:
        hstart = blk.start + 16
        hlen = len(codec.json.dumps(blk.header, separators=(",", ":")).encode())
        for _ in range(8):
            _flip_in(ref, blk, rng, hstart, hstart + hlen)
            n += 1
    _summary("bit flip in a block header with collections JSON", collections.Counter({"block lost, rest readable": n}))


def test_bit_flips_in_payloads(ref):
    rng = np.random.default_rng(4)
    outcomes: collections.Counter = collections.Counter()
    for _ in range(30):
        dat, off, length, key = ref.payloads[rng.integers(len(ref.payloads))]
        with _Damaged(dat) as data:
            b = bytearray(data)
            b[off + int(rng.integers(length))] ^= 1 << int(rng.integers(8))
            with open(dat, "wb") as f:
                f.write(bytes(b))
            trial = _trial(ref)
            _settle(trial)
            got, errors = _read_all(trial)
            assert set(errors) == {key}
            assert errors[key].path == dat and errors[key].offset == off and "checksum" in errors[key].reason
            assert {k: v for k, v in ref.values.items() if k != key} == got
            assert trial.damage == []
            outcomes["that value raises CorruptData, rest readable"] += 1
    _summary("bit flip in a payload (.dat)", outcomes)


def test_truncated_index_files(ref):
    rng = np.random.default_rng(5)
    idx_files = ref.files(".idx")
    outcomes: collections.Counter = collections.Counter()
    for _ in range(25):
        path = idx_files[rng.integers(len(idx_files))]
        with _Damaged(path) as data:
            cut = int(rng.integers(1, len(data)))
            with open(path, "wb") as f:
                f.write(data[:cut])
            blocks = [b for b in ref.blocks if b.path == path]
            lost = set().union(*[b.keys for b in blocks if b.end > cut])
            torn = [b for b in blocks if b.start < cut < b.end]
            last_chunk = path == idx_files[-1]
            _check(ref, lost, [(path, torn[0].start)] if torn else [], must_end=bool(torn) or not last_chunk)
            outcomes["cut inside a block" if torn else "cut at a block boundary"] += 1
    _summary("truncated .idx", outcomes)


def test_truncated_data_files(ref):
    rng = np.random.default_rng(6)
    dat_files = ref.files(".dat")
    outcomes: collections.Counter = collections.Counter()
    for _ in range(15):
        dat = dat_files[rng.integers(len(dat_files))]
        with _Damaged(dat) as data:
            cut = int(rng.integers(0, len(data)))
            with open(dat, "wb") as f:
                f.write(data[:cut])
            trial = _trial(ref)
            _settle(trial)
            got, errors = _read_all(trial)
            cut_off = {key: off for d, off, n, key in ref.payloads if d == dat and off + n > cut}
            assert set(errors) == set(cut_off)
            for key, e in errors.items():
                assert e.path == dat and e.offset == cut_off[key] and "truncated" in e.reason
            assert got == {k: v for k, v in ref.values.items() if k not in cut_off}
            outcomes[f"{len(cut_off)} values raise CorruptData, rest readable"] += 1
    _summary("truncated .dat", outcomes)


def test_trailing_garbage(ref):
    rng = np.random.default_rng(7)
    idx_files = ref.files(".idx")
    for i in range(15):
        path = idx_files[i % len(idx_files)]
        with _Damaged(path) as data:
            garbage = rng.integers(0, 256, int(rng.integers(1, 600)), dtype=np.uint8).tobytes()
            with open(path, "wb") as f:
                f.write(data + garbage)
            _check(ref, set(), [(path, len(data))], must_end=True)
    _summary("random bytes appended to an .idx", collections.Counter({"reported, nothing lost": 15}))


def test_missing_files(ref):
    outcomes: collections.Counter = collections.Counter()
    for dat in ref.files(".dat"):
        with _Damaged(dat):
            os.unlink(dat)
            trial = _trial(ref)
            _settle(trial)
            got, errors = _read_all(trial)
            in_it = {key for d, _, _, key in ref.payloads if d == dat}
            assert set(errors) == in_it and all("missing" in e.reason and e.path == dat for e in errors.values())
            assert got == {k: v for k, v in ref.values.items() if k not in in_it}
            outcomes["missing .dat: its values raise CorruptData"] += 1
    for idx in ref.files(".idx")[:-1]:
        with _Damaged(idx):
            os.unlink(idx)
            lost = set().union(*[b.keys for b in ref.blocks if b.path == idx])
            _check(ref, lost, [], must_end=True)
            outcomes["missing .idx: its chunk is invisible"] += 1
    _summary("missing files", outcomes)
